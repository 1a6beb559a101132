"""What decides a run's next random numbers, to save with its checkpoint and put back at its resume,
so that a paused, promoted, copied or killed run draws what the uninterrupted one would have drawn
(its shuffled batches, its dropout masks):

    state = {"model": ..., "optimizer": ..., "epoch": epoch, "random": random_state()}
    torch.save(state, path)                      # save, then report
    ...
    set_random_state(torch.load(path, weights_only=False)["random"])   # at the resume

:func:`random_state` holds Python's ``random``, NumPy's global generator and torch's CPU generator
and every CUDA device's, each where the run has imported it; only plain numbers, lists and torch
tensors, so a ``torch.load(..., weights_only=True)`` reads it too. A generator of the script's own
(a ``torch.Generator`` given to a ``DataLoader``, a ``numpy.random.Generator``) is its own to save:
nothing here can find it. The framework callbacks (``integrations``) save and restore it for you.
"""

from __future__ import annotations

import random
import sys
from typing import Any

__all__ = ["random_state", "set_random_state"]


def random_state() -> dict[str, Any]:
    """The state of every global generator the process has imported (see the module's text)."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(internal), gauss]}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        name, keys, position, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = [name, [int(key) for key in keys], int(position), int(has_gauss), float(cached)]
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_random_state(state: dict[str, Any]) -> None:
    """Put back what :func:`random_state` gave. A part of it for a library this process has not
    imported is imported to be set (the run imports it to draw from it anyway); CUDA's states are
    set on as many devices as both the state and this process have."""
    if not isinstance(state, dict):
        raise TypeError(f"set_random_state() takes what random_state() gave (a dict), not {type(state).__name__}")
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        import numpy

        name, keys, position, has_gauss, cached = state["numpy"]
        numpy.random.set_state((name, numpy.asarray(keys, dtype=numpy.uint32), position, has_gauss, cached))
    if "torch" in state:
        import torch

        torch.set_rng_state(state["torch"])
        if state.get("cuda") and torch.cuda.is_available():
            for device, device_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(device_state, device)
