import contextlib
import os
import signal
import socketserver
import sys
import threading
import time
import uuid

import pytest

MARK = "GTS_TEST_MARK"

# Every scheduler the tests start, in this process or in a child (``gts`` on the command line),
# reads GPUs through the fake NVML: none unless a test writes a table (fake_nvml.ENV). So the
# suite behaves the same on a machine with GPUs; test_real_gpu.py passes the real bindings in.
TESTS = os.path.dirname(os.path.abspath(__file__))
os.environ["GTS_NVML_MODULE"] = "fake_nvml"
# A process the tests start that hangs is sent SIGABRT before it is killed (finish() in
# test_process_control.py): with this, it prints every thread's stack first, so a hang says where.
os.environ["PYTHONFAULTHANDLER"] = "1"
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))
# Bytecode is cached, as on a user's machine, whatever the environment says: the suite starts
# thousands of Python processes (runners, `gts`, warm processes, agents), and each compiled the
# package's modules from source where PYTHONDONTWRITEBYTECODE was set (as on this project's CI
# machines): 0.1 s more for each start of the scheduler's modules, minutes over the suite.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# The suite runs as from a terminal, whatever started it: under `nohup`, or as a background job of a
# shell without job control, SIGHUP or SIGINT comes ignored and every process started inherits it;
# a sweep leaves an ignored signal ignored (engine/hooks.StopSignals), and the tests that stop one
# with it would fail.
for _signum in (signal.SIGHUP, signal.SIGQUIT):
    if signal.getsignal(_signum) is signal.SIG_IGN:
        signal.signal(_signum, signal.SIG_DFL)
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Imported only by runs on a machine with PyTorch (test_real_gpu.py), or run as scripts by sweeps
# of the framework tests (test_integration_sweeps.py): not modules to collect (each imports its
# framework, which an install without the integrations extra lacks).
collect_ignore = ["gts_torch_module.py", "pbt_lightning.py", "pbt_trainer.py", "pbt_keras.py"]

# `pytest -m quick`: a check of an install in under a minute (README, "The test suite"): the
# configs, naming, the command line, the ledger, the engine's decisions and a few whole sweeps, and
# the package's doctests. None of these files starts Ray, Slurm or a browser, kills processes on
# purpose or runs a battery of seeds; the whole suite does all of that.
QUICK = {
    "test_cli.py",
    "test_config.py",
    "test_decisions.py",
    "test_events.py",
    "test_hostile_input.py",
    "test_hostile_root.py",
    "test_keeper.py",
    "test_lease.py",
    "test_logs_command.py",
    "test_metrics.py",
    "test_naming.py",
    "test_new_user.py",
    "test_notify_tls.py",
    "test_overrides.py",
    "test_recordclass.py",
    "test_results_ranking.py",
    "test_retry_command.py",
    "test_scheduler.py",
    "test_shell_template.py",
    "test_source_imports.py",
    "test_stages.py",
    "test_stop_command.py",
    "test_stopping_and_output.py",
    "test_trials.py",
    "test_watch_command.py",
}


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker more than the machine's CPUs. The "clusters" group's chain (Ray, then
    Slurm: minutes, one worker) mostly waits on daemons and polls, so beside it the others keep
    every CPU busy. Measured on 2 cores, clean clones: 606-609 s with 3 workers and the groups
    holding (pytest below 9.2); with 2, 679-714 s, measured while pytest 9.2 spread the groups."""
    return (os.cpu_count() or 1) + 1


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = str(item.path)
        if os.path.basename(path) in QUICK or not path.startswith(TESTS + os.sep):  # a doctest of the package
            item.add_marker(pytest.mark.quick)
    # The tests of an xdist group run one after another in one worker (--dist loadgroup): first, so
    # that each group's chain (minutes) runs beside the other tests, not after those collected before it.
    # In the "clusters" group, every Ray test before every Slurm test: the Slurm tests stop the shared
    # Ray instance (see ray_instance), which then starts once, not once per test.
    items.sort(key=lambda item: (item.get_closest_marker("xdist_group") is None, not _uses_ray(item)))


def _uses_ray(item):
    params = getattr(getattr(item, "callspec", None), "params", {})
    fixtures = getattr(item, "fixturenames", ())
    return "ray" in item.path.name or "ray" in params.values() or any(f.startswith("ray_") for f in fixtures)


def marked_pids(mark):
    """Processes (any parent) whose environment carries this test's mark."""
    needle = f"{MARK}={mark}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ and state != b"Z":
            pids.append(int(entry))
    return pids


