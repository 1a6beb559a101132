"""Lightning imported as ``pytorch_lightning``: the same callback as ``integrations.lightning``,
on that package's ``Callback`` (a ``pytorch_lightning.Trainer`` takes no other)."""

from __future__ import annotations

from pytorch_lightning.callbacks import Callback

from .lightning_hooks import LightningHooks, resume_from

__all__ = ["GTSCallback", "resume_from"]


class GTSCallback(LightningHooks, Callback):
    __doc__ = LightningHooks.__doc__
