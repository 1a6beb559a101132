"""The engine's decisions as tables (engine/decide.py), and the loop's use of them on a fake
launcher and a fake clock (no processes, no waiting: each test takes milliseconds)."""

import pytest
from fake_launcher import FakeWorld
from helpers import ledger_rows, make_config

from gpu_task_scheduler.engine.decide import (
    OOM_GROWTH,
    Classified,
    ExitFacts,
    after_exit,
    before_run,
    classify,
)
from gpu_task_scheduler.engine.loop import Scheduler
from gpu_task_scheduler.gpu.placement import WHOLE_GPU
from gpu_task_scheduler.records.ledger.record import KnownRun
from gpu_task_scheduler.records.prior import Prior
from gpu_task_scheduler.records.protocol import Outcome
from gpu_task_scheduler.records.status import RunStatus
from gpu_task_scheduler.sweep.expand import Sweep

S, F, T, INT = RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.INTERRUPTED


def record(status, config_hash="h"):
    return KnownRun(status=status, config_hash=config_hash, params='{"a": 1}')


GOOD = Outcome(status="succeeded", token="t", config_hash="h", result=1)

# (duplicate, record, folder_ok, outcome, force_rerun, skip_existing_folders) -> (action, dry-run label)
BEFORE_RUN = [
    ((True, None, False, None, False, False), ("skip", "skip (same config as an earlier run)")),
    ((True, None, False, None, True, False), ("skip", "skip (same config as an earlier run)")),
    ((False, record(S), True, None, True, False), ("run", "run (force_rerun)")),
    ((False, record(S), True, None, False, False), ("skip", "skip (succeeded)")),
    ((False, record(S, None), True, None, False, False), ("skip", "skip (succeeded)")),  # recorded before hashes
    ((False, record(S, "other"), True, None, False, False), ("run", "run again (config changed)")),
    ((False, record(S), False, None, False, False), ("run", "run again (folder gone)")),
    ((False, record(F), True, None, False, False), ("run", "run again (failed)")),
    ((False, record(INT), True, GOOD, False, True), ("run", "run again (interrupted)")),
    ((False, None, False, None, False, True), ("run", "run")),
    ((False, None, True, GOOD, False, False), ("adopt", "skip (folder records a success)")),  # the ledger was lost
    ((False, None, True, Outcome("succeeded", config_hash="other"), False, False), ("run", "run")),
    ((False, None, True, Outcome("failed", config_hash="h"), False, True), ("skip", "skip (folder exists)")),
    ((False, None, True, None, False, False), ("run", "run")),
]


@pytest.mark.parametrize("inputs, expected", BEFORE_RUN)
def test_before_run(inputs, expected):
    duplicate, rec, folder_ok, outcome, force, skip_existing = inputs
    prior = Prior(duplicate=duplicate, config_hash="h", record=rec, folder_ok=folder_ok, outcome=outcome)
    decision = before_run(prior, force_rerun=force, skip_existing_folders=skip_existing)
    assert (decision.action, decision.label) == expected


# Whether a run that runs again goes on from its checkpoint: only the same run (same config, its
# folder there) that did not end; never a success forced again, a changed config or a new run.
RESUMES = [
    (record(F), True, False, True),
    (record(INT), True, False, True),
    (record(T), True, False, True),
    (record(F, None), True, False, True),  # recorded before config hashes
    (record(F, "other"), True, False, False),  # its config changed: afresh
    (record(INT), False, False, False),  # its folder is gone
    (record(F), True, True, False),  # force_rerun: afresh
    (record(S), True, True, False),
    (None, False, False, False),
]


@pytest.mark.parametrize("rec, folder_ok, force, resume", RESUMES)
def test_a_run_that_did_not_end_resumes_only_as_the_same_run(rec, folder_ok, force, resume):
    prior = Prior(duplicate=False, config_hash="h", record=rec, folder_ok=folder_ok, outcome=None)
    decision = before_run(prior, force_rerun=force, skip_existing_folders=False)
    assert decision.action == "run" and decision.resume is resume


def facts(returncode=0, **changes):
    base = dict(
        returncode=returncode,
        reports_outcome=True,
        outcome=None,
        stopped=None,
        unsafe=None,
        folder_exists=True,
        log_tail="",
    )
    return ExitFacts(**{**base, **changes})


