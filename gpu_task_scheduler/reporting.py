"""Reporting metrics as a run trains: ``gpu_task_scheduler.report(step, loss=0.23)``.

Each call appends one line, ``{"step": 12, "loss": 0.23}``, to the file the
environment variable ``GTS_METRICS_FILE`` names (the scheduler sets it for
every run: ``<run>/.gts/metrics.jsonl``). Outside a sweep the variable is
unset and a call does nothing, so a training script runs by hand unchanged.
Any program in any language can do the same: append one JSON object per
line, with a numeric ``step`` that never goes back and numeric values.

In a ``GPUTask``, ``self.report(step, **metrics)`` is the same call.
"""

from __future__ import annotations

import json
import math
import os

METRICS_ENV = "GTS_METRICS_FILE"


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


def _check(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(
            f"report(): {name}={value!r} is not a finite number (a tensor? pass tensor.item(); a NaN? "
            "report it only when it is a number)"
        )