def wait_until(predicate, timeout=20.0, interval=0.02, message="condition"):
    """Wait for a condition that has no event to wait on (a file appearing, a process dying)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


@pytest.fixture(autouse=True)
def own_reservations_dir(tmp_path_factory, monkeypatch):
    """Each test's schedulers share GPU reservations among themselves only (the fake GPUs of
    tests running side by side have the same UUIDs)."""
    folder = tmp_path_factory.mktemp("reservations")
    monkeypatch.setenv("GTS_RESERVATIONS_DIR", str(folder / "shared"))
    return folder / "shared"


@pytest.fixture(autouse=True)
def own_cache_dir(tmp_path_factory, monkeypatch):
    """Each test's sweeps keep what their warm processes imported (backends/local/importcache.py)
    to themselves, not in the user's cache."""
    folder = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("GTS_CACHE_DIR", str(folder))
    return folder


@pytest.fixture(autouse=True)
def no_leaked_processes(monkeypatch):
    """Every process a test starts carries a mark; none may survive the test."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK, mark)
    yield mark
    try:
        wait_until(lambda: not marked_pids(mark), timeout=10, message="the test's processes to exit")
    except AssertionError:
        leaked = marked_pids(mark)
        described = []
        for pid in leaked:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    argv = handle.read().split(b"\0")
                described.append(f"{pid} {b' '.join(argv)[:100].decode(errors='replace')}")
            except OSError:
                described.append(str(pid))
        for pid in leaked:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        pytest.fail(f"processes left running after the test: {described}")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run the test with a fresh temporary folder as the current directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


class _SMTPHandler(socketserver.StreamRequestHandler):
    """Just enough SMTP (with AUTH PLAIN) to receive one message on 127.0.0.1."""

    def reply(self, line):
        self.wfile.write((line + "\r\n").encode())

    def handle(self):
        self.reply("220 localhost test SMTP")
        data, in_data = [], False
        for raw in self.rfile:
            line = raw.decode().rstrip("\r\n")
            if in_data:
                if line == ".":
                    in_data = False
                    self.server.messages.append("\r\n".join(data))
                    self.reply("250 queued")
                else:
                    data.append(line[1:] if line.startswith("..") else line)
                continue
            verb = line.split(" ")[0].upper()
            if verb == "EHLO":
                self.wfile.write(b"250-localhost\r\n250 AUTH PLAIN\r\n")
            elif verb == "AUTH":
                self.server.auth.append(line)
                self.reply("235 ok")
            elif verb == "DATA":
                in_data = True
                self.reply("354 go on")
            elif verb == "QUIT":
                self.reply("221 bye")
                return
            else:
                self.reply("250 ok")


@pytest.fixture
def smtp_server():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _SMTPHandler)
    server.daemon_threads = True
    server.messages, server.auth = [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


# Ray and Slurm: the tests that use either run in one pytest worker (xdist_group "clusters", with
# --dist loadgroup), never side by side, and never with a Ray instance of the tests alive while a
# Slurm test runs. A raylet SIGKILLs a worker by the pid it recorded, also once the worker is gone
# ("Failed to send exit request to worker ... Killing it using SIGKILL instead", 11 times in one
# day's raylet logs here); with pid_max 32768 and the thousands of processes a suite run starts,
# that pid may be another process by then. Seen: the test Slurm lost the slurmstepd of 2 of 19 batch
# steps, killed from outside without a word in slurmd's log, and a Slurm run ended by SIGKILL before
# it wrote a line (test_a_handle_knows_its_run_ended_before_the_loop_hears_of_it[slurm]).
# So the Ray tests run first (pytest_collection_modifyitems) and the Slurm fixtures stop Ray.
# Ray: one instance of 4 declared GPUs for the Ray tests, on this machine only.
RAY_GPUS = 4
_RAY = []  # the ray module, while the tests' instance is up


@pytest.fixture
def ray_instance():
    """A Ray instance shared by the tests of this worker (started by the first that needs it): the
    Ray launcher uses a connection the program already has (and leaves it open). Stopped with
    ray.shutdown(), never `ray stop`: at the end, or when a Slurm test comes."""
    ray = pytest.importorskip("ray")
    if not _RAY:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        mark = os.environ.pop(MARK, None)  # Ray's processes outlive the test that happened to start them
        try:
            ray.init(address="local", num_cpus=2, num_gpus=RAY_GPUS, include_dashboard=False, log_to_driver=False)
        finally:
            if mark is not None:
                os.environ[MARK] = mark
        _RAY.append(ray)
    return ray


def _stop_ray():
    if _RAY:
        _RAY.pop().shutdown()


@pytest.fixture(scope="session", autouse=True)
def _ray_stopped_at_the_end():
    yield
    _stop_ray()


# Slurm: that worker starts one Slurm cluster of its own (slurm_cluster.py: one node, 4 GPUs as GRES)
# for all of them.
def _started_cluster(tmp_path_factory, nodes):
    from slurm_cluster import SlurmCluster, why_not

    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    _stop_ray()
    mark = os.environ.pop(MARK, None)  # the daemons outlive the test that happened to start them
    cluster = SlurmCluster(str(tmp_path_factory.mktemp(f"slurm{nodes}")), nodes)
    try:
        cluster.start()
    finally:
        if mark is not None:
            os.environ[MARK] = mark
    return cluster


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """The tests' own one-node Slurm cluster; every job of it is cancelled and its daemons stopped
    (by their pids) at the end. A test that uses it finds it through SLURM_CONF."""
    cluster = _started_cluster(tmp_path_factory, 1)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def slurm_pool_cluster(tmp_path_factory):
    """A Slurm cluster of two nodes (gts0, gts1: two slurmd on this machine) for the pools' tests."""
    cluster = _started_cluster(tmp_path_factory, 2)
    yield cluster
    cluster.stop()


