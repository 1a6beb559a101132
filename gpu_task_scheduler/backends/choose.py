"""Which launcher runs a sweep's runs: ``scheduler_config["backend"]``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..engine.launcher import Launcher
from ..errors import GTSError
from ..gpu_task import GPUTask
from ..sweep.options import SchedulerOptions
from .local.launcher import LocalLauncher
from .local.prepare import TaskFactory


@contextlib.contextmanager
def launcher_for(
    options: SchedulerOptions, task: type[GPUTask] | TaskFactory, *, detach: bool = False
) -> Iterator[Launcher]:
    """The local launcher, the Ray one (connected while the ``with`` block runs), or the Slurm one.
    ``detach``: the runs handed to Slurm stay there when the sweep returns (Slurm only)."""
    if detach and options.backend != "slurm":
        raise GTSError("--detach needs backend slurm: only Slurm's runs outlive the scheduler that started them")
    if options.backend == "slurm" and options.slurm is not None and options.slurm.pool is not None:
        from .slurm.pool import PoolLauncher

        with PoolLauncher(task, options, detach=detach) as pool:
            yield pool
    elif options.backend == "slurm":
        from .slurm.launcher import SlurmLauncher

        with SlurmLauncher(task, options, detach=detach) as slurm:
            yield slurm
    elif options.backend == "ray":
        from .ray.launcher import RayLauncher

        with RayLauncher(task, options) as launcher:
            yield launcher
    else:
        yield LocalLauncher(
            task, grace_period=options.grace_period, prewarm=options.prewarm, warm_imports=options.warm_imports
        )
