"""Which launcher runs a sweep's runs: ``scheduler_config["backend"]``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..engine.launcher import Launcher
from ..gpu_task import GPUTask
from ..sweep.options import SchedulerOptions
from .local.launcher import LocalLauncher
from .local.prepare import TaskFactory


@contextlib.contextmanager
def launcher_for(options: SchedulerOptions, task: type[GPUTask] | TaskFactory) -> Iterator[Launcher]:
    """The local launcher, or the Ray one (connected while the ``with`` block runs)."""
    if options.backend == "ray":
        from .ray.launcher import RayLauncher

        with RayLauncher(task, options) as launcher:
            yield launcher
    else:
        yield LocalLauncher(task, grace_period=options.grace_period, prewarm=options.prewarm)
