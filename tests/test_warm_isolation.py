"""A warm-forked run is as isolated as a cold one (backends/local/isolation.py holds the contract).

The differential check: one probe script, run cold and then warm in the same folders, reports
what it sees of its process (environment, flags, signal handlers, descriptors, limits, modules,
logging, decimal, command line, its own forks...); the two must be equal, field by field, except
where the contract says why not. Then each finding of the hostile round, with its own test."""

import json
import os
import sys

import pytest
from helpers import ledger_rows, make_config

from gpu_task_scheduler import GPUTask, GPUTaskScheduler

PROBE = r"""
import sys
at_start = sorted(sys.modules)
import decimal, faulthandler, gc, json, locale, logging, os, random, resource, signal, threading, time, warnings

def handler(number):
    found = signal.getsignal(number)
    names = {signal.SIG_DFL: "SIG_DFL", signal.SIG_IGN: "SIG_IGN", signal.default_int_handler: "KeyboardInterrupt"}
    return names.get(found, repr(found))

def kind(fd):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "gone"
    return target.split(":")[0] if target.startswith(("pipe:", "socket:", "anon_inode:")) else target

fds = {fd: kind(fd) for fd in sorted(int(fd) for fd in os.listdir("/proc/self/fd"))}
with open("/proc/self/cmdline", "rb") as handle:
    cmdline = handle.read().rstrip(b"\0").split(b"\0")
helper = os.fork()
if helper == 0:
    os._exit(7)
_, status = os.waitpid(helper, 0)
root_before = len(logging.getLogger().handlers)
own_log = f"own-{sys.argv[-1]}.log"  # the runs share their folder: each its own file
logging.basicConfig(filename=own_log, level=logging.INFO, force=False)
logging.info("the run's own line")
signals = [number for number in signal.Signals if number not in (signal.SIGKILL, signal.SIGSTOP)]
seen = {
    "argv": sys.argv, "orig_argv": sys.orig_argv, "cmdline": [part.decode() for part in cmdline],
    "env": {key: value for key, value in os.environ.items() if key != "GTS_RUN_TOKEN"},
    "flags": list(sys.flags), "hash": hash("probe"),
    "signals": {number.name: handler(number) for number in signals},
    "fds": fds, "limits": {name: resource.getrlimit(getattr(resource, name))
        for name in dir(resource) if name.startswith("RLIMIT_")},
    "modules": at_start, "root_handlers": root_before, "own_log": open(own_log).read(),
    "decimal": [decimal.getcontext().prec, str(decimal.Decimal(1) / 7)], "umask": os.umask(0o22),
    "cwd": os.getcwd(), "path": sys.path, "executable": sys.executable, "name": __name__, "file": __file__,
    "stdin": sys.stdin.read(), "encoding": [sys.stdout.encoding, sys.stdout.errors, sys.stdout.line_buffering],
    "faulthandler": faulthandler.is_enabled(), "hooks": [sys.excepthook is sys.__excepthook__,
        sys.displayhook is sys.__displayhook__, threading.excepthook is threading.__excepthook__],
    "recursion": sys.getrecursionlimit(), "switch": sys.getswitchinterval(),
    "gc": [gc.isenabled(), *gc.get_threshold()], "locale": locale.setlocale(locale.LC_ALL), "tz": list(time.tzname),
    "affinity": sorted(os.sched_getaffinity(0)), "nice": os.nice(0), "fork_status": os.waitstatus_to_exitcode(status),
    "warnings": [str(f) for f in warnings.filters], "threads": sorted(thread.name for thread in threading.enumerate()),
    "random": random.random(), "forked": b"GTS_RUN_TOKEN=" not in open("/proc/self/environ", "rb").read(),
}
os.unlink(own_log)
print("PROBE " + json.dumps(seen), flush=True)
"""

# Where the contract (isolation.py) says a fork differs from a cold start, and how.
DOCUMENTED = {
    "modules",  # the warm process's modules are there too: checked below, a cold start's are a part of them
    "warnings",  # filters libraries add as they are imported: a cold start's are a part of them
    "threads",  # the fork's lifeline watcher (a cold start's wrapper is a process of its own)
    "random",  # each run its own draw, warm or cold: checked below
    "forked",
}

