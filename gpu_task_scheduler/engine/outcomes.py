"""What the engine writes down about runs: the ledger, the sweep summary, the callbacks, the log lines.

The loop decides (with ``decide.py``) and this module records, in one place
per event: a run skipped or adopted, started, not started, ended. Each
event's ledger write comes first, the summary and the callbacks after it, so
a callback that raises (or a scheduler killed in it) never loses a record.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import GTSError
from ..gpu.devices import Slot
from ..jsonable import to_jsonable
from ..layout import RESULT_FILE
from ..records.ledger import Ledger
from ..records.ledger.record import RunRecord
from ..records.metrics import MetricsReader, attempt_files, read_all, run_summary
from ..records.paths import MAX_INLINE_RESULT, RunPaths, atomic_write_json, read_json
from ..records.prior import Prior, adopt
from ..records.protocol import Outcome
from ..records.status import RunStatus
from ..sweep.expand import RunSpec, Sweep
from .decide import Classified, Decision, ExitFacts
from .hooks import Hooks
from .launcher import Ended
from .logs import file_only
from .summary import RunOutcome, SweepSummary

if TYPE_CHECKING:
    from ..gpu.capacity import Released

logger = logging.getLogger("gpu_task_scheduler")


class Exit(NamedTuple):
    """What was read after a run's process ended: the facts to classify, and the files behind them."""

    facts: ExitFacts
    outcome: Outcome | None
    tail: str
    folder_problem: str | None  # paths.unsafe(), read with facts.unsafe (its records-only part)


def read_exit(
    paths: RunPaths, token: str, ended: Ended, *, reports_outcome: bool, stopped: tuple[RunStatus, str] | None
) -> Exit:
    """Read the run's outcome file and log tail, unless the run planted a link where our records go."""
    unsafe, folder_problem = paths.problems()
    outcome = Outcome.read(paths.outcome, token=token) if unsafe is None else None
    tail = paths.tail()
    facts = ExitFacts(
        returncode=ended.returncode,
        reports_outcome=reports_outcome,
        outcome=outcome,
        stopped=stopped or ended.stopped,
        unsafe=unsafe,
        folder_exists=paths.exists(),
        log_tail=tail,
        unstoppable=ended.unstoppable,
        lost=ended.lost,
        handed_back=ended.handed_back,
    )
    return Exit(facts, outcome, tail, folder_problem)


