"""XGBoost: one callback, and the rounds left to train.

::

    from gpu_task_scheduler.integrations.xgboost import GTSCallback, resume

    booster = xgboost.train(params, dtrain, evals=[(dvalid, "valid")], callbacks=[GTSCallback()],
                            **resume(num_boost_round=200))

Every ``every`` rounds (and at the last) the callback saves the booster into the run's checkpoint
folder, then reports the latest value of each evaluation metric, named ``<data>-<metric>``
(``valid-rmse``) at the number of rounds trained. A paused or pruned run's training ends there.
``resume(num_boost_round=N)`` gives ``xgboost.train`` the saved booster (``xgb_model``) and only the
rounds left to reach N; on a fresh start, N rounds and no model. The scikit-learn estimators take the
same callback (``XGBRegressor(callbacks=[GTSCallback()])``; ``fit(..., xgb_model=...)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import xgboost

from .common import XGBOOST, RunSide, checkpoint_path, rounds, rounds_left, saved

__all__ = ["GTSCallback", "resume"]

CHECKPOINT = XGBOOST
HINT = "pass **resume(num_boost_round=N) to xgboost.train() (from gpu_task_scheduler.integrations.xgboost)"


def resume(num_boost_round: int) -> dict[str, Any]:
    """``xgboost.train``'s ``num_boost_round`` (the rounds left to reach it) and ``xgb_model`` (the
    run's saved booster) when this attempt goes on from a checkpoint; else ``num_boost_round`` alone."""
    return rounds_left(CHECKPOINT, num_boost_round, "xgb_model", _rounds_in)


def _rounds_in(path: str) -> int:
    return int(xgboost.Booster(model_file=path).num_boosted_rounds())


def latest(evals_log: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The latest value of each metric of an ``evals_log``, as ``<data>-<metric>`` (a cross-validation's
    ``(mean, std)``: its mean)."""
    found = {}
    for data, metrics in evals_log.items():
        for metric, values in metrics.items():
            if len(values):
                value = values[-1]
                found[f"{data}-{metric}"] = value[0] if isinstance(value, tuple) else value
    return found


class GTSCallback(xgboost.callback.TrainingCallback):
    """Save the booster, then report, every ``every`` rounds; stop when the run is paused or pruned."""

    def __init__(self, every: int = 1) -> None:
        super().__init__()
        self.every = rounds(every)
        self.run = RunSide("XGBoost", HINT)
        self._log: Any = {}

    def before_training(self, model: Any) -> Any:
        self.run.check_resumed(model.num_boosted_rounds() > 0)
        return model

    def after_iteration(self, model: Any, epoch: int, evals_log: Any) -> bool:
        self._log = evals_log
        if model.num_boosted_rounds() % self.every:
            return False
        return not self._save_and_report(model)

    def after_training(self, model: Any) -> Any:
        if model.num_boosted_rounds() % self.every and self.run.stopped is None:
            self._save_and_report(model)  # the last rounds, past the last multiple of every
        return model

    def _save_and_report(self, model: Any) -> bool:
        path = checkpoint_path(CHECKPOINT)
        if path is None:
            return True
        model.save_model(saved(path))
        step, metrics = model.num_boosted_rounds(), latest(self._log)
        self.run.commit(path, step, metrics)
        return self.run.report(step, metrics)

    @property
    def stopped(self) -> str | None:
        """``"paused"`` or ``"pruned"`` once the scheduler ended this run's training."""
        return self.run.stopped
