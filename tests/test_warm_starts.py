"""Warm starts (backends/local/zygote.py, forkserver.py): a sweep's Python commands are forked from
a warm process that imported what they import, and each forked run is what a cold start would
have been: its argv, environment, folder, streams, generators and outcome; refusals start cold."""

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import marked_pids, wait_until
from helpers import ledger_rows, make_config
from test_process_control import finish

from gpu_task_scheduler import GPUTask, GPUTaskScheduler
from gpu_task_scheduler.backends.local import forkserver
from gpu_task_scheduler.backends.local.zygote import script_argv
from gpu_task_scheduler.records.protocol import Outcome

PROBE = r"""
import json, os, random, sys
started_with = sorted(name for name in ("fractions", "decimal") if name in sys.modules)  # before any import here
def learned():  # imported in a function: what only the runs' ends teach (no read of the source finds it)
    import fractions
learned()
from gpu_task_scheduler import report
with open("/proc/self/environ", "rb") as handle:
    first_environment = handle.read().split(b"\0")
seen = {
    "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "name": __name__, "file": __file__,
    "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "seen": os.environ.get("GTS_TEST_SEEN"),
    "metrics": bool(os.environ.get("GTS_METRICS_FILE")), "stdin": sys.stdin.read(), "random": random.random(),
    "preloaded": started_with, "forked": not any(line.startswith(b"GTS_RUN_TOKEN=") for line in first_environment),
    "imported_here": "helper_of_probe" in sys.modules,
}
import helper_of_probe
seen["helper"] = helper_of_probe.VALUE
print("PROBE " + json.dumps(seen), flush=True)
report(1, loss=float(sys.argv[2]))
"""


def _probe(folder, *, prewarm=None, runs=4, slots=("cpu", "cpu"), command=None):
    (folder / "probe.py").write_text(PROBE)
    (folder / "helper_of_probe.py").write_text("VALUE = 1\n")
    options = {} if prewarm is None else {"prewarm": prewarm}
    config = make_config(folder / "r", [{"i": list(range(runs))}], slots=slots, **options)
    config["command"] = command or [sys.executable, "probe.py", "--i", "{i}"]
    return config


def _seen(root):
    found = {}
    for name in os.listdir(root):
        if name.endswith(","):
            for line in (root / name / "worker.log").read_text().splitlines():
                if line.startswith("PROBE "):
                    found[name] = json.loads(line[6:])
    return found


def test_a_forked_run_sees_what_a_cold_start_sees(in_tmp, monkeypatch, no_leaked_processes):
    monkeypatch.setenv("GTS_TEST_SEEN", "ambient")
    runs = {}
    for prewarm in (False, {"imports": ["decimal"]}):
        folder = in_tmp / ("warm" if prewarm else "cold")
        folder.mkdir()
        monkeypatch.chdir(folder)
        assert GPUTaskScheduler(_probe(folder, prewarm=prewarm)).start().ok
        runs[bool(prewarm)] = _seen(folder / "r")
    cold, warm = runs[False], runs[True]
    assert sorted(cold) == sorted(warm) == [f"i-{i}," for i in range(4)]
    assert all(seen["forked"] for seen in warm.values()) and not any(seen["forked"] for seen in cold.values())
    # Imported by the warm process; a later run may have `fractions` too: the first runs' imports are
    # learned, and under load the warm process that has them can be ready before the last run starts.
    assert all(seen["preloaded"] in (["decimal"], ["decimal", "fractions"]) for seen in warm.values()), warm
    assert warm["i-0,"]["preloaded"] == ["decimal"]
    assert all(seen["preloaded"] == [] for seen in cold.values())
    for name in cold:  # the same, but where each was made (its folder) and its random draw
        same = {key for key in cold[name] if key not in ("cwd", "path0", "file", "random", "forked", "preloaded")}
        assert {key: cold[name][key] for key in same} == {key: warm[name][key] for key in same}, name
        assert warm[name]["argv"] == ["probe.py", "--i", name[2:-1]] and warm[name]["name"] == "__main__"
        assert warm[name]["cwd"] == str(in_tmp / "warm") and warm[name]["path0"] == str(in_tmp / "warm")
        assert warm[name]["stdin"] == "" and warm[name]["cvd"] == "" and warm[name]["seen"] == "ambient"
    assert len({seen["random"] for seen in warm.values()}) == 4  # each run its own draw, as cold ones
    for name in warm:
        outcome = json.loads((in_tmp / "warm" / "r" / name / ".gts" / "outcome.json").read_text())
        assert outcome["status"] == "succeeded"
    log = (in_tmp / "warm" / "r" / "scheduler.log").read_text()
    assert "warm starts: a warm process imported " in log


