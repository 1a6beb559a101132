"""The checkpoint protocol: a folder per run across its attempts, and the step an attempt goes on
from ("save your checkpoint, then report that step"), after a failure, a kill -9 of the scheduler,
or not at all (a fresh start)."""

import json
import os
import sys

import gts_test_tasks as tasks
import pytest
from conftest import marked_pids, wait_until
from helpers import journal_lines, ledger_rows, make_config
from test_process_control import finish, launch

from gpu_task_scheduler import GPUTaskScheduler

TOTAL = sum(range(1, 9))  # steps 1..8


def _steps(lines, run):
    return [line.split()[0] for line in lines if line.endswith(f" {run}")]


def test_a_retried_run_goes_on_from_its_checkpoint_and_runs_no_step_twice(in_tmp):
    root, journal = in_tmp / "r", str(in_tmp / "journal")
    config = make_config(root, [{"fail_at": [5]}], global_config={"steps": 8, "journal": journal}, max_retries=1)
    summary = GPUTaskScheduler(config, tasks.CheckpointTask).start()
    assert summary.ok, summary.report()
    (outcome,) = summary.succeeded
    assert outcome.attempts == 2 and outcome.result == {"total": TOTAL}  # the state went on, not again
    assert _steps(journal_lines(journal), "fail_at-5,") == [f"step{k}" for k in range(1, 5)] + ["resume4"] + [
        f"step{k}" for k in range(5, 9)
    ]
    # Each attempt reports its own curve: the resumed one from the step after its checkpoint.
    meta = root / "fail_at-5," / ".gts"
    for path, steps in (
        (meta / "logs" / "attempt-1-metrics.jsonl", range(1, 5)),
        (meta / "metrics.jsonl", range(5, 9)),
    ):
        assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == list(steps)
    assert json.loads(ledger_rows(root)["fail_at-5,"]["metrics"])["loss"]["step"] == 8
    # The run's curve, as the plots, the page and the report draw it, goes on across them.
    from gpu_task_scheduler.results import curve_rows
    from gpu_task_scheduler.web.data import curves

    assert [row["step"] for row in curve_rows(str(root))] == list(range(1, 9))
    (drawn,) = curves(str(root), "loss", ["fail_at-5,"])["runs"]
    assert drawn["steps"] == list(range(1, 9)) and drawn["values"] == pytest.approx([1 / k for k in range(1, 9)])


def test_after_a_kill_9_the_next_start_goes_on_from_each_runs_last_reported_step(in_tmp, no_leaked_processes):
    root, journal, hold = in_tmp / "r", str(in_tmp / "journal"), in_tmp / "hold"
    config = make_config(
        root, [{"a": [1]}], global_config={"steps": 8, "journal": journal, "hold_at": 3, "hold": str(hold)}
    )
    scheduler = launch(config, "CheckpointTask")
    wait_until(lambda: "step3 a-1," in journal_lines(journal), message="the run to report step 3")
    wait_until(lambda: (root / "a-1," / ".gts" / "metrics.jsonl").exists(), message="step 3's report")
    wait_until(lambda: '"step": 3' in (root / "a-1," / ".gts" / "metrics.jsonl").read_text(), message="step 3's report")
    scheduler.kill()
    finish(scheduler)
    wait_until(lambda: not marked_pids(no_leaked_processes), timeout=10, message="the orphaned run to die")
    hold.write_text("")
    summary = GPUTaskScheduler(config, tasks.CheckpointTask).start()
    assert summary.ok and summary.outcomes["a-1,"].result == {"total": TOTAL}
    assert _steps(journal_lines(journal), "a-1,") == ["step1", "step2", "step3", "resume3"] + [
        f"step{k}" for k in range(4, 9)
    ]


