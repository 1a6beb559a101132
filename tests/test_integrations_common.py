"""What every framework callback shares (gpu_task_scheduler/integrations/common.py), without any
framework: which values are reported, what a run outside a sweep does, where checkpoints are written,
and the checks of a callback's arguments."""

import json
import math
import os

import numpy as np
import pytest
from run_side import RunSide as Scheduler

from gpu_task_scheduler import reporting
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
    side = common.RunSide("Tests", "pass resume=... to fit()")
    side.commit(path, 5, {"loss": 0.25})
    assert not os.path.exists(new) and common.resumable("model.weights.h5") == path
    # Until its report is written, the report of the step the checkpoint holds is kept beside it.
    pending = os.path.join(os.path.dirname(path), reporting.PENDING_REPORT)
    with open(pending) as handle:
        kept = json.load(handle)
    assert kept["checkpoint"] == "model.weights.h5" and json.loads(kept["line"])["step"] == 5
    assert side.report(5, {"loss": 0.25}) and not os.path.exists(pending)
    assert run.lines() == [{"step": 5, "loss": 0.25}]
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


def _pending_run(tmp_path, reported, pending, *, new=False):
    """A run folder whose metrics file holds ``reported`` steps and whose checkpoint folder holds
    ``model.ckpt`` (and its ``.new-`` one, ``new``) and the pending report ``pending`` (bytes, or a
    callable making it at a path)."""
    from gpu_task_scheduler.records.paths import RunPaths

    paths = RunPaths(str(tmp_path / "run"), None)
    os.makedirs(paths.checkpoint)
    with open(paths.metrics, "w") as handle:
        for step in reported:
            handle.write('{"step": 2, "lo' if step == "cut" else json.dumps({"step": step, "loss": 1.0 / step}) + "\n")
    open(os.path.join(paths.checkpoint, "model.ckpt"), "wb").close()
    if new:
        open(os.path.join(paths.checkpoint, ".new-model.ckpt"), "wb").close()
    where = os.path.join(paths.checkpoint, reporting.PENDING_REPORT)
    if callable(pending):
        pending(where)
    elif pending is not None:
        with open(where, "wb") as handle:
            handle.write(pending)
    return paths


def _record(step, name="model.ckpt", **line):
    return json.dumps({"checkpoint": name, "line": reporting.metrics_line(step, {"loss": 0.125, **line})}).encode()


def _link_to_a_good_one(where):
    with open(where + ".elsewhere", "wb") as handle:
        handle.write(_record(3))
    os.symlink(where + ".elsewhere", where)


@pytest.mark.parametrize(
    "reported, pending, new, recorded",
    [
        ([1, 2], _record(3), False, 3),  # killed once the checkpoint was in place: its report recorded
        ([], _record(1), False, 1),  # a first attempt's first step: the same
        ([1, "cut"], _record(3), False, 3),  # after a line cut short: a line of its own
        ([1, 2], _record(3), True, None),  # killed before it was put in place: the old one holds step 2
        ([1, 2, 3], _record(3), False, None),  # killed after its report was written
        ([1, 2], None, False, None),  # nothing pending
        ([1, 2], _record(3)[:-9], False, None),  # half written (killed while it was written)
        ([1, 2], b"[" * 200_000, False, None),  # hostile: no record
        ([1, 2], _record(3, name="../model.ckpt"), False, None),  # hostile: a name outside the folder
        ([1, 2], _record(3, name="gone.ckpt"), False, None),  # names no checkpoint there
        ([1, 2], b'{"checkpoint": "model.ckpt", "line": "{\\"step\\": 3}\\n{\\"step\\": 4}\\n"}', False, None),
        ([1, 2], _record(3) + b" " * (1 << 17), False, None),  # too long to be one
        ([1, 2], _link_to_a_good_one, False, None),  # a link: not followed
        ([1, 2], os.mkfifo, False, None),  # a FIFO: never opened (that would block)
    ],
    ids=[
        "in-place",
        "first-step",
        "after-a-cut-line",
        "not-in-place",
        "reported",
        "none",
        "half-written",
        "no-record",
        "outside",
        "no-such-checkpoint",
        "two-lines",
        "too-long",
        "a-link",
        "a-fifo",
    ],
)
def test_a_checkpoint_put_in_place_as_its_run_was_killed_has_its_report_recorded(
    tmp_path, reported, pending, new, recorded
):
    """A callback's attempt killed after it put a step's checkpoint in place and before it reported
    that step: before the next attempt goes on from the checkpoint, the scheduler records the report
    kept beside it, so that the attempt goes on from the step the checkpoint holds, and that step's
    report is the one the run made. Nothing else is recorded, hostile or not; what is pending goes."""
    from gpu_task_scheduler.records.metrics import run_points
    from gpu_task_scheduler.records.resume import last_step, settle_pending_report

    paths = _pending_run(tmp_path, reported, pending, new=new)
    assert settle_pending_report(paths) == recorded
    reported = [step for step in reported if step != "cut"]
    steps = [step for step, _ in run_points(paths)]
    assert steps == (reported + [recorded] if recorded is not None else reported)
    assert last_step(paths) == (recorded if recorded is not None else reported[-1] if reported else None)
    if recorded is not None:
        assert run_points(paths)[-1][1] == {"loss": 0.125}  # the run's own values
    assert not os.path.lexists(os.path.join(paths.checkpoint, reporting.PENDING_REPORT))


def test_no_pending_report_is_trusted_in_a_checkpoint_folder_that_is_a_link(tmp_path):
    from gpu_task_scheduler.records.paths import RunPaths
    from gpu_task_scheduler.records.resume import settle_pending_report

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "model.ckpt").write_bytes(b"")
    (elsewhere / reporting.PENDING_REPORT).write_bytes(_record(3))
    paths = RunPaths(str(tmp_path / "run"), None)
    os.makedirs(paths.meta)
    os.symlink(elsewhere, paths.checkpoint)
    assert settle_pending_report(paths) is None and not os.path.exists(paths.metrics)
    assert (elsewhere / reporting.PENDING_REPORT).exists()  # nothing outside the run is touched


def test_the_generators_state_is_put_back_exactly_and_loads_with_weights_only(tmp_path):
    """random_state() / set_random_state(): Python's, NumPy's and torch's generators go on from where
    they stood when the state was taken, through a torch.save and a torch.load(weights_only=True)."""
    import random

    torch = pytest.importorskip("torch")
    from gpu_task_scheduler import random_state, set_random_state

    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1), np.random.standard_normal()  # each holds a cached draw now
    torch.save(random_state(), tmp_path / "random.pt")
    expected = (random.gauss(0, 1), random.random(), np.random.standard_normal(), torch.rand(3).tolist())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    set_random_state(torch.load(tmp_path / "random.pt", weights_only=True))
    assert (random.gauss(0, 1), random.random(), np.random.standard_normal(), torch.rand(3).tolist()) == expected
    with pytest.raises(TypeError, match="takes what random_state"):
        set_random_state([1, 2])