# A cold command's wrapper shell (prepare.py) passes its own variables on to the script; a fork has
# no wrapper.
WRAPPER_VARIABLES = ("GTS_CWD", "GTS_FORKED_FD", "GTS_LIFELINE_FD", "GTS_KEEPER")


def _seen(root):
    found = {}
    for name in sorted(os.listdir(root)):
        if name.endswith(","):
            lines = (root / name / "worker.log").read_text().splitlines()
            found[name] = json.loads([line for line in lines if line.startswith("PROBE ")][-1][6:])
    return found


def test_a_probe_run_cold_and_warm_sees_the_same(in_tmp, monkeypatch, no_leaked_processes):
    monkeypatch.setenv("PYTHONHASHSEED", "1234")  # the one thing a fork cannot draw anew (the contract says)
    (in_tmp / "probe.py").write_text(PROBE)
    config = make_config(in_tmp / "r", [{"i": [0, 1]}], slots=("cpu", "cpu"), prewarm=False)
    config["command"] = [sys.executable, "probe.py", "--i", "{i}"]
    assert GPUTaskScheduler(config).start().ok
    cold = _seen(in_tmp / "r")
    config["scheduler_config"].update(prewarm={"imports": ["decimal", "fractions"]}, force_rerun=True)
    assert GPUTaskScheduler(config).start().ok
    warm = _seen(in_tmp / "r")
    assert sorted(cold) == sorted(warm) == ["i-0,", "i-1,"]
    assert all(run["forked"] for run in warm.values()) and not any(run["forked"] for run in cold.values())
    for name in cold:
        wrapper = cold[name]["env"].get("GTS_FORKED_FD")
        for field in sorted(set(cold[name]) - DOCUMENTED):
            if field == "fds":  # the listing's own, the wrapper's descriptor its script inherits, and the
                # root's lock, at the number each scheduler holds it at (the two sweeps' schedulers differ)
                for seen in (cold[name], warm[name]):
                    fds = {fd: what for fd, what in seen["fds"].items() if what != "gone" and fd != wrapper}
                    assert list(fds.values()).count(str(in_tmp / "r")) == 1, fds
                    seen["fds"] = {fd: what for fd, what in fds.items() if what != str(in_tmp / "r")}
            if field == "env":  # the attempt's number (the warm sweep is the folder's second), the wrapper's own
                for key in ("GTS_ATTEMPT", *WRAPPER_VARIABLES):
                    cold[name]["env"].pop(key, None), warm[name]["env"].pop(key, None)
            assert warm[name][field] == cold[name][field], (name, field, cold[name][field], warm[name][field])
        assert set(cold[name]["modules"]) <= set(warm[name]["modules"]), name
        assert "fractions" in warm[name]["modules"] and "fractions" not in cold[name]["modules"]
        assert set(cold[name]["warnings"]) <= set(warm[name]["warnings"]), name
        assert warm[name]["cmdline"][1:] == ["probe.py", "--i", name[2:-1]] == warm[name]["orig_argv"][1:]
        assert warm[name]["own_log"] == "INFO:root:the run's own line\n" and warm[name]["fork_status"] == 7
    assert warm["i-0,"]["random"] != warm["i-1,"]["random"]


def _script(folder, name, text):
    (folder / name).write_text(text)


def test_a_helper_the_run_forks_never_records_the_runs_success(in_tmp, no_leaked_processes):
    """S1: the helper inherits the run's exit handlers; its sys.exit(0) recorded the run's success,
    though the run exits 3. Warm and cold: failed."""
    _script(
        in_tmp,
        "forks.py",
        "import os, sys\npid = os.fork()\nif pid == 0:\n    sys.exit(0)\nos.waitpid(pid, 0)\nsys.exit(3)\n",
    )
    for prewarm in (False, True):
        root = in_tmp / f"r-{prewarm}"
        config = make_config(root, [{"i": [0]}], prewarm=prewarm)
        config["command"] = [sys.executable, "forks.py"]
        assert not GPUTaskScheduler(config).start().ok
        row = ledger_rows(root)["i-0,"]
        assert row["status"] == "failed" and row["exit_code"] == 3, (prewarm, row)
        assert not (root / "i-0," / ".gts" / "outcome.json").exists(), prewarm