def test_a_forced_rerun_starts_afresh_with_an_empty_checkpoint_folder_and_keeps_the_old_one(in_tmp):
    root, journal = in_tmp / "r", str(in_tmp / "journal")
    config = make_config(root, [{"a": [1]}], global_config={"steps": 3, "journal": journal})
    assert GPUTaskScheduler(config, tasks.CheckpointTask).start().ok
    config["scheduler_config"]["force_rerun"] = True
    assert GPUTaskScheduler(config, tasks.CheckpointTask).start().ok
    assert _steps(journal_lines(journal), "a-1,") == ["step1", "step2", "step3"] * 2  # no resume
    run = root / "a-1,"
    kept = json.loads((run / ".gts" / "logs" / "attempt-1-checkpoint" / "state.json").read_text())
    assert kept == {"step": 3, "total": 6.0}
    assert json.loads((run / ".gts" / "checkpoint" / "state.json").read_text()) == {"step": 3, "total": 6.0}
    assert [json.loads(line)["step"] for line in (run / ".gts" / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_a_command_gets_its_checkpoint_folder_and_resume_step_in_its_environment(in_tmp):
    root = in_tmp / "r"
    config = make_config(root, [{"a": [1]}], max_retries=1)
    config["command"] = [
        sys.executable,
        "-c",
        "import json, os, sys\n"
        "ckpt, resume = os.environ['GTS_CHECKPOINT_DIR'], os.environ['GTS_RESUME_STEP']\n"
        "open(os.path.join(ckpt, 'seen'), 'a').write(repr(resume) + ' ' + str(os.path.isdir(ckpt)) + '\\n')\n"
        "open(os.environ['GTS_METRICS_FILE'], 'a').write(json.dumps({{'step': 2.5, 'x': 1}}) + '\\n')\n"
        "sys.exit(0 if resume else 1)\n",
    ]
    assert GPUTaskScheduler(config).start().ok  # fails, then succeeds on its resumed attempt
    seen = (root / "a-1," / ".gts" / "checkpoint" / "seen").read_text().splitlines()
    assert seen == ["'' True", "'2.5' True"]


def test_outside_a_sweep_a_task_has_no_checkpoint_folder_and_no_resume_step(monkeypatch):
    monkeypatch.delenv("GTS_CHECKPOINT_DIR", raising=False)
    monkeypatch.delenv("GTS_RESUME_STEP", raising=False)
    task = tasks.CheckpointTask({}, "/tmp")
    assert task.checkpoint_dir is None and task.resume_step is None
    monkeypatch.setenv("GTS_RESUME_STEP", "9")
    assert task.resume_step == 9 and isinstance(task.resume_step, int)
    monkeypatch.setenv("GTS_RESUME_STEP", "2.5")
    assert task.resume_step == 2.5


@pytest.mark.parametrize(
    "attempts, curve",
    [
        ([[1, 2, 3], [4, 5]], [1, 2, 3, 4, 5]),  # resumed after step 3
        ([[1, 2, 3, 4], [4, 5]], [1, 2, 3, 4, 5]),  # step 4 ran again: the later attempt's counts
        ([[1, 2, 3], [1, 2]], [1, 2]),  # started again from its first step: replaces the earlier one
        ([[1, 2], [], [3, 4]], [1, 2, 3, 4]),  # an attempt that reported nothing
        ([[1, 2, 3], [2, 3], [4]], [1, 2, 3, 4]),
        ([[5, 6], [1]], [1]),
    ],
)
def test_a_runs_curve_is_each_attempts_points_before_the_next_ones_first_step(attempts, curve):
    from gpu_task_scheduler.records.metrics import stitch

    stitched = stitch([[(step, {"attempt": n}) for step in steps] for n, steps in enumerate(attempts)])
    assert [step for step, _ in stitched] == curve
    if curve == [1, 2, 3, 4, 5] and attempts[0] == [1, 2, 3, 4]:
        assert stitched[3] == (4, {"attempt": 1})


def test_the_median_rule_sees_a_resumed_runs_whole_curve(in_tmp):
    """Its running average at a step before the resume comes from the earlier attempt's points:
    after a restart of the scheduler (from the ledger and the files), and as the resumed attempt
    starts (its curve up to the resume step)."""
    from gpu_task_scheduler.engine.stopper import Stopper
    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.paths import RootPaths, RunPaths
    from gpu_task_scheduler.sweep.expand import Sweep

    root = in_tmp / "r"
    config = make_config(root, [{"fail_at": [5]}], global_config={"steps": 8}, max_retries=1)
    config["early_stop"] = {"method": "median", "metric": "loss", "mode": "min", "min_step": 1, "min_runs": 99}
    assert GPUTaskScheduler(config, tasks.CheckpointTask).start().ok
    sweep = Sweep(config)
    with Ledger(RootPaths(str(root))) as ledger:
        stopper = Stopper(sweep, ledger, str(root))
        curve = stopper._curves[None]["fail_at-5,"]
        assert curve.last_step == 8 and curve.mean_up_to(2) == pytest.approx((1 + 1 / 2) / 2)
        (spec,) = list(sweep)
        stopper.watch(spec, RunPaths(spec.work_dir, None), resume_step=4)  # as a resumed attempt starts
        curve = stopper._curves[None]["fail_at-5,"]
        assert curve.last_step == 4 and curve.mean_up_to(4) == pytest.approx(sum(1 / k for k in range(1, 5)) / 4)


def test_checkpoints_set_aside_by_fresh_attempts_are_bounded_and_gts_clean_removes_them(in_tmp, capsys):
    """Each forced rerun sets the checkpoint before it aside: the newest two are kept per run (a
    20 GB checkpoint under max_retries: 5 once kept 100 GB), and ``gts clean`` removes the rest."""
    from gpu_task_scheduler.backends.local.prepare import KEEP_SET_ASIDE
    from gpu_task_scheduler.cli.main import main as gts
    from gpu_task_scheduler.records.ledger.lock import SweepLock
    from gpu_task_scheduler.records.paths import RootPaths

    root, journal = in_tmp / "r", str(in_tmp / "journal")
    config = make_config(root, [{"a": [1]}], global_config={"steps": 2, "journal": journal})
    assert GPUTaskScheduler(config, tasks.CheckpointTask).start().ok
    config["scheduler_config"]["force_rerun"] = True
    for _ in range(4):
        assert GPUTaskScheduler(config, tasks.CheckpointTask).start().ok
    logs = root / "a-1," / ".gts" / "logs"
    kept = sorted(name for name in os.listdir(logs) if name.endswith("-checkpoint"))
    assert len(kept) == KEEP_SET_ASIDE == 2
    with SweepLock(RootPaths(str(root))):  # a sweep running there: nothing is touched
        assert gts(["clean", str(root)]) != 0
    assert sorted(name for name in os.listdir(logs) if name.endswith("-checkpoint")) == kept
    capsys.readouterr()
    assert gts(["clean", str(root), "--keep", "1"]) == 0
    assert [name for name in os.listdir(logs) if name.endswith("-checkpoint")] == [kept[-1]]
    assert "removed 1 checkpoint(s) set aside by fresh attempts, of 1 run(s)" in capsys.readouterr().out
    assert json.loads((root / "a-1," / ".gts" / "checkpoint" / "state.json").read_text())["step"] == 2


@pytest.mark.parametrize("odd", ["attempt-²-checkpoint", "attempt-٣-checkpoint", "attempt--1-checkpoint"])
def test_a_folder_named_like_a_set_aside_checkpoint_but_not_one_is_left_alone_said(in_tmp, capsys, caplog, odd):
    """A name read back from a folder is parsed by one rule (ASCII digits): ``'²'.isdigit()`` is
    true and ``int('²')`` fails, which crashed a run's fresh retry and ``gts clean`` at every start."""
    from gpu_task_scheduler.cli.main import main as gts

    root, journal = in_tmp / "r", str(in_tmp / "journal")
    config = make_config(root, [{"a": [1]}], global_config={"steps": 2, "journal": journal})
    assert GPUTaskScheduler(config, tasks.CheckpointTask).start().ok
    logs = root / "a-1," / ".gts" / "logs"
    (logs / odd).mkdir(parents=True)
    (logs / odd / "keep").write_text("the user's")
    config["scheduler_config"]["force_rerun"] = True
    for _ in range(3):  # fresh attempts, each setting its checkpoint aside
        assert GPUTaskScheduler(config, tasks.CheckpointTask).start().ok
    assert f"{odd} left alone: not a checkpoint set aside by gts" in caplog.text
    assert gts(["clean", str(root)]) == 0
    assert (logs / odd / "keep").read_text() == "the user's"
    assert sorted(name for name in os.listdir(logs) if name.endswith("-checkpoint")) == [odd]
