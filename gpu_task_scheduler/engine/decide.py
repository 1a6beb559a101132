"""The engine's decisions, as pure functions of what was observed.

* :func:`before_run`: is a run skipped, adopted from its folder's record, or run?
  The loop and ``gts run --dry-run`` both call it, so they cannot disagree.
* :func:`classify`: how did an attempt end (succeeded, failed, timed out,
  interrupted, pruned, paused, out of GPU memory), and why?
* :func:`after_exit`: what happens next (retry, run later with a larger memory
  need, or done)?

Nothing here reads a file, the clock or NVML; the inputs are plain values
(``records/prior.py`` reads a run's prior state).
"""

from __future__ import annotations

import signal
from typing import Any, NamedTuple

from ..gpu.oom import detect_oom
from ..gpu.placement import WHOLE_GPU, Need
from ..records.prior import Prior
from ..records.protocol import Outcome
from ..records.status import RunStatus

OOM_GROWTH = 1.5  # after an out-of-memory failure, a run's estimate grows by this factor


# --- before a run ---------------------------------------------------------------


class Decision(NamedTuple):
    action: str  # "run", "skip", "adopt" (skip, recording the folder's success in the ledger)
    # or "keep" (skip, recording its result as this config's: on_config_change keep)
    reason: str  # for the log
    label: str  # for --dry-run: "skip (succeeded)", "run again (failed)", ...
    warning: str | None = None
    # It runs again as the same run (an attempt that did not end, with the same config and program,
    # in its folder): it goes on from its checkpoint (GTS_RESUME_STEP), not afresh.
    resume: bool = False


def before_run(
    prior: Prior,
    *,
    force_rerun: bool,
    skip_existing_folders: bool,
    keep_changed: bool = False,
    rerun_pruned: bool = False,
) -> Decision:
    """``rerun_pruned``: a run the sweep's early_stop rule stopped runs again (``gts retry --pruned``);
    otherwise it is done, as a success is."""
    if prior.duplicate:
        return Decision("skip", "the same config appears earlier in the sweep", "skip (same config as an earlier run)")
    if force_rerun:
        return Decision("run", "force_rerun", "run (force_rerun)")
    record = prior.record
    if record is not None:
        done = (RunStatus.SUCCEEDED,) if rerun_pruned else (RunStatus.SUCCEEDED, RunStatus.PRUNED)
        if record.status not in done:
            same = record.config_hash in (None, prior.config_hash) and not program_changed(
                record.program, prior.program
            )
            return Decision(
                "run",
                f"it ended {record.status.value} before",
                f"run again ({record.status.value})",
                resume=same and prior.folder_ok,
            )
        if not prior.folder_ok:
            return Decision("run", "its folder is gone", "run again (folder gone)")
        changed = program_changed(record.program, prior.program)
        if record.config_hash not in (None, prior.config_hash) or changed:
            if keep_changed:
                return Decision(
                    "keep",
                    "it succeeded with another config, kept (on_config_change: keep)",
                    "skip (config changed; kept)",
                )
            what = "what it runs (its task or command)" if changed else "its config"
            return Decision(
                "run",
                f"{what} changed",
                "run again (config changed)",
                warning=f"{_earlier(record.status)}, but {what} changed since; its result is not this config's, "
                "so it runs again",
            )
        if (
            prior.dependencies_ended is not None
            and record.started_at is not None
            and prior.dependencies_ended > record.started_at
        ):
            return Decision(
                "run",
                "a run it depends on ran again after it",
                "run again (input changed)",
                warning=f"{_earlier(record.status)}, but a run it depends on ran again after it started: "
                "its inputs changed, so it runs again",
            )
        if record.status is RunStatus.PRUNED:
            return Decision("skip", "it was stopped early (early_stop)", "skip (pruned)")
        return Decision("skip", "it succeeded before", "skip (succeeded)")
    if not prior.folder_ok:
        return Decision("run", "it is new", "run")
    outcome = prior.outcome
    if outcome is not None and outcome.succeeded and outcome.config_hash == prior.config_hash:
        return Decision("adopt", "its folder records a success", "skip (folder records a success)")
    if skip_existing_folders:
        return Decision("skip", "its folder exists (skip_existing_folders)", "skip (folder exists)")
    return Decision("run", "it is new", "run")


def _earlier(status: RunStatus) -> str:
    return "succeeded earlier" if status is RunStatus.SUCCEEDED else "was stopped early (pruned) earlier"


def program_changed(recorded: str | None, current: str | None) -> bool:
    """Whether a run ran something else before (its task class or command); unknown is no change."""
    return recorded is not None and current is not None and recorded != current


# --- how an attempt ended -------------------------------------------------------


class ExitFacts(NamedTuple):
    returncode: int  # negative: killed by that signal
    reports_outcome: bool  # False for a plain command
    outcome: Outcome | None  # this attempt's outcome file (token checked), if any
    stopped: tuple[RunStatus, str] | None  # we stopped it: (TIMED_OUT, INTERRUPTED, PRUNED or PAUSED, cause)
    unsafe: str | None  # its folder was changed into something unsafe
    folder_exists: bool
    log_tail: str
    unstoppable: tuple[int, ...] = ()
    lost: str | None = None  # the launcher lost it with its machine (Ended.lost)
    handed_back: bool = False  # ... on schedule: it goes on elsewhere, not counted (Ended.handed_back)