@pytest.fixture
def slurm(slurm_cluster, monkeypatch):
    """The one-node cluster, with no job of an earlier test left in it (none may be: each test checks)."""
    _stop_ray()
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.conf)
    yield from _no_jobs_left(slurm_cluster)


@pytest.fixture
def slurm_pool(slurm_pool_cluster, monkeypatch):
    """The two-node cluster, as ``slurm`` is the one-node one."""
    _stop_ray()
    monkeypatch.setenv("SLURM_CONF", slurm_pool_cluster.conf)
    yield from _no_jobs_left(slurm_pool_cluster)


def _ending(slurm_cluster):
    """Whether every job still listed is one that ended and that Slurm is tidying up (COMPLETING:
    its nodes' epilog). ``srun`` returns when its step ends, before its job leaves the queue."""
    states = slurm_cluster.run("squeue", "-h", "-r", "-o", "%T", check=False).stdout.split()
    return not states or set(states) == {"COMPLETING"}


def _no_jobs_left(slurm_cluster):
    yield slurm_cluster
    if _ending(slurm_cluster):  # a job tidied up is gone in moments; one in any other state is left
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not slurm_cluster.jobs(), timeout=30, interval=0.2)
    left = slurm_cluster.jobs()
    if left:  # what they wait for, and the node's state: the reason is in Slurm, not in the test
        queue = slurm_cluster.run("squeue", "-h", "-r", "-o", "%i %T %r", check=False).stdout
        node = slurm_cluster.run("sinfo", "-h", "-o", "%T %E", check=False).stdout
        import subprocess

        ps = subprocess.run(["ps", "-eo", "pid,ppid,sid,stat,etime,args"], capture_output=True, text=True).stdout
        jobs = "\n".join(line[:200] for line in ps.splitlines() if "slurm" in line or "gpu_task" in line)
        slurm_cluster.cancel_all()
        pytest.fail(f"jobs left in Slurm's queue:\n{queue}node: {node}{slurm_cluster.logs()}\n{jobs}")
