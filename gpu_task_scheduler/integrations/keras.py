"""Keras 3: one callback, which also resumes the model.

::

    from gpu_task_scheduler.integrations.keras import GTSCallback

    model.fit(x, y, epochs=12, validation_data=(vx, vy), callbacks=[GTSCallback()])

At each epoch's end the callback saves the model's weights and its optimizer's state into the run's
checkpoint folder, then reports the epoch's logs (``loss``, ``val_loss``, ...) at the epochs done,
counted from 1. A paused or pruned run's ``fit()`` returns there. When the attempt goes on from a
checkpoint, the callback loads it into the model at ``fit()``'s start and ``fit()`` goes on with the
next epoch, as Keras's own ``BackupAndRestore`` does; unlike it, the callback never deletes the
checkpoint when ``fit()`` ends, so a run paused at a rung resumes after its clean stop. The model
must be built (called on a batch, or given an ``Input``) before ``fit()``.
"""

from __future__ import annotations

import os
from typing import Any

import keras

from . import reapply as values
from .common import KERAS, RunSide, checkpoint_dir, resume_step, saved, say

__all__ = ["GTSCallback"]

NAME = KERAS


def checkpoints(folder: str) -> dict[int, str]:
    """The epochs of the checkpoints in ``folder`` and their files (each written whole, by a rename)."""
    found = {}
    for name in os.listdir(folder):
        match = NAME.fullmatch(name)
        if match:
            found[int(match.group(1))] = os.path.join(folder, name)
    return found


class GTSCallback(keras.callbacks.Callback):
    """Save (weights and optimizer), then report, at each epoch's end; stop when the run is paused
    or pruned; resume the model at ``fit()``'s start when the attempt goes on from a checkpoint.

    ``reapply``: the optimizer's variables restored with the weights include its learning rate
    (when it is a number; a ``LearningRateSchedule`` is the script's own object, not restored, and
    goes on from the restored ``iterations``): the rate this run's script set wins over the
    restored one, so a population-based training member that copied another run's checkpoint
    trains at its own rate. Its other hyperparameters (``weight_decay``, ``beta_1``, ...) are not
    in the checkpoint. ``reapply=False`` keeps the restored rate. The log says which it is."""

    def __init__(self, reapply: bool = True) -> None:
        super().__init__()
        self.run = RunSide("Keras", "")
        self.reapply = reapply
        self._resumed = False

    def on_train_begin(self, logs: Any = None) -> None:
        folder, step = checkpoint_dir(), resume_step()
        if folder is None or step is None:
            return
        saved_epochs = checkpoints(folder)
        if not saved_epochs:
            say(
                f"this attempt should go on from step {step:g} but {folder} holds no Keras checkpoint: it starts afresh"
            )
            return
        epoch = max(saved_epochs)
        if not self.model.built:
            raise ValueError(
                "GTSCallback resumes the model: build it before fit() (call it on a batch, or give it an Input)"
            )
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)  # so that its state loads too
        fresh = _rate(optimizer)
        self.model.load_weights(saved_epochs[epoch])
        if fresh is not None:
            say(self._put_back(optimizer, fresh))
        elif optimizer is not None:
            say(
                "the learning rate is this run's own schedule (a schedule is not in the checkpoint); it goes on "
                f"from the restored iteration {int(keras.ops.convert_to_numpy(optimizer.iterations))}"
            )
        self.model._initial_epoch = epoch  # what fit() goes on from (as keras.callbacks.BackupAndRestore sets it)
        self._resumed = True
        say(f"Keras goes on after epoch {epoch}, from {saved_epochs[epoch]}")

    def _put_back(self, optimizer: Any, fresh: float) -> str:
        if not self.reapply:
            return values.KEPT.format(framework="Keras")
        restored = _rate(optimizer)
        if restored is None or restored == fresh:
            return values.describe([], "Keras")
        optimizer.learning_rate = fresh
        return values.describe([values.Change(name="learning_rate", restored=restored, fresh=fresh)], "Keras")

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        folder = checkpoint_dir()
        if folder is None or self.run.stopped is not None:
            return
        path = os.path.join(folder, f"keras-epoch-{epoch + 1}.weights.h5")
        self.model.save_weights(saved(path))
        self.run.commit(path, epoch + 1, logs or {})
        for done, old in checkpoints(folder).items():
            if done != epoch + 1:
                os.unlink(old)
        if not self.run.report(epoch + 1, logs or {}):
            self.model.stop_training = True

    def on_train_end(self, logs: Any = None) -> None:
        if self._resumed:  # a later fit() of the same model starts where it is told to
            self.model._initial_epoch = None
            self._resumed = False

    @property
    def stopped(self) -> str | None:
        """``"paused"`` or ``"pruned"`` once the scheduler ended this run's training."""
        return self.run.stopped


def _rate(optimizer: Any) -> float | None:
    """The optimizer's learning rate when it is a variable (restored with the weights); None for a
    schedule or a callable, or no optimizer."""
    if optimizer is None or not isinstance(getattr(optimizer, "_learning_rate", None), keras.Variable):
        return None
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))
