"""Slurm pools (``slurm: {pool: {...}}``) against a real Slurm of two nodes (conftest.slurm_pool:
two slurmd on this machine, gts0 and gts1), and the pool's pure parts.

Each run here is ``stepping_command.py``: it journals its start (and the step it went on from),
each step after reporting it, and its end, with its node. What must hold after every fault: each
run ends exactly once, no step is trained twice after it was reported, every run succeeded, and
nothing is left in Slurm's queue or the pool's folders.

The fault battery runs one seed per fault in the suite; ``GTS_POOL_SEEDS=5`` runs five."""

import json
import os
import random
import re
import signal
import subprocess
import sys

import pytest
import yaml
from conftest import wait_until
from helpers import journal_lines, ledger_rows
from test_process_control import finish
from test_slurm import gts

from gpu_task_scheduler.backends.slurm.pool import PoolLauncher
from gpu_task_scheduler.backends.slurm.poolfiles import PoolFiles, job_of
from gpu_task_scheduler.errors import ConfigError
from gpu_task_scheduler.sweep.options import parse_scheduler_config

HERE = os.path.dirname(os.path.abspath(__file__))
pool_only = pytest.mark.xdist_group("clusters")
SEEDS = range(int(os.environ.get("GTS_POOL_SEEDS", "1")))


def write_sweep(folder, runs, steps, seconds, *, pool=None, **scheduler):
    config = {
        "scheduler_config": {
            "gpu": ["cpu"],
            "result_root_folder": str(folder / "results"),
            "backend": "slurm",
            "grace_period": 2,
            "lease_interval": 0.5,
            "node_failure_retries": 0,  # a lost run fails: the faults below must hand runs back or adopt them
            "max_retries": 0,
            "slurm": {
                "poll_interval": 0.5,
                "start_timeout": 30,  # an allocation whose batch step slurmd lost is replaced in time
                "pool": {"nodes": 2, "slots_per_node": 2, "idle_exit": 2, **(pool or {})},
            },
            **scheduler,
        },
        "command": [
            sys.executable,
            os.path.join(HERE, "stepping_command.py"),
            "{i}",
            str(steps),
            str(seconds),
            str(folder / "journal"),
        ],
        "test_config": [{"i": list(range(runs))}],
    }
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def journal(folder):
    """Per run: its starts (the step each went on from), its steps in order, its ends, its nodes."""
    runs = {}
    for line in journal_lines(folder / "journal"):
        word, run, *rest = line.split()
        entry = runs.setdefault(run, {"starts": [], "steps": [], "ends": 0, "nodes": set(), "spans": []})
        if word == "start":
            entry["starts"].append(int(rest[0]))
            entry["spans"].append([float(rest[1]), None, rest[2], rest[-1]])  # start, end, GPUs, node
        elif word == "step":
            entry["steps"].append(int(rest[0]))
        else:
            entry["ends"] += 1
            entry["spans"][-1][1] = float(rest[0])
        entry["nodes"].add(rest[-1])
    return runs


def check_exactly_once(folder, runs, steps):
    """Every run ended once, having trained each step at most once, its last one last; the ledger
    says succeeded; nothing of the pool is left behind."""
    found = journal(folder)
    assert sorted(found) == sorted(map(str, range(runs))), found
    for run, entry in found.items():
        assert entry["ends"] == 1, (run, entry)
        assert entry["steps"] == sorted(set(entry["steps"])) and entry["steps"][-1] == steps, (run, entry)
    rows = ledger_rows(folder / "results")
    assert {row["status"] for row in rows.values()} == {"succeeded"}, {n: r["status"] for n, r in rows.items()}
    files = PoolFiles(str(folder / "results"))
    assert os.listdir(files.queue) == [] and os.listdir(files.events) == [], "pool files left behind"
    assert all(os.listdir(files.claimed(agent)) == [] for agent in os.listdir(files.agents))
    return found, rows


def allocations(cluster, state="RUNNING"):
    return cluster.run("squeue", "-h", "-t", state, "-o", "%i").stdout.split()


def steps_reported(folder, least):
    return sum(len(entry["steps"]) >= least for entry in journal(folder).values())


# --- the pool's pure parts ------------------------------------------------------------------


