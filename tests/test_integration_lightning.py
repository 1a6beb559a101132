"""The Lightning callback, against real Lightning on the CPU: a pause and a resume give the
uninterrupted run's numbers, no epoch is trained twice, a pruned fit ends cleanly, and a forgotten
resume call is said in the log."""

import logging
import os
import shutil

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


def _shuffled_fit(example, epochs):
    """The example's model with dropout, its training data shuffled: what a resumed fit draws
    decides its numbers. The final validation loss."""
    import torch

    from gpu_task_scheduler.integrations.lightning import GTSCallback, resume_from

    class Dropped(example.Regressor):
        def __init__(self, lr, width):
            super().__init__(lr, width)
            layers = [torch.nn.Linear(4, width), torch.nn.Tanh(), torch.nn.Dropout(0.3), torch.nn.Linear(width, 1)]
            self.net = torch.nn.Sequential(*layers)

    train, valid = example.loaders()
    example.L.seed_everything(0, verbose=False)
    trainer = example.L.Trainer(
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[GTSCallback()],
    )
    shuffled = torch.utils.data.DataLoader(train.dataset, batch_size=32, shuffle=True)
    trainer.fit(Dropped(0.1, 8), shuffled, valid, ckpt_path=resume_from())
    return trainer.callback_metrics["val_loss"].item()


def test_a_paused_and_resumed_fit_with_shuffled_data_and_dropout_gives_the_same_numbers_bit_for_bit(
    example, run, tmp_path, monkeypatch
):
    """The generators' state is saved with each checkpoint and put back at the resume, before the
    next epoch draws its batches: every value the resumed attempts report is the uninterrupted
    fit's, to the last bit (without it, the resumed fit drew other batches and other masks)."""
    (tmp_path / "whole").mkdir()
    whole = RunSide(tmp_path / "whole", monkeypatch)
    whole.attempt_at()
    expected = _shuffled_fit(example, 5)
    uninterrupted = whole.lines()
    run.attempt_at(pause_at=2)
    _shuffled_fit(example, 5)
    assert run.steps() == [1, 2]
    run.attempt_at(resume=2)
    assert _shuffled_fit(example, 5) == expected
    assert run.lines() == uninterrupted[2:]  # epochs 3 to 5, every value equal


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


def _schedules(torch):
    """Per step (``interval: step``): constant, a linear warm-up over 6 steps, a cosine over the fit."""
    return {
        "constant": None,
        "warm-up": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda step: min(1.0, (step + 1) / 6)),
        "cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=48),
    }


def _fit_recording(example, lr, schedule, epochs, **callback):
    """Fit the example's model at ``lr`` under ``schedule`` (resumed where the run resumes); the rate
    its optimizer used at each global step, and the final validation loss."""
    import torch

    from gpu_task_scheduler.integrations.lightning import GTSCallback, resume_from

    make = _schedules(torch)[schedule]

    class Scheduled(example.Regressor):
        def configure_optimizers(self):
            optimizer = super().configure_optimizers()
            if make is None:
                return optimizer
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": make(optimizer), "interval": "step"}}

    rates = {}

    class Rates(example.L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            rates[trainer.global_step] = trainer.optimizers[0].param_groups[0]["lr"]

    example.L.seed_everything(0, verbose=False)
    trainer = example.L.Trainer(
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[GTSCallback(**callback), Rates()],
    )
    trainer.fit(Scheduled(lr, 8), *example.loaders(), ckpt_path=resume_from())
    return rates, trainer.callback_metrics["val_loss"].item()


@pytest.mark.parametrize("schedule", ["constant", "warm-up", "cosine"])
def test_a_member_that_copied_a_checkpoint_trains_at_its_own_rate(example, run, capfd, schedule):
    """Population-based training's copy, as the member sees it: its checkpoint folder holds the
    donor's checkpoint (lr 0.1, after 2 epochs); it resumes with its own lr 0.05. At every step
    after the copy the optimizer's rate is 0.05 times the schedule's factor at that step, as if
    the member had trained at 0.05 from the start; the log says what was put back. With
    ``reapply=False`` the member trains at the donor's rate, and the log says so."""
    run.clear()
    own, _ = _fit_recording(example, 0.05, schedule, 6)  # by hand: the member's own schedule
    ended = {}
    for reapply in (True, False):
        shutil.rmtree(os.path.join(run.folder, "checkpoint"), ignore_errors=True)
        run.attempt_at(pause_at=2)
        _fit_recording(example, 0.1, schedule, 6)  # the donor, paused after epoch 2 (16 steps)
        run.attempt_at(resume=2)
        capfd.readouterr()
        rates, ended[reapply] = _fit_recording(example, 0.05, schedule, 6, reapply=reapply)
        said = capfd.readouterr().err
        assert sorted(rates) == list(range(16, 48))  # the steps after the copy, each once
        factor = 1 if reapply else 2  # the member's rate, or the donor's
        expected = [own[step] * factor for step in sorted(rates)]
        assert [rates[step] for step in sorted(rates)] == pytest.approx(expected, rel=1e-9)
        base = "base lr" if schedule != "constant" else "lr"
        if reapply:
            assert f"{base} 0.1 (restored) -> 0.05 (this run's config)" in said
        else:
            assert "reapply=False: the values Lightning restored stay" in said
    assert ended[True] != ended[False]  # one copy, trained on at two rates, ends apart
