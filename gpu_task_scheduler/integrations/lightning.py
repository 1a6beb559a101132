"""Lightning: one callback, and the checkpoint to resume from.

::

    from gpu_task_scheduler.integrations.lightning import GTSCallback, resume_from

    trainer = lightning.Trainer(max_epochs=27, callbacks=[GTSCallback()])
    trainer.fit(model, datamodule, ckpt_path=resume_from())

At each validation's end the callback saves the trainer's checkpoint into the run's checkpoint
folder, then reports ``trainer.callback_metrics`` at the epoch (``GTSCallback(unit="step")``: at the
global step). A paused or pruned run's ``fit()`` returns; the run is recorded ``paused`` or
``pruned``. For scripts that import ``pytorch_lightning``: ``integrations.pytorch_lightning``.
"""

from __future__ import annotations

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # only the older package
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment,no-redef,unused-ignore]

from .lightning_hooks import LightningHooks, resume_from

__all__ = ["GTSCallback", "resume_from"]


class GTSCallback(LightningHooks, Callback):
    __doc__ = LightningHooks.__doc__