def test_what_the_runs_import_is_learned_and_later_runs_start_with_it(in_tmp, monkeypatch):
    """One slot: the first runs import fractions themselves; they say so at their first report, a
    warm process with it is started, and the runs forked from it find it imported."""
    config = _probe(in_tmp, runs=8, slots=("cpu",))
    assert GPUTaskScheduler(config).start().ok
    seen = _seen(in_tmp / "r")
    order = sorted(seen, key=lambda name: int(name[2:-1]))
    had = ["fractions" in seen[name]["preloaded"] for name in order]
    assert not had[0] and had[-1], had
    assert had == sorted(had), had  # once learned, every later run has it
    log = (in_tmp / "r" / "scheduler.log").read_text()
    assert "warm starts: a warm process with the" in log


STATIC = r"""
import os, sys
before = sorted(name for name in NAMES if name in sys.modules)
import fractions
try:
    import graphlib
except ImportError:
    pass
from helper_of_static import VALUE
if os.environ.get("NEVER_SET"):
    import wave
def later():
    import colorsys
if __name__ == "__main__":
    import difflib
    later()
    print("STATIC " + json.dumps(before), flush=True)
"""


def test_the_first_run_is_forked_from_a_warm_process_with_its_scripts_imports(in_tmp, no_leaked_processes):
    """The warm process imports what the script imports whenever it runs, read from its source, before
    any run has ended: the first run finds it imported. Not what it imports under another condition
    or in a function (learned from the runs, as before), nor the user's own module (whose imports are
    read in turn)."""
    names = ["fractions", "graphlib", "csv", "wave", "colorsys", "difflib", "helper_of_static"]
    (in_tmp / "static.py").write_text(f"import json\nNAMES = {names!r}\n" + STATIC)
    (in_tmp / "helper_of_static.py").write_text("import csv\nVALUE = 1\n")
    config = make_config(in_tmp / "r", [{"i": [0, 1]}], slots=("cpu",))
    config["command"] = [sys.executable, "static.py", "--i", "{i}"]
    assert GPUTaskScheduler(config).start().ok
    lines = (in_tmp / "r" / "i-0," / "worker.log").read_text().splitlines()
    first = [line for line in lines if line.startswith("STATIC ")]
    assert json.loads(first[0][7:]) == ["csv", "difflib", "fractions", "graphlib"], first
    log = (in_tmp / "r" / "scheduler.log").read_text()
    (said,) = [line for line in log.splitlines() if "warm starts: static.py imports " in line]
    assert all(name in said for name in ("fractions", "graphlib", "csv", "difflib")), said
    assert not any(name in said for name in ("wave", "colorsys", "helper_of_static")), said
    assert "starts cold" not in log


