"""The Keras 3 callback, against real Keras (PyTorch backend) on the CPU: a pause and a resume give
the uninterrupted run's numbers, no epoch is trained twice, the checkpoint outlives a clean stop,
and a pruned fit ends cleanly."""

import os
import shutil

import pytest
from run_side import RunSide, framework

from gpu_task_scheduler import reporting


@pytest.fixture(scope="module")
def example():
    return framework("keras")


@pytest.fixture
def run(tmp_path, monkeypatch):
    return RunSide(tmp_path, monkeypatch)


def test_a_paused_and_resumed_fit_gives_the_uninterrupted_numbers(example, run):
    whole = example.train(0.1, 32, 6)
    run.attempt_at(pause_at=2)
    first = example.train(0.1, 32, 6)
    assert first["epochs"] == 2 and run.steps() == [1, 2]
    assert reporting.paused_cause() == "paused at rung 2"
    assert os.listdir(os.path.join(run.folder, "checkpoint")) == ["keras-epoch-2.weights.h5"]  # kept after the stop
    run.attempt_at(resume=2)
    second = example.train(0.1, 32, 6)
    assert run.steps() == [3, 4, 5, 6] and second["epochs"] == 4  # each epoch trained once
    assert second["val_loss"] == pytest.approx(whole["val_loss"], rel=1e-5)
    assert {"loss", "val_loss"} <= set(run.lines()[-1])


def test_a_pruned_fit_ends_cleanly(example, run):
    run.attempt_at(prune_at=1)
    assert example.train(0.1, 32, 6)["epochs"] == 1 and run.steps() == [1]
    assert reporting.pruned_cause() == "pruned at step 1"


def _fit_recording(example, lr, schedule, epochs, **callback):
    """The example's model fit at ``lr`` (a number, a warm-up or a cosine schedule), resumed where
    the run resumes: the rate the optimizer used at each of its iterations, and the last val_loss."""
    import keras

    from gpu_task_scheduler.integrations.keras import GTSCallback

    rates = {}

    class Rates(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            optimizer = self.model.optimizer
            rates[int(optimizer.iterations)] = float(keras.ops.convert_to_numpy(optimizer.learning_rate))

    rate = {
        "constant": lr,
        "warm-up": keras.optimizers.schedules.CosineDecay(0.0, 48, warmup_target=lr, warmup_steps=6),
        "cosine": keras.optimizers.schedules.CosineDecay(lr, 48),
    }[schedule]
    return rates, example.train(rate, 8, epochs, callbacks=[GTSCallback(**callback), Rates()])["val_loss"]


@pytest.mark.parametrize("schedule", ["constant", "warm-up", "cosine"])
def test_a_member_that_copied_a_checkpoint_trains_at_its_own_rate(example, run, capfd, schedule):
    """Population-based training's copy, as the member sees it: its checkpoint folder holds the
    donor's epoch-2 checkpoint (lr 0.1); it resumes with its own lr 0.05. At every step after the
    copy the rate is the member's own (a number restored with the optimizer's variables is put
    back; a schedule is the script's own object, and goes on from the restored iterations)."""
    run.clear()
    own, _ = _fit_recording(example, 0.05, schedule, 6)
    ended = {}
    for reapply in (True, False):
        shutil.rmtree(os.path.join(run.folder, "checkpoint"), ignore_errors=True)
        run.attempt_at(pause_at=2)
        _fit_recording(example, 0.1, schedule, 6)
        run.attempt_at(resume=2)
        capfd.readouterr()
        rates, ended[reapply] = _fit_recording(example, 0.05, schedule, 6, reapply=reapply)
        said = capfd.readouterr().err
        assert sorted(rates) == list(range(16, 48))  # the iterations after the copy, each once
        factor = 2 if schedule == "constant" and not reapply else 1  # a schedule is never restored
        expected = [own[step] * factor for step in sorted(rates)]
        assert [rates[step] for step in sorted(rates)] == pytest.approx(expected, rel=1e-6)
        if schedule != "constant":
            assert "the learning rate is this run's own schedule" in said and "iteration 16" in said
        elif reapply:
            assert "learning_rate 0.1 (restored) -> 0.05 (this run's config)" in said
        else:
            assert "reapply=False: the values Keras restored stay" in said
    if schedule == "constant":
        assert ended[True] != ended[False]  # one copy, trained on at two rates, ends apart
    else:
        assert ended[True] == ended[False]  # a schedule: nothing to put back either way