@pytest.mark.parametrize(
    "how",
    [["fails.py"], ["-m", "fails"], ["-c", "import fails"], ["hooked.py"]],
    ids=["script", "module", "code", "own-hook"],
)
def test_a_script_that_fails_logs_the_traceback_a_cold_start_logs(in_tmp, how, no_leaked_processes):
    """An exception nothing caught: the run's log holds what a cold start's holds, its traceback
    from the script's first frame (``-m``: runpy's), or what the script's own excepthook printed;
    exit status 1. (Warm, six of the warm process's frames came first, as if gts had crashed.)"""
    _script(in_tmp, "fails.py", "import os\n\ndef load():\n    import no_such_module_anywhere\n\nload()\n")
    _script(
        in_tmp,
        "hooked.py",
        "import sys\n"
        "sys.excepthook = lambda kind, error, tb: print('hook', kind.__name__, tb.tb_frame.f_code.co_filename)\n"
        "raise OSError(2)\n",
    )
    logs = {}
    for prewarm in (False, True):
        root = in_tmp / f"r-{prewarm}"
        config = make_config(root, [{"i": [0]}], prewarm=prewarm)
        config["command"] = [sys.executable, *how]
        assert not GPUTaskScheduler(config).start().ok
        row = ledger_rows(root)["i-0,"]
        assert row["status"] == "failed" and row["exit_code"] == 1, (prewarm, row)
        logs[prewarm] = (root / "i-0," / "worker.log").read_text()
    assert logs[True] == logs[False]
    assert "gpu_task_scheduler" not in logs[True] and ("hook OSError" in logs[True]) == (how == ["hooked.py"])
    if how != ["hooked.py"]:  # from the script's first frame (-m: runpy's, as a cold start's)
        first = logs[True].splitlines()[1]
        assert first.startswith('  File "<frozen runpy>"' if how[0] == "-m" else "  File"), logs[True]


ENDS = r"""
import atexit, os, sys, threading, time
os.chdir(sys.argv[2])
unclosed = open("unclosed.txt", "w")  # never closed: flushed at the end
unclosed.write("all of it")

class Held:  # held by a global: released at the end (what it calls kept, as at a cold end builtins go)
    def __del__(self, open=open):
        with open("held.txt", "w") as handle:
            handle.write("released")

held = Held()

class Cycle:  # garbage in a cycle: collected at the end
    def __del__(self, open=open):
        with open("cycle.txt", "w") as handle:
            handle.write("collected")

loop = Cycle()
loop.me = loop
del loop
atexit.register(lambda: open("atexit.txt", "w").write("ran"))

def late():
    time.sleep(0.2)
    open("thread.txt", "w").write("joined")

threading.Thread(target=late).start()  # not a daemon: joined before the end
print("no newline at the end", end="")
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("code", [0, 300])
def test_a_forked_run_ends_as_a_cold_one_does(in_tmp, code, no_leaked_processes):
    """A forked run's end skips the teardown of what it inherited (seconds of torch's objects), not
    what a cold end does for the run: its threads joined, its exit handlers, its unclosed files
    flushed, what its globals held released, its garbage collected, its output flushed, its status."""
    _script(in_tmp, "ends.py", ENDS)
    seen = {}
    for prewarm in (False, True):
        root = in_tmp / f"r-{prewarm}"
        config = make_config(root, [{"i": [0]}], prewarm=prewarm)
        config["command"] = [sys.executable, str(in_tmp / "ends.py"), str(code), "{work_dir}"]
        GPUTaskScheduler(config).start()
        run = root / "i-0,"
        row = ledger_rows(root)["i-0,"]
        files = {name: (run / name).read_text() for name in os.listdir(run) if name.endswith(".txt")}
        seen[prewarm] = (row["status"], row["exit_code"], files, (run / "worker.log").read_text())
    assert seen[True] == seen[False]
    status, exit_code, files, log = seen[True]
    assert (status, exit_code) == (("succeeded", 0) if code == 0 else ("failed", 300 & 0xFF)), seen
    assert files == {"unclosed.txt": "all of it", "held.txt": "released", "cycle.txt": "collected"} | {
        "atexit.txt": "ran",
        "thread.txt": "joined",
    }
    assert log.startswith("no newline at the end"), log


class _ForkingTask(GPUTask):
    """main() forks a helper that returns from main() too (through the runner), then fails."""

    def main(self):
        if os.fork() == 0:
            return {"from": "the helper"}
        os.wait()
        raise SystemExit(3)


@pytest.mark.parametrize("prewarm", [True, False], ids=["warm", "cold"])
def test_a_helper_main_forks_never_records_the_tasks_success(in_tmp, prewarm, no_leaked_processes):
    config = make_config(in_tmp / "r", [{"i": [0]}], prewarm=prewarm)
    assert not GPUTaskScheduler(config, _ForkingTask).start().ok
    row = ledger_rows(in_tmp / "r")["i-0,"]
    assert row["status"] == "failed" and row["exit_code"] == 3 and row["result"] is None, row


def test_an_outcome_of_success_with_a_failing_exit_is_no_success():
    """The engine's side of S1: whoever wrote it, a success the process did not exit with is none."""
    from gpu_task_scheduler.engine.decide import ExitFacts, classify
    from gpu_task_scheduler.records.protocol import Outcome
    from gpu_task_scheduler.records.status import RunStatus

    def facts(returncode, stopped=None, **fields):
        outcome = Outcome(status="succeeded", token="t", **fields)
        return ExitFacts(returncode, True, outcome, stopped, None, True, "")

    ended = classify(facts(3))
    assert ended.status is RunStatus.FAILED and ended.exit_code == 3 and "exited with code 3" in ended.cause
    assert classify(facts(0)).status is RunStatus.SUCCEEDED
    assert classify(facts(-9)).status is RunStatus.SUCCEEDED  # killed after its success was recorded
    stop = (RunStatus.INTERRUPTED, "the sweep was stopped")
    assert classify(facts(0, stop)).status is RunStatus.SUCCEEDED  # it ended before it heard the stop
    assert classify(facts(0, stop, unheard="it closed its lifeline")).status is RunStatus.INTERRUPTED
    assert classify(facts(0, None, unheard="it closed its lifeline")).status is RunStatus.SUCCEEDED