def test_a_dry_run_says_how_each_runs_command_starts_with_the_imports_read_from_its_script(in_tmp, capsys):
    """The command as each run runs it (a script given as a placeholder): forked warm, from a warm
    process that imports what the script imports (read from its source), or cold, and why. It said
    "the runs start cold" for a placeholder, then forked every run warm."""
    import yaml

    from gpu_task_scheduler.cli.main import main as gts

    (in_tmp / "static.py").write_text("import fractions\n")
    config = make_config(in_tmp / "r", [{"script": ["static.py", "missing.py"]}])
    config["command"] = [sys.executable, "{script}"]
    (in_tmp / "sweep.yaml").write_text(yaml.safe_dump(config))
    assert gts(["run", str(in_tmp / "sweep.yaml"), "--dry-run"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warm starts:")]
    assert said[0] == "warm starts: 1 of the 2 run(s) looked at start cold: its script 'missing.py' is not a file"
    assert said[1].startswith("warm starts: the other runs are forked from a warm process that imports fractions")
    assert len(said) == 2 and not (in_tmp / "r").exists()


def test_a_sweep_started_again_recalls_what_its_runs_imported(in_tmp):
    """What a run imported stays in its folder (.gts/imports.json): started again (here: forced), the
    sweep's first warm process imports it ahead, so its very first run finds it imported."""
    config = _probe(in_tmp, runs=2, slots=("cpu",))
    assert GPUTaskScheduler(config).start().ok
    assert "fractions" not in _seen(in_tmp / "r")["i-0,"]["preloaded"]  # learned only from this run
    config["scheduler_config"]["force_rerun"] = True
    assert GPUTaskScheduler(config).start().ok
    seen = _seen(in_tmp / "r")
    assert all("fractions" in seen[name]["preloaded"] and seen[name]["forked"] for name in seen), seen
    log = (in_tmp / "r" / "scheduler.log").read_text()
    assert "module(s) the runs imported before are imported ahead" in log
    # The fork wrote what it imported this time (the file read at its start was removed first).
    assert "fractions" in json.loads((in_tmp / "r" / "i-0," / ".gts" / "imports.json").read_text())


def test_a_sweep_in_another_root_forks_its_first_run_with_what_earlier_sweeps_of_the_script_imported(in_tmp):
    """A warm process that imported what the runs import (here: fractions, in a function, which no
    read of the source finds) and got ready is kept on this machine for the script as it is: a sweep
    of it in another root has it imported from its first run. Edited, the script starts afresh."""

    def sweep(root, runs=8):
        config = _probe(in_tmp, runs=runs, slots=("cpu",))
        config["scheduler_config"]["result_root_folder"] = str(in_tmp / root)
        config["scheduler_config"]["scheduler_log_file_path"] = str(in_tmp / f"{root}.log")
        os.utime(in_tmp / "probe.py", ns=(1, 10**18))  # _probe wrote it again: as it was (the same mtime)
        assert GPUTaskScheduler(config).start().ok
        seen = _seen(in_tmp / root)
        assert all(run["forked"] for run in seen.values()), seen
        had = [("fractions" in seen[f"i-{i},"]["preloaded"]) for i in range(runs)]
        return had, (in_tmp / f"{root}.log").read_text()

    first, _ = sweep("r")
    assert first[0] is False and first[-1] is True, first  # learned from this sweep's first run
    again, log = sweep("r2", runs=2)
    assert again == [True, True], again
    assert "warm processes of earlier sweeps of probe.py imported are imported too" in log
    config = _probe(in_tmp, runs=1, slots=("cpu",))  # written again, with a new mtime: as if edited
    config["scheduler_config"]["result_root_folder"] = str(in_tmp / "r3")
    assert GPUTaskScheduler(config).start().ok
    assert "fractions" not in _seen(in_tmp / "r3")["i-0,"]["preloaded"]


def test_what_is_kept_for_later_sweeps_is_imported_only_where_it_is_an_installed_module(tmp_path):
    """The kept list is read as untrusted: a name that is the user's own module on the run's path (or
    no module at all) is never imported ahead; a damaged file gives nothing."""
    from gpu_task_scheduler.backends.local import importcache

    (tmp_path / "mine.py").write_text("X = 1\n")
    importcache.remember(["script:1"], ["fractions", "mine", "no_such_module_here", "json.decoder"], {"tkinter"})
    names, unwanted = importcache.recall("script:1")
    assert names == ["fractions", "mine", "no_such_module_here", "json.decoder"] and unwanted == ["tkinter"]
    search = [str(tmp_path), *(folder for folder in sys.path[1:] if folder)]
    assert importcache.installed(names, search) == ["fractions", "json.decoder"]
    assert importcache.recall("script:2") == ([], [])
    with open(importcache._file("script:1"), "w") as handle:
        handle.write("[" * 200_000)
    assert importcache.recall("script:1") == ([], [])


def test_the_gpus_a_machines_environment_holds_for_its_run_are_no_part_of_the_warm_processs(monkeypatch):
    """CUDA_VISIBLE_DEVICES is set for each run (its GPUs), never part of a warm process's identity,
    whatever the supervisor's own environment holds. A Ray worker's environment holds the GPUs of
    the task it runs now: its second run, on other GPUs, started cold ("its environment differs ...
    in CUDA_VISIBLE_DEVICES"; 1 in 8 of test_ray_backend's warm test under load, where a worker
    was given a second run)."""
    from gpu_task_scheduler.backends.local.zygote import shared_env

    seen = []
    for gpus in ("0", "2"):  # the worker's environment as Ray sets it for each task, and the run's
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus)
        seen.append(shared_env({**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "GTS_RUN_NAME": f"run-{gpus}"}))
    assert seen[0] == seen[1] and "CUDA_VISIBLE_DEVICES" not in seen[0]
    assert "GTS_RUN_NAME" not in seen[0] and seen[0].get("PATH") == os.environ.get("PATH")


def test_a_request_longer_than_the_socket_hands_over_at_once_is_forked(in_tmp):
    """The warm process read each request with one receive. A request longer than what the socket
    hands over at once was cut, and the warm process died on it: a learned imports list of 3,475
    modules, sent along with every request, made every fork of a Lightning sweep fail, and each run
    then imported for itself (seen in bench/warm_start_bench.py). Here a run of 5,000 arguments:
    forked whole, as a cold start would run it."""
    extra = [f"argument-{index:05d}-" + "x" * 48 for index in range(5000)]  # about 320 KB of request
    config = _probe(in_tmp, runs=2, slots=("cpu",), prewarm={"imports": ["decimal"]})
    config["command"] = [sys.executable, "probe.py", "--i", "{i}", *extra]
    assert GPUTaskScheduler(config).start().ok
    seen = _seen(in_tmp / "r")
    assert sorted(seen) == ["i-0,", "i-1,"]
    assert all(run["forked"] and run["argv"][3:] == extra for run in seen.values())
    assert "starts cold" not in (in_tmp / "r" / "scheduler.log").read_text()


def test_a_module_of_the_users_folder_is_never_preloaded_so_an_edit_counts(in_tmp):
    config = _probe(in_tmp, runs=2, slots=("cpu",), prewarm={"imports": ["helper_of_probe"]})
    config["test_config"] = [{"i": [0]}]
    assert GPUTaskScheduler(config).start().ok
    # Edited between two runs of the sweep. (Of another size: an edit in the same second to a file of
    # the same size is one Python's bytecode cache cannot tell from the file it compiled.)
    (in_tmp / "helper_of_probe.py").write_text("VALUE = 2  # edited\n")
    config["test_config"] = [{"i": [0, 1]}]
    assert GPUTaskScheduler(config).start().ok
    seen = _seen(in_tmp / "r")
    assert seen["i-0,"]["helper"] == 1 and seen["i-1,"]["helper"] == 2
    assert seen["i-1,"]["forked"] and not seen["i-1,"]["imported_here"]
    imports = json.loads((in_tmp / "r" / "i-1," / ".gts" / "imports.json").read_text())
    assert "helper_of_probe" not in imports and "fractions" in imports


def test_a_warm_process_that_started_a_thread_is_not_forked_from(in_tmp, monkeypatch):
    (in_tmp / "lib").mkdir()
    (in_tmp / "lib" / "threaded_at_import.py").write_text(
        "import threading, time\n"
        "def _tick():\n    while True:\n        time.sleep(60)\n"
        "threading.Thread(target=_tick, name='ticker', daemon=True).start()\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(in_tmp / "lib"))
    config = _probe(in_tmp, runs=2, prewarm={"imports": ["threaded_at_import"]})
    assert GPUTaskScheduler(config).start().ok
    seen = _seen(in_tmp / "r")
    assert not any(run["forked"] for run in seen.values())
    log = (in_tmp / "r" / "scheduler.log").read_text()
    assert "an import started a Python thread: 'ticker' (from threaded_at_import)" in log


@pytest.mark.parametrize("library", ["libcuda.so.550.54", "libnvidia-ml.so.1"])
def test_a_warm_process_that_loaded_a_gpu_driver_is_not_forked_from(tmp_path, monkeypatch, library):
    """CUDA's driver, and NVML's alone (a library that asks NVML for the GPUs at import)."""
    maps = tmp_path / "maps"
    maps.write_text(f"7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/{library}\n")
    refused = forkserver.gpu_driver_loaded(str(maps))
    assert refused is not None and library.split(".so")[0] + ".so" in refused
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libopenblas.so\n")
    assert forkserver.gpu_driver_loaded(str(maps)) is None


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["python3.9", "probe.py"], "is not found on its PATH"),
        (["/bin/sh", "probe.py"], "is not the Python that runs gts"),
        ([sys.executable, "-u", "probe.py"], "gives the interpreter an option (-u)"),
        ([sys.executable, "missing.py"], "is not a file"),
        ([sys.executable], "not a Python script"),
    ],
)
def test_commands_that_start_cold_say_why(in_tmp, argv, why):
    (in_tmp / "probe.py").write_text("")
    found, said = script_argv(argv, {"PATH": os.path.dirname(sys.executable)}, str(in_tmp))
    assert found is None and why in said


