"""The engine's entry points: plan a sweep (what would run), run it (with its log and notifications).

``GPUTaskScheduler`` (the original's class) and the ``gts`` command are thin
layers over these two functions, so a library call and a command line behave
the same in every case.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from types import ModuleType

from ..errors import ConfigError, GTSError
from ..records.known import RootIndex
from ..records.ledger import Ledger
from ..records.paths import RootPaths, result_root_problem
from ..records.prior import read_prior
from ..sweep.expand import RunSpec, Sweep
from ..sweep.options import SchedulerOptions
from .changes import settle_changes
from .decide import Decision, before_run
from .hooks import Hooks
from .launcher import Launcher
from .logs import scheduler_logging
from .loop import Scheduler
from .summary import SweepSummary

logger = logging.getLogger("gpu_task_scheduler")


def check_root(sweep: Sweep) -> None:
    """The sweep's result root can be one (a folder or nothing yet, a path SQLite can open), or a
    ConfigError: asked before anything runs, by every way of starting or planning a sweep."""
    problem = result_root_problem(sweep.options.result_root_folder)
    if problem is not None:
        raise ConfigError(f"scheduler_config['result_root_folder']: {problem}")


def plan(sweep: Sweep) -> Iterator[tuple[RunSpec, Decision]]:
    """Each run with what a start would do with it now (the loop's own decision), read-only."""
    check_root(sweep)
    options = sweep.options
    root = options.result_root_folder
    ledger = Ledger.read_only(RootPaths(root))
    try:
        take_over = settle_changes(sweep, ledger, root) if ledger is not None else frozenset()
        known = RootIndex(ledger, root, take_over=take_over)
        pauses = paused_runs(sweep, ledger)
        for spec in sweep.runs(known.foreign):
            if spec.name in pauses:  # its pausing method resumes it if it promotes it, from its checkpoint
                rung = pauses[spec.name]
                yield spec, Decision("skip", f"it is paused at rung {rung:g}", f"skip (paused at rung {rung:g})")
                continue
            prior = read_prior(spec, known)
            yield (
                spec,
                before_run(
                    prior,
                    force_rerun=options.force_rerun,
                    skip_existing_folders=options.skip_existing_folders,
                    keep_changed=options.on_config_change == "keep",
                    rerun_pruned=sweep.rerun_pruned,
                ),
            )
    finally:
        if ledger:
            ledger.close()


def paused_runs(sweep: Sweep, ledger: Ledger | None) -> dict[str, float]:
    """The runs a pausing early_stop method holds paused, and the rung each waits at (none without one)."""
    from ..tuning.stopping import Pausing  # here: a sweep without early_stop never needs the rules

    if ledger is None or sweep.options.force_rerun or not any(isinstance(r, Pausing) for r in sweep.stopping.values()):
        return {}
    from .pauses import Pauses

    pauses = Pauses(sweep, ledger, read_only=True)
    return {name: rung for name in pauses.known() if (rung := pauses.paused_at(name)) is not None}


def run_sweep(
    sweep: Sweep,
    launcher: Launcher,
    *,
    hooks: Hooks | None = None,
    nvml: ModuleType | None = None,
    console: logging.Handler | None = None,
    keep_succeeded: bool = True,
    detach: bool = False,
) -> SweepSummary:
    """Run the sweep to its end (or a stop signal) and return its summary.

    The machine is checked first (no GPU for ``"gpu": "all"`` is a GTSError
    before anything is written); the scheduler log is open while it runs; the
    summary is logged and the notifications sent at the end. ``detach``: see
    :class:`~.loop.Scheduler` (Slurm's runs stay queued and running when it returns).
    """
    check_root(sweep)
    hooks = hooks or Hooks()
    options = sweep.options
    scheduler = Scheduler(sweep, launcher, nvml=nvml, hooks=hooks, keep_succeeded=keep_succeeded, detach=detach)
    try:
        scheduler.setup()
        with scheduler_logging(options.scheduler_log_file_path, console):
            summary = scheduler.run()
            hooks.close()  # the status line's last state, then the summary below it
            # ERROR only when a run failed (or was blocked by one); a stopped sweep is a warning.
            failed = len(summary.failed) > len(summary.interrupted) or summary.blocked
            stopped = summary.interrupted_by is not None or summary.interrupted or summary.not_started
            (logger.error if failed else logger.warning if stopped else logger.info)("%s", summary.report())
            if options.notify_command is not None or options.notify_email is not None:
                # here, not at the top: smtplib and ssl take 30 ms to import, before the first run
                from ..reports.notify import run_notify_command, send_email
            if options.notify_command is not None:
                run_notify_command(options.notify_command, summary)
            if options.notify_email is not None:
                send_email(options.notify_email, summary, attachments=_report_attachment(options))
    finally:
        hooks.close()
    return summary


def _report_attachment(options: SchedulerOptions) -> list[tuple[str, str, bytes]]:
    """The sweep's report (``gts report``) for its mail, when ``notify_email`` asks for it."""
    if not (options.notify_email or {}).get("attach_report"):
        return []
    from ..web.report import report_html  # the web view's page: only when asked

    try:
        return [("sweep.html", "text/html", report_html(options.result_root_folder).encode("utf-8"))]
    except (GTSError, OSError) as error:
        logger.error("notify_email: the sweep's report could not be made, the mail goes without it: %s", error)
        return []


def reraise_interruption(summary: SweepSummary) -> None:
    """Act on the signal that stopped the sweep as if it had not been caught.

    SIGINT raises a plain ``KeyboardInterrupt`` (the summary as its ``summary``
    attribute), so an uncaught one ends the process with SIGINT's status;
    SIGTERM and SIGHUP are delivered again to the previous handler.
    """
    if summary.interrupted_by == "SIGINT":
        # The summary was logged; the traceback need not repeat it.
        interrupt = KeyboardInterrupt("the sweep was interrupted (its summary is above and in .summary)")
        interrupt.summary = summary  # type: ignore[attr-defined]
        raise interrupt
    if summary.interrupted_by in ("SIGTERM", "SIGHUP"):  # not `gts stop`: it asks only the sweep to stop
        os.kill(os.getpid(), getattr(signal, summary.interrupted_by))
