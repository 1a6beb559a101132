"""Reporting metrics as a run trains: ``gpu_task_scheduler.report(step, loss=0.23)``.

Each call appends one line, ``{"step": 12, "loss": 0.23, "@time": 1764432000.125}``, to the
file the environment variable ``GTS_METRICS_FILE`` names (the scheduler sets it for
every run: ``<run>/.gts/metrics.jsonl``); ``@time`` is when it was reported (seconds since
the epoch: what the exports give the trackers as the step's time), and is optional. Outside a sweep the variable is
unset and a call does nothing, so a training script runs by hand unchanged.
Any program in any language can do the same: append one JSON object per
line, with a numeric ``step`` that never goes back and numeric values (and, if
it likes, ``"@time"``: when, in seconds since the epoch).

In a ``GPUTask``, ``self.report(step, **metrics)`` is the same call.

With ``early_stop`` in the config, the scheduler may stop a run early: it
writes the reason to the file ``GTS_PRUNE_FILE`` names, and the run's next
``report()`` raises :class:`Pruned` there (a ``BaseException``, so an
``except Exception`` in the training loop does not swallow it; catch it by
name to save a checkpoint, then return or re-raise). A run that does not
report again within the sweep's ``grace_period`` gets SIGTERM, then SIGKILL,
as commands do at once.

With a pausing method (``early_stop: {method: asha, promotion: true}`` or
``{method: hyperband}``), a run that reaches a rung may be paused: its next
``report()`` raises :class:`Paused` (a ``BaseException`` too). Save nothing
then: the checkpoint of the step just reported is the one the run resumes
from (``GTS_RESUME_STEP``) if it is promoted; a command gets SIGTERM.

Under ASHA, a report at one of its rungs waits (a moment, at most
``RUNG_WAIT`` seconds; a pausing method's, ``PAUSE_WAIT``) until the scheduler
has judged it, so that a run the rule stops trains no further step: the
scheduler reads the line, then writes ``pruned`` (the run stops), the pause's
cause to ``GTS_PAUSE_FILE`` (it pauses) or the rung to ``GTS_JUDGED_FILE`` (it
goes on). The wait looks at those files every 5 ms: they may be on a shared
file system, where no change notification reaches this machine.

A command in any language gets the same wait by reporting through this module::

    python -m gpu_task_scheduler.reporting STEP NAME=VALUE [NAME=VALUE ...]

It appends the line as ``report()`` does, waits at a rung for the verdict, and
exits 0 (train the next step) or :data:`STOP_EXIT` (paused or stopped early:
exit now, saving nothing; the cause is on stderr). A command that writes its
lines itself is told only by SIGTERM, which may come after it began the next
step: that step is then trained again when the run resumes from the step it
reported last. (The protocol the module follows, for a command that would
rather follow it itself: after a line at a step of ``GTS_RUNGS``, wait until
``GTS_JUDGED_FILE`` holds that step or more, or ``GTS_PAUSE_FILE`` or
``GTS_PRUNE_FILE`` exists.)
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable

from .finite import step_problem

TIME_KEY = "@time"  # a metrics line's time (seconds since the epoch): not a metric

METRICS_ENV = "GTS_METRICS_FILE"
PRUNE_ENV = "GTS_PRUNE_FILE"
# The checkpoint protocol: a folder that lasts across a run's attempts, and the step an attempt
# goes on from (empty on a fresh start): the last step the run reported before, which it saved a
# checkpoint of first ("save your checkpoint, then report that step").
CHECKPOINT_ENV = "GTS_CHECKPOINT_DIR"
RESUME_ENV = "GTS_RESUME_STEP"
# In the checkpoint folder, from just before a framework callback puts a step's checkpoint in place
# until its report is written: that report's line, for the scheduler to record if the run was killed
# between the two (records/resume.py: settle_pending_report).
PENDING_REPORT = ".gts-report.json"
NEW_PREFIX = ".new-"  # a callback's checkpoint written whole beside its place, before it is put there
# ASHA only: {"metric": "loss", "steps": [1, 3, 9]}, its rungs; and the file in which the scheduler
# says up to which rung it let the run go on.
RUNGS_ENV = "GTS_RUNGS"
JUDGED_ENV = "GTS_JUDGED_FILE"
PAUSE_ENV = "GTS_PAUSE_FILE"  # a pausing method only: the file in which the scheduler says why it pauses the run
RUNG_WAIT = 5.0  # seconds report() waits at a rung for the verdict, at most (then it goes on)
# A pausing method's: a run that went on past a rung and is then paused trains a step it may train
# again, so it waits as long as a loaded scheduler may take to decide (it answers in milliseconds
# when it is not loaded); a run whose scheduler died goes on after this.
PAUSE_WAIT = 60.0
STOP_EXIT = 3  # python -m gpu_task_scheduler.reporting: paused or stopped early, exit now
_CAUSE_BYTES = 4096


class Pruned(BaseException):
    """The scheduler stopped this run early (``early_stop``): raised by ``report()``.

    ``str(error)`` says why, e.g. ``pruned at step 3: loss 1.92, rung cutoff 0.87``."""


class Paused(BaseException):
    """A pausing ``early_stop`` method paused this run at a rung: raised by ``report()``. The run
    resumes from its checkpoint of the step it reported last if the method promotes it.

    ``str(error)`` says why, e.g. ``paused at rung 3 (0.87 there): resumed if it is promoted``."""


_pruned: str | None = None  # the cause, once report() raised Pruned in this process
_paused: str | None = None  # the cause, once report() raised Paused in this process


def pruned_cause() -> str | None:
    """Why this run was stopped early, if ``report()`` raised :class:`Pruned` in this process."""
    return _pruned


def paused_cause() -> str | None:
    """Why this run was paused, if ``report()`` raised :class:`Paused` in this process."""
    return _paused


def told() -> dict[str, str]:
    """What early stopping told this process's run, for its outcome: ``{"pruned": cause}``,
    ``{"paused": cause}``, or nothing. A run that exits 0 after it was paused is paused, not done."""
    return {"pruned": _pruned} if _pruned is not None else {"paused": _paused} if _paused is not None else {}


# Called once, after this process's first report (a run forked warm says then what it imported:
# backends/local/forkserver.py), so that the warm process learns it before the run ends.
_first_report: Callable[[], None] | None = None


def report(step: float, **metrics: float) -> None:
    """Record ``metrics`` at ``step`` for this run (nothing outside a sweep).

    Values must be finite numbers (a tensor's ``.item()``, a float); a value the
    scheduler would skip is an error here, where it can be fixed.
    """
    path = os.environ.get(METRICS_ENV)
    problem = step_problem(step)
    if problem is not None:
        shown = repr(step) if len(repr(step)) <= 40 else f"{repr(step)[:20]}... ({len(repr(step))} characters)"
        raise ValueError(f"report(): step={shown} is no step: {problem} (a step is a number from 0 to 2**53)")
    for name, value in metrics.items():
        _check(name, value)
    if not path:
        return
    line = metrics_line(step, metrics)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, line.encode())  # one write of one line: lines of concurrent writers never interleave
    finally:
        os.close(fd)
    global _first_report
    if _first_report is not None:
        told, _first_report = _first_report, None
        told()
    _wait_at_a_rung(step, metrics)
    _raise_if_told()


def metrics_line(step: float, metrics: dict[str, float]) -> str:
    """The line :func:`report` writes to the run's metrics file (values checked before)."""
    return json.dumps({"step": step, **metrics, TIME_KEY: round(time.time(), 3)}) + "\n"


class _Waits:
    """Where this run's report() waits for the scheduler's word (``GTS_RUNGS``): at ASHA's rung
    ``steps``, or at each multiple of ``every`` below ``below`` (population-based training), for
    ``wait`` seconds at most."""

    def __init__(self, raw: str) -> None:
        self.metric, self.steps, self.every, self.below, self.wait = "", [], 0.0, math.inf, RUNG_WAIT
        try:
            value = json.loads(raw or "null")
            self.metric = str(value["metric"])
            self.steps = [float(step) for step in value.get("steps", ())]
            self.every = float(value.get("every", 0.0))
            self.below = float(value.get("below", math.inf))
            self.wait = float(value.get("wait", RUNG_WAIT))
        except (ValueError, TypeError, KeyError, AttributeError):
            self.metric = ""

    def rung(self, passed: float, step: float) -> float | None:
        """The step waited at by a report at ``step`` after one at ``passed``, if any."""
        if self.every > 0:
            boundary = math.floor(step / self.every) * self.every
            return boundary if passed < boundary <= step and 0 < boundary < self.below else None
        return max((r for r in self.steps if passed < r <= step), default=None)


_waits: _Waits | None = None  # read once
_passed: float | None = None  # the step reported last, past which rungs are waited at


def _wait_at_a_rung(step: float, metrics: dict[str, float]) -> None:
    global _waits, _passed
    if _waits is None:
        _waits = _Waits(os.environ.get(RUNGS_ENV, ""))
    if _passed is None:  # a resumed attempt was judged up to the step it goes on from
        _passed = _resume_step()
    rung = _waits.rung(_passed, step)
    _passed = max(_passed, step)
    if rung is None or _waits.metric not in metrics:
        return
    judged_file, marker = os.environ.get(JUDGED_ENV, ""), os.environ.get(PRUNE_ENV, "")
    pause = os.environ.get(PAUSE_ENV, "")
    deadline = time.monotonic() + _waits.wait
    while time.monotonic() < deadline and not os.path.exists(marker) and not (pause and os.path.exists(pause)):
        try:
            with open(judged_file, "rb") as handle:
                if float(handle.read(64)) >= rung:
                    return
        except (OSError, ValueError):
            pass  # not judged yet (the scheduler writes the file whole, by a rename)
        time.sleep(0.005)


def _resume_step() -> float:
    """The step this attempt goes on from; -inf for none (or for ``nan``, ``inf`` or a negative
    step, which no scheduler gives: such a run would never wait at a rung again)."""
    try:
        step = float(os.environ.get(RESUME_ENV) or "-inf")
    except ValueError:
        return float("-inf")
    return step if math.isfinite(step) and step >= 0 else float("-inf")


def _raise_if_told() -> None:
    """Raise Pruned or Paused if the scheduler wrote why to the file the run was given for it."""
    global _pruned, _paused
    cause = _told(PRUNE_ENV)
    if cause is not None:
        _pruned = cause or "pruned"
        raise Pruned(_pruned)
    cause = _told(PAUSE_ENV)
    if cause is not None:
        _paused = cause or "paused"
        raise Paused(_paused)


def _told(variable: str) -> str | None:
    """What the scheduler wrote to the file ``variable`` names, if it wrote it."""
    marker = os.environ.get(variable)
    if not marker:
        return None
    try:
        fd = os.open(marker, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:  # none yet (the cost of the check: one failed open)
        return None
    try:
        return os.read(fd, _CAUSE_BYTES).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)


def _check(name: str, value: object) -> None:
    if name == TIME_KEY:
        raise ValueError(f"report(): {TIME_KEY!r} is when a step was reported, written by report(): give another name")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(
            f"report(): {name}={value!r} is not a finite number (a tensor? pass tensor.item(); a NaN? "
            "report it only when it is a number)"
        )


def main(argv: list[str] | None = None) -> int:
    """``python -m gpu_task_scheduler.reporting STEP NAME=VALUE ...``: :func:`report` for a command
    in any language (see the module's text): 0, go on; :data:`STOP_EXIT`, paused or stopped early;
    2, bad arguments."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m gpu_task_scheduler.reporting STEP NAME=VALUE [NAME=VALUE ...]"
    try:
        if not args or any("=" not in arg for arg in args[1:]):
            raise ValueError("give a step, then NAME=VALUE pairs")
        step = float(args[0])
        metrics = {}
        for arg in args[1:]:
            name, _, text = arg.partition("=")
            if name == "step":
                raise ValueError("'step' is the first argument, not a metric's name: give another name")
            if not name:
                raise ValueError(f"{arg!r}: give the metric's name before '='")
            metrics[name] = float(text)
        report(int(step) if step.is_integer() else step, **metrics)
    except ValueError as error:
        print(f"{usage}\n{error}", file=sys.stderr)
        return 2
    except (Paused, Pruned) as error:
        print(f"{'paused' if isinstance(error, Paused) else 'pruned'}: {error}", file=sys.stderr)
        return STOP_EXIT
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
