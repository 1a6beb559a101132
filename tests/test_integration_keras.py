"""The Keras 3 callback, against real Keras (PyTorch backend) on the CPU: a pause and a resume give
the uninterrupted run's numbers, no epoch is trained twice, the checkpoint outlives a clean stop,
and a pruned fit ends cleanly."""

import os

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