def _options(pool, **slurm):
    return parse_scheduler_config(
        {"gpu": ["cpu"], "result_root_folder": "/tmp/r", "backend": "slurm", "slurm": {"pool": pool, **slurm}}
    )


def test_each_allocation_asks_for_its_nodes_its_gpus_and_the_warning_before_its_time_limit():
    launcher = PoolLauncher(
        type("T", (), {}), _options({"nodes": 3, "allocations": 2, "time": "4:00:00", "gpus_per_node": 4})
    )
    args = launcher.job_args()
    assert "--nodes=3" in args and "--no-kill" in args and "--gres=gpu:4" in args and "--time=4:00:00" in args
    assert "--signal=B:USR1@60" in args  # the grace period and a margin, at least Slurm's minute
    assert launcher.pool_slots() == 4 * 3 * 2  # one run per GPU unless max_runs_per_gpu packs more
    no_time = PoolLauncher(type("T", (), {}), _options({"nodes": 1, "slots_per_node": 5}, partition="cpu")).job_args()
    assert "--partition=cpu" in no_time and not any(arg.startswith(("--signal", "--time", "--gres")) for arg in no_time)


class _Handle:
    """What the driver's requests touch of an attempt's handle."""

    def __init__(self, token):
        import threading

        self.token, self.ended, self.over = token, None, threading.Event()

    def has_exited(self):
        return self.ended is not None

    def on_exit(self):
        pass


def test_a_kill_asked_while_the_stop_is_written_is_sent_too(tmp_path, monkeypatch):
    """Two Ctrl-C within a millisecond: the second (KILL) comes while the driver writes the first's
    word (TERM) for the agent that holds the run. It was lost (a flag set after the write), and a
    run that traps SIGTERM ran out its grace period; now the next round writes the kill."""
    from gpu_task_scheduler.backends.slurm import pool as pool_module
    from gpu_task_scheduler.backends.slurm.pool import _Attempt

    launcher = PoolLauncher(type("T", (), {}), _options({"nodes": 1}, poll_interval=0.5))
    launcher._files = PoolFiles(str(tmp_path))
    os.makedirs(launcher._files.events)
    os.makedirs(launcher._files.queue)
    task = _Attempt(_Handle("t0"), {"name": "a,"}, entry="000000001.t0.json")  # claimed: not in the queue
    launcher._attempts["t0"] = task
    real, written = pool_module.atomic_write, []

    def write(path, data, **kwargs):
        written.append(os.path.basename(path))
        real(path, data, **kwargs)
        if len(written) == 1:
            launcher.request("t0", "KILL")  # the second signal, in the window

    monkeypatch.setattr(pool_module, "atomic_write", write)
    launcher.request("t0", "TERM")
    launcher._send_requests()
    launcher._send_requests()
    assert written == ["t0.stop", "t0.kill"]
    launcher._send_requests()
    assert written == ["t0.stop", "t0.kill"]  # each word once


def _returns_at_once(call):
    """call()'s value, or a failure if it blocks (a plain open() of a FIFO does, for good)."""
    import threading

    result = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "it blocked"
    return result[0]


def _release(fifo):
    """A reader blocked on the FIFO (a failing run of these tests) gets its writer, and goes."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def test_what_lies_where_the_driver_reads_the_pools_size_never_blocks_it(tmp_path, caplog):
    """S1: a FIFO at .gts/slurm/pool/allocations hung the driver for good (a plain open()): runs
    ended unheard and no signal stopped it. The size file is read regular-only, never through a
    link; what cannot be read is said once, and the config's size holds."""
    launcher = PoolLauncher(type("T", (), {}), _options({"nodes": 1, "allocations": 3}))
    files = launcher._files = PoolFiles(str(tmp_path))
    files.make()
    launcher._most = 4  # the partition's nodes over the allocation's (open() asks sinfo)
    os.mkfifo(files.target)
    try:
        assert _returns_at_once(launcher._target) == 3
    finally:
        _release(files.target)
    assert _returns_at_once(launcher._target) == 3
    assert caplog.text.count("is not a regular file") == 1 and files.target in caplog.text, caplog.text
    os.unlink(files.target)
    (tmp_path / "two").write_text("2\n")
    os.symlink(tmp_path / "two", files.target)
    assert launcher._target() == 3 and "is a symbolic link" in caplog.text
    os.unlink(files.target)
    for text, size in (("2\n", 2), ("5\n", 3), ("0\n", 3), ("4", 4)):
        (tmp_path / "asked").write_text(text)
        os.replace(tmp_path / "asked", files.target)
        assert launcher._target() == size, text
    assert "'5' is no number of allocations from 1 to 4" in caplog.text


