"""The event loop: place runs on free slots, react to exits, timeouts and signals.

One thread (the caller's) makes every decision and every ledger write; child
watcher threads and signal handlers only post events to a queue. The loop
sleeps in ``queue.get`` until an event arrives or the nearest deadline (a run
timeout, the end of a grace period) passes, so a slot gets its next run the
moment its child exits.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import queue
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple, Type

from .devices import Slot
from .errors import GTSError
from .gpu_task import GPUTask
from .launch import LaunchError, prepare
from .ledger import Ledger, RunStatus, SweepLock
from .paths import RootPaths, RunPaths, read_json
from .process import Child, describe_returncode
from .summary import RunOutcome, SweepSummary
from .sweep import RunSpec, Sweep

logger = logging.getLogger("gpu_task_scheduler")

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class _Active:
    spec: RunSpec
    slot: Slot
    child: Child
    paths: RunPaths
    token: str
    tries: int  # attempts of this run in this start()
    started: float
    deadline: Optional[float]
    stop_reason: Optional[RunStatus] = None  # TIMED_OUT or INTERRUPTED once we stop it
    stop_cause: Optional[str] = None
    kill_at: Optional[float] = None


class Scheduler:
    def __init__(self, sweep: Sweep, task_class: Type[GPUTask], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sweep = sweep
        self.options = sweep.options
        self.task_class = task_class
        self._clock = clock
        self._events: "queue.SimpleQueue[Tuple[str, Any]]" = queue.SimpleQueue()
        self._active: Dict[int, _Active] = {}
        self._free: Deque[int] = collections.deque(range(len(self.options.slots)))
        self._idle_reported: set = set()
        self._retry: Deque[Tuple[RunSpec, int]] = collections.deque()
        self._runs: Optional[Iterator[RunSpec]] = None
        self._stop_level = 0
        self._summary = SweepSummary()

    # --- entry ----------------------------------------------------------------

    def run(self) -> SweepSummary:
        started = self._clock()
        root = RootPaths(self.options.result_root_folder)
        try:
            os.makedirs(root.root, exist_ok=True)
        except OSError as error:
            raise GTSError(f"cannot create the result root {root.root!r}: {error}") from error
        lock = SweepLock(root)
        lock.acquire()
        try:
            self._ledger = Ledger(root)
            try:
                self._settle_previous()
                self._runs = iter(self.sweep)
                with _StopSignals(self._events):
                    self._loop()
            finally:
                self._kill_everything()
                self._ledger.close()
        finally:
            lock.release()
        self._summary.duration = self._clock() - started
        return self._summary

    def _settle_previous(self) -> None:
        """Runs a killed scheduler left marked ``running``: done, or interrupted."""
        for record in self._ledger.running():
            outcome = read_json(RunPaths(record.work_dir or "", None).outcome) if record.work_dir else None
            if outcome and outcome.get("token") == record.token and outcome.get("status") == "succeeded":
                self._ledger.finish(record.name, RunStatus.SUCCEEDED, exit_code=0,
                                    result=json.dumps(outcome.get("result")), ended_at=outcome.get("finished_at"))
            else:
                self._ledger.finish(record.name, RunStatus.INTERRUPTED,
                                    cause="the scheduler stopped while the run was active")

    # --- the loop -------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            if self._stop_level == 0:
                self._fill_free_slots()
            if not self._active:
                return
            try:
                kind, value = self._events.get(timeout=self._seconds_to_next_deadline())
            except queue.Empty:
                kind, value = "tick", None
            if kind == "exit":
                self._on_exit(value)
            elif kind == "signal":
                self._on_signal(value)
            self._enforce_deadlines()

    def _seconds_to_next_deadline(self) -> Optional[float]:
        deadlines = [d for a in self._active.values() for d in (a.deadline, a.kill_at) if d is not None]
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - self._clock())

    def _next_spec(self) -> Optional[Tuple[RunSpec, int]]:
        if self._retry:
            return self._retry.popleft()
        assert self._runs is not None
        spec = next(self._runs, None)
        return None if spec is None else (spec, 0)

    def _fill_free_slots(self) -> None:
        while self._free:
            index = self._free[0]
            slot = self.options.slots[index]
            item = self._next_spec()
            if item is None:
                for idle in self._free:
                    if idle not in self._idle_reported:
                        self._idle_reported.add(idle)
                        logger.info("%s finished", self.options.slots[idle].name)
                return
            spec, tries = item
            self._idle_reported.discard(index)
            logger.info("%s receives task %s", slot.name, spec.test_config_string)
            reason = None if tries else self._skip_reason(spec)
            if reason is not None:
                logger.info("%s skips task %s", slot.name, spec.test_config_string)
                logger.debug("skipped %s: %s", spec.name, reason)
                self._summary.skipped.append(spec.name)
                continue
            if self._launch(spec, index, tries + 1):
                self._free.popleft()

    def _skip_reason(self, spec: RunSpec) -> Optional[str]:
        if spec.duplicate:
            return "the same config appears earlier in the sweep"
        if self.options.force_rerun:
            return None
        record = self._ledger.get(spec.name)
        folder_exists = os.path.isdir(spec.work_dir)
        if record is not None:
            if record.status is not RunStatus.SUCCEEDED or not folder_exists:
                return None
            if record.config_hash not in (None, spec.config_hash):
                logger.warning(
                    "%s succeeded earlier with a different config; keeping that result "
                    "(set force_rerun to run it again)", spec.work_dir)
            return "it succeeded before"
        if not folder_exists:
            return None
        outcome = read_json(RunPaths(spec.work_dir, None).outcome)
        if outcome and outcome.get("status") == "succeeded" and outcome.get("config_hash") == spec.config_hash:
            self._ledger.adopt(name=spec.name, run_index=spec.index, config_hash=spec.config_hash,
                               work_dir=spec.work_dir, result=json.dumps(outcome.get("result")),
                               ended_at=outcome.get("finished_at"))
            return "its folder records a success"
        if self.options.skip_existing_folders:
            return "its folder exists (skip_existing_folders)"
        return None

    # --- starting and ending runs ----------------------------------------------

    def _launch(self, spec: RunSpec, slot_index: int, tries: int) -> bool:
        slot = self.options.slots[slot_index]
        paths = RunPaths(spec.work_dir, self.options.log_file)
        token = uuid.uuid4().hex
        attempt = self._ledger.mark_running(name=spec.name, run_index=spec.index, config_hash=spec.config_hash,
                                            slot=slot.name, token=token, work_dir=spec.work_dir)
        try:
            launch = prepare(spec=spec, slot=slot, task_class=self.task_class, paths=paths,
                             token=token, attempt=attempt)
            child = Child(launch.argv, env=launch.env, cwd=launch.cwd, log_path=paths.log,
                          on_exit=lambda: self._events.put(("exit", slot_index)))
        except (LaunchError, OSError) as error:
            cause = f"could not start: {error}"
            self._ledger.finish(spec.name, RunStatus.FAILED, cause=cause)
            logger.error("%s fails task %s (%s)", slot.name, spec.test_config_string, cause)
            self._summary.record(RunOutcome(name=spec.name, work_dir=spec.work_dir, status=RunStatus.FAILED,
                                            attempts=tries, slot=slot.name, cause=cause, log_path=paths.log))
            return False
        self._ledger.set_pid(spec.name, child.pid)
        now = self._clock()
        timeout = self.options.timeout
        self._active[slot_index] = _Active(spec=spec, slot=slot, child=child, paths=paths, token=token,
                                           tries=tries, started=now,
                                           deadline=None if timeout is None else now + timeout)
        return True

    def _on_exit(self, slot_index: int) -> None:
        active = self._active.pop(slot_index)
        returncode = active.child.reap()
        duration = self._clock() - active.started
        spec, paths = active.spec, active.paths
        exit_code, signal_name = describe_returncode(returncode)
        outcome = read_json(paths.outcome)
        if outcome is not None and outcome.get("token") != active.token:
            outcome = None
        result = None
        if outcome is not None and outcome.get("status") == "succeeded":
            status, cause, result = RunStatus.SUCCEEDED, None, outcome.get("result")
        elif active.stop_reason is not None:
            status, cause = active.stop_reason, active.stop_cause
        else:
            status = RunStatus.FAILED
            cause = (outcome or {}).get("error")
            if cause is not None and outcome.get("phase") == "load":
                cause = f"the task could not be loaded in the run's process: {cause}"
            if cause is None and not os.path.isdir(spec.work_dir):
                cause = "the run folder disappeared"
            if cause is None and exit_code == 0:
                cause = "the process exited without recording an outcome"
        tail = paths.tail()
        self._ledger.finish(spec.name, status, exit_code=exit_code, signal=signal_name, cause=cause,
                            log_tail=tail, result=None if result is None else json.dumps(result))
        record = RunOutcome(name=spec.name, work_dir=spec.work_dir, status=status, attempts=active.tries,
                            slot=active.slot.name, exit_code=exit_code, signal=signal_name, cause=cause,
                            log_path=paths.log, log_tail=tail, duration=duration, result=result)
        self._summary.record(record)
        if status is RunStatus.SUCCEEDED:
            logger.info("%s finishes task %s", active.slot.name, spec.test_config_string)
        else:
            logger.error("%s fails task %s (%s)", active.slot.name, spec.test_config_string, record.describe())
            retryable = status in (RunStatus.FAILED, RunStatus.TIMED_OUT)
            if retryable and self._stop_level == 0 and active.tries <= self.options.max_retries:
                logger.info("%s will be retried (attempt %d of %d)", spec.name, active.tries + 1,
                            self.options.max_retries + 1)
                self._retry.append((spec, active.tries))
        self._free.append(slot_index)

    def _stop(self, active: _Active, reason: RunStatus, cause: str) -> None:
        """SIGTERM the run's group now, SIGKILL it when the grace period ends."""
        if active.stop_reason is None:
            active.stop_reason, active.stop_cause = reason, cause
        active.child.signal_group(signal.SIGTERM)
        active.kill_at = self._clock() + self.options.grace_period
        active.deadline = None

    def _enforce_deadlines(self) -> None:
        now = self._clock()
        for active in self._active.values():
            if active.deadline is not None and now >= active.deadline:
                self._stop(active, RunStatus.TIMED_OUT, f"timed out after {self.options.timeout:g}s")
            elif active.kill_at is not None and now >= active.kill_at:
                logger.warning("%s did not stop within %gs of SIGTERM; sending SIGKILL",
                               active.spec.name, self.options.grace_period)
                active.child.signal_group(signal.SIGKILL)
                active.kill_at = None

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        self._summary.interrupted_by = self._summary.interrupted_by or name
        self._stop_level += 1
        if self._stop_level == 1:
            logger.warning("received %s: starting no more runs; stopping %d running run(s) "
                           "(SIGTERM, then SIGKILL after %gs). Press Ctrl-C again to stop at once.",
                           name, len(self._active), self.options.grace_period)
            for active in self._active.values():
                self._stop(active, RunStatus.INTERRUPTED, f"interrupted by {name}")
        else:
            logger.warning("received %s again: killing %d run(s) now", name, len(self._active))
            for active in self._active.values():
                active.stop_reason = active.stop_reason or RunStatus.INTERRUPTED
                active.child.signal_group(signal.SIGKILL)

    def _kill_everything(self) -> None:
        """Last resort when the loop ends abnormally: no child may outlive us."""
        for slot_index, active in list(self._active.items()):
            active.child.signal_group(signal.SIGKILL)
            active.child.reap()
            del self._active[slot_index]
            try:
                self._ledger.finish(active.spec.name, RunStatus.INTERRUPTED,
                                    cause="the scheduler stopped on an error")
            except GTSError:
                pass  # the ledger is what failed; the next start marks the run interrupted


class _StopSignals:
    """While active, SIGINT and SIGTERM only post an event to the loop."""

    def __init__(self, events: "queue.SimpleQueue[Tuple[str, Any]]") -> None:
        self._events = events
        self._previous: Dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        self._events.put(("signal", signum))  # SimpleQueue.put is safe in a signal handler

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in _STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
