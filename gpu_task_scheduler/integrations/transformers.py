"""The Hugging Face ``Trainer``: one callback, and the checkpoint to resume from.

::

    from gpu_task_scheduler.integrations.transformers import GTSCallback, resume_from

    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=valid, callbacks=[GTSCallback()])
    trainer.train(resume_from_checkpoint=resume_from())

At each evaluation the callback has the Trainer save a checkpoint (``control.should_save``), then
reports the evaluation's metrics (``eval_loss``, ...) once it is saved: at the epoch with
``eval_strategy="epoch"``, else at the global step. A paused or pruned run's training ends there
(``control.should_training_stop``); the run is recorded ``paused`` or ``pruned``.

In a sweep the Trainer's ``output_dir`` becomes the run's checkpoint folder (the log says so): that
is where every checkpoint the run may resume from must be, and where population-based training
copies one from. Outside a sweep it is left as it is. ``save_total_limit`` bounds what it holds.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from . import reapply as values
from .common import RunSide, checkpoint_dir, newest_trainer_checkpoint, resume_step, say

__all__ = ["GTSCallback", "resume_from"]

HINT = (
    "pass resume_from_checkpoint=resume_from() to trainer.train() (from gpu_task_scheduler.integrations.transformers)"
)


def resume_from() -> str | None:
    """For ``trainer.train(resume_from_checkpoint=resume_from())``: the run's newest whole checkpoint
    when this attempt goes on from one, else None (a fresh start)."""
    folder, step = checkpoint_dir(), resume_step()
    if folder is None or step is None:
        return None
    newest = newest_trainer_checkpoint(folder, os.listdir(folder))
    if newest is None:
        say(f"this attempt goes on from step {step:g} but {folder} holds no whole Trainer checkpoint: a fresh start")
        return None
    return os.path.join(folder, newest[1])


class GTSCallback(TrainerCallback):
    """Save, then report, at each evaluation; stop training when the run is paused or pruned.

    ``reapply``: when ``train()`` resumes from a checkpoint, the optimizer's hyperparameters and
    the LR scheduler's base rates of this run (``args.learning_rate``, ``args.weight_decay``,
    ``adam_beta1``/``adam_beta2``/``adam_epsilon``; or those of the optimizer and scheduler given
    in ``optimizers=``) win over those restored from ``optimizer.pt`` and ``scheduler.pt``, the
    schedule going on from its restored step (``integrations/reapply.py``). ``reapply=False``
    keeps what the checkpoint holds. Either way the log says what the run trains with."""

    def __init__(self, reapply: bool = True) -> None:
        self.run = RunSide("the Trainer", HINT)
        self.reapply = reapply
        self._pending: tuple[float, dict[str, Any]] | None = None
        self._given: values.Fresh | None = None  # the optimizer and scheduler given to the Trainer, as built

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = checkpoint_dir()
        if folder is None:
            return
        optimizer, scheduler = kwargs.get("optimizer"), kwargs.get("lr_scheduler")
        if optimizer is not None:  # optimizers=(optimizer, scheduler): not built from args
            self._given = values.capture([optimizer], [scheduler] if scheduler is not None else [])
        if str(getattr(args, "save_strategy", "")).lower().endswith("best"):
            raise ValueError(
                'GTSCallback saves a checkpoint at each evaluation, before it reports it: save_strategy="best" '
                "would skip those saves (use save_total_limit to bound what is kept)"
            )
        if os.path.abspath(args.output_dir) != os.path.abspath(folder):
            say(f"the Trainer's output_dir is the run's checkpoint folder {folder} (instead of {args.output_dir})")
            args.output_dir = folder

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The Trainer calls this once optimizer.pt and scheduler.pt are loaded.
        resumed = state.global_step > 0
        if state.is_world_process_zero:
            self.run.check_resumed(resumed)
        optimizer, scheduler = kwargs.get("optimizer"), kwargs.get("lr_scheduler")
        if self.run.active and not resumed and scheduler is not None:  # its checkpoints carry its base
            values.remember_bases([scheduler])
        if not (self.run.active and resumed and optimizer is not None):
            return
        schedulers = [scheduler] if scheduler is not None else []
        if not self.reapply:
            line = values.KEPT.format(framework="the Trainer")
        else:
            fresh = self._given or _from_args(args, optimizer, schedulers)
            line = values.describe(values.reapply(fresh, [optimizer], schedulers), "the Trainer")
        if state.is_world_process_zero:
            say(line)

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        if checkpoint_dir() is None or self.run.stopped is not None:
            return
        by_epoch = str(getattr(args, "eval_strategy", "")).lower().endswith("epoch")
        step = round(state.epoch) if by_epoch and state.epoch is not None else state.global_step
        self._pending = (step, dict(metrics or {}))
        control.should_save = True  # saved right after this evaluation; reported once saved (on_save)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        go_on = True
        if state.is_world_process_zero:  # the Trainer put checkpoint-<global step> in place just now
            self.run.pend(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"), *pending)
            go_on = self.run.report(*pending)
        if not _agreed(go_on):  # every process stops with the first (it alone reports)
            control.should_training_stop = True
            self.run.stopped = self.run.stopped or "stopped"

    @property
    def stopped(self) -> str | None:
        """``"paused"`` or ``"pruned"`` once the scheduler ended this run's training."""
        return self.run.stopped


def _agreed(go_on: bool) -> bool:
    """The first process's word, in every process of a distributed run (each calls this at the same
    save); a process's own where it runs alone."""
    try:
        import torch.distributed as dist
    except ImportError:
        return go_on
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return go_on
    word = [go_on]
    dist.broadcast_object_list(word, src=0)
    return bool(word[0])


def _from_args(args: Any, optimizer: Any, schedulers: list[Any]) -> values.Fresh:
    """What the Trainer builds from ``args`` (``Trainer.create_optimizer``): every group at
    ``learning_rate``; the first group (the decayed parameters), and any other whose decay is not
    0, at ``weight_decay``; Adam's ``betas`` and ``eps`` from ``adam_beta1``, ``adam_beta2`` and
    ``adam_epsilon``. Other values stay as restored."""
    from_args = {"betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}
    groups = []
    for place, group in enumerate(optimizer.param_groups):
        fresh = values.hyperparameters(group)
        fresh.update({name: value for name, value in from_args.items() if name in fresh})
        fresh.update({name: args.learning_rate for name in values.RATE_KEYS if name in fresh})
        if "weight_decay" in fresh and (place == 0 or fresh["weight_decay"] != 0):
            fresh["weight_decay"] = args.weight_decay
        groups.append(fresh)
    rates = [float(args.learning_rate)] * len(groups)
    bases = [(0, list(rates)) for scheduler in schedulers if hasattr(scheduler, "base_lrs")]
    return values.Fresh(groups=[groups], schedulers=bases)
