"""The XGBoost and LightGBM callbacks, against the real libraries: a pause and a resume give the
uninterrupted run's booster and numbers, no round is trained twice, a pruned run ends cleanly,
``every`` reports every N rounds and the last, and a forgotten resume is said in the log."""

import importlib
import os
import shutil

import pytest
from run_side import RunSide, framework

from gpu_task_scheduler import reporting

# the example's train() arguments for one configuration, and its metric
CASES = {
    "xgboost": ({"eta": 0.3, "max_depth": 4}, "valid-rmse"),
    "lightgbm": ({"learning_rate": 0.3, "num_leaves": 15}, "valid-l2"),
}


@pytest.fixture(params=sorted(CASES))
def case(request, tmp_path, monkeypatch):
    example = framework(request.param)
    integration = importlib.import_module(f"gpu_task_scheduler.integrations.{request.param}")
    params, metric = CASES[request.param]
    return example, integration, params, metric, RunSide(tmp_path, monkeypatch)


def test_a_paused_and_resumed_booster_is_the_uninterrupted_one(case):
    example, _, params, metric, run = case
    whole = example.train(**params, rounds=12)
    run.attempt_at(pause_at=5)
    first = example.train(**params, rounds=12)
    assert first["rounds"] == 5 and run.steps() == [1, 2, 3, 4, 5]
    assert reporting.paused_cause() == "paused at rung 5"
    run.attempt_at(resume=5)
    second = example.train(**params, rounds=12)
    assert run.steps() == list(range(6, 13)) and second["rounds"] == 12  # each round trained once
    assert second[metric] == pytest.approx(whole[metric], rel=1e-9)
    assert run.lines()[-1][metric] == pytest.approx(whole[metric], rel=1e-6)


def test_a_pruned_booster_ends_cleanly(case):
    example, _, params, _, run = case
    run.attempt_at(prune_at=3)
    assert example.train(**params, rounds=12)["rounds"] == 3 and run.steps() == [1, 2, 3]
    assert reporting.pruned_cause() == "pruned at step 3"


def test_every_n_rounds_and_the_last(case, monkeypatch):
    example, integration, params, _, run = case
    run.attempt_at()
    real = integration.GTSCallback
    monkeypatch.setattr(example, "GTSCallback", lambda: real(every=5))
    example.train(**params, rounds=12)
    assert run.steps() == [5, 10, 12]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="a whole number of rounds"):
            real(every=bad)


def test_a_forgotten_resume_is_said_in_the_log(case, capfd, monkeypatch):
    example, integration, params, _, run = case
    run.attempt_at(pause_at=2)
    example.train(**params, rounds=4)
    run.attempt_at(resume=2)
    real = integration.resume
    monkeypatch.setattr(example, "resume", lambda num_boost_round: {"num_boost_round": num_boost_round})
    example.train(**params, rounds=4)
    said = capfd.readouterr().err
    assert "was not given the run's checkpoint, so it trains again from the start" in said
    assert "pass **resume(num_boost_round=N)" in said
    assert real(num_boost_round=4)["num_boost_round"] == 0  # the checkpoint holds all 4 rounds now


def test_a_member_that_copied_a_booster_trains_its_next_rounds_at_its_own_rate(case):
    """Population-based training's copy, as the member sees it: its checkpoint folder holds the
    donor's booster after 5 rounds. The booster file holds no training parameters that win over
    the script's: resumed at the donor's rate it is the donor's uninterrupted booster; resumed at
    half that rate, its 7 rounds after the copy are other rounds."""
    example, _, params, metric, run = case
    rate = "eta" if "eta" in params else "learning_rate"
    whole = example.train(**params, rounds=12)
    run.attempt_at(pause_at=5)
    example.train(**params, rounds=12)
    folder = os.path.join(run.folder, "checkpoint")
    shutil.copytree(folder, folder + ".copy")
    ended = {}
    for factor in (1.0, 0.5):
        shutil.rmtree(folder)
        shutil.copytree(folder + ".copy", folder)
        run.attempt_at(resume=5)
        ended[factor] = example.train(**{**params, rate: params[rate] * factor}, rounds=12)
        assert run.steps() == list(range(6, 13)) and ended[factor]["rounds"] == 12
    assert ended[1.0][metric] == pytest.approx(whole[metric], rel=1e-9)  # the copy holds the donor's state
    assert ended[0.5][metric] != pytest.approx(whole[metric], rel=1e-3)  # and its own rate trained after it
