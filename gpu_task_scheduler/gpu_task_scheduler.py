"""``GPUTaskScheduler``: the original's entry point, over the new engine."""
from __future__ import annotations

import contextlib
import inspect
import logging
import os
import signal
import sys
from types import ModuleType
from typing import Iterator, Optional, Type

from .config_files import ConfigSource
from .errors import TaskClassError
from .gpu_task import GPUTask
from .scheduler import Scheduler
from .summary import SweepSummary
from .sweep import Sweep

logger = logging.getLogger("gpu_task_scheduler")
_FORMAT = "%(asctime)s %(levelname)s %(message)s"
_DATE_FORMAT = "%a, %d %b %Y %H:%M:%S"


def check_task_class(task_class: object) -> Type[GPUTask]:
    if not (inspect.isclass(task_class) and issubclass(task_class, GPUTask)):
        raise TaskClassError(
            f"gpu_task_class must be a subclass of gpu_task_scheduler.gpu_task.GPUTask; got {task_class!r}"
        )
    return task_class


@contextlib.contextmanager
def scheduler_logging(path: Optional[str]) -> Iterator[None]:
    """The original's scheduler log: appended to ``path`` and shown on the console.

    Handlers go on this package's logger for the duration of ``start()`` only;
    the root logger is left alone. The console handler is added only when the
    application has not configured logging itself, so nothing prints twice.
    """
    handlers = []
    if path is not None:
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        handlers.append(logging.FileHandler(path, mode="a", encoding="utf-8"))
    if not logging.getLogger().handlers:
        handlers.append(logging.StreamHandler(sys.stderr))
    formatter = logging.Formatter(_FORMAT, datefmt=_DATE_FORMAT)
    previous_level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    for handler in handlers:
        handler.setFormatter(formatter)
        logger.addHandler(handler)
    try:
        yield
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
            handler.close()
        logger.setLevel(previous_level)


class GPUTaskScheduler:
    """Run every run of a sweep with ``gpu_task_class``, in parallel over the slots.

    ``config`` is a dict or the path of a ``.yaml``/``.yml``/``.json``/``.py``
    config file. It is validated here, completely; nothing is written to disk
    until :meth:`start`.
    """

    def __init__(self, config: ConfigSource, gpu_task_class: Type[GPUTask], *,
                 nvml: Optional[ModuleType] = None) -> None:
        self._sweep = Sweep(config)
        self._gpu_task_class = check_task_class(gpu_task_class)
        self._nvml = nvml  # a module with pynvml's interface; the real bindings when None

    @property
    def sweep(self) -> Sweep:
        return self._sweep

    def start(self) -> SweepSummary:
        """Run the sweep and return its :class:`SweepSummary`.

        Runs that succeeded before are skipped (unless ``force_rerun``); a
        failed run does not stop the others. On Ctrl-C the running runs are
        stopped and ``KeyboardInterrupt`` is raised (with the summary as its
        ``summary`` attribute; a plain ``KeyboardInterrupt``, so that an
        uncaught one ends the process with SIGINT's status); on SIGTERM they are stopped and SIGTERM is delivered again to
        the previous handler (by default ending the process).
        """
        scheduler = Scheduler(self._sweep, self._gpu_task_class, nvml=self._nvml)
        scheduler.setup()  # no GPU for "all": an error before anything is written
        with scheduler_logging(self._sweep.options.scheduler_log_file_path):
            summary = scheduler.run()
            (logger.info if summary.ok else logger.error)("%s", summary.report())
        if summary.interrupted_by == "SIGINT":
            interrupt = KeyboardInterrupt(summary.report())
            interrupt.summary = summary  # type: ignore[attr-defined]
            raise interrupt
        if summary.interrupted_by == "SIGTERM":
            os.kill(os.getpid(), signal.SIGTERM)
        return summary