def test_a_python_of_another_folder_starts_cold(in_tmp):
    """Another virtual environment's `python` is a link to the same interpreter, with other
    packages: it is not the Python that runs gts."""
    (in_tmp / "probe.py").write_text("")
    other = in_tmp / "other-venv" / "bin"
    other.mkdir(parents=True)
    (other / "python").symlink_to(sys.executable)
    found, said = script_argv([str(other / "python"), "probe.py"], {"PATH": str(other)}, str(in_tmp))
    assert found is None and "is not the Python that runs gts" in said
    found, said = script_argv(["python", "probe.py"], {"PATH": str(other)}, str(in_tmp))
    assert found is None and str(other) in said


def test_a_sweep_of_commands_that_are_not_python_never_goes_through_warm_starts(in_tmp, no_leaked_processes):
    config = make_config(in_tmp / "r", [{"i": [0, 1, 2]}])
    config["command"] = ["sh", "-c", "echo run {i}"]
    assert GPUTaskScheduler(config).start().ok
    assert "warm starts" not in (in_tmp / "r" / "scheduler.log").read_text()
    assert all((in_tmp / "r" / f"i-{i}," / "worker.log").read_text() == f"run {i}\n" for i in range(3))


def test_a_forked_runs_log_starts_with_what_its_warm_processs_imports_printed(in_tmp, monkeypatch):
    """A stated import (prewarm: {imports: [...]}) that prints: each forked run's log begins with it,
    as a cold run's would if it imported the module first."""
    lib = in_tmp / "lib"
    lib.mkdir()
    (lib / "says_hello.py").write_text("print('hello from the import', flush=True)\n")
    monkeypatch.setenv("PYTHONPATH", str(lib))
    config = _probe(in_tmp, runs=2, prewarm={"imports": ["says_hello"]})
    assert GPUTaskScheduler(config).start().ok
    for name, run in _seen(in_tmp / "r").items():
        assert run["forked"], name
        assert (in_tmp / "r" / name / "worker.log").read_text().startswith("hello from the import\n"), name