class _EnvTask(GPUTask):
    """Its required_env sets what Python reads as it starts: PYTHONPATH (a folder with a module of
    its own) and PYTHONHASHSEED."""

    def required_env(self):
        return {"PYTHONPATH": self._config["lib"], "PYTHONHASHSEED": "77"}

    def main(self):
        import only_on_the_path

        forked = b"GTS_RUN_TOKEN=" not in open("/proc/self/environ", "rb").read()
        return {"value": only_on_the_path.VALUE, "hash": hash("seed"), "forked": forked}


def test_variables_python_reads_at_its_start_are_the_runs_warm_or_cold(in_tmp, no_leaked_processes):
    """M1: a task's PYTHONPATH and PYTHONHASHSEED reach a forked run (its warm process is started
    with them), as they reach a cold one; a run whose values differ from the warm process's starts
    cold, and the log says why."""
    lib = in_tmp / "lib"
    lib.mkdir()
    (lib / "only_on_the_path.py").write_text("VALUE = 42\n")
    import subprocess

    expected = subprocess.run(
        [sys.executable, "-c", "print(hash('seed'))"], env={**os.environ, "PYTHONHASHSEED": "77"}, capture_output=True
    )
    found = {}
    for prewarm in (False, True):
        root = in_tmp / f"r-{prewarm}"
        config = make_config(root, [{"i": [0, 1], "lib": [str(lib)]}], prewarm=prewarm)
        assert GPUTaskScheduler(config, _EnvTask).start().ok
        found[prewarm] = {name: json.loads(row["result"]) for name, row in ledger_rows(root).items()}
    for prewarm, results in found.items():
        for result in results.values():
            assert result["value"] == 42 and result["hash"] == int(expected.stdout), (prewarm, result)
    assert any(result["forked"] for result in found[True].values())


class _Seeds(GPUTask):
    def required_env(self):
        return {"PYTHONHASHSEED": str(self._config["seed"])}

    def main(self):
        return {"hash": hash("seed"), "forked": b"GTS_RUN_TOKEN=" not in open("/proc/self/environ", "rb").read()}


