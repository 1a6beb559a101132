"""Reporting metrics as a run trains: ``gpu_task_scheduler.report(step, loss=0.23)``.

Each call appends one line, ``{"step": 12, "loss": 0.23}``, to the file the
environment variable ``GTS_METRICS_FILE`` names (the scheduler sets it for
every run: ``<run>/.gts/metrics.jsonl``). Outside a sweep the variable is
unset and a call does nothing, so a training script runs by hand unchanged.
Any program in any language can do the same: append one JSON object per
line, with a numeric ``step`` that never goes back and numeric values.

In a ``GPUTask``, ``self.report(step, **metrics)`` is the same call.

With ``early_stop`` in the config, the scheduler may stop a run early: it
writes the reason to the file ``GTS_PRUNE_FILE`` names, and the run's next
``report()`` raises :class:`Pruned` there (a ``BaseException``, so an
``except Exception`` in the training loop does not swallow it; catch it by
name to save a checkpoint, then return or re-raise). A run that does not
report again within the sweep's ``grace_period`` gets SIGTERM, then SIGKILL,
as commands do at once.
"""

from __future__ import annotations

import json
import math
import os

METRICS_ENV = "GTS_METRICS_FILE"
PRUNE_ENV = "GTS_PRUNE_FILE"
_CAUSE_BYTES = 4096


class Pruned(BaseException):
    """The scheduler stopped this run early (``early_stop``): raised by ``report()``.

    ``str(error)`` says why, e.g. ``pruned at step 3: loss 1.92, rung cutoff 0.87``."""


_pruned: str | None = None  # the cause, once report() raised Pruned in this process


def pruned_cause() -> str | None:
    """Why this run was stopped early, if ``report()`` raised :class:`Pruned` in this process."""
    return _pruned


def report(step: float, **metrics: float) -> None:
    """Record ``metrics`` at ``step`` for this run (nothing outside a sweep).

    Values must be finite numbers (a tensor's ``.item()``, a float); a value the
    scheduler would skip is an error here, where it can be fixed.
    """
    path = os.environ.get(METRICS_ENV)
    _check("step", step)
    for name, value in metrics.items():
        _check(name, value)
    if not path:
        return
    line = json.dumps({"step": step, **metrics}) + "\n"
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, line.encode())  # one write of one line: lines of concurrent writers never interleave
    finally:
        os.close(fd)
    _raise_if_pruned()


def _raise_if_pruned() -> None:
    global _pruned
    marker = os.environ.get(PRUNE_ENV)
    if not marker:
        return
    try:
        fd = os.open(marker, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:  # none yet (the cost of the check: one failed open)
        return
    try:
        cause = os.read(fd, _CAUSE_BYTES).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)
    _pruned = cause or "pruned"
    raise Pruned(_pruned)


def _check(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(
            f"report(): {name}={value!r} is not a finite number (a tensor? pass tensor.item(); a NaN? "
            "report it only when it is a number)"
        )
