"""What ``GPUTaskScheduler.start()`` returns: the sweep's outcome."""

from __future__ import annotations

import textwrap
from typing import Any

from ..errors import RunsFailedError
from ..recordclass import Record, field
from ..records.status import NOTHING_LEFT, RunStatus


class RunOutcome(Record):
    """How one run of this sweep ended (its last attempt)."""

    name: str
    work_dir: str
    status: RunStatus
    attempts: int = 0  # attempts made by this start()
    slot: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    cause: str | None = None  # why it failed, in words
    log_path: str | None = None
    log_tail: str = ""
    duration: float | None = None
    result: Any = None  # what main() returned, as JSON-compatible data (None if it is in result_file)
    result_file: str | None = None  # a result over 1 MiB of JSON: <work_dir>/.gts/result.json
    gpu_leftover: str | None = None  # GPU memory its processes still held after it ended, in words
    gpu_seconds: float | None = None  # this attempt's share of the GPUs' busy time (gpu/usage.py)
    energy: float | None = None  # joules of this attempt's share of the GPUs' energy, where they count it
    left_nothing: bool = False  # it succeeded with no result (returned, or result.json) and reported no metric

    def describe(self) -> str:
        if self.cause:
            return self.cause
        if self.signal:
            return f"killed by {self.signal}"
        if self.exit_code is not None:
            return f"exit code {self.exit_code}"
        return str(self.status)


