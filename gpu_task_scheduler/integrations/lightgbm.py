"""LightGBM: one callback, and the rounds left to train.

::

    from gpu_task_scheduler.integrations.lightgbm import GTSCallback, resume

    booster = lightgbm.train(params, train_set, valid_sets=[valid_set], valid_names=["valid"],
                             callbacks=[GTSCallback()], **resume(num_boost_round=200))

Every ``every`` rounds (and at the last) the callback saves the booster into the run's checkpoint
folder, then reports each validation metric, named ``<data>-<metric>`` (``valid-l2``), at the number
of rounds trained. A paused or pruned run's training ends there (as LightGBM's own early stopping
ends it). ``resume(num_boost_round=N)`` gives ``lightgbm.train`` the saved booster (``init_model``)
and only the rounds left to reach N; on a fresh start, N rounds and no model.
"""

from __future__ import annotations

from typing import Any

import lightgbm

from .common import LIGHTGBM, RunSide, checkpoint_path, rounds, rounds_left, saved

__all__ = ["GTSCallback", "resume"]

CHECKPOINT = LIGHTGBM
HINT = "pass **resume(num_boost_round=N) to lightgbm.train() (from gpu_task_scheduler.integrations.lightgbm)"


def resume(num_boost_round: int) -> dict[str, Any]:
    """``lightgbm.train``'s ``num_boost_round`` (the rounds left to reach it) and ``init_model`` (the
    run's saved booster) when this attempt goes on from a checkpoint; else ``num_boost_round`` alone."""
    return rounds_left(CHECKPOINT, num_boost_round, "init_model", _rounds_in)


def _rounds_in(path: str) -> int:
    return int(lightgbm.Booster(model_file=path).current_iteration())


class GTSCallback:
    """Save the booster, then report, every ``every`` rounds; stop when the run is paused or pruned."""

    order = 25  # after record_evaluation (20), before early_stopping (30)
    before_iteration = False

    def __init__(self, every: int = 1) -> None:
        self.every = rounds(every)
        self.run = RunSide("LightGBM", HINT)
        self._told = False

    def __call__(self, env: Any) -> None:
        if not self._told:
            self._told = True
            self.run.check_resumed(env.begin_iteration > 0)
        path = checkpoint_path(CHECKPOINT)
        rounds = env.iteration + 1
        if path is None or (rounds % self.every and rounds != env.end_iteration):
            return
        env.model.save_model(saved(path))
        results = env.evaluation_result_list or []
        metrics = {f"{data}-{name}": value for data, name, value, *_ in results}
        self.run.commit(path, rounds, metrics)
        if not self.run.report(rounds, metrics):
            raise lightgbm.callback.EarlyStopException(env.iteration, results)

    @property
    def stopped(self) -> str | None:
        """``"paused"`` or ``"pruned"`` once the scheduler ended this run's training."""
        return self.run.stopped