def test_a_run_whose_inherited_environment_changed_is_not_forked_and_the_log_says_why(in_tmp, monkeypatch):
    """The scheduler's own environment changed during the sweep (a callback set a variable): the
    runs after it would inherit it cold, so they are not forked from the warm process that lacks it."""
    monkeypatch.delenv("GTS_TEST_CHANGED", raising=False)

    def changed(outcome):
        os.environ["GTS_TEST_CHANGED"] = "1"

    try:
        config = _probe(in_tmp, runs=3, slots=("cpu",), prewarm={"imports": ["decimal"]})
        assert GPUTaskScheduler(config, on_run_end=changed).start().ok
    finally:
        os.environ.pop("GTS_TEST_CHANGED", None)
    seen = _seen(in_tmp / "r")
    assert seen["i-0,"]["forked"] and not seen["i-1,"]["forked"] and not seen["i-2,"]["forked"]
    log = (in_tmp / "r" / "scheduler.log").read_text()
    assert "warm starts: a run starts cold: its environment differs from the warm process's in GTS_TEST_CHANGED" in log


def test_a_python_script_or_module_of_this_interpreter_is_forked(in_tmp):
    (in_tmp / "probe.py").write_text("")
    env = {"PATH": os.path.dirname(sys.executable)}
    assert script_argv([sys.executable, "probe.py", "--x"], env, str(in_tmp)) == (["probe.py", "--x"], "")
    assert script_argv([sys.executable, "-m", "json.tool", "-h"], env, str(in_tmp)) == (["-m", "json.tool", "-h"], "")
    assert script_argv([sys.executable, "-c", "pass", "x"], env, str(in_tmp)) == (["-c", "pass", "x"], "")
    name = os.path.basename(sys.executable)
    assert script_argv([name, "probe.py"], env, str(in_tmp))[0] == ["probe.py"]