class SweepSummary(Record, frozen=False):
    """Succeeded, failed, blocked, pruned, paused and skipped runs of one ``start()``.

    ``summary.ok`` is False when any run failed or was blocked (stages) or the
    sweep was interrupted; ``summary.exit_code`` is a process exit status for
    scripts (0 all fine, runs stopped early or paused by ``early_stop`` included; 1 some runs failed or were
    blocked, 130 interrupted); ``summary.raise_for_failures()``
    raises :class:`RunsFailedError` when anything failed.
    """

    outcomes: dict[str, RunOutcome] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    interrupted_by: str | None = None  # "SIGINT", "SIGTERM" when the sweep was stopped
    budget_spent: str | None = None  # the budget was spent (engine/budget.py): no run started after, in words
    duration: float = 0.0
    # A sweep stopped or drained: the runs it would still have run (the first 100,000 looked at;
    # not_started_more: there were more to look at).
    not_started: list[str] = field(default_factory=list)
    not_started_more: bool = False
    detached: int = 0  # runs left queued or running on the cluster (`gts run --detach`)
    # False (gts queue, an endless stream): succeeded runs are counted, not kept, so memory stays flat.
    keep_succeeded: bool = True
    _succeeded_not_kept: int = 0
    _left_nothing_not_kept: int = 0

    def record(self, outcome: RunOutcome) -> None:
        """Keep the run's outcome (a retry replaces the earlier attempt); the log's
        tail only for runs that did not succeed, where it explains something."""
        if outcome.status is RunStatus.SUCCEEDED:
            outcome = outcome._replace(log_tail="")
            if not self.keep_succeeded:
                self.outcomes.pop(outcome.name, None)
                self._succeeded_not_kept += 1
                self._left_nothing_not_kept += outcome.left_nothing
                return
        self.outcomes[outcome.name] = outcome

    @property
    def succeeded_count(self) -> int:
        return len(self.succeeded) + self._succeeded_not_kept

    def _with(self, *statuses: RunStatus) -> list[RunOutcome]:
        return [o for o in self.outcomes.values() if o.status in statuses]

    @property
    def succeeded(self) -> list[RunOutcome]:
        return self._with(RunStatus.SUCCEEDED)

    @property
    def left_nothing(self) -> list[RunOutcome]:
        """Runs that succeeded with no result (none returned, no result.json) and no metric reported:
        a result written somewhere else goes unnoticed."""
        return [o for o in self.succeeded if o.left_nothing]

    @property
    def failed(self) -> list[RunOutcome]:
        """Runs that failed, timed out or were interrupted (the report counts the interrupted apart)."""
        return self._with(RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.INTERRUPTED)

    @property
    def interrupted(self) -> list[RunOutcome]:
        """Runs stopped by a stop of the sweep (Ctrl-C, ``gts stop``): not their own failure."""
        return self._with(RunStatus.INTERRUPTED)

    @property
    def blocked(self) -> list[RunOutcome]:
        """Runs not started because a run of an earlier stage they depend on did not succeed."""
        return self._with(RunStatus.BLOCKED)

    @property
    def pruned(self) -> list[RunOutcome]:
        """Runs the sweep's early_stop rule stopped early: not failures."""
        return self._with(RunStatus.PRUNED)

    @property
    def paused(self) -> list[RunOutcome]:
        """Runs a pausing early_stop method paused and had not promoted when the start ended: not failures."""
        return self._with(RunStatus.PAUSED)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.blocked and self.interrupted_by is None

    @property
    def exit_code(self) -> int:
        if self.interrupted_by is not None:
            return 130
        return 1 if self.failed or self.blocked else 0

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-compatible data (what ``notify_command`` reads on stdin)."""

        def outcome(o: RunOutcome) -> dict[str, Any]:
            return {
                "name": o.name,
                "work_dir": o.work_dir,
                "status": o.status.value,
                "attempts": o.attempts,
                "slot": o.slot,
                "exit_code": o.exit_code,
                "signal": o.signal,
                "cause": o.cause,
                "log_path": o.log_path,
                "duration": o.duration,
                "result": o.result,
                "gpu_leftover": o.gpu_leftover,
                "gpu_seconds": o.gpu_seconds,
                "energy": o.energy,
                "left_nothing": o.left_nothing,
            }

        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "duration": self.duration,
            "interrupted_by": self.interrupted_by,
            "budget_spent": self.budget_spent,
            "counts": {
                "succeeded": self.succeeded_count,
                "failed": len(self.failed) - len(self.interrupted),
                "interrupted": len(self.interrupted),
                "blocked": len(self.blocked),
                "pruned": len(self.pruned),
                "paused": len(self.paused),
                "skipped": len(self.skipped),
                "not_started": len(self.not_started),
                "detached": self.detached,
                "left_nothing": len(self.left_nothing) + self._left_nothing_not_kept,
            },
            "runs": [outcome(o) for o in self.outcomes.values()],
            "skipped": list(self.skipped),
        }

    def raise_for_failures(self) -> None:
        if not self.ok:
            raise RunsFailedError(self.report(), self)

    def report(self) -> str:
        interrupted = len(self.interrupted)
        counts = [f"{self.succeeded_count} succeeded", f"{len(self.failed) - interrupted} failed"]
        if interrupted:
            counts.append(f"{interrupted} interrupted")
        if self.blocked:
            counts.append(f"{len(self.blocked)} blocked")
        if self.pruned:
            counts.append(f"{len(self.pruned)} stopped early")
        if self.paused:  # a PBT member waits for its turn or its copy, not for a promotion
            turns = sum(1 for o in self.paused if (o.cause or "").startswith(("waits for its turn", "exploits")))
            if len(self.paused) > turns:
                counts.append(f"{len(self.paused) - turns} paused (not promoted)")
            if turns:
                counts.append(f"{turns} paused (population-based training: the next start resumes them)")
        counts.append(f"{len(self.skipped)} skipped")
        if self.detached:
            counts.append(f"{self.detached} left running on the cluster (detached)")
        if self.not_started:
            counts.append(f"{len(self.not_started)}{'+' if self.not_started_more else ''} not started")
        head = f"{', '.join(counts)} in {self.duration:.1f}s"
        if self.interrupted_by:
            head += f" (interrupted by {self.interrupted_by})"
        elif self.budget_spent:
            head += f" (stopped: {self.budget_spent})"
        lines = [f"Sweep summary: {head}"]
        if self.not_started:
            shown = ", ".join(self.not_started[:10]) + (" ..." if len(self.not_started) > 10 else "")
            why = (
                "they were not ready when it detached"
                if self.detached
                else "the budget was spent before their turn"
                if self.budget_spent and not self.interrupted_by
                else "the sweep was stopped before their turn"
            )
            lines.append(f"  not started ({why}): {shown}")
        nothing = [o.name for o in self.left_nothing]
        if nothing or self._left_nothing_not_kept:
            shown = ", ".join(nothing[:10]) + (" ..." if len(nothing) > 10 or self._left_nothing_not_kept else "")
            lines.append(
                f"  {len(nothing) + self._left_nothing_not_kept} succeeded but left no result and reported no "
                f"metric ({NOTHING_LEFT}): {shown}"
            )
        for outcome in self.failed:
            lines.append(f"  {outcome.status}: {outcome.work_dir} ({outcome.describe()})")
            if outcome.log_path:
                lines.append(f"    log: {outcome.log_path}")
            if outcome.log_tail:
                lines.append(textwrap.indent(outcome.log_tail, "    | "))
        for outcome in self.blocked:
            lines.append(f"  blocked: {outcome.work_dir} ({outcome.describe()})")
        for outcome in self.outcomes.values():
            if outcome.gpu_leftover:
                lines.append(f"  left GPU memory held: {outcome.work_dir} ({outcome.gpu_leftover})")
        return "\n".join(lines)

    __str__ = report