def test_a_run_whose_start_variables_differ_from_the_warm_process_starts_cold(in_tmp, no_leaked_processes):
    from gpu_task_scheduler.backends.local.zygote import READ_AT_START, shared_env

    assert "MKL_NUM_THREADS" in shared_env({**os.environ, "MKL_NUM_THREADS": "3"})
    assert "GTS_RUN_NAME" not in shared_env({**os.environ, "GTS_RUN_NAME": "x"})
    assert all(name.startswith(READ_AT_START) for name in ("PYTHONWARNINGS", "PYTHONMALLOC", "OMP_NUM_THREADS"))

    config = make_config(in_tmp / "r", [{"seed": [1, 2]}])
    assert GPUTaskScheduler(config, _Seeds).start().ok
    results = {name: json.loads(row["result"]) for name, row in ledger_rows(in_tmp / "r").items()}
    assert results["seed-1,"]["hash"] != results["seed-2,"]["hash"]
    assert not results["seed-2,"]["forked"]
    log = (in_tmp / "r" / "scheduler.log").read_text()
    assert "differs from the warm process's in PYTHONHASHSEED (read as Python or a library starts" in log


@pytest.mark.parametrize(
    "content", [b"[" * 200_000, b"\xff\xfe", b'{"a": 1}', b'[1, null, "os"]'], ids=["deep", "binary", "object", "list"]
)
def test_a_damaged_imports_file_is_ignored_said_and_removed(in_tmp, content, caplog, no_leaked_processes):
    """M2: a run writes its .gts/imports.json itself; a damaged one crashed every start."""
    _script(in_tmp, "ok.py", "print('ran')\n")
    config = make_config(in_tmp / "r", [{"i": [0]}])
    config["command"] = [sys.executable, "ok.py"]
    assert GPUTaskScheduler(config).start().ok
    imports = in_tmp / "r" / "i-0," / ".gts" / "imports.json"
    imports.write_bytes(content)
    config["scheduler_config"]["force_rerun"] = True
    assert GPUTaskScheduler(config).start().ok
    assert ledger_rows(in_tmp / "r")["i-0,"]["status"] == "succeeded"
    if content.startswith(b"[1"):  # a list: its names are read, what is no module name is not
        return
    assert "imports.json is damaged and ignored" in (in_tmp / "r" / "scheduler.log").read_text()


def test_a_module_outside_the_working_folder_is_not_learned_so_an_edit_counts(in_tmp, monkeypatch):
    """M3: a library checkout on PYTHONPATH (or an editable install) is the user's code: learned as
    an installed library, it was frozen at its first import for the whole sweep."""
    checkout = in_tmp / "checkout"
    checkout.mkdir()
    (checkout / "mylib.py").write_text("VALUE = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(checkout))
    work = in_tmp / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    _script(
        work,
        "uses.py",
        "import fractions, sys, mylib\nfrom gpu_task_scheduler import report\n"
        "print('VALUE', mylib.VALUE, flush=True)\nreport(1, loss=1.0)\n"
        "open(sys.argv[1] + '.done', 'w').close()\n",
    )
    config = make_config(work / "r", [{"i": [0, 1, 2]}])
    config["command"] = [sys.executable, "uses.py", "{i}"]
    assert GPUTaskScheduler(config).start().ok
    learned = json.loads((work / "r" / "i-0," / ".gts" / "imports.json").read_text())
    assert "mylib" not in learned and "fractions" in learned
    (checkout / "mylib.py").write_text("VALUE = 2  # edited\n")
    config["scheduler_config"]["force_rerun"] = True  # the runs recall what they imported
    assert GPUTaskScheduler(config).start().ok
    for i in range(3):
        assert "VALUE 2" in (work / "r" / f"i-{i}," / "worker.log").read_text()


EFFECTS = """
import decimal, logging
logging.basicConfig(level=logging.DEBUG)
decimal.getcontext().prec = 5
"""

SEES = r"""
import decimal, json, logging, sys
from gpu_task_scheduler import report
if sys.argv[1] == "0":
    import gts_effects
    import this
seen = {"handlers": len(logging.getLogger().handlers), "prec": decimal.getcontext().prec,
        "forked": b"GTS_RUN_TOKEN=" not in open("/proc/self/environ", "rb").read()}
print("PROBE " + json.dumps(seen), flush=True)
report(1, loss=1.0)
"""


def test_one_runs_import_side_effects_never_reach_runs_that_do_not_import_it(in_tmp, monkeypatch):
    """M4: an installed module that configures logging and decimal at import, and `this`, which
    prints: learned from the first run, they reached every later run (their own basicConfig wrote
    nothing; precision 5). A warm process whose import changed them is replaced by one without
    them; the run that imports them still gets their effects, as a cold one."""
    site = in_tmp / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "gts_effects.py").write_text(EFFECTS)
    monkeypatch.setenv("PYTHONPATH", str(site))
    _script(in_tmp, "sees.py", SEES)
    config = make_config(in_tmp / "r", [{"i": [0, 1, 2, 3, 4, 5]}])
    config["command"] = [sys.executable, "sees.py", "{i}"]
    # Started twice: the second start's first warm process has what the first start's runs imported
    # (recalled), so it is refused for what they change whatever the timing (the first start's runs
    # may all end before a warm process with them is ready).
    for _ in range(2):
        assert GPUTaskScheduler(config).start().ok
        config["scheduler_config"]["force_rerun"] = True
        seen = _seen(in_tmp / "r")
        assert seen["i-0,"] == {**seen["i-0,"], "handlers": 1, "prec": 5}
        for name in list(seen)[1:]:
            assert seen[name]["handlers"] == 0 and seen[name]["prec"] == 28, (name, seen[name])
            assert "Zen of Python" not in (in_tmp / "r" / name / "worker.log").read_text(), name
        assert "Zen of Python" in (in_tmp / "r" / "i-0," / "worker.log").read_text()
    log = (in_tmp / "r" / "scheduler.log").read_text()
    assert "warm starts: importing gts_effects changes the root logger's handlers" in log, log
    assert any(run["forked"] for run in seen.values())