def test_an_agent_refuses_options_that_are_no_regular_file_at_once(tmp_path, capsys):
    from gpu_task_scheduler.backends.slurm import agent

    files = PoolFiles(str(tmp_path))
    files.make()
    (tmp_path / ".gts" / "slurm" / "pool" / "pool.json").write_text("{}")
    os.mkfifo(files.options)
    try:
        assert _returns_at_once(lambda: agent.main([str(tmp_path)])) == 2
    finally:
        _release(files.options)
    assert "cannot read the pool's options" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("pool", "words"),
    [
        ({"nodes": 0}, "'nodes'] must be an integer >= 1"),
        ({"nodes": 2, "allocation": 1}, "unknown key 'allocation'"),
        ({"time": "forever"}, "a Slurm time"),
        ({"gpus_per_node": -1}, "an integer >= 0"),
        ({"idle_exit": True}, "seconds between 0 and 86400"),
        ("two nodes", "must be a dict"),
    ],
)
def test_a_pool_key_that_slurm_would_not_take_is_refused_before_anything_is_submitted(pool, words):
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        _options(pool)


def test_a_dry_run_says_how_many_jobs_a_start_submits_and_what_each_asks_for(in_tmp):
    def dry_run(path):
        argv = [sys.executable, "-m", "gpu_task_scheduler", "run", path, "--dry-run"]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    pool = write_sweep(in_tmp, 5, 1, 0.1, pool={"time": "1:00:00", "allocations": 2})
    said = dry_run(pool)
    assert "slurm pool: 2 allocation job(s) of 2 node(s) for the 5 run(s), up to 8 at once" in said, said
    assert "--nodes=2 --ntasks-per-node=1 --no-kill --time=1:00:00 --signal=B:USR1@60" in said
    config = yaml.safe_load(pool.read_text())
    del config["scheduler_config"]["slurm"]["pool"]
    pool.write_text(yaml.safe_dump(config))
    said = dry_run(pool)
    assert "slurm: 5 job array task(s) in at least 1 array(s)" in said and "one per run" in said, said


# --- on the real Slurm ---------------------------------------------------------------------


@pool_only
def test_a_pool_runs_every_run_once_on_both_nodes_with_one_job(slurm_pool, in_tmp, no_leaked_processes):
    """16 runs through one allocation of 2 nodes, 2 slots each: every run once, on both nodes, at
    most 4 at once, one sbatch for the whole sweep; `gts status` shows the pool while it runs."""
    path = write_sweep(in_tmp, 16, 2, 0.2)
    process = gts("run", path, "--plain")
    wait_until(lambda: steps_reported(in_tmp, 1) >= 2, timeout=60, message="runs to start")
    status = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "status", str(in_tmp / "results")],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    output = finish(process, timeout=120)
    assert process.returncode == 0, output
    found, _ = check_exactly_once(in_tmp, 16, 2)
    assert set().union(*(entry["nodes"] for entry in found.values())) == {"gts0", "gts1"}
    assert output.count("Slurm pool: submitted allocation") == 1, output
    assert "pool: 1 allocation" in status and "gts0" in status and "gts1" in status, status
    from gpu_task_scheduler.web.data import overview  # the page and the report show what status shows

    assert overview(str(in_tmp / "results"))["pool"] == ["pool: over; 1 allocation(s) submitted by its last start"]
    assert slurm_pool.jobs() == []
    assert os.listdir(PoolFiles(str(in_tmp / "results")).agents) == []  # the allocation ended: its agents' folders went


