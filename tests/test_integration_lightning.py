"""The Lightning callback, against real Lightning on the CPU: a pause and a resume give the
uninterrupted run's numbers, no epoch is trained twice, a pruned fit ends cleanly, and a forgotten
resume call is said in the log."""

import logging
import os

import pytest
from run_side import RunSide, framework

from gpu_task_scheduler import reporting


@pytest.fixture(scope="module")
def example():
    return framework("lightning")


@pytest.fixture
def run(tmp_path, monkeypatch):
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    return RunSide(tmp_path, monkeypatch)


def test_a_paused_and_resumed_fit_gives_the_uninterrupted_numbers(example, run):
    whole = example.train(0.1, 8, 6)  # by hand: the callback does nothing
    assert whole["epochs"] == 6 and not os.path.exists(run.metrics(1))
    run.attempt_at(pause_at=2)
    first = example.train(0.1, 8, 6)
    assert first["epochs"] == 2 and run.steps() == [1, 2]
    assert reporting.paused_cause() == "paused at rung 2"
    run.attempt_at(resume=2)
    second = example.train(0.1, 8, 6)
    assert run.steps() == [3, 4, 5, 6]  # each epoch trained (and reported) once
    assert second["val_loss"] == pytest.approx(whole["val_loss"], rel=1e-6)
    assert {"val_loss", "train_loss"} <= set(run.lines()[-1])


def test_a_pruned_fit_ends_cleanly(example, run):
    run.attempt_at(prune_at=1)
    result = example.train(0.1, 8, 6)
    assert result["epochs"] == 1 and run.steps() == [1]
    assert reporting.pruned_cause() == "pruned at step 1"


def test_a_forgotten_resume_call_is_said_in_the_log(example, run, capfd):
    from gpu_task_scheduler.integrations.lightning import GTSCallback, resume_from

    run.attempt_at(pause_at=1)
    example.train(0.1, 8, 3)
    run.attempt_at(resume=1)
    assert resume_from() == os.path.join(run.folder, "checkpoint", "lightning.ckpt")
    trainer = example.L.Trainer(
        max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False, callbacks=[GTSCallback()]
    )
    trainer.fit(example.Regressor(0.1, 8), *example.loaders())  # no ckpt_path
    said = capfd.readouterr().err
    assert "was not given the run's checkpoint, so it trains again from the start" in said
    assert "pass ckpt_path=resume_from() to trainer.fit()" in said


def test_a_step_unit_reports_the_global_step_at_each_validation(example, run):
    from gpu_task_scheduler.integrations.lightning import GTSCallback

    run.attempt_at()
    trainer = example.L.Trainer(
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        val_check_interval=4,
        callbacks=[GTSCallback(unit="step")],
    )
    trainer.fit(example.Regressor(0.1, 8), *example.loaders())
    assert run.steps() == [4, 8, 12, 16]
    with pytest.raises(ValueError, match="GTSCallback\\(unit='batch'\\)"):
        GTSCallback(unit="batch")


def test_the_checkpoint_of_a_step_is_in_place_before_that_step_is_reported(example, run, monkeypatch):
    """The protocol: save, then report. At each report, the run's checkpoint is the one of the epoch
    just reported (a pause there resumes from it)."""
    import torch

    run.attempt_at()
    reported = reporting.report  # the run side's: writes the metrics line
    seen = []

    def report(step, **metrics):
        path = os.path.join(run.folder, "checkpoint", "lightning.ckpt")
        saved = torch.load(path, weights_only=False) if os.path.exists(path) else None
        seen.append((step, None if saved is None else saved["epoch"]))
        reported(step, **metrics)

    monkeypatch.setattr(reporting, "report", report)
    example.train(0.1, 8, 3)
    assert seen == [(1, 0), (2, 1), (3, 2)]  # the epoch just trained (Lightning counts from 0)