CLASSIFY = [
    (facts(0, outcome=GOOD), (S, None)),
    (facts(-15, outcome=GOOD, stopped=(INT, "interrupted by SIGINT")), (S, None)),  # it finished first
    (facts(0, reports_outcome=False), (S, None)),
    (facts(3, reports_outcome=False), (F, "the command failed with exit code 3")),
    (facts(-9, reports_outcome=False), (F, "the command was killed by SIGKILL")),
    (
        facts(1, reports_outcome=False, log_tail="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"),
        (F, "GPU out of memory (PyTorch): the command failed with exit code 1"),
    ),
    (facts(-15, reports_outcome=False, stopped=(T, "timed out after 5s")), (T, "timed out after 5s")),
    (facts(-15, stopped=(INT, "interrupted by SIGINT")), (INT, "interrupted by SIGINT")),
    (facts(1, outcome=Outcome("failed", phase="main", error="ValueError: boom")), (F, "ValueError: boom")),
    (
        facts(3, outcome=Outcome("failed", phase="load", error="ImportError: x")),
        (F, "the task could not be loaded in the run's process: ImportError: x"),
    ),
    (
        facts(1, unsafe="x is a symbolic link"),
        (F, "the run folder was changed into something unsafe: x is a symbolic link"),
    ),
    (facts(1, folder_exists=False), (F, "the run folder disappeared")),
    (facts(0), (F, "the process exited without recording an outcome")),
    (facts(-11), (F, None)),
    (
        facts(1, log_tail="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
        (F, "GPU out of memory (PyTorch)"),
    ),
    (facts(0, outcome=GOOD, unstoppable=(7, 8)), (S, "processes it started could not be stopped: pid 7, 8")),
    # The machine went away: interrupted, whatever the exit status; unless it succeeded first, or we stopped it.
    (facts(-9, lost="its machine went away"), (INT, "its machine went away")),
    (facts(-9, outcome=GOOD, lost="its machine went away"), (S, None)),
    (facts(-9, stopped=(T, "timed out after 1s"), lost="x"), (T, "timed out after 1s")),
]


@pytest.mark.parametrize("given, expected", CLASSIFY)
def test_classify(given, expected):
    ended = classify(given)
    assert (ended.status, ended.cause) == expected


def ended(status, oom=None):
    return Classified(status=status, cause=None, exit_code=None, signal=None, oom=oom)


# (ended, tries, oom_retries, reserved, peak, stopping) -> (action, need), with max_retries=1, max_oom_retries=2
AFTER_EXIT = [
    ((ended(S), 1, 0, 0, None, False), ("done", None)),
    ((ended(F), 1, 0, 0, None, False), ("retry", None)),
    ((ended(T), 1, 0, 0, None, False), ("retry", None)),
    ((ended(F), 2, 0, 0, None, False), ("done", None)),  # max_retries used up
    ((ended(INT), 1, 0, 0, None, False), ("done", None)),
    ((ended(F), 1, 0, 0, None, True), ("done", None)),  # the sweep is stopping
    ((ended(F, oom="x"), 1, 0, 10, 20, False), ("defer", int(20 * OOM_GROWTH))),
    ((ended(F, oom="x"), 1, 0, 30, 20, False), ("defer", int(30 * OOM_GROWTH))),
    ((ended(F, oom="x"), 1, 0, WHOLE_GPU, None, False), ("defer", WHOLE_GPU)),
    ((ended(F, oom="x"), 1, 0, 0, None, False), ("defer", WHOLE_GPU)),  # nothing known: the whole GPU
    ((ended(F, oom="x"), 3, 2, 10, None, False), ("done", None)),  # max_oom_retries used up
    ((ended(F), 3, 2, 10, None, False), ("retry", None)),  # out-of-memory retries do not use up max_retries
]


def test_an_attempt_lost_with_its_machine_runs_again_a_bounded_number_of_times():
    lost = classify(facts(-9, lost="its machine went away"))
    common = dict(tries=5, oom_retries=0, reserved=None, peak=None, max_retries=0, max_oom_retries=0)
    assert after_exit(lost, stopping=False, lost_retries=2, max_lost_retries=3, **common).action == "lost"
    assert after_exit(lost, stopping=False, lost_retries=3, max_lost_retries=3, **common).action == "done"
    assert after_exit(lost, stopping=True, lost_retries=0, max_lost_retries=3, **common).action == "done"


@pytest.mark.parametrize("inputs, expected", AFTER_EXIT)
def test_after_exit(inputs, expected):
    end, tries, oom_retries, reserved, peak, stopping = inputs
    step = after_exit(
        end,
        tries=tries,
        oom_retries=oom_retries,
        reserved=reserved,
        peak=peak,
        max_retries=1,
        max_oom_retries=2,
        stopping=stopping,
    )
    assert (step.action, step.need) == expected


# --- the loop on the fake launcher ------------------------------------------------------


def run(config):
    world = FakeWorld()
    summary = Scheduler(Sweep(config), world, clock=world.clock, inbox=world).run()
    return world, summary


def test_retries_run_again_at_once_and_are_bounded(tmp_path):
    world, summary = run(make_config(tmp_path / "r", [{"exit": [3], "seconds": [1]}], max_retries=2))
    (failed,) = summary.failed
    assert failed.attempts == 3 and [t for t, _, _ in world.starts] == [0.0, 1.0, 2.0]


def test_out_of_memory_runs_go_last_and_are_bounded(tmp_path):
    blocks = [{"i": [0], "oom": [True]}, {"i": [1, 2]}]
    world, summary = run(make_config(tmp_path / "r", blocks, max_oom_retries=2))
    assert [name for _, name, _ in world.starts] == ["i-0,oom-True,", "i-1,", "i-2,", "i-0,oom-True,", "i-0,oom-True,"]
    (failed,) = summary.failed
    assert failed.cause.startswith("GPU out of memory") and failed.attempts == 3


def test_a_timed_out_run_is_stopped_and_recorded_and_the_others_go_on(tmp_path):
    root = tmp_path / "r"
    world, summary = run(make_config(root, [{"seconds": [100, 0.5]}], slots=("cpu", "cpu"), timeout=1))
    (failed,) = summary.failed
    assert (failed.status, failed.signal, failed.cause) == (RunStatus.TIMED_OUT, "SIGTERM", "timed out after 1s")
    assert world.stops == [(1.0, "seconds-100,", "term")] and [o.name for o in summary.succeeded] == ["seconds-0.5,"]
    assert ledger_rows(root)["seconds-100,"]["status"] == "timed_out"


def test_a_run_that_ignores_sigterm_is_killed_when_the_grace_period_ends(tmp_path, caplog):
    config = make_config(tmp_path / "r", [{"seconds": [100], "trap_term": [True]}], timeout=10, grace_period=5)
    world, summary = run(config)
    assert world.stops == [(10.0, "seconds-100,trap_term-True,", "term"), (15.0, "seconds-100,trap_term-True,", "kill")]
    (failed,) = summary.failed
    assert (failed.status, failed.signal) == (RunStatus.TIMED_OUT, "SIGKILL") and summary.duration == 15.0
    assert "seconds-100,trap_term-True, did not stop within 5s of SIGTERM; sending SIGKILL" in caplog.text


def test_a_run_that_timed_out_is_retried_at_once(tmp_path):
    root = tmp_path / "r"
    world, summary = run(make_config(root, [{"hang_until_attempt": [2]}], timeout=5, max_retries=1))
    (succeeded,) = summary.succeeded
    assert succeeded.attempts == 2 and not summary.failed and [t for t, _, _ in world.starts] == [0.0, 5.0]
    row = ledger_rows(root)["hang_until_attempt-2,"]
    assert (row["status"], row["attempts"]) == ("succeeded", 2)


def test_a_run_that_ended_before_its_deadline_is_not_timed_out_by_a_late_look(tmp_path):
    """The run ended at 0.3 s, but the loop hears of it only at 1.8 s (the scheduler was suspended):
    at its deadline (1 s) the run has exited, so its own exit status decides, not the clock."""
    root = tmp_path / "r"
    world, summary = run(make_config(root, [{"seconds": [0.3], "noticed_after": [1.5]}], timeout=1))
    assert world.stops == [] and [o.status for o in summary.outcomes.values()] == [RunStatus.SUCCEEDED]
    assert summary.duration == 1.8


def test_a_run_the_launcher_cannot_start_fails_alone(tmp_path):
    world, summary = run(make_config(tmp_path / "r", [{"refuse": [True, False], "seconds": [1]}]))
    (failed,) = summary.failed
    assert failed.cause == "could not start: refused by the fake launcher" and len(summary.succeeded) == 1