def test_a_warm_run_stopped_by_the_scheduler_records_no_success_even_if_it_exits_0(in_tmp, no_leaked_processes):
    """As the command wrapper does: a run asked to stop (here by its timeout) that traps the signal
    and exits 0 has not succeeded; its outcome file stays empty."""
    (in_tmp / "trap.py").write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "print('waiting', flush=True)\n"
        "time.sleep(60)\n"
    )
    config = make_config(in_tmp / "r", [{"i": [0]}], timeout=2, grace_period=10)
    config["command"] = [sys.executable, "trap.py"]
    summary = GPUTaskScheduler(config).start()
    assert not summary.ok
    rows = ledger_rows(in_tmp / "r")
    assert rows["i-0,"]["status"] == "timed_out"
    assert not (in_tmp / "r" / "i-0," / ".gts" / "outcome.json").exists()
    assert "waiting" in (in_tmp / "r" / "i-0," / "worker.log").read_text()


def test_prewarm_false_starts_every_run_cold(in_tmp, no_leaked_processes):
    assert GPUTaskScheduler(_probe(in_tmp, prewarm=False, runs=2)).start().ok
    assert not any(run["forked"] for run in _seen(in_tmp / "r").values())
    assert not marked_pids(no_leaked_processes)


SEEN_CODE = (
    "import json, sys\n"
    "main = sys.modules['__main__']\n"
    "print('PROBE ' + json.dumps({'argv': sys.argv, 'path0': sys.path[0], 'name': __name__, "
    "'file': getattr(main, '__file__', None), 'spec': str(getattr(main, '__spec__', None)).split(' at ')[0], "
    "'keys': sorted(name for name in vars(main) if name.startswith('__'))}), flush=True)\n"
)


