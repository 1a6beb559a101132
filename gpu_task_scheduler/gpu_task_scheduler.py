"""``GPUTaskScheduler``: the original's entry point, a thin layer over ``engine/api.py``."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from .backends.choose import launcher_for
from .backends.local.prepare import unguarded_start_problem
from .backends.local.tasks import resolve_task
from .engine.api import check_root, reraise_interruption, run_sweep
from .engine.hooks import HookList, Hooks
from .engine.summary import RunOutcome, SweepSummary
from .errors import TaskClassError
from .gpu.devices import Slot
from .gpu_task import GPUTask
from .sweep.expand import RunSpec, Sweep
from .sweep.files import ConfigSource


class GPUTaskScheduler:
    """Run every run of a sweep, in parallel over the slots.

    ``config`` is a dict or the path of a ``.yaml``/``.yml``/``.json``/``.py``
    config file. Each run is ``gpu_task_class``'s ``main()``, or, without a
    class, the config's ``task`` (``"package.module:Class"``) or ``command``
    template (also given here as ``command=``, see ``sweep/commands.py``). The
    config is validated here, completely; nothing is written to disk until
    :meth:`start`.

    ``on_run_start(spec, slot)``, ``on_run_end(outcome)`` and
    ``on_sweep_end(summary)`` are called in the scheduler process; an
    exception they raise is logged and the sweep goes on. ``live_status``: a
    redrawn status line on the console (None: on a terminal, unless the
    application set up logging).
    """

    def __init__(
        self,
        config: ConfigSource,
        gpu_task_class: type[GPUTask] | None = None,
        *,
        command: Any = None,
        shell: bool | None = None,
        nvml: ModuleType | None = None,  # a module with pynvml's interface; the real bindings when None
        on_run_start: Callable[[RunSpec, Slot], Any] | None = None,
        on_run_end: Callable[[RunOutcome], Any] | None = None,
        on_sweep_end: Callable[[SweepSummary], Any] | None = None,
        hooks: Sequence[Hooks] = (),
        console: logging.Handler | None = None,
        live_status: bool | None = None,
    ) -> None:
        self.sweep = Sweep(config)
        check_root(self.sweep)
        self._make_task = resolve_task(self.sweep, gpu_task_class, command=command, shell=shell)
        self._classes = [gpu_task_class] if gpu_task_class is not None else []
        self._classes += [stage.task_ref for stage in self.sweep.stages if isinstance(stage.task_ref, type)]
        self._nvml, hooks = nvml, list(hooks)
        if console is None:
            from .cli.progress import live_status as status_line

            status = status_line(len(self.sweep), live_status)
            if status is not None:
                hooks.append(status)
                console = status.log_handler()
        self._hooks = HookList(hooks, on_run_start=on_run_start, on_run_end=on_run_end, on_sweep_end=on_sweep_end)
        self._console = console

    def start(self, *, reraise_signals: bool = True) -> SweepSummary:
        """Run the sweep and return its :class:`SweepSummary`.

        Runs that succeeded before are skipped (unless ``force_rerun``); a failed run does not
        stop the others. On Ctrl-C the runs are stopped and ``KeyboardInterrupt`` is raised (its
        ``summary`` attribute is the summary); on SIGTERM or SIGHUP they are stopped and the
        signal goes on to the previous handler. ``reraise_signals=False``: return the summary.
        """
        if self.sweep.options.backend != "ray":  # Ray carries a script's classes by value
            problem = unguarded_start_problem(self._classes, sys._getframe(1))
            if problem is not None:
                raise TaskClassError(problem)
        with launcher_for(self.sweep.options, self._make_task) as launcher:
            summary = run_sweep(self.sweep, launcher, hooks=self._hooks, nvml=self._nvml, console=self._console)
        if reraise_signals:
            reraise_interruption(summary)
        return summary