@pool_only
def test_the_time_limit_warning_hands_running_runs_back_and_they_go_on_from_their_last_step(
    slurm_pool, in_tmp, no_leaked_processes
):
    """Slurm's warning before the time limit (--signal=B:USR1, sent here by scancel --batch): the
    agents start nothing more and stop their runs; each goes on from its last reported step in a
    second allocation. No run fails, none is counted as a retry (max_retries and
    node_failure_retries are 0)."""
    path = write_sweep(in_tmp, 4, 8, 0.3, pool={"slots_per_node": 2})
    process = gts("run", path, "--plain")
    wait_until(lambda: steps_reported(in_tmp, 2) == 4, timeout=60, message="every run to report 2 steps")
    (job,) = allocations(slurm_pool)
    slurm_pool.run("scancel", "--signal=USR1", "--batch", job)
    output = finish(process, timeout=120)
    assert process.returncode == 0, output
    found, rows = check_exactly_once(in_tmp, 4, 8)
    assert output.count("Slurm pool: submitted allocation") == 2, output
    for run, entry in found.items():
        first, second = entry["starts"]  # handed back once, gone on from its last reported step
        assert first == 0 and second >= 2 and entry["steps"][0] == 1, (run, entry)
        assert rows[f"i-{run},"]["attempts"] == 2


@pool_only
def test_a_node_left_with_nothing_to_run_is_given_back_while_the_other_works(slurm_pool, in_tmp, no_leaked_processes):
    """One run, two nodes, idle_exit 1 s: the agent with nothing to run ends, and its node leaves the
    allocation (scontrol update NodeList=) while the run goes on on the other; the node that runs
    the batch script goes with the job."""
    path = write_sweep(in_tmp, 1, 12, 0.5, pool={"slots_per_node": 1, "idle_exit": 1})
    process = gts("run", path, "--plain")
    wait_until(lambda: steps_reported(in_tmp, 1), timeout=60, message="the run to report")
    (node,) = journal(in_tmp)["0"]["nodes"]
    (job,) = allocations(slurm_pool)
    nodes = lambda: slurm_pool.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()  # noqa: E731
    if node == "gts0":  # the batch script's node: gts1 is given back
        wait_until(lambda: nodes() == "gts0", timeout=30, message="gts1 to leave the allocation")
    else:
        assert nodes() == "gts[0-1]"
    output = finish(process, timeout=120)
    assert process.returncode == 0, output
    check_exactly_once(in_tmp, 1, 12)


@pool_only
def test_gts_pool_grows_the_pool_of_a_running_sweep(slurm_pool, in_tmp, no_leaked_processes):
    """One allocation of one node; `gts pool ROOT --allocations 2` from another shell: a second
    allocation is submitted at once, and the runs spread over both."""
    path = write_sweep(in_tmp, 12, 4, 0.3, pool={"nodes": 1, "slots_per_node": 2})
    process = gts("run", path, "--plain")
    wait_until(lambda: steps_reported(in_tmp, 1) >= 1, timeout=60, message="a run to report")
    too_many = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "pool", str(in_tmp / "results"), "--allocations", "99999"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert too_many.returncode == 1 and "the pool can use 1 to 2 allocation(s)" in too_many.stderr, too_many.stderr
    asked = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "pool", str(in_tmp / "results"), "--allocations", "2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert asked.returncode == 0 and "to keep 2 allocation(s)" in asked.stdout, asked.stdout + asked.stderr
    output = finish(process, timeout=120)
    assert process.returncode == 0, output
    found, _ = check_exactly_once(in_tmp, 12, 4)
    assert output.count("Slurm pool: submitted allocation") == 2, output
    assert len(set(re.findall(r"\(pool job (\d+)\)", output))) == 2, output  # runs ran in both