@pytest.mark.parametrize("form", ["-c", "-m"])
def test_python_c_and_m_forked_see_what_cold_ones_see(in_tmp, monkeypatch, form):
    (in_tmp / "seen_module.py").write_text(SEEN_CODE)
    found = {}
    for prewarm in (False, True):
        code = SEEN_CODE.replace("{", "{{").replace("}", "}}")  # the template's literal braces
        command = [sys.executable, form, code if form == "-c" else "seen_module", "x", "{i}"]
        config = make_config(in_tmp / f"r-{prewarm}", [{"i": [0, 1]}], prewarm=prewarm)
        config["command"] = command
        assert GPUTaskScheduler(config).start().ok
        found[prewarm] = _seen(in_tmp / f"r-{prewarm}")
    assert found[False] == found[True] and len(found[True]) == 2
    assert found[True]["i-1,"]["argv"][1:] == ["x", "1"] and found[True]["i-1,"]["name"] == "__main__"
    log = (in_tmp / "r-True" / "scheduler.log").read_text()
    assert "warm starts: a warm process imported" in log and "starts cold" not in log


def test_numpy_and_torch_generators_are_seeded_afresh_in_each_fork(in_tmp):
    """The warm process imported NumPy and PyTorch (and their generators were seeded there once):
    two unseeded forked runs draw differently, as two cold starts do."""
    pytest.importorskip("torch")
    code = (
        "import json, numpy, torch\n"
        "print('PROBE ' + json.dumps({'numpy': float(numpy.random.random()), 'torch': torch.initial_seed(), "
        "'forked': b'GTS_RUN_TOKEN=' not in open('/proc/self/environ', 'rb').read()}), flush=True)\n"
    )
    (in_tmp / "draw.py").write_text(code)
    config = make_config(in_tmp / "r", [{"i": [0, 1]}], prewarm={"imports": ["numpy", "torch"]})
    config["command"] = [sys.executable, "draw.py", "{i}"]
    assert GPUTaskScheduler(config).start().ok
    seen = _seen(in_tmp / "r")
    assert all(run["forked"] for run in seen.values()) and len(seen) == 2
    assert seen["i-0,"]["numpy"] != seen["i-1,"]["numpy"] and seen["i-0,"]["torch"] != seen["i-1,"]["torch"]


class _ThreadsTask(GPUTask):
    """Prints the size of PyTorch's CPU thread pool; its environment asks for ``threads``."""

    def required_env(self):
        return {"OMP_NUM_THREADS": str(self.config["threads"])}

    def main(self):
        import torch

        forked = b"GTS_RUN_TOKEN=" not in open("/proc/self/environ", "rb").read()
        print("PROBE " + json.dumps({"threads": torch.get_num_threads(), "forked": forked}), flush=True)


@pytest.mark.parametrize("prewarm", [{"imports": ["torch"]}, False], ids=["warm", "cold"])
def test_a_forked_runs_torch_uses_the_threads_its_environment_asks_for(in_tmp, prewarm):
    """PyTorch reads OMP_NUM_THREADS when it is imported: a cold run whose environment asks for a
    number of threads (its required_env; a pool's agent sets it to the run's share of CPUs) gets
    them. The warm process imported torch with the scheduler's environment, so a fork sizes torch's
    pool from the run's again. The run asks for another size than the scheduler's torch has."""
    pytest.importorskip("torch")
    fresh = subprocess.run(  # what the warm process's torch has: a fresh import's, in this environment
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True, text=True
    )
    threads = 2 if int(fresh.stdout) == 1 else 1
    config = make_config(in_tmp / "r", [{"threads": [threads]}], prewarm=prewarm)
    assert GPUTaskScheduler(config, _ThreadsTask).start().ok
    (seen,) = _seen(in_tmp / "r").values()
    assert seen == {"threads": threads, "forked": bool(prewarm)}, seen