def test_the_isolation_contract_spots_what_an_import_changes():
    """The table isolation.configuration() checks: each entry changed alone is named."""
    import decimal
    import logging
    import signal

    from gpu_task_scheduler.backends.local import isolation

    changes = {
        "the root logger's handlers": lambda: logging.getLogger().addHandler(logging.NullHandler()),
        "decimal's context": lambda: setattr(decimal.getcontext(), "prec", 7),
        "the recursion limit": lambda: sys.setrecursionlimit(sys.getrecursionlimit() + 1),
        "signal handlers": lambda: signal.signal(signal.SIGUSR2, lambda *_: None),
        "sys.excepthook": lambda: setattr(sys, "excepthook", lambda *_: None),
    }
    for name, change in changes.items():
        saved = (
            list(logging.getLogger().handlers),
            decimal.getcontext().copy(),
            sys.getrecursionlimit(),
            signal.getsignal(signal.SIGUSR2),
            sys.excepthook,
        )
        before = isolation.configuration()
        change()
        try:
            assert isolation.changed(before, isolation.configuration()) == [name]
        finally:
            logging.getLogger().handlers[:] = saved[0]
            decimal.setcontext(saved[1])
            sys.setrecursionlimit(saved[2])
            signal.signal(signal.SIGUSR2, saved[3])
            sys.excepthook = saved[4]
    assert isolation.changed(isolation.configuration(), isolation.configuration()) == []


CLOSES = r"""
import os, signal, sys, time
os.closerange(3, 1024)
open("/dev/null").close()
held = open(os.devnull)  # takes a number the lifeline had
def save(*_):
    open("saved", "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print("waiting", flush=True)
if sys.argv[1] == "stop":
    time.sleep(60)
"""


@pytest.mark.parametrize("prewarm", [True, False], ids=["warm", "cold"])
def test_a_run_that_closes_its_inherited_descriptors_ends_on_its_own_or_saves_when_stopped(
    in_tmp, prewarm, no_leaked_processes
):
    """M6: a warm run read its closed lifeline as the scheduler's death and was killed at once (or
    at its first stop, before its SIGTERM handler could save). Now: ended on its own, succeeded;
    stopped (its timeout), it saves and exits 0, and is recorded stopped, not succeeded."""
    _script(in_tmp, "closes.py", CLOSES)
    config = make_config(in_tmp / "r", [{"how": ["end", "stop"]}], slots=("cpu", "cpu"), prewarm=prewarm, timeout=3)
    config["command"] = [sys.executable, "closes.py", "{how}"]
    GPUTaskScheduler(config).start()
    rows = ledger_rows(in_tmp / "r")
    assert rows["how-end,"]["status"] == "succeeded", rows["how-end,"]
    assert rows["how-stop,"]["status"] == "timed_out", rows["how-stop,"]
    assert (in_tmp / "saved").exists()  # its working folder: the sweep's
    assert "waiting" in (in_tmp / "r" / "how-stop," / "worker.log").read_text()


