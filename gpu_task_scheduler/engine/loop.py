"""The event loop: start runs where capacity allows, react to exits, deadlines and signals.

One thread (the caller's) makes every decision and every ledger write; the
launcher's exit reports and signal handlers only post events to the inbox.
The loop sleeps in ``inbox.get`` until an event arrives or the nearest
deadline passes (a run's timeout, the end of a grace period, the next look at
the GPUs while runs wait for memory or are measured), so a slot gets its next
run the moment the last one ends.

What to decide is in ``decide.py`` (pure), where runs fit in
``gpu/capacity.py``, how a run's process starts in the launcher; this module
is the order of events around them and the I/O (ledger, outcome files, logs).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from queue import Empty
from types import ModuleType
from typing import Any

from ..errors import GTSError
from ..gpu.capacity import Capacity
from ..gpu.devices import Slot, format_memory
from ..gpu.host import HostProbe
from ..gpu.placement import Need, WholeGpu
from ..records.ledger import Ledger, SweepLock, foreign_checker
from ..records.paths import RootPaths, RunPaths
from ..records.prior import adopt, read_prior, settle_running
from ..records.protocol import Outcome
from ..records.status import RunStatus
from ..sweep.expand import RunSpec, Sweep, params_text
from .decide import ExitFacts, after_exit, before_run, classify
from .hooks import NOT_READY, Hooks, Inbox, StopSignals
from .launcher import Attempt, Handle, Launcher, LaunchError
from .summary import RunOutcome, SweepSummary

logger = logging.getLogger("gpu_task_scheduler")
FILE_ONLY = {"gts_file_only": True}  # log records for scheduler.log only (see ConsoleFilter in gpu_task_scheduler.py)


@dataclass
class _Pending:
    spec: RunSpec
    tries: int = 0  # attempts of this run in this start()
    oom_retries: int = 0
    need: Need = None  # the memory estimate raised after an out-of-memory failure


@dataclass
class _Active:
    item: _Pending
    slot_index: int
    slot: Slot
    handle: Handle
    paths: RunPaths
    token: str
    started: float
    deadline: float | None
    stopped: tuple[RunStatus, str] | None = None  # (TIMED_OUT or INTERRUPTED, cause) once we stop it
    kill_at: float | None = None

    @property
    def spec(self) -> RunSpec:
        return self.item.spec


class Scheduler:
    def __init__(
        self,
        sweep: Sweep,
        launcher: Launcher,
        *,
        nvml: ModuleType | None = None,
        hooks: Hooks | None = None,
        clock: Callable[[], float] = time.monotonic,
        inbox: Inbox | None = None,
        host: HostProbe | None = None,
        keep_succeeded: bool = True,
    ) -> None:
        self.sweep, self.options, self._launcher = sweep, sweep.options, launcher
        self._hooks, self._nvml, self._clock, self._host = hooks or Hooks(), nvml, clock, host
        self.inbox = inbox or Inbox()
        self._active: dict[int, _Active] = {}
        self._keys = iter(range(1 << 62))
        self._retry: collections.deque[_Pending] = collections.deque()
        self._deferred: collections.deque[_Pending] = collections.deque()  # out-of-memory retries, last
        self._held: _Pending | None = None  # the next run, waiting for room
        self._runs: Iterator[RunSpec] | None = None
        self._exhausted = False
        self._stop_level = 0
        self._summary = SweepSummary(keep_succeeded=keep_succeeded)
        self._capacity: Capacity | None = None
        self._waiting_for: str | None = None
        self._next_poll: float | None = None
        self._skips: dict[str, int] = {}  # reason -> runs skipped for it, not yet reported

    def setup(self) -> Capacity:
        """Find the slots on this machine; raises GTSError (and writes nothing) if there are none."""
        if self._capacity is None:
            self._capacity = Capacity(self.options, nvml=self._nvml, host=self._host)
        return self._capacity

    @property
    def slots(self) -> list[Slot]:
        return self.setup().slots

    def run(self) -> SweepSummary:
        started = self._clock()
        root = RootPaths(self.options.result_root_folder)
        capacity = self.setup()
        try:
            capacity.log_gpus()
            try:
                os.makedirs(root.root, exist_ok=True)
            except OSError as error:
                raise GTSError(f"cannot create the result root {root.root!r}: {error}") from error
            with SweepLock(root) as lock:
                assert lock.fd is not None
                self._launcher.open(lock.fd)  # every run holds the lock too: the root stays locked while one lives
                with Ledger(root) as self._ledger:
                    try:
                        settle_running(self._ledger)
                        self._record_sweep()
                        self._ledger.set_meta("log_file", self.options.log_file or "")
                        self._runs = self.sweep.runs(foreign_checker(self._ledger, root.root))
                        with StopSignals(self.inbox):
                            self._loop()
                    finally:
                        self._kill_everything()
        finally:
            capacity.close()
        self._summary.duration = self._clock() - started
        self._call("on_sweep_end", self._summary)
        return self._summary

    def _record_sweep(self) -> None:
        """What ``gts status`` needs to know beyond the runs: the sweep's size (none for gts queue)."""
        try:
            self._ledger.set_meta("sweep_runs", str(len(self.sweep)))
        except TypeError:  # an open-ended sweep
            self._ledger.set_meta("sweep_runs", "")

    def post(self, kind: str, value: Any = None) -> None:
        """Wake the loop from another thread (e.g. new input for ``gts queue``)."""
        self.inbox.put(kind, value)

    def _call(self, hook: str, *args: Any) -> None:
        try:
            getattr(self._hooks, hook)(*args)
        except Exception:
            logger.exception("the %s callback raised; the sweep goes on", hook)

    # --- the loop -------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            if self._stop_level == 0:
                self._fill()
            if not self._active and (self._stop_level or (self._held is None and self._done_taking())):
                return
            try:
                kind, value = self.inbox.get(self._seconds_to_next_deadline())
            except Empty:
                kind, value = "tick", None
                self.setup().measure()  # what the runs use now (their peaks teach us their needs)
            if kind == "exit":
                self._on_exit(value)
            elif kind == "signal":
                self._on_signal(value)
            self._enforce_deadlines()

    def _done_taking(self) -> bool:
        return self._exhausted and not self._retry and not self._deferred

    def _seconds_to_next_deadline(self) -> float | None:
        deadlines = [d for a in self._active.values() for d in (a.deadline, a.kill_at) if d is not None]
        if (self._held is not None or self.setup().measuring) and self._stop_level == 0:
            if self._next_poll is None or self._next_poll <= self._clock():
                self._next_poll = self._clock() + self.options.gpu_poll_interval
            deadlines.append(self._next_poll)
        return None if not deadlines else max(0.0, min(deadlines) - self._clock())

    def _next(self) -> _Pending | None:
        if self._held is None:
            if self._retry:
                self._held = self._retry.popleft()
            elif not self._exhausted:
                assert self._runs is not None
                spec = next(self._runs, None)
                if spec is None:
                    self._exhausted = True
                elif spec is not NOT_READY:
                    self._held = _Pending(spec)
            if self._held is None and self._exhausted and self._deferred:
                self._held = self._deferred.popleft()
        return self._held

    def _fill(self) -> None:
        capacity = self.setup()
        while (item := self._next()) is not None:
            if not item.tries and self._skipped(item.spec):
                self._held = None
                continue
            need = capacity.need(item.spec.config, item.need)
            placement = capacity.place(item.spec.name, need)
            if placement.impossible is not None:
                self._held = None
                self._fail(item, placement.impossible)
                continue
            if placement.view is None:
                if placement.waiting is not None and placement.waiting != self._waiting_for:
                    self._waiting_for = placement.waiting  # waiting for our own runs is the normal case
                    (logger.warning if placement.news else logger.info)("%s", placement.waiting)
                return
            self._held, self._waiting_for = None, None
            self._report_skips()
            logger.info("%s receives task %s", placement.view.slot.name, item.spec.test_config_string)
            self._launch(item, placement.view.index, need)
        if self._done_taking():
            self._report_skips()
            for slot in capacity.newly_idle():
                logger.info("%s finished", slot.name)

    def _skipped(self, spec: RunSpec) -> bool:
        prior = read_prior(spec, self._ledger)
        decision = before_run(
            prior,
            force_rerun=self.options.force_rerun,
            skip_existing_folders=self.options.skip_existing_folders,
        )
        if decision.warning:
            logger.warning("%s %s", spec.work_dir, decision.warning)
        if decision.action == "run":
            return False
        if decision.action == "adopt" and prior.outcome is not None:
            adopt(self._ledger, spec, prior.outcome, params_text(spec.test_config))
        name = self.setup().free_slot_name()
        # The original's two lines, for scheduler.log; the console gets one count (_report_skips).
        logger.info("%s receives task %s", name, spec.test_config_string, extra=FILE_ONLY)
        logger.info("%s skips task %s", name, spec.test_config_string, extra=FILE_ONLY)
        self._skips[decision.reason] = self._skips.get(decision.reason, 0) + 1
        self._summary.skipped.append(spec.name)
        self._call("on_skip", spec)
        return True

    def _report_skips(self) -> None:
        """One line for the runs skipped since the last one started (the console shows no per-run lines)."""
        if self._skips:
            reasons = "; ".join(f"{count} because {reason}" for reason, count in self._skips.items())
            logger.info("skipped %d run(s): %s", sum(self._skips.values()), reasons)
            self._skips.clear()

    # --- starting and ending runs ----------------------------------------------

    def _fail(
        self, item: _Pending, cause: str, slot: Slot | None = None, paths: RunPaths | None = None, tail: str = ""
    ) -> None:
        """A run that failed before its process could start."""
        spec = item.spec
        has_log = paths is not None and paths.log is not None and os.path.isfile(paths.log)
        slot_name = slot.name if slot is not None else self.setup().free_slot_name()
        logger.error("%s fails task %s (%s)", slot_name, spec.test_config_string, cause)
        outcome = RunOutcome(
            name=spec.name,
            work_dir=spec.work_dir,
            status=RunStatus.FAILED,
            attempts=item.tries,
            slot=None if slot is None else slot.name,
            cause=cause,
            log_path=paths.log if has_log and paths is not None else None,
            log_tail=tail,
        )
        self._summary.record(outcome)
        self._call("on_run_end", outcome)

    def _launch(self, item: _Pending, slot_index: int, need: Need) -> None:
        spec, slot = item.spec, self.setup().slots[slot_index]
        item.tries += 1
        paths = RunPaths(spec.work_dir, self.options.log_file)
        token = uuid.uuid4().hex
        number = self._ledger.mark_running(
            name=spec.name,
            run_index=spec.index,
            config_hash=spec.config_hash,
            slot=slot.name,
            token=token,
            work_dir=spec.work_dir,
            params=params_text(spec.test_config),
        )
        key = next(self._keys)
        try:
            handle = self._launcher.start(
                Attempt(spec, slot, paths, token, number), lambda: self.inbox.put("exit", key)
            )
        except (LaunchError, OSError) as error:
            cause = f"could not start: {error}"
            tail = paths.tail() or "\n".join(getattr(error, "details", "").splitlines()[-20:])
            self._ledger.finish(spec.name, RunStatus.FAILED, cause=cause, log_tail=tail or None)
            self._fail(item, cause, slot, paths, tail)
            return
        now, timeout = self._clock(), self.options.timeout
        self.setup().take(slot_index, handle.pid, need)
        deadline = None if timeout is None else now + timeout
        self._active[key] = _Active(item, slot_index, slot, handle, paths, token, now, deadline)
        self._call("on_run_start", spec, slot)

    def _on_exit(self, key: int) -> None:
        active = self._active.pop(key)
        reserved, peak = self.setup().release(active.slot_index, active.handle.pid)  # before reaping
        ended = active.handle.reap()
        spec, paths, item = active.spec, active.paths, active.item
        unsafe = paths.unsafe(records_only=True)  # the run itself may have planted a link where our records go
        outcome = Outcome.read(paths.outcome, token=active.token) if unsafe is None else None
        tail = paths.tail()
        end = classify(
            ExitFacts(
                returncode=ended.returncode,
                reports_outcome=active.handle.reports_outcome,
                outcome=outcome,
                stopped=active.stopped,
                unsafe=unsafe,
                folder_exists=paths.exists(),
                log_tail=tail,
                unstoppable=ended.unstoppable,
            )
        )
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
        if peak and end.oom is None:
            self.setup().learn(peak)
        succeeded = end.status is RunStatus.SUCCEEDED
        result_file = outcome.large_result_file if succeeded and outcome else None
        self._ledger.finish(
            spec.name,
            end.status,
            exit_code=end.exit_code,
            signal=end.signal,
            cause=end.cause,
            log_tail=tail,
            result=None if end.result is None else json.dumps(end.result),
            gpu_memory_peak=peak,
            pid=active.handle.pid,
            result_file=result_file,
        )
        record = RunOutcome(
            name=spec.name,
            work_dir=spec.work_dir,
            status=end.status,
            attempts=item.tries,
            slot=active.slot.name,
            exit_code=end.exit_code,
            signal=end.signal,
            cause=end.cause,
            log_path=paths.log,
            log_tail=tail,
            duration=self._clock() - active.started,
            result=end.result,
            result_file=paths.result if result_file else None,
        )
        self._summary.record(record)
        self._call("on_run_end", record)
        if succeeded:
            logger.info("%s finishes task %s", active.slot.name, spec.test_config_string)
            return
        logger.error("%s fails task %s (%s)", active.slot.name, spec.test_config_string, record.describe())
        o = self.options
        step = after_exit(
            end,
            tries=item.tries,
            oom_retries=item.oom_retries,
            reserved=reserved,
            peak=peak,
            max_retries=o.max_retries,
            max_oom_retries=o.max_oom_retries,
            stopping=self._stop_level > 0,
        )
        if step.action == "defer":
            item.oom_retries += 1
            item.need = step.need
            size = "the whole GPU" if isinstance(step.need, WholeGpu) else format_memory(step.need)
            logger.info(
                "%s ran out of GPU memory; it will run again later, reserving %s (out-of-memory retry %d of %d)",
                spec.name,
                size,
                item.oom_retries,
                o.max_oom_retries,
            )
            self._deferred.append(item)
        elif step.action == "retry":
            logger.info("%s will be retried (attempt %d of %d)", spec.name, item.tries + 1, o.max_retries + 1)
            self._retry.append(item)

    # --- stopping -----------------------------------------------------------------

    def _stop(self, active: _Active, reason: RunStatus, cause: str) -> None:
        """SIGTERM the run now, SIGKILL it when the grace period ends."""
        active.stopped = active.stopped or (reason, cause)
        active.handle.stop()
        active.kill_at = self._clock() + self.options.grace_period
        active.deadline = None

    def _enforce_deadlines(self) -> None:
        now = self._clock()
        for active in self._active.values():
            if active.deadline is not None and now >= active.deadline:
                if active.handle.has_exited():
                    # It ended while we were not looking (the scheduler was stopped, or
                    # busy): its own exit status says how, not the clock we read late.
                    active.deadline = None
                    continue
                self._stop(active, RunStatus.TIMED_OUT, f"timed out after {self.options.timeout:g}s")
            elif active.kill_at is not None and now >= active.kill_at:
                logger.warning(
                    "%s did not stop within %gs of SIGTERM; sending SIGKILL",
                    active.spec.name,
                    self.options.grace_period,
                )
                active.handle.kill()
                active.kill_at = None

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        self._summary.interrupted_by = self._summary.interrupted_by or name
        self._stop_level += 1
        if self._stop_level == 1:
            logger.warning(
                "received %s: starting no more runs; stopping %d running run(s) "
                "(SIGTERM, then SIGKILL after %gs). Press Ctrl-C again to stop at once.",
                name,
                len(self._active),
                self.options.grace_period,
            )
            for active in self._active.values():
                self._stop(active, RunStatus.INTERRUPTED, f"interrupted by {name}")
        else:
            logger.warning("received %s again: killing %d run(s) now", name, len(self._active))
            for active in self._active.values():
                active.stopped = active.stopped or (RunStatus.INTERRUPTED, f"interrupted by {name}")
                active.kill_at = None
                active.handle.kill()

    def _kill_everything(self) -> None:
        """Last resort when the loop ends abnormally: no run may outlive us."""
        for key, active in list(self._active.items()):
            active.handle.kill()
            active.handle.reap()
            del self._active[key]
            try:
                self._ledger.finish(active.spec.name, RunStatus.INTERRUPTED, cause="the scheduler stopped on an error")
            except GTSError:
                pass  # the ledger is what failed; the next start marks the run interrupted
