"""``GPUTaskScheduler``: the original's entry point, over the new engine."""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

from .backends.local.launcher import LocalLauncher
from .backends.local.prepare import TaskFactory
from .engine.hooks import Hooks
from .engine.loop import Scheduler
from .engine.summary import RunOutcome, SweepSummary
from .errors import ConfigError, GTSError, TaskClassError
from .gpu.devices import Slot
from .gpu_task import GPUTask
from .reports.notify import run_notify_command, send_email
from .sweep.commands import CommandTask, check_template
from .sweep.expand import RunSpec, Sweep
from .sweep.files import ConfigSource

logger = logging.getLogger("gpu_task_scheduler")
_FORMAT = "%(asctime)s %(levelname)s %(message)s"
_DATE_FORMAT = "%a, %d %b %Y %H:%M:%S"


def check_task_class(task_class: object) -> type[GPUTask]:
    if not (inspect.isclass(task_class) and issubclass(task_class, GPUTask)):
        raise TaskClassError(
            f"gpu_task_class must be a subclass of gpu_task_scheduler.gpu_task.GPUTask; got {task_class!r}"
        )
    return task_class


class ConsoleFilter(logging.Filter):
    """Keeps per-run lines meant for scheduler.log only (each skipped run) off a console."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "gts_file_only", False)


@contextlib.contextmanager
def scheduler_logging(path: str | None, console: logging.Handler | None = None) -> Iterator[None]:
    """The original's scheduler log: appended to ``path`` and shown on the console.

    Handlers go on this package's logger for the duration of ``start()`` only;
    the root logger is left alone. The console handler is added only when the
    application has not configured logging itself, so nothing prints twice.
    """
    handlers: list[logging.Handler] = []
    if path is not None:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            handlers.append(logging.FileHandler(path, mode="a", encoding="utf-8"))
        except OSError as error:
            raise GTSError(
                f"cannot write the scheduler log {path!r}: {error.strerror or error}; set "
                "scheduler_log_file_path to a writable file, or to null for the console only"
            ) from None
    if console is not None:
        console.addFilter(ConsoleFilter())
        handlers.append(console)
    elif not logging.getLogger().handlers:
        stream = logging.StreamHandler(sys.stderr)
        stream.addFilter(ConsoleFilter())
        handlers.append(stream)
    formatter = logging.Formatter(_FORMAT, datefmt=_DATE_FORMAT)
    previous_level = logger.level
    if previous_level == logging.NOTSET:  # a level the application set on our logger is kept
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


class _Callbacks(Hooks):
    def __init__(
        self,
        hooks: Sequence[Hooks],
        on_run_start: Callable | None = None,
        on_run_end: Callable | None = None,
        on_sweep_end: Callable | None = None,
    ) -> None:
        self._hooks = list(hooks)
        self._functions = {"on_run_start": on_run_start, "on_run_end": on_run_end, "on_sweep_end": on_sweep_end}

    def _each(self, name: str, *args: Any) -> None:
        for hook in self._hooks:
            try:
                getattr(hook, name)(*args)
            except Exception:
                logger.exception("the %s callback raised; the sweep goes on", name)
        function = self._functions.get(name)
        if function is not None:
            function(*args)

    def on_run_start(self, spec: RunSpec, slot: Slot) -> None:
        self._each("on_run_start", spec, slot)

    def on_run_end(self, outcome: RunOutcome) -> None:
        self._each("on_run_end", outcome)

    def on_skip(self, spec: RunSpec) -> None:
        self._each("on_skip", spec)

    def on_sweep_end(self, summary: SweepSummary) -> None:
        self._each("on_sweep_end", summary)

    def close(self) -> None:
        """Let hooks that hold a resource (the live status line's ticker) release it."""
        for hook in self._hooks:
            close = getattr(hook, "close", None)
            if close is not None:
                close()


def _live_status_wanted(choice: bool | None) -> bool:
    """``live_status``: True/False as asked; None (the default): on a terminal where
    the application has not set up logging of its own (our lines would mix with its)."""
    if choice is not None:
        return choice
    from .cli.progress import wanted

    return wanted(sys.stderr) and not logging.getLogger().handlers and logger.level == logging.NOTSET


def import_task(reference: str) -> type[GPUTask]:
    """``"package.module:ClassName"`` -> the class (the current directory is importable, as with ``python -m``)."""
    module_name, _, class_name = reference.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
        task_class = getattr(module, class_name)
    except Exception as error:
        raise ConfigError(f"cannot import the task {reference!r}: {type(error).__name__}: {error}") from error
    return check_task_class(task_class)


def command_factory(sweep: Sweep, command: Any, shell: bool) -> TaskFactory:
    parts = check_template(command, sweep.keys(), shell=shell)

    def make(spec: RunSpec) -> GPUTask:
        return CommandTask(
            copy.deepcopy(spec.config),
            spec.work_dir,
            parts=parts,
            shell=shell,
            run_name=spec.name,
            run_index=spec.index,
        )

    make.__name__ = "CommandTask"
    return make


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
    exception they raise is logged and the sweep goes on.
    """

    def __init__(
        self,
        config: ConfigSource,
        gpu_task_class: type[GPUTask] | None = None,
        *,
        command: Any = None,
        shell: bool | None = None,
        nvml: ModuleType | None = None,
        on_run_start: Callable[[RunSpec, Slot], Any] | None = None,
        on_run_end: Callable[[RunOutcome], Any] | None = None,
        on_sweep_end: Callable[[SweepSummary], Any] | None = None,
        hooks: Sequence[Hooks] = (),
        console: logging.Handler | None = None,
        live_status: bool | None = None,
    ) -> None:
        self._sweep = Sweep(config)
        shell = self._sweep.shell if shell is None else shell
        if gpu_task_class is not None:
            self._make_task: Any = check_task_class(gpu_task_class)
        elif command is not None or self._sweep.command is not None:
            self._make_task = command_factory(
                self._sweep, command if command is not None else self._sweep.command, shell
            )
        elif self._sweep.task_ref is not None:
            self._make_task = import_task(self._sweep.task_ref)
        else:
            raise TaskClassError(
                "no task to run: pass gpu_task_class, or set task ('package.module:Class') or command in the config"
            )
        self._nvml = nvml  # a module with pynvml's interface; the real bindings when None
        hooks = list(hooks)
        if console is None and _live_status_wanted(live_status):
            from .cli.progress import LiveStatus

            status = LiveStatus(len(self._sweep))
            hooks.append(status)
            console = status.log_handler()
        self._hooks = _Callbacks(hooks, on_run_start, on_run_end, on_sweep_end)
        self._console = console

    @property
    def sweep(self) -> Sweep:
        return self._sweep

    def start(self, *, reraise_signals: bool = True) -> SweepSummary:
        """Run the sweep and return its :class:`SweepSummary`.

        Runs that succeeded before are skipped (unless ``force_rerun``); a
        failed run does not stop the others. On Ctrl-C the running runs are
        stopped and ``KeyboardInterrupt`` is raised (with the summary as its
        ``summary`` attribute; a plain ``KeyboardInterrupt``, so that an
        uncaught one ends the process with SIGINT's status); on SIGTERM they
        are stopped and SIGTERM is delivered again to the previous handler (by
        default ending the process); SIGHUP likewise. With ``reraise_signals=False``
        the summary is returned instead (its ``exit_code`` is 130).
        """
        options = self._sweep.options
        launcher = LocalLauncher(self._make_task, grace_period=options.grace_period)
        scheduler = Scheduler(self._sweep, launcher, nvml=self._nvml, hooks=self._hooks)
        try:
            scheduler.setup()  # no GPU for "all": an error before anything is written
            with scheduler_logging(options.scheduler_log_file_path, self._console):
                summary = scheduler.run()
                self._hooks.close()  # the status line's last state, then the summary below it
                (logger.info if summary.ok else logger.error)("%s", summary.report())
                if options.notify_command is not None:
                    run_notify_command(options.notify_command, summary)
                if options.notify_email is not None:
                    send_email(options.notify_email, summary)
        finally:
            self._hooks.close()
        if not reraise_signals or summary.interrupted_by is None:
            return summary
        if summary.interrupted_by == "SIGINT":
            # The summary was logged above; the traceback need not repeat it.
            interrupt = KeyboardInterrupt("the sweep was interrupted (its summary is above and in .summary)")
            interrupt.summary = summary  # type: ignore[attr-defined]
            raise interrupt
        os.kill(os.getpid(), getattr(signal, summary.interrupted_by))  # SIGTERM, SIGHUP: as if we had not caught it
        return summary
