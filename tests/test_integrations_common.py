"""What every framework callback shares (gpu_task_scheduler/integrations/common.py), without any
framework: which values are reported, what a run outside a sweep does, where checkpoints are written,
and the checks of a callback's arguments."""

import math
import os

import numpy as np
import pytest
from run_side import RunSide as Scheduler

from gpu_task_scheduler.integrations import common


class Tensor:
    """Stands for a framework's tensor: numel() and float()."""

    def __init__(self, *values):
        self.values = values

    def numel(self):
        return len(self.values)

    def __float__(self):
        if len(self.values) != 1:
            raise TypeError("only one element tensors can be converted to Python scalars")
        return float(self.values[0])


def test_only_finite_scalars_are_reported():
    found = common.numbers(
        {
            "loss": 0.5,
            "step_count": 3,
            "acc": np.float32(0.75),
            "lr": Tensor(0.01),
            "grads": Tensor(1.0, 2.0),
            "array": np.array([0.25]),
            "nan": math.nan,
            "inf": np.float64("inf"),
            "flag": True,
            "name": "run",
            "list": [1.0],
            "none": None,
        }
    )
    assert found == {"loss": 0.5, "step_count": 3.0, "acc": 0.75, "lr": 0.01, "array": 0.25}


def test_outside_a_sweep_nothing_is_reported_saved_or_resumed(tmp_path, monkeypatch):
    Scheduler(tmp_path, monkeypatch).clear()
    side = common.RunSide("Tests", "hint")
    assert not side.active and side.report(1, {"loss": 0.5}) is True
    assert common.checkpoint_dir() is None and common.checkpoint_path("x.ckpt") is None
    assert common.resume_step() is None and common.resumable("x.ckpt") is None


def test_a_run_reports_each_step_once_and_stops_when_told(tmp_path, monkeypatch, capfd):
    run = Scheduler(tmp_path, monkeypatch)
    run.attempt_at(pause_at=2)
    side = common.RunSide("Tests", "hint")
    assert side.report(1, {"loss": 0.5, "note": "x"}) and side.report(1, {"loss": 0.4})  # step 1 once
    assert side.report(1.5, {}) is True  # nothing to report: not a line
    assert side.report(2, {"loss": 0.3}) is False and side.stopped == "paused"
    assert side.report(3, {"loss": 0.2}) is False  # stopped: nothing more
    assert run.lines() == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.3}]
    assert "paused: paused at rung 2; Tests ends its training here" in capfd.readouterr().err


def test_checkpoints_are_written_beside_and_put_in_place_whole(tmp_path, monkeypatch, capfd):
    run = Scheduler(tmp_path, monkeypatch)
    run.attempt_at(resume=4)
    path = common.checkpoint_path("model.weights.h5")
    assert os.path.isdir(os.path.dirname(path))  # the folder is made
    new = common.saved(path)
    assert os.path.basename(new) == ".new-model.weights.h5" and new.endswith(".h5")  # the format's ending kept
    assert common.resumable("model.weights.h5") is None  # expected, not there: said
    assert "should go on from step 4 but there is no checkpoint" in capfd.readouterr().err
    with open(new, "w") as handle:
        handle.write("weights")
    common.commit(path)
    assert not os.path.exists(new) and common.resumable("model.weights.h5") == path
    side = common.RunSide("Tests", "pass resume=... to fit()")
    side.check_resumed(True)
    side.check_resumed(False)
    said = capfd.readouterr().err
    assert said.count("trains again from the start") == 1 and "pass resume=... to fit()" in said


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, "3"])
def test_every_is_a_whole_number_of_rounds(bad):
    assert common.rounds(5) == 5
    with pytest.raises(ValueError, match="a whole number of rounds"):
        common.rounds(bad)


def test_the_checkpoint_a_run_left_is_found_for_each_callback(tmp_path):
    from gpu_task_scheduler.integrations.common import checkpoint_left

    folder = tmp_path / "checkpoint"
    assert checkpoint_left(str(folder)) is None  # none made
    folder.mkdir()
    assert checkpoint_left(str(folder)) is None  # made, empty
    for step in (20, 100, 300):  # the Trainer's: the newest whole one (300 has no trainer_state.json)
        (folder / f"checkpoint-{step}").mkdir()
        if step != 300:
            (folder / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    assert checkpoint_left(str(folder)) == str(folder / "checkpoint-100")
    (folder / "keras-epoch-3.weights.h5").write_bytes(b"")
    assert checkpoint_left(str(folder)) == str(folder / "checkpoint-100")  # by number: 100 > 3
    for name in ("lightgbm.txt", "xgboost.ubj", "lightning.ckpt"):  # a callback's file comes first
        (folder / name).write_bytes(b"")
        assert checkpoint_left(str(folder)) == str(folder / name)
    other = tmp_path / "own"
    other.mkdir()
    (other / "model.pt").write_bytes(b"")
    assert checkpoint_left(str(other)) == str(other)  # a script's own files: the folder
