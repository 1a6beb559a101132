"""What a new user trips on (the command line, shipped files, messages): each habit the tools
our users know have set, as ``gts`` meets it."""

import json
import os
import subprocess
import sys

import pytest

from gpu_task_scheduler.cli.main import main as gts

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
WRITER = """import json, sys
table = json.load(open(sys.argv[1]))
json.dump(table[int(sys.argv[2])], open(sys.argv[3] + "/result.json", "w"))
"""


def write_sweep(folder, results, *, name="sweep.yaml", **more):
    """A command sweep over ``i`` whose run i writes ``results[i]`` as its result.json (YAML
    holds JSON); ``more``: top-level keys to add."""
    (folder / "table.json").write_text(json.dumps(results))
    (folder / "writer.py").write_text(WRITER)
    config = {
        "scheduler_config": {"gpu": ["cpu", "cpu"], "result_root_folder": "results"},
        "command": [sys.executable, str(folder / "writer.py"), str(folder / "table.json"), "{i}", "{work_dir}"],
        "test_config": [{"i": list(range(len(results)))}],
        **more,
    }
    path = folder / name
    path.write_text(json.dumps(config, indent=1))
    return str(path)


def _gts(*argv, cwd, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


# --- the command line ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "sweep.yaml", "--dry-run", "i=5"],
        ["run", "sweep.yaml", "--dry-run", "--task", "gts_test_tasks:RecordTask", "i=5"],
        ["run", "sweep.yaml", "i=5", "--dry-run"],
        ["run", "--dry-run", "sweep.yaml", "--plain", "+seed=7", "i=5"],
    ],
)
def test_overrides_are_accepted_anywhere_after_the_subcommand(in_tmp, capsys, argv):
    write_sweep(in_tmp, [{}])
    assert gts(argv) == 0
    out = capsys.readouterr().out
    assert "i = 5" in out and "i-5," in out and "i-0," not in out
    assert ("global_config.seed = 7" in out) == ("+seed=7" in argv)


def test_what_is_not_an_override_is_still_refused(in_tmp, capsys):
    write_sweep(in_tmp, [{}])
    with pytest.raises(SystemExit) as exit:
        gts(["run", "sweep.yaml", "--dry-run", "--bogus", "i=5"])
    assert exit.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit:
        gts(["status", "results", "i=5"])
    assert exit.value.code == 2 and "unrecognized arguments: i=5" in capsys.readouterr().err