class Records:
    def __init__(self, ledger: Ledger, summary: SweepSummary, hooks: Hooks) -> None:
        self.ledger, self.summary, self._hooks = ledger, summary, hooks
        self._skips: dict[str, int] = {}  # reason -> runs skipped for it, not yet reported
        self._skip_lines: list[str] = []  # their lines for scheduler.log, not yet written
        # What made the runs (records/provenance.py): read once, in a thread of its own started
        # after the first run started (git must delay no start, nor the loop: a large diff takes
        # seconds), and recorded for the runs started before as soon as it is read.
        self._made_with: dict[str, Any] | None = None
        self._unrecorded: list[RunSpec] = []
        self._reading: tuple[threading.Thread, dict[str, Any]] | None = None

    def call(self, hook: str, *args: object) -> None:
        try:
            getattr(self._hooks, hook)(*args)
        except Exception:
            logger.exception("the %s callback raised; the sweep goes on", hook)

    def sweep_starting(self, sweep: Sweep) -> None:
        """What ``gts status`` needs to know beyond the runs: where runs log, the sweep's size (none for gts queue)."""
        self.ledger.set_meta("log_file", sweep.options.log_file or "")
        self.ledger.set_meta("waiting", "")  # why runs wait, while they do (`gts status --watch`)
        try:
            len(sweep)
        except TypeError:  # an open-ended sweep
            self.ledger.set_meta("sweep_runs", "")
        else:
            self.ledger.set_meta("sweep_runs", str(sweep.size))
        if sweep.selected is None:  # `gts retry` runs the recorded sweep: the record stays as it is
            self.ledger.set_meta("sweep_config", sweep.record() or "")
            self.ledger.set_meta("task_files", json.dumps(sweep.task_files()))

    def sweep_completed(self, sweep: Sweep) -> None:
        """Every run of the sweep was decided: a start with the same identity has no changed run
        to look for (engine/changes.py). Not after a stop: some changes may be undecided still."""
        if sweep.selected is None:
            self.ledger.set_meta("sweep_identity", sweep.identity() or "")

    # --- before a run ------------------------------------------------------------

    def skipped(
        self, spec: RunSpec, prior: Prior, decision: Decision, slot_name: str, *, paused: RunRecord | None = None
    ) -> None:
        """``spec`` does not run now; ``paused``: its record, where an earlier start paused it and it
        waits for a promotion (the summary counts it paused, as ``gts status`` does, not skipped)."""
        if decision.action == "adopt" and prior.outcome is not None:
            adopt(self.ledger, spec, prior.outcome, spec.params)
        elif decision.action == "keep":  # from now on its result is this config's
            self.ledger.keep(spec.name, params=spec.params, config_hash=spec.config_hash, program=spec.program)
            paths = RunPaths(spec.work_dir, None)
            if paths.unsafe() is None:  # its folder's config too: a later change is told against this one
                try:
                    atomic_write_json(paths.config, to_jsonable(spec.config), durable=False)
                except OSError as error:
                    logger.warning("%s: could not record its kept config (%s)", spec.work_dir, error)
        # The original's two lines, for scheduler.log; the console gets one count (report_skips).
        self._skip_lines += (
            f"{slot_name} receives task {spec.test_config_string}",
            f"{slot_name} skips task {spec.test_config_string}",
        )
        if len(self._skip_lines) >= 4096:
            self.flush()
        self._skips[decision.reason] = self._skips.get(decision.reason, 0) + 1
        if paused is not None:
            self.summary.record(
                RunOutcome(name=spec.name, work_dir=spec.work_dir, status=RunStatus.PAUSED, cause=paused.cause)
            )
        else:
            self.summary.skipped.append(spec.name)
        self.call("on_skip", spec)

    def flush(self) -> None:
        """Write the skipped runs' lines to scheduler.log."""
        file_only(self._skip_lines)
        self._skip_lines.clear()

    def report_skips(self) -> None:
        """One line for the runs skipped since the last one started (the console shows no per-run lines)."""
        self.flush()
        if self._skips:
            reasons = "; ".join(
                f"{count} because {reason if count == 1 else _plural(reason)}" for reason, count in self._skips.items()
            )
            total = sum(self._skips.values())
            logger.info("skipped %d %s: %s", total, "run" if total == 1 else "runs", reasons)
            self._skips.clear()

    # --- a run starting ------------------------------------------------------------

    def starting(self, spec: RunSpec, slot: Slot, token: str, *, queued: bool = False) -> int:
        """Record the attempt before its process exists (a crash now leaves 'running', settled on resume),
        with what made it (the code, the environment, its seed: :meth:`run_started`); ``queued``: it
        waits for a cluster's machine until it is placed."""
        provenance = None
        if self._made_with is None:
            self._unrecorded.append(spec)
        else:
            from ..records.provenance import of_run  # loaded by the reading already

            provenance = of_run(spec.config, self._made_with)
        return self.ledger.mark_running(
            name=spec.name,
            run_index=spec.index,
            config_hash=spec.config_hash,
            slot=slot.name,
            token=token,
            work_dir=spec.work_dir,
            params=spec.params,
            stage=spec.stage,
            program=spec.program,
            provenance=provenance,
            queued=queued,
        )

    def run_started(self, spec: RunSpec, slot: Slot) -> None:
        """``spec``'s process started: the hooks are told, and, the first time, what made the runs is
        read and recorded for those started so far (after their start, which it must not delay)."""
        if self._reading is None:  # here: a sweep that starts nothing reads no git
            from ..records.provenance import collected

            found: dict[str, Any] = {}
            folder = os.getcwd()
            reader = threading.Thread(
                target=lambda: found.setdefault("made_with", collected(folder)), name="gts-provenance", daemon=True
            )
            reader.start()
            self._reading = (reader, found)
        self.record_provenance()
        self.call("on_run_start", spec, slot)

    def record_provenance(self, *, wait: bool = False) -> None:
        """Record what made the runs started so far, once it has been read (``wait``: for it, at
        the sweep's end; git's calls are bounded by records/provenance.GIT_SECONDS)."""
        if self._reading is None or not self._unrecorded:
            return
        reader, found = self._reading
        if wait:
            reader.join()
        if "made_with" not in found:
            return
        from ..records.provenance import of_run

        self._made_with = found["made_with"]
        for started in self._unrecorded:
            self.ledger.set_provenance(started.name, of_run(started.config, self._made_with))
        self._unrecorded.clear()

    def not_started(
        self,
        spec: RunSpec,
        attempts: int,
        cause: str,
        slot_name: str,
        *,
        slot: Slot | None = None,
        paths: RunPaths | None = None,
        tail: str = "",
    ) -> None:
        """A run that failed before its process could start (``slot``: it was recorded as starting there)."""
        if slot is not None:
            self.ledger.finish(spec.name, RunStatus.FAILED, cause=cause, log_tail=tail or None)
        logger.error("%s fails task %s (%s)", slot_name, spec.test_config_string, cause)
        log = paths.log if paths is not None else None
        outcome = RunOutcome(
            name=spec.name,
            work_dir=spec.work_dir,
            status=RunStatus.FAILED,
            attempts=attempts,
            slot=None if slot is None else slot.name,
            cause=cause,
            log_path=log if log is not None and os.path.isfile(log) else None,
            log_tail=tail,
        )
        self.summary.record(outcome)
        self.call("on_run_end", outcome)

    def blocked(self, spec: RunSpec, cause: str) -> None:
        """A run not started: a run it depends on did not succeed. Run again, it waits for that run again."""
        self.ledger.block(
            name=spec.name,
            run_index=spec.index,
            config_hash=spec.config_hash,
            work_dir=spec.work_dir,
            params=spec.params,
            stage=spec.stage,
            cause=cause,
        )
        logger.warning("%s is blocked: %s", spec.name, cause)
        outcome = RunOutcome(name=spec.name, work_dir=spec.work_dir, status=RunStatus.BLOCKED, cause=cause)
        self.summary.record(outcome)
        self.call("on_run_end", outcome)

    def abandoned(self, spec: RunSpec) -> None:
        """A run killed because the scheduler stopped on an error (as much as the ledger still takes)."""
        try:
            self.ledger.finish(spec.name, RunStatus.INTERRUPTED, cause="the scheduler stopped on an error")
        except GTSError:
            pass  # the ledger is what failed; the next start marks the run interrupted

    # --- a run ending ----------------------------------------------------------------

    def ended(
        self,
        spec: RunSpec,
        slot: Slot,
        paths: RunPaths,
        exit: Exit,
        end: Classified,
        ended: Ended,
        *,
        attempts: int,
        pid: int | None,
        peak: int | None,
        duration: float,
        reader: MetricsReader | None,
        gpu_leftover: str | None = None,
        again: bool = False,
        usage: Released | None = None,
    ) -> RunOutcome:
        """``reader``: its metrics file read in full, when it was read off the loop (engine/endreads.py);
        ``again``: the run is queued to run again in this start (a retry); ``usage``: what the attempt
        cost (its part not saved yet is added to the run's total here)."""
        self.record_provenance()
        if ended.strays:
            logger.warning(
                "%s left %d process(es) running outside its process group; stopped pid %s",
                spec.name,
                len(ended.strays),
                ", ".join(map(str, ended.strays)),
            )
        if ended.unstoppable:
            stuck = ", ".join(map(str, ended.unstoppable))
            logger.error("%s: processes it started could not be stopped: pid %s", spec.name, stuck)
        if gpu_leftover:
            logger.warning(
                "%s has ended, but processes it started still hold GPU memory: %s; that GPU counts as busy "
                "until they let go",
                spec.name,
                gpu_leftover,
            )
        succeeded = end.status is RunStatus.SUCCEEDED
        # A pruned run that caught Pruned and returned keeps its result, too.
        returned = (
            exit.outcome is not None
            and exit.outcome.succeeded
            and end.status in (RunStatus.SUCCEEDED, RunStatus.PRUNED)
        )
        result_file = exit.outcome.large_result_file if returned and exit.outcome else None
        metrics = None
        if exit.facts.unsafe is None:  # what it reported as it trained, within bounds
            reader = reader or read_all(paths.metrics)
            metrics = reader.summary_json()
            if len(attempt_files(paths)) > 1:  # its curve spans attempts (a resumed run's does)
                metrics = run_summary(paths)
            if reader.problem is not None:
                logger.warning("%s reported metrics the scheduler skips: %s", spec.name, reader.problem)
        result = None if end.result is None else json.dumps(end.result)
        if result is None and end.status in (RunStatus.SUCCEEDED, RunStatus.PRUNED) and not result_file:
            result = own_result(paths, safe=exit.folder_problem is None)
        if usage is not None and (usage.unsaved.gpu_seconds or usage.unsaved.joules):
            self.ledger.add_usage({spec.name: usage.unsaved})
        self.ledger.finish(
            spec.name,
            end.status,
            exit_code=end.exit_code,
            signal=end.signal,
            cause=end.cause,
            log_tail=exit.tail,
            result=result,
            gpu_memory_peak=peak,
            pid=pid,
            result_file=result_file,
            gpu_leftover=gpu_leftover,
            metrics=metrics,
        )
        record = RunOutcome(
            name=spec.name,
            work_dir=spec.work_dir,
            status=end.status,
            attempts=attempts,
            slot=slot.name,
            exit_code=end.exit_code,
            signal=end.signal,
            cause=end.cause,
            log_path=paths.log,
            log_tail=exit.tail,
            duration=duration,
            result=end.result,
            result_file=paths.result if result_file else None,
            gpu_leftover=gpu_leftover,
            gpu_seconds=None if usage is None else usage.usage.gpu_seconds,
            energy=None if usage is None else usage.usage.joules,
            left_nothing=succeeded and result is None and not result_file and metrics is None,
        )
        self.summary.record(record)
        self.call("on_run_end", record)
        if succeeded:
            logger.info("%s finishes task %s", slot.name, spec.test_config_string)
        elif end.status is RunStatus.PRUNED:
            logger.info("%s stopped task %s early (%s)", slot.name, spec.test_config_string, record.describe())
        elif end.status is RunStatus.PAUSED:
            logger.info("%s paused task %s (%s)", slot.name, spec.test_config_string, record.describe())
        elif end.status is RunStatus.INTERRUPTED and not again:  # the sweep was stopped: no failure
            logger.warning(
                "%s stopped task %s (%s); it runs again at the next start",
                slot.name,
                spec.test_config_string,
                record.describe(),
            )
        elif again:  # what follows says how it runs again (its machine went away: on another)
            logger.warning(
                "%s: attempt %d of task %s ended (%s)", slot.name, attempts, spec.test_config_string, record.describe()
            )
        else:
            logger.error("%s fails task %s (%s)", slot.name, spec.test_config_string, record.describe())
        return record


def _plural(reason: str) -> str:
    """A skip's reason, said of several runs: "it succeeded before" -> "they succeeded before"."""
    for one, many in (("it was ", "they were "), ("it is ", "they are "), ("it ", "they "), ("its ", "their ")):
        if reason.startswith(one):
            return many + reason[len(one) :]
    return reason


def own_result(paths: RunPaths, *, safe: bool) -> str | None:
    """A run that returned nothing (a command) and left a ``result.json`` in its folder: that
    result as the ledger keeps it, so that SQLite can rank runs by it (``gts results --top``, the
    web view) as it ranks returned results. None when there is none, it is over
    MAX_INLINE_RESULT bytes (it stays the file's, read as before), or not JSON."""
    if not safe:  # the run folder holds a link or a non-regular file (RunPaths.unsafe)
        return None
    value = read_json(os.path.join(paths.work_dir, RESULT_FILE), limit=MAX_INLINE_RESULT)
    if value is None:
        return None
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:  # NaN or infinity: not JSON that SQLite reads; the file keeps it
        return None