def test_a_stop_signal_while_the_first_warm_process_imports_is_acted_on_at_once(in_tmp, no_leaked_processes):
    """The first Python run waits (up to 15 s) for the first warm process's imports, on the loop's
    thread. A Ctrl-C then was acted on only once the wait ended; now it ends the wait (the run
    starts cold, and is stopped with the sweep), and nothing of the warm process is left."""
    site = in_tmp / "site"
    site.mkdir()
    (site / "slow_to_import.py").write_text(
        "import os, time\nopen(os.environ['GTS_TEST_IMPORTING'], 'w').close()\ntime.sleep(120)\n"
    )
    scheduler = f"{{gpu: [cpu], result_root_folder: {in_tmp / 'r'}, prewarm: {{imports: [slow_to_import]}}}}"
    (in_tmp / "s.yaml").write_text(
        f"scheduler_config: {scheduler}\n"
        "test_config: [{a: [1]}]\n"
        f"command: [{sys.executable}, -c, 'import time; time.sleep(120)']\n"
    )
    importing = in_tmp / "importing"
    env = {**os.environ, "PYTHONPATH": str(site), "GTS_TEST_IMPORTING": str(importing)}
    process = subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler", "run", "s.yaml", "--plain"],
        cwd=in_tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    wait_until(importing.exists, timeout=60, message="the warm process to be importing")
    process.send_signal(signal.SIGINT)
    output = finish(process, timeout=10)  # the import has 120 s to go: the wait was given up
    assert process.returncode == 130, output
    assert "warm starts: a run starts cold: the warm process is not ready yet" in output, output


_FORKS = r"""
import os, sys
from gpu_task_scheduler.backends.local import forkserver
from gpu_task_scheduler.proctree import become_subreaper

become_subreaper()  # the runs are ours to reap, as in the scheduler
late = 0
for _ in range(int(sys.argv[1])):
    hold, release = os.pipe()
    pid = forkserver._fork_twice()
    if pid == 0:  # the run: alive until told, doing nothing of its own first
        os.close(release)
        os.read(hold, 1)
        os._exit(0)
    os.close(hold)
    late += os.getsid(pid) != pid  # the scheduler signals its group, other sweeps count its reservation
    os.close(release)
    os.waitpid(pid, 0)
print(late)
"""


def test_a_forked_runs_pid_is_told_only_once_it_leads_its_own_session(no_leaked_processes):
    """The pid a warm start hands back is at once the run's process group: told by the helper before
    the run called setsid(), it was not, in 13 forks of 300 on a quiet machine; another sweep then
    took the run's GPU reservation for a dead group's and started a run the GPU had no room for."""
    done = subprocess.run([sys.executable, "-c", _FORKS, "300"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"]


_PAUSED_THEN_DONE = r"""
import sys
from gpu_task_scheduler import reporting
from gpu_task_scheduler.backends.local import forkserver

forkserver._Run.outcome = {"file": sys.argv[1], "token": "t", "config_hash": "h"}
reporting._paused = "exploits lr-0.04, at step 4"  # as report() leaves it when it raised Paused
forkserver._record_success()  # the script caught Paused, saved, and exited 0 before its stop word
"""


def test_a_forked_command_paused_by_report_that_exits_0_is_recorded_paused(tmp_path):
    """A command forked warm that was paused at its report (a PBT exploit, a rung) saves and exits 0,
    as the framework callbacks do: its outcome says paused, so a success is not what the scheduler
    reads if the exit comes before the stop word (a Keras member told to exploit was recorded
    succeeded under load, its exploit never made, and it never trained to the end)."""
    path = tmp_path / "outcome.json"
    subprocess.run([sys.executable, "-c", _PAUSED_THEN_DONE, str(path)], check=True, timeout=60)
    outcome = Outcome.read(str(path), token="t")
    assert outcome is not None and outcome.succeeded and outcome.paused == "exploits lr-0.04, at step 4"