def test_commands_on_a_root_accept_the_config_file_instead(in_tmp, capsys):
    sweep = write_sweep(in_tmp, [{"loss": 2.0}, {"loss": 1.0}])
    assert gts(["run", sweep, "--plain"]) == 0
    capsys.readouterr()
    assert gts(["status", sweep]) == 0
    assert "2 succeeded" in capsys.readouterr().out
    assert gts(["results", sweep, "--best", "loss", "--min", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["name"] == "i-1,"
    assert gts(["logs", sweep, "i-0,"]) == 0
    assert gts(["retry", sweep, "i-0,", "--force", "--plain"]) == 0
    assert "running 1 run(s) again: i-0," in capsys.readouterr().out
    assert gts(["stop", sweep]) == 1  # read the root from the file, found nothing running there
    assert "no scheduler" in capsys.readouterr().err
    (in_tmp / "broken.yaml").write_text("scheduler_config: 3\n")
    assert gts(["status", "broken.yaml"]) == 2
    assert "without a scheduler_config" in capsys.readouterr().err


def test_a_cli_sweep_logs_into_its_result_root(in_tmp, capsys):
    one = write_sweep(in_tmp, [{}], name="one.yaml")
    two = write_sweep(in_tmp, [{}, {}], name="two.yaml")
    config = json.loads((in_tmp / "two.yaml").read_text())
    config["scheduler_config"]["result_root_folder"] = "other"
    (in_tmp / "two.yaml").write_text(json.dumps(config))
    assert gts(["run", one, "--plain"]) == 0 and gts(["run", two, "--plain"]) == 0
    assert not (in_tmp / "scheduler.log").exists()
    assert "1 succeeded" in (in_tmp / "results" / "scheduler.log").read_text()
    assert "2 succeeded" in (in_tmp / "other" / "scheduler.log").read_text()
    config["scheduler_config"]["scheduler_log_file_path"] = "mine.log"  # a path the config names is kept
    (in_tmp / "two.yaml").write_text(json.dumps(config))
    assert gts(["run", two, "--plain", "--force-rerun"]) == 0
    assert "2 succeeded" in (in_tmp / "mine.log").read_text()


@pytest.fixture
def nested_root(in_tmp, capsys):
    results = [
        {"loss": 3.0, "val": {"acc": 0.5, "f1": {"macro": 0.2}}, "note": "a"},
        {"loss": 1.0, "val": {"acc": 0.9, "f1": {"macro": 0.1}}, "note": "b"},
        {"loss": 2.0, "val": {"acc": 0.7, "f1": {"macro": 0.3}}, "note": "c"},
    ]
    sweep = write_sweep(in_tmp, results)
    assert gts(["run", sweep, "--plain"]) == 0
    capsys.readouterr()
    return str(in_tmp / "results")


def _names(capsys):
    return [row["name"] for row in json.loads(capsys.readouterr().out)]


def test_nested_results_are_columns_everywhere(nested_root, capsys):
    from gpu_task_scheduler import results

    table = results.rows(nested_root)
    assert table[0]["result.val.acc"] == 0.5 and table[0]["result.val.f1.macro"] == 0.2
    assert list(results.to_dataframe(nested_root)["result.val.f1.macro"]) == [0.2, 0.1, 0.3]
    assert gts(["results", nested_root, "--sort", "val.acc", "--desc", "--format", "json"]) == 0
    assert _names(capsys) == ["i-1,", "i-2,", "i-0,"]
    # Ranked by SQLite (--top) as by the rows: the same order.
    for key in ("val.acc", "result.val.f1.macro", "val.f1.macro"):
        for top in ("1", "2", "3"):
            assert gts(["results", nested_root, "--sort", key, "--top", top, "--format", "json"]) == 0
            whole = [row["name"] for row in results.sort_rows(results.rows(nested_root), key)]
            assert _names(capsys) == whole[: int(top)]
    assert gts(["results", nested_root, "--best", "val.f1.macro", "--max", "--format", "json"]) == 0
    assert _names(capsys) == ["i-2,"]
    assert gts(["results", nested_root]) == 0
    assert "result.val.f1.macro" in capsys.readouterr().out.splitlines()[0]


def test_an_unknown_key_is_an_error_with_the_closest_one(nested_root, capsys):
    for argv, words in [
        (["--sort", "los"], "no run of %s has 'los'; did you mean 'loss'?"),
        (["--sort", "val.ac", "--top", "2"], "has 'val.ac'; did you mean 'val.acc'?"),
        (["--best", "val.ac", "--max"], "has 'val.ac'; did you mean 'val.acc'?"),
        (["--average-over", "ii"], "has the parameter 'ii' to average over; did you mean 'i'? Parameters: i."),
        (["--sort", "note"], "'note' is not a number in any run"),
    ]:
        assert gts(["results", nested_root, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert (words % nested_root if "%s" in words else words) in err, (argv, err)
    sweep_over_seeds = ["--average-over", "i", "--sort", "los"]
    assert gts(["results", nested_root, *sweep_over_seeds]) == 2
    assert "no averaged result is named 'los'; did you mean 'loss'?" in capsys.readouterr().err
    png = os.path.join(nested_root, "..", "x.png")
    assert gts(["plot", nested_root, "--metric", "los", "--by", "i", "-o", png]) == 2
    assert "no succeeded run has the result 'los'; did you mean 'loss'?" in capsys.readouterr().err
    assert gts(["plot", nested_root, "--metric", "loss", "--by", "j", "-o", png]) == 2
    assert "no run has the parameter 'j'" in capsys.readouterr().err


def test_best_says_which_way_it_goes(nested_root, in_tmp, capsys):
    assert gts(["results", nested_root, "--best", "val.acc"]) == 2
    assert "say which way 'val.acc' is better: --best val.acc --min (e.g. a loss) or --max" in capsys.readouterr().err
    for flags, expected in [(["--max"], "i-1,"), (["--desc"], "i-1,"), (["--min"], "i-0,")]:
        assert gts(["results", nested_root, "--best", "val.acc", *flags, "--format", "json"]) == 0
        assert _names(capsys) == [expected]
    assert gts(["results", nested_root, "--sort", "loss", "--max"]) == 2
    # A sweep whose config declares the metric's mode: that is the way.
    config = json.loads((in_tmp / "sweep.yaml").read_text())
    config["early_stop"] = {"method": "median", "metric": "acc", "mode": "max"}
    config["scheduler_config"]["result_root_folder"] = "declared"
    (in_tmp / "declared.yaml").write_text(json.dumps(config))
    (in_tmp / "table.json").write_text(json.dumps([{"acc": 0.5}, {"acc": 0.9}, {"acc": 0.7}]))
    assert gts(["run", "declared.yaml", "--plain"]) == 0
    capsys.readouterr()
    assert gts(["results", "declared.yaml", "--best", "acc", "--format", "json"]) == 0
    assert _names(capsys) == ["i-1,"]
    # --best alone: the metric the config declares; with the run's folder and the checkpoint it left.
    folder = in_tmp / "declared" / "i-1,"
    assert gts(["results", "declared.yaml", "--best", "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["name"] == "i-1," and row["folder"] == str(folder) and row["checkpoint"] is None
    (folder / ".gts" / "checkpoint").mkdir(parents=True, exist_ok=True)  # made for each run, empty
    (folder / ".gts" / "checkpoint" / "lightning.ckpt").write_bytes(b"weights")
    assert gts(["results", "declared.yaml", "--best"]) == 0
    shown = capsys.readouterr().out
    assert str(folder / ".gts" / "checkpoint" / "lightning.ckpt") in shown and "i-1," in shown
    assert gts(["results", nested_root, "--best"]) == 2
    assert "give --best KEY: the sweep's config declares no metric" in capsys.readouterr().err


# --- messages in the user's words -------------------------------------------------------


def test_messages_speak_the_command_line(in_tmp, capsys):
    (in_tmp / "notask.yaml").write_text("scheduler_config: {gpu: [cpu]}\ntest_config: [{a: [1]}]\n")
    assert gts(["run", "notask.yaml", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "give --task MODULE:CLASS" in err and "gpu_task_class" not in err
    (in_tmp / "extra.yaml").write_text(
        "scheduler_config: {gpu: [cpu]}\ncommand: 'echo {a}'\ntest_config: [{a: [1]}]\nzzz: 1\n"
    )
    assert gts(["run", "extra.yaml", "--dry-run"]) == 2
    assert "unknown key 'zzz' in the config. Valid keys: command, " in capsys.readouterr().err
    for command, words in [
        ("awk '{print $1}' {a}", "placeholder {print $1}, which is not a config key"),
        ("echo {a} '{'", "is malformed"),
    ]:
        config = {"scheduler_config": {"gpu": ["cpu"]}, "command": command, "test_config": [{"a": [1]}]}
        (in_tmp / "braces.yaml").write_text(json.dumps(config))
        assert gts(["run", "braces.yaml", "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert words in err and "a literal brace is written doubled: {{ for {, }} for }" in err, err


def test_gpus_all_without_a_gpu_suggests_cpu_slots_and_a_dry_run_fails_the_same_way(in_tmp, capsys):
    # The tests' NVML (conftest) sees no GPU unless a test writes a table: a machine without GPUs.
    sweep = write_sweep(in_tmp, [{}])
    for argv in (["run", sweep, "--gpus", "all", "--plain"], ["run", sweep, "--gpus", "all", "--dry-run"]):
        assert gts(argv) == 1, argv
        err = capsys.readouterr().err
        assert "--gpus all, but no GPU is available (" in err and "use --gpus cpu" in err, err
    result = _gts(
        "queue",
        "--gpus",
        "all",
        cwd=in_tmp,
        input="echo hi\n",
        env={**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, REPO])},
    )
    assert result.returncode == 1 and "use --gpus cpu" in result.stderr, result.stderr
    config = json.loads((in_tmp / "sweep.yaml").read_text())
    config["scheduler_config"]["gpu"] = "all"
    (in_tmp / "sweep.yaml").write_text(json.dumps(config))
    assert gts(["run", sweep, "--plain"]) == 1
    real = capsys.readouterr().err
    assert gts(["run", sweep, "--dry-run"]) == 1
    assert capsys.readouterr().err == real and 'gpu is "all" but no GPU is available' in real
    assert not (in_tmp / "results").exists()


# --- gts status and gts results -------------------------------------------------------------


def test_status_fits_the_terminal_lists_pending_runs_and_says_who_holds_the_root(in_tmp, capsys, monkeypatch):
    sweep = write_sweep(in_tmp, [{}, {}, {}])
    fail = in_tmp / ("x" * 200)  # a run fails with a long cause: "RuntimeError: asked to fail by <this path>"
    fail.write_text("")
    task = ["--task", "gts_test_tasks:RecordTask", "scheduler_config.result_root_folder=r"]
    assert gts(["run", sweep, "--plain", *task, "i=0,1", "+fail_if=" + str(fail)]) == 1
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "80")
    assert gts(["status", "r"]) == 0  # to a pipe or a file: every column, whatever COLUMNS says
    assert "r/i-1,/worker.log" in capsys.readouterr().out
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # a terminal from here on
    for columns in ("80", "100", "200"):
        monkeypatch.setenv("COLUMNS", columns)
        assert gts(["status", "r"]) == 0
        lines = capsys.readouterr().out.splitlines()
        table = [line for line in lines if not line.startswith(str(in_tmp))]  # the head line holds the path
        assert table and max(map(len, table)) <= int(columns), (columns, lines)
        assert any(line.startswith("i-1,") and "failed" in line for line in table), lines
    monkeypatch.setenv("COLUMNS", "0")  # a terminal that reports width 0: as wide as it needs
    assert gts(["status", "r"]) == 0 and "…" in capsys.readouterr().out  # the cause is still cut
    assert gts(["status", "r", "--verbose"]) == 0
    verbose = capsys.readouterr().out
    assert "…" not in verbose and f"asked to fail by {fail}" in verbose
    assert gts(["status", "r", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["scheduler"]["holder"] is None and report["scheduler"]["running"] is False
    # Pending runs: a sweep drained after its first run leaves the rest recorded as nothing.
    assert gts(["run", sweep, "--plain", "scheduler_config.result_root_folder=p", "i=0"]) == 0
    config = json.loads((in_tmp / "sweep.yaml").read_text())
    config["scheduler_config"]["result_root_folder"] = "p"
    (in_tmp / "p.yaml").write_text(json.dumps(config))
    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.paths import RootPaths

    with Ledger(RootPaths(str(in_tmp / "p"))) as ledger:  # as a start that was stopped before i-1 leaves it
        ledger.set_meta("sweep_runs", "2")
        recorded = json.loads(ledger.get_meta("sweep_config"))
        recorded["test_config"] = [{"i": [0, 1]}]
        ledger.set_meta("sweep_config", json.dumps(recorded))
    capsys.readouterr()
    assert gts(["status", "p.yaml"]) == 0
    assert "i-1," not in capsys.readouterr().out
    assert gts(["status", "p.yaml", "--all"]) == 0
    out = capsys.readouterr().out
    assert "1 pending, 1 succeeded" in out and any(line.split()[:2] == ["i-1,", "pending"] for line in out.splitlines())


def test_results_shows_durations_as_status_does(nested_root, capsys):
    assert gts(["results", nested_root]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    column = header.split().index("duration")
    assert all(line.split()[column].endswith("s") for line in lines), lines
    assert gts(["results", nested_root, "--format", "json"]) == 0
    assert all(isinstance(row["duration"], float) for row in json.loads(capsys.readouterr().out))


# --- a sweep script fed on stdin -------------------------------------------------------------

STDIN_SCRIPT = """
from gpu_task_scheduler import GPUTask, GPUTaskScheduler

class Square(GPUTask):
    def main(self):
        return {"y": self._config["x"] ** 2}

config = {
    "scheduler_config": {"gpu": ["cpu", "cpu"], "result_root_folder": "stdin-results"},
    "test_config": [{"x": [1, 2, 3]}],
}
summary = GPUTaskScheduler(config, Square).start()
print("succeeded", sorted(run.result["y"] for run in summary.succeeded))
"""


def test_a_sweep_script_fed_on_stdin_runs_its_task(in_tmp, no_leaked_processes):
    pytest.importorskip("cloudpickle")  # the test extra has it: the class travels by value
    result = _gts_python("-", cwd=in_tmp, input=STDIN_SCRIPT)
    assert result.returncode == 0 and "succeeded [1, 4, 9]" in result.stdout, result.stderr


def test_without_cloudpickle_a_task_from_stdin_is_refused_before_anything_runs(in_tmp, monkeypatch):
    import types

    from gpu_task_scheduler import GPUTask, GPUTaskScheduler, TaskClassError

    main = types.ModuleType("__main__")  # what `python - < sweep.py` runs in: no file to import again
    main.__file__ = "<stdin>"
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setitem(sys.modules, "cloudpickle", None)  # not installed
    Square = type("Square", (GPUTask,), {"__module__": "__main__", "main": lambda self: 1})
    config = {"scheduler_config": {"gpu": ["cpu"], "result_root_folder": "r"}, "test_config": [{"x": [1]}]}
    with pytest.raises(TaskClassError, match="defined in a script without a file .* 'gts-sweep\\[interactive\\]'"):
        GPUTaskScheduler(config, Square)
    assert not (in_tmp / "r").exists()


def _gts_python(*argv, cwd, **kwargs):
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=120, **kwargs)


# --- gts grid | gts queue --resume -----------------------------------------------------------


def test_grid_piped_into_queue_resume_runs_nothing_the_second_time(in_tmp):
    grid = ["grid", "echo {lr} {seed} >> ran", "-p", "lr", "0.1", "0.01", "-p", "seed", "1", "2", "3"]
    first, again = _gts(*grid, cwd=in_tmp).stdout, _gts(*grid, cwd=in_tmp).stdout
    assert first == again and len(first.splitlines()) == 6  # shuffled, in an order fixed by the input
    assert first != _gts(*grid, "--seed", "5", cwd=in_tmp).stdout  # a seed picks another
    for _ in range(2):
        queue = _gts("queue", "--gpus", "cpu", "cpu", "--resume", cwd=in_tmp, input=first)
        assert queue.returncode == 0, queue.stderr
    assert sorted((in_tmp / "ran").read_text().splitlines()) == sorted(line[5:-7] for line in first.splitlines())
    assert "0 succeeded, 0 failed, 6 skipped" in queue.stderr
    # A job is its command: lines in another order, one new and one repeated, run only what is new.
    lines = first.splitlines()
    changed = "\n".join(["echo new >> ran", *reversed(lines), lines[0]]) + "\n"
    queue = _gts("queue", "--gpus", "cpu", "--resume", cwd=in_tmp, input=changed)
    assert queue.returncode == 0 and "2 succeeded, 0 failed, 6 skipped" in queue.stderr, queue.stderr
    assert (in_tmp / "ran").read_text().splitlines()[6:] == ["new", lines[0][5:-7]]
    jobs = sorted(name for name in os.listdir(in_tmp / "gts-queue") if name.startswith("job-"))
    assert len(jobs) == 8 and sum(name.count("-") == 2 for name in jobs) == 1  # the repeat: job-<hash>-2


# --- gts retry from anywhere -----------------------------------------------------------------

TASK_MODULE = """
import os
from gpu_task_scheduler import GPUTask

class Flaky(GPUTask):
    def main(self):
        if os.path.exists(self._config["fail_if"]):
            raise RuntimeError("asked to fail")
        return {"x": self._config["x"]}
"""


def test_retry_finds_the_task_file_the_ledger_recorded_wherever_it_is_started(in_tmp, monkeypatch, capsys):
    project, elsewhere = in_tmp / "project", in_tmp / "elsewhere"
    (project / "mypkg").mkdir(parents=True)
    elsewhere.mkdir()
    (project / "mypkg" / "__init__.py").write_text("")
    (project / "mypkg" / "tasks.py").write_text(TASK_MODULE)
    fail = in_tmp / "fail"
    fail.write_text("")
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": str(in_tmp / "root")},
        "task": "mypkg.tasks:Flaky",
        "global_config": {"fail_if": str(fail)},
        "test_config": [{"x": [1, 2]}],
    }
    (project / "sweep.json").write_text(json.dumps(config))
    run = _gts("run", "sweep.json", "--plain", cwd=project)
    assert run.returncode == 1 and "0 succeeded, 2 failed" in run.stderr, run.stderr
    fail.unlink()
    retry = _gts("retry", str(in_tmp / "root"), "--failed", "--plain", cwd=elsewhere)
    assert retry.returncode == 0 and "2 succeeded, 0 failed" in retry.stderr, retry.stderr
    # Gone: the message says where it looked.
    (project / "mypkg" / "tasks.py").rename(project / "mypkg" / "moved.py")
    result = _gts("retry", str(in_tmp / "root"), "x-1,", "--force", "--plain", cwd=elsewhere)
    assert result.returncode == 2, result.stderr
    assert f"looked for mypkg.tasks in {project / 'mypkg' / 'tasks.py'}: no such file or directory" in result.stderr


def test_retry_imports_no_recorded_file_that_others_may_write(in_tmp, capsys):
    from gpu_task_scheduler.cli.commands.retry import _find_recorded_tasks

    shared = in_tmp / "shared"
    shared.mkdir()
    (shared / "theirs_gts_test.py").write_text("raise SystemExit('imported')\n")
    shared.chmod(0o777)  # anyone may write here: not trusted
    looked = _find_recorded_tasks(json.dumps({"theirs_gts_test": str(shared / "theirs_gts_test.py")}))
    assert looked == [f"{shared / 'theirs_gts_test.py'} is not yours (or others may write there): not imported"]
    assert str(shared) not in sys.path
    assert _find_recorded_tasks(json.dumps({"a.b": "/x/y.py"})) == [
        "the ledger records a.b in '/x/y.py', which is not that module's file"
    ]


UNGUARDED = """import sys
from gpu_task_scheduler import GPUTask, GPUTaskScheduler


class Train(GPUTask):
    def main(self):
        return {{"loss": self._config["lr"]}}


config = {{
    "scheduler_config": {{"gpu": ["cpu"], "result_root_folder": "results", "scheduler_log_file_path": None}},
    "test_config": [{{"lr": [0.1, 0.2]}}],
}}
{start}
"""


@pytest.mark.parametrize(
    "start, refused",
    [
        ("GPUTaskScheduler(config, Train).start()", True),
        ("def go():\n    GPUTaskScheduler(config, Train).start()\n\n\ngo()", True),
        ('if __name__ == "__main__":\n    GPUTaskScheduler(config, Train).start()', False),
        (
            'try:\n    if __name__ == "__main__":\n        GPUTaskScheduler(config, Train).start()\nfinally:\n    pass',
            False,
        ),
    ],
)
def test_a_script_that_starts_its_sweep_unguarded_is_refused_before_any_run(in_tmp, start, refused):
    """Each run's process loads the script again to find its class: unguarded, that would start the
    sweep again there, and every run would fail naming the user's own sweep as another scheduler."""
    (in_tmp / "sweep.py").write_text(UNGUARDED.format(start=start))
    result = subprocess.run([sys.executable, "sweep.py"], cwd=in_tmp, capture_output=True, text=True, timeout=120)
    if refused:
        assert result.returncode == 1 and "another scheduler" not in result.stderr
        assert "sweep.py starts the sweep at line " in result.stderr, result.stderr
        assert 'put the call to start() (and what only the sweep needs) under `if __name__ == "__main__":`' in (
            result.stderr
        )
        assert not (in_tmp / "results").exists()  # nothing ran, nothing was written
    else:
        assert result.returncode == 0, result.stderr
        assert "2 succeeded, 0 failed" in result.stderr


@pytest.mark.parametrize("module, extra", [("matplotlib", "plot"), ("pandas", "results"), ("ray", "ray")])
def test_a_missing_extra_names_the_command_that_works_from_a_clone_too(in_tmp, monkeypatch, module, extra):
    """Someone who cloned the repository installs with pip install -e '.[extra]'."""
    from gpu_task_scheduler import GTSError, results
    from gpu_task_scheduler.backends.ray.launcher import import_ray
    from gpu_task_scheduler.reports.plots import _pyplot

    needs = {"plot": _pyplot, "results": lambda: results.to_dataframe(str(in_tmp)), "ray": import_ray}[extra]
    monkeypatch.setitem(sys.modules, module, None)  # an import of it fails as if it were not installed
    with pytest.raises(GTSError) as caught:
        needs()
    hint = f"pip install 'gts-sweep[{extra}]' (from a clone of the repository: pip install -e '.[{extra}]')"
    assert hint in str(caught.value)