def _warm_process_of(mark):
    """The pid of the warm process of this test's sweep (its environment carries GTS_WARM and the
    test's mark), or None."""
    from conftest import marked_pids

    for pid in marked_pids(mark):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if b"GTS_WARM=1" in handle.read().split(b"\0"):
                    return pid
        except OSError:
            continue
    return None


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0].decode()
    except OSError:
        return None


def test_a_warm_process_killed_with_sigkill_is_reaped_at_once_not_left_a_zombie(in_tmp, no_leaked_processes):
    """It stayed a zombie until the next start dropped it; a sweep that started nothing more kept
    it so to its end. The run it forked goes on and succeeds."""
    import signal
    import threading

    from conftest import wait_until

    _script(in_tmp, "waits.py", "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.02)\n")
    config = make_config(in_tmp / "r", [{"i": [0]}], prewarm={"imports": ["decimal"]})
    config["command"] = [sys.executable, "waits.py"]
    summary = {}
    sweep = threading.Thread(target=lambda: summary.setdefault("ok", GPUTaskScheduler(config).start().ok))
    sweep.start()
    try:
        pid = wait_until(lambda: _warm_process_of(no_leaked_processes), message="the warm process")
        wait_until(lambda: (in_tmp / "r" / "i-0," / "worker.log").exists(), message="the run to start")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: _state(pid) is None, message="the killed warm process to be reaped (no zombie)")
    finally:
        (in_tmp / "go").touch()
        sweep.join(60)
    assert summary["ok"] and ledger_rows(in_tmp / "r")["i-0,"]["status"] == "succeeded"


@pytest.mark.parametrize("prewarm", [True, False], ids=["warm", "cold"])
def test_a_run_that_closed_its_descriptors_still_ends_with_its_killed_scheduler(in_tmp, prewarm, no_leaked_processes):
    """Its lifeline closed, a forked run watches its scheduler (its parent) instead: the scheduler
    killed with SIGKILL, the run goes with it, as a cold one goes with its wrapper's keeper."""
    import subprocess

    from conftest import wait_until

    _script(
        in_tmp,
        "closes.py",
        "import os, time\nos.closerange(3, 1024)\nopen('pid', 'w').write(str(os.getpid()))\n"
        "while not os.path.exists('go'):\n    time.sleep(0.05)\n",
    )
    config = make_config(in_tmp / "r", [{"i": [0]}], prewarm=prewarm)
    config["command"] = [sys.executable, "closes.py"]
    (in_tmp / "sweep.json").write_text(json.dumps(config))
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler", "run", "sweep.json", "--plain"],
        cwd=in_tmp,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: (in_tmp / "pid").exists() and (in_tmp / "pid").read_text(), message="the run to start")
        run = int((in_tmp / "pid").read_text())
    finally:
        scheduler.kill()
        scheduler.wait()
    try:
        wait_until(lambda: _state(run) in (None, "Z"), timeout=20, message="the run to end with its scheduler")
    finally:
        (in_tmp / "go").touch()


@pytest.mark.parametrize("how", ["learned", "read"])
def test_a_warm_process_that_dies_of_its_imports_is_not_started_again_at_every_start(in_tmp, monkeypatch, how):
    """A module that takes the warm process down as it is imported (here: only there), learned from
    the runs (imported in a function) or read from the script: the warm process with it dies, and
    is not started again for each later run (each would die too); the runs import it themselves."""
    site = in_tmp / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "kills_warm.py").write_text("import os\nif os.environ.get('GTS_WARM'):\n    os._exit(3)\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    load = "def load():\n    import kills_warm\nload()\n" if how == "learned" else "import kills_warm\n"
    _script(
        in_tmp, "imports.py", "import sys\nfrom gpu_task_scheduler import report\n" + load + "report(1, loss=1.0)\n"
    )
    config = make_config(in_tmp / "r", [{"i": list(range(6))}], prewarm={"imports": ["decimal"]})
    config["command"] = [sys.executable, "imports.py", "{i}"]
    assert GPUTaskScheduler(config).start().ok
    log = (in_tmp / "r" / "scheduler.log").read_text()
    if how == "learned":  # started once (whether a later start sees it dead depends on the runs' pace)
        assert log.count("warm starts: a warm process with the") == 1, log
    else:  # the first one dies: from then on prewarm's imports only, and the runs are forked from it
        assert "a warm process died as it imported the" in log, log
        assert log.count("warm starts: a warm process imported") == 1, log
        assert "a run starts cold: the warm process died as it imported" in log, log