class Classified(NamedTuple):
    status: RunStatus
    cause: str | None
    exit_code: int | None
    signal: str | None
    result: Any = None
    oom: str | None = None  # the out-of-memory message found in the log
    lost: bool = False  # ended because its machine went away: run again elsewhere
    handed_back: bool = False  # ... on schedule (a pool's time limit): not counted as a retry


def describe_returncode(returncode: int) -> tuple[int | None, str | None]:
    """``(exit_code, signal_name)`` for a ``Popen.returncode``.

    >>> describe_returncode(3)
    (3, None)
    >>> describe_returncode(-11)
    (None, 'SIGSEGV')
    """
    if returncode >= 0:
        return returncode, None
    try:
        return None, signal.Signals(-returncode).name
    except ValueError:
        return None, f"signal {-returncode}"


def classify(facts: ExitFacts) -> Classified:
    exit_code, signal_name = describe_returncode(facts.returncode)
    result, oom = None, None
    outcome = facts.outcome
    lost = False
    pruned = facts.stopped is not None and facts.stopped[0] is RunStatus.PRUNED
    contradicted = None
    if outcome is not None and outcome.succeeded and facts.returncode > 0:
        # Its process says otherwise: a success it did not exit with is none (a helper it forked,
        # inheriting its exit handlers, wrote it; the run itself failed).
        contradicted, outcome = f"it recorded a success, but its process exited with code {facts.returncode}", None
    elif outcome is not None and outcome.succeeded and outcome.unheard is not None and facts.stopped is not None:
        # It could not hear that it was asked to stop (it closed its lifeline): the stop stands.
        outcome = None
    if outcome is not None and outcome.succeeded and outcome.pruned is not None:
        # main() caught Pruned (to save, say) and returned: stopped early all the same, its result kept
        status, result = RunStatus.PRUNED, outcome.result
        cause = facts.stopped[1] if facts.stopped is not None and pruned else outcome.pruned
    elif outcome is not None and outcome.succeeded and outcome.paused is not None:
        # main() caught Paused and returned: paused all the same (what it returned is no run's result)
        paused = facts.stopped is not None and facts.stopped[0] is RunStatus.PAUSED
        status, cause = RunStatus.PAUSED, facts.stopped[1] if facts.stopped is not None and paused else outcome.paused
    elif outcome is not None and outcome.succeeded:
        status, cause, result = RunStatus.SUCCEEDED, None, outcome.result
    elif facts.lost is not None and facts.stopped is None:
        # Whatever its exit status says, the machine took it down: an interruption, not its failure.
        status, cause, lost = RunStatus.INTERRUPTED, facts.lost, True
        exit_code, signal_name = None, None
    elif not facts.reports_outcome and facts.stopped is None:
        if facts.returncode == 0:
            status, cause = RunStatus.SUCCEEDED, None
        else:
            status = RunStatus.FAILED
            how = f"failed with exit code {exit_code}" if exit_code else f"was killed by {signal_name}"
            cause = f"the command {how}"
            oom = detect_oom(facts.log_tail)
            if oom is not None:  # a command running PyTorch, say: retried later with more memory
                cause = f"GPU out of memory ({oom}): {cause}"
    elif facts.stopped is not None:
        status, cause = facts.stopped
    else:
        status = RunStatus.FAILED
        cause = outcome.failure if outcome is not None else contradicted
        if cause is None and facts.unsafe is not None:
            cause = f"the run folder was changed into something unsafe: {facts.unsafe}"
        if cause is None and not facts.folder_exists:
            cause = "the run folder disappeared"
        if cause is None and exit_code == 0:
            cause = "the process exited without recording an outcome"
        oom = detect_oom(facts.log_tail)
        if oom is not None:
            cause = f"GPU out of memory ({oom})" + (f": {cause}" if cause else "")
    if facts.unstoppable:
        note = "processes it started could not be stopped: pid " + ", ".join(map(str, facts.unstoppable))
        cause = f"{cause}; {note}" if cause else note
    return Classified(status, cause, exit_code, signal_name, result, oom, lost, lost and facts.handed_back)


# --- what happens next ----------------------------------------------------------


class Next(NamedTuple):
    # "done", "retry" (queued again now), "lost" (queued again now: its machine went away),
    # "handback" (queued again now, not counted: its machine was taken back on schedule) or
    # "defer" (after every other run, with `need`)
    action: str
    need: Need = None


def after_exit(
    ended: Classified,
    *,
    tries: int,
    oom_retries: int,
    reserved: Need,
    peak: int | None,
    max_retries: int,
    max_oom_retries: int,
    stopping: bool,
    lost_retries: int = 0,
    max_lost_retries: int = 0,
    handbacks: int = 0,
) -> Next:
    """``tries``: attempts made so far (this one included); ``oom_retries``: out-of-memory retries so far;
    ``lost_retries``: attempts run again because their machine went away; ``handbacks``: ... because
    it was taken back on schedule."""
    if ended.status is RunStatus.SUCCEEDED or stopping:
        return Next("done")
    if ended.handed_back:
        return Next("handback")
    if ended.lost:
        return Next("lost") if lost_retries < max_lost_retries else Next("done")
    if ended.oom is not None:
        if oom_retries >= max_oom_retries:
            return Next("done")
        grown = max(reserved if isinstance(reserved, int) else 0, peak or 0)
        return Next("defer", int(grown * OOM_GROWTH) if grown > 0 else WHOLE_GPU)
    counted = tries - oom_retries - lost_retries - handbacks
    if ended.status in (RunStatus.FAILED, RunStatus.TIMED_OUT) and counted <= max_retries:
        return Next("retry")
    return Next("done")