@pool_only
@pytest.mark.parametrize("need", ["declared", "learned"])
def test_small_runs_share_a_gpu_of_a_pool_node_by_memory(slurm_pool, in_tmp, no_leaked_processes, monkeypatch, need):
    """A node of 1 GPU of 8 GiB (the fake NVML), runs of 2 GiB, max_runs_per_gpu 4, the 512 MiB
    margin: three runs share the GPU at once, as on a local machine, never four. Declared
    (gpu_memory), or learned: the first run has the GPU to itself until its peak is measured. Each
    run's peak reaches the ledger."""
    import fake_nvml

    table = in_tmp / "nvml.json"
    fake_nvml.write_state(str(table), [{"name": "Fake GPU", "total": 8 * fake_nvml.GiB}])
    monkeypatch.setenv(fake_nvml.ENV, str(table))
    monkeypatch.setenv("GPU_BYTES", str(2 * fake_nvml.GiB))
    declared = {"gpu_memory": "2GiB"} if need == "declared" else {}
    path = write_sweep(in_tmp, 7, 3, 0.3, pool={"nodes": 1, "gpus_per_node": 1}, max_runs_per_gpu=4, **declared)
    process = gts("run", path, "--plain")
    output = finish(process, timeout=120)
    assert process.returncode == 0, output
    found, rows = check_exactly_once(in_tmp, 7, 3)
    # What each used at most, measured by its agent on its node, is in the ledger as a local run's is.
    assert {row["gpu_memory_peak"] for row in rows.values()} == {2 * fake_nvml.GiB}, rows
    spans = [span for entry in found.values() for span in entry["spans"]]
    assert {span[2] for span in spans} == {"0"}  # the one GPU Slurm gave the job
    moments = sorted([(start, 1) for start, _, _, _ in spans] + [(end, -1) for _, end, _, _ in spans])
    at_once = max(sum(change for _, change in moments[: index + 1]) for index in range(len(moments)))
    assert at_once == 3, spans
    if need == "learned":
        first, second = sorted(spans)[:2]
        assert second[0] >= first[1], spans  # alone until what it used was known


FAULTS = ["scancel", "requeue", "node-down", "agent-sigkill", "driver-sigkill"]


@pool_only
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fault", FAULTS)
def test_every_run_ends_once_through_a_fault_at_a_random_moment(slurm_pool, in_tmp, no_leaked_processes, fault, seed):
    """8 runs of 6 steps through one allocation of 2 nodes; at a random moment (after 1 to 4 steps of
    the first runs): the whole allocation cancelled, requeued, a node set DOWN, an agent SIGKILLed,
    or the driver SIGKILLed and `gts run` started again. Lost runs run again (node_failure_retries
    2), and every run still ends exactly once, none trains a reported step twice."""
    rng = random.Random(f"{fault}-{seed}")
    path = write_sweep(in_tmp, 8, 6, 0.25, node_failure_retries=2)
    process = gts("run", path, "--plain")
    moment = rng.randint(1, 4)
    wait_until(lambda: steps_reported(in_tmp, moment) >= 1, timeout=60, message=f"a run at step {moment}")
    (job,) = wait_until(lambda: allocations(slurm_pool), timeout=30, message="the allocation")
    files = PoolFiles(str(in_tmp / "results"))
    outputs = []
    try:
        if fault == "scancel":
            slurm_pool.run("scancel", job)
        elif fault == "requeue":
            slurm_pool.run("scontrol", "requeue", job)
        elif fault == "node-down":
            slurm_pool.set_node(rng.choice(["gts0", "gts1"]), "DOWN")
        elif fault == "agent-sigkill":
            agents = [agent for agent in os.listdir(files.agents) if job_of(agent) == job]
            beat = json.loads(open(files.beat(rng.choice(sorted(agents)))).read())
            os.kill(beat["pid"], signal.SIGKILL)
        else:
            process.kill()
            outputs.append(finish(process))
            process = gts("run", path, "--plain")
        outputs.append(finish(process, timeout=180))
    finally:
        for node in ("gts0", "gts1"):
            state = slurm_pool.run("sinfo", "-h", "-n", node, "-o", "%T", check=False).stdout.strip()
            if "down" in state or "drain" in state:
                slurm_pool.set_node(node, "RESUME")
    assert process.returncode == 0, "\n".join(outputs)
    check_exactly_once(in_tmp, 8, 6)
    assert slurm_pool.jobs() == []


@pool_only
def test_a_detached_pool_runs_on_and_a_later_start_follows_it(slurm_pool, in_tmp, no_leaked_processes):
    """`gts run --detach`: the driver returns once the runs are queued and an allocation asked for;
    the agents run through the queue; `gts run` again follows what still runs and records every run
    once."""
    path = write_sweep(in_tmp, 6, 4, 0.25)
    process = gts("run", path, "--plain", "--detach")
    first = finish(process, timeout=60)
    assert process.returncode == 0 and "Slurm pool: submitted allocation" in first, first
    wait_until(lambda: steps_reported(in_tmp, 1) >= 1, timeout=60, message="a run to report")
    again = gts("run", path, "--plain")
    output = finish(again, timeout=120)
    assert again.returncode == 0, first + output
    check_exactly_once(in_tmp, 6, 4)
    assert slurm_pool.jobs() == []
