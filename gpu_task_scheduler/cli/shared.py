"""What the ``gts`` subcommands share: the parser's class and layout, exit codes, the options several
commands take (``--gpus``, a result root or the config that names it) and running a sweep with the
status line. Each subcommand is a module of cli/commands/."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

from ..engine.logs import plain_console_logging
from ..errors import ConfigError, GTSError, NoGpuError
from ..sweep.files import load_config

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits 2 too; keep its message, add the hint
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n(see {self.prog} --help)\n")


def formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32, width=columns() - 2)


def columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size`` gives it (argparse's own default).
    argparse makes a formatter for each option it adds, and its default width imports shutil
    (and with it zlib, bz2 and lzma): 2 ms of every start of ``gts``."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):  # no stdout (None), closed, or not a terminal
        return 80


def gpu_option(values: list[str]) -> Any:
    """``--gpus`` as the ``gpu`` config value: ``all``, or one slot per id.

    As in simple-gpu-scheduler, ids separated by commas or spaces are one slot
    each (``0,1,2`` and ``0 1 2`` are three slots); ``+`` joins GPUs into one
    slot for runs that need several (``0+1 2+3``: two slots of two GPUs).

    >>> gpu_option(["0,1,2"]), gpu_option(["0+1", "2+3"]), gpu_option(["cpu", "cpu"])
    (['0', '1', '2'], [['0', '1'], ['2', '3']], ['cpu', 'cpu'])
    """
    if values == ["all"]:
        return "all"
    slots: list[Any] = []
    for value in values:
        for item in value.split(","):
            if not item:
                raise ConfigError(f"--gpus {value!r} has an empty id; write ids like 0,1 or 0 1 (0+1 for a group)")
            slots.append(item.split("+") if "+" in item else item)
    return slots


def root_of(given: str) -> str:
    """A result root named on the command line, or the config file of the sweep (``gts status
    sweep.yaml``): its ``result_root_folder``, relative to here as ``gts run`` reads it."""
    from ..sweep.files import SUFFIXES

    if os.path.splitext(given)[1].lower() not in SUFFIXES or not os.path.isfile(given):
        return given
    config = load_config(given)
    scheduler = config.get("scheduler_config")
    if not isinstance(scheduler, dict):
        raise ConfigError(f"{given} is a config file without a scheduler_config to find its result root in")
    root = scheduler.get("result_root_folder", "results/")
    if not isinstance(root, (str, os.PathLike)):
        raise ConfigError(f"{given}: scheduler_config['result_root_folder'] must be a path; got {root!r}")
    return os.fspath(root)


@contextlib.contextmanager
def gpus_all_said_here(gpus: list[str] | None) -> Iterator[None]:
    """``--gpus all`` on a machine without GPUs: the way out in the command line's words."""
    try:
        yield
    except NoGpuError as error:
        if gpus != ["all"]:
            raise
        raise GTSError(
            f"--gpus all, but no GPU is available ({error.reason}): use --gpus cpu for CPU slots "
            "(--gpus cpu cpu: two runs at a time), or name GPU ids (--gpus 0 1)"
        ) from None


def log_in_root(root: Any) -> Any:
    """Where a sweep run from the command line logs when its config names no place: in its result
    root, so that two sweeps started from one folder keep their logs apart (the Python API keeps
    the original's ``scheduler.log`` in the current folder). A root that is not a path is left to
    the config's validation."""
    if not isinstance(root, (str, os.PathLike)):
        return None
    return os.path.join(os.path.abspath(root), "scheduler.log")


def run_with_status(sweep: Any, make_task: Any, *, plain: bool, detach: bool = False) -> int:
    """Run it with the status line on a terminal (plain log lines otherwise); its exit code."""
    from ..backends.choose import launcher_for
    from ..engine.api import run_sweep
    from ..engine.hooks import HookList

    status = None
    if not plain:  # the status line's module (and the reports it uses) is imported only for it: 3 ms
        from .progress import live_status, wanted

        status = live_status(len(sweep), wanted(sys.stderr))
    if status is None:
        plain_console_logging()
    console = None if status is None else status.log_handler()
    with launcher_for(sweep.options, make_task, detach=detach) as launcher:
        hooks = HookList([] if status is None else [status])
        summary = run_sweep(sweep, launcher, hooks=hooks, console=console, detach=detach)
    return summary.exit_code
