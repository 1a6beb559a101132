"""The Lightning callback's hooks, for either import path (``lightning.pytorch`` or
``pytorch_lightning``): ``integrations/lightning.py`` and ``integrations/pytorch_lightning.py``
give them the base class of the Lightning the script imports, whose ``Trainer`` checks it."""

from __future__ import annotations

from typing import Any

from ..randomness import random_state, set_random_state
from . import reapply as values
from .common import LIGHTNING, RunSide, checkpoint_path, resumable, saved, say

CHECKPOINT = LIGHTNING
RANDOM = "gpu_task_scheduler_random"  # in the checkpoint: the generators' state (randomness.py)
UNITS = ("epoch", "step")
HINT = "pass ckpt_path=resume_from() to trainer.fit() (from gpu_task_scheduler.integrations.lightning)"


def resume_from() -> str | None:
    """For ``trainer.fit(model, ckpt_path=resume_from())``: the run's checkpoint when this attempt
    goes on from one (a paused run promoted, an interrupted one resumed), else None (a fresh start)."""
    return resumable(CHECKPOINT)


class LightningHooks:
    """Report the logged metrics at each epoch's end, after saving the trainer's checkpoint into the
    run's checkpoint folder; end ``fit()`` cleanly when the run is paused or pruned.

    ``unit``: what a step is, ``"epoch"`` (epochs done, counted from 1, reported at each epoch's
    end, after its validation) or ``"step"`` (the trainer's ``global_step``, reported at each
    validation's end: for validation every N batches). Under DDP
    rank 0 saves and reports, and every rank stops together.

    ``reapply``: when ``fit()`` restores a checkpoint, the optimizers' hyperparameters and the LR
    schedulers' base rates the script set (from this run's config) win over those the checkpoint
    brought back, the schedules going on from their restored step (``integrations/reapply.py``):
    a population-based training member that copied another run's checkpoint trains at its own
    rate. ``reapply=False`` keeps what the checkpoint holds. Either way the log says what was
    restored and what the run trains with.

    Each checkpoint holds the global generators' state (``randomness.random_state``), put back when
    ``fit()`` resumes: a resumed fit draws the batches and dropout masks the uninterrupted one draws."""

    def __init__(self, unit: str = "epoch", reapply: bool = True) -> None:
        super().__init__()
        if unit not in UNITS:
            raise ValueError(f"GTSCallback(unit={unit!r}): give one of {', '.join(map(repr, UNITS))}")
        self.unit, self.reapply = unit, reapply
        self.run = RunSide("Lightning", HINT)
        self._fresh: values.Fresh | None = None
        self._random: Any = None  # the generators' state the restored checkpoint holds

    def _put_back_random(self) -> None:
        """The generators where the uninterrupted fit's stood when it saved the checkpoint (at an
        epoch's end): before the loader's iterator for the next epoch is made (it draws its seed
        then), the sanity check's draws put back by Lightning itself."""
        saved, self._random = self._random, None
        if isinstance(saved, dict):
            set_random_state(saved)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._put_back_random()  # the checkpoint is restored into the callbacks by now
        # Here the optimizers and schedulers are those configure_optimizers() built, and the
        # checkpoint's state is not restored into them yet (it is, before on_train_start).
        if trainer.is_global_zero:
            self.run.check_resumed(trainer.ckpt_path is not None)
        if self.run.active and trainer.ckpt_path is not None:
            self._fresh = values.capture(trainer.optimizers, _schedulers(trainer))
        elif self.run.active:  # a first attempt: its checkpoints carry what a restore needs to know
            values.remember_bases(_schedulers(trainer))

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        # What the next epoch draws (its shuffled batches, its dropout), for a resume. One process
        # only: under DDP rank 0 writes the checkpoint, and its state would be every rank's (their
        # DistributedSampler orders by its seed and the epoch: that resumes exactly all the same).
        if self.run.active and trainer.world_size == 1:
            checkpoint[RANDOM] = random_state()

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self._random = checkpoint.get(RANDOM) if self.run.active else None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._put_back_random()  # a strategy that restores the checkpoint after on_fit_start
        fresh, self._fresh = self._fresh, None
        if fresh is None:
            return
        if not self.reapply:
            line = values.KEPT.format(framework="Lightning")
        else:
            line = values.describe(values.reapply(fresh, trainer.optimizers, _schedulers(trainer)), "Lightning")
        if trainer.is_global_zero:
            say(line)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        # Callbacks hear this before the module's own hook: the epoch's training metrics and its
        # validation's (run before it) are both in trainer.callback_metrics.
        if self.unit == "epoch":
            self._save_and_report(trainer, trainer.current_epoch + 1)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.unit == "step" and not trainer.sanity_checking:
            self._save_and_report(trainer, trainer.global_step)

    def _save_and_report(self, trainer: Any, step: int) -> None:
        path = checkpoint_path(CHECKPOINT)
        if path is None or self.run.stopped is not None:
            return
        trainer.save_checkpoint(saved(path))  # every rank takes part; rank 0 writes
        # Every rank reads the metrics: those logged with sync_dist are reduced across ranks then.
        metrics = dict(trainer.callback_metrics)
        go_on = True
        if trainer.is_global_zero:
            self.run.commit(path, step, metrics)
            go_on = self.run.report(step, metrics)
        if not trainer.strategy.broadcast(go_on, src=0):
            trainer.should_stop = True
            self.run.stopped = self.run.stopped or "stopped"

    @property
    def stopped(self) -> str | None:
        """``"paused"`` or ``"pruned"`` once the scheduler ended this run's training (rank 0)."""
        return self.run.stopped


def _schedulers(trainer: Any) -> list[Any]:
    return [config.scheduler for config in trainer.lr_scheduler_configs]
