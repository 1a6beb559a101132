"""The event loop: place runs on slots, react to exits, timeouts, signals and GPU state.

One thread (the caller's) makes every decision and every ledger write; child
watcher threads and signal handlers only post events to a queue. The loop
sleeps in ``queue.get`` until an event arrives or the nearest deadline passes
(a run's timeout, the end of a grace period, the next look at the GPUs while
runs are waiting for memory or being measured), so a slot gets its next run
the moment its child exits.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import random
import signal
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..backends.local.prepare import LaunchError, TaskFactory, class_factory, log_launch_failure, prepare
from ..backends.local.process import Child, describe_returncode
from ..backends.local.proctree import wait_gone
from ..errors import GTSError
from ..gpu.devices import Slot, format_memory
from ..gpu.host import HostProbe
from ..gpu.nvml import GpuMonitor, NvmlUnavailable
from ..gpu.oom import detect_oom
from ..gpu.placement import EXCLUSIVE, Reservation, SlotView, book, busy_reason, choose, machine_slots, process_group
from ..gpu_task import GPUTask
from ..records.ledger import Ledger, RunStatus, SweepLock, foreign_checker
from ..records.paths import RootPaths, RunPaths, read_json
from ..sweep.expand import RunSpec, Sweep, params_text
from .summary import RunOutcome, SweepSummary

logger = logging.getLogger("gpu_task_scheduler")
# Log records for scheduler.log only (see ConsoleFilter in gpu_task_scheduler.py).
FILE_ONLY = {"gts_file_only": True}

# SIGHUP (the terminal closed) stops the sweep as gracefully as Ctrl-C.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
OOM_GROWTH = 1.5  # after an out-of-memory failure, a run's estimate grows by this factor


@dataclass
class _Pending:
    spec: RunSpec
    tries: int = 0  # attempts of this run in this start()
    oom_retries: int = 0
    need: int | None = None  # the memory estimate raised after an out-of-memory failure


@dataclass
class _Active:
    item: _Pending
    slot_index: int
    slot: Slot
    child: Child
    paths: RunPaths
    token: str
    started: float
    deadline: float | None
    reservation: Reservation
    direct: bool = False  # a plain command: exit status 0 means success
    stop_reason: RunStatus | None = None  # TIMED_OUT or INTERRUPTED once we stop it
    stop_cause: str | None = None
    kill_at: float | None = None
    draining: bool = False  # stopped, its first process ended, the rest may still use the grace period

    @property
    def spec(self) -> RunSpec:
        return self.item.spec


# What a sweep's iterator yields when its next run is not known yet (``gts queue``
# waiting for input); it posts a "wake" event when there is more.
NOT_READY: Any = object()


class Hooks:
    """Callbacks around runs; the scheduler logs and ignores exceptions they raise."""

    def on_run_start(self, spec: RunSpec, slot: Slot) -> None:
        pass

    def on_run_end(self, outcome: RunOutcome) -> None:
        pass

    def on_skip(self, spec: RunSpec) -> None:
        pass

    def on_sweep_end(self, summary: SweepSummary) -> None:
        pass


class Scheduler:
    def __init__(
        self,
        sweep: Sweep,
        task: type[GPUTask] | TaskFactory,
        *,
        nvml: ModuleType | None = None,
        hooks: Hooks | None = None,
        clock: Callable[[], float] = time.monotonic,
        host: HostProbe | None = None,
        keep_succeeded: bool = True,
    ) -> None:
        self.sweep = sweep
        self.options = sweep.options
        self._make_task = class_factory(task) if isinstance(task, type) else task
        self._hooks = hooks or Hooks()
        self._nvml_module = nvml
        self._clock = clock
        self._host = host or HostProbe()
        self._events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._active: dict[int, _Active] = {}
        self._keys = iter(range(1 << 62))
        self._retry: collections.deque[_Pending] = collections.deque()
        self._deferred: collections.deque[_Pending] = (
            collections.deque()
        )  # out-of-memory retries, after everything else
        self._held: _Pending | None = None  # the next run, waiting for room
        self._runs: Iterator[RunSpec] | None = None
        self._exhausted = False
        self._idle_reported: set = set()
        self._stop_level = 0
        self._summary = SweepSummary(keep_succeeded=keep_succeeded)
        self._monitor: GpuMonitor | None = None
        self._learned: list[int] = []
        self._last_slot = -1
        self._rng = random.Random(0)
        self._waiting_for: str | None = None
        self._next_poll: float | None = None
        self._setup_done = False
        self._gpu_states: dict[str, Any] = {}
        self._lock_fd: int | None = None
        self._skips: dict[str, int] = {}  # reason -> runs skipped for it, not yet reported

    # --- entry ----------------------------------------------------------------

    def setup(self) -> None:
        """Find the slots on this machine; raises GTSError (and writes nothing) if there are none."""
        if self._setup_done:
            return
        try:
            self._setup_slots()
        except BaseException:
            self._close_monitor()
            raise
        self._setup_done = True

    def run(self) -> SweepSummary:
        started = self._clock()
        root = RootPaths(self.options.result_root_folder)
        self.setup()
        self._log_gpus()
        try:
            os.makedirs(root.root, exist_ok=True)
        except OSError as error:
            self._close_monitor()
            raise GTSError(f"cannot create the result root {root.root!r}: {error}") from error
        lock = SweepLock(root)
        try:
            lock.acquire()
        except BaseException:
            self._close_monitor()
            raise
        self._lock_fd = lock.fd  # every run holds the lock too, so the root stays locked while one lives
        try:
            self._ledger = Ledger(root)
            try:
                self._settle_previous()
                self._record_sweep()
                self._runs = self.sweep.runs(foreign_checker(self._ledger, root.root))
                with _StopSignals(self._events):
                    self._loop()
            finally:
                self._kill_everything()
                self._ledger.close()
        finally:
            lock.release()
            self._close_monitor()
        self._summary.duration = self._clock() - started
        self._call("on_sweep_end", self._summary)
        return self._summary

    def post(self, kind: str, value: Any = None) -> None:
        """Wake the loop from another thread (e.g. new input for ``gts queue``)."""
        self._events.put((kind, value))

    def _call(self, hook: str, *args: Any) -> None:
        try:
            getattr(self._hooks, hook)(*args)
        except Exception:
            logger.exception("the %s callback raised; the sweep goes on", hook)

    def _setup_slots(self) -> None:
        o = self.options
        wants_gpus = o.slots is None or any(not slot.is_cpu for slot in o.slots)
        if wants_gpus:
            try:
                self._monitor = GpuMonitor(self._nvml_module)
            except NvmlUnavailable as error:
                if o.slots is not None:
                    ids = sorted({gpu for slot in o.slots for gpu in slot.gpu_ids})
                    logger.warning(
                        "GPU %s could not be checked: %s. The runs start on them anyway (CUDA decides "
                        "whether they exist), one run per slot, without memory checks",
                        ", ".join(ids),
                        error,
                    )
        self.slots: list[Slot] = machine_slots(o, self._monitor)
        packing_ok = self._monitor is not None
        self._capacity = [1 if slot.is_cpu or not packing_ok else o.max_runs_per_gpu for slot in self.slots]
        self._running = [0] * len(self.slots)
        if self._monitor is not None:
            ids = sorted({gpu for slot in self.slots for gpu in slot.gpu_ids})
            try:
                self._gpu_states = self._read_gpus(ids)
            except BaseException:
                self._close_monitor()
                raise
        if o.max_host_cpu_percent is not None:
            self._host.cpu_percent()  # start the first measuring interval

    def _read_gpus(self, ids: list[str]) -> dict[str, Any]:
        """Each listed GPU's state; a GPU NVML does not know is an error that lists those it does."""
        assert self._monitor is not None
        states, unknown = {}, []
        for gpu_id in ids:
            try:
                states[gpu_id] = self._monitor.state(gpu_id)
            except Exception as error:  # the bindings' NVMLError subclasses
                unknown.append(f"{gpu_id} ({error})")
        if not unknown:
            return states
        try:
            present = (
                "; ".join(
                    f"{state.index}: {state.name}, {format_memory(state.total_memory)}" for state in self._monitor.all()
                )
                or "none"
            )
        except Exception as error:
            present = f"unknown ({error})"
        hint = (
            "; CUDA_VISIBLE_DEVICES is set, so ids count within it"
            if os.environ.get("CUDA_VISIBLE_DEVICES") is not None
            else ""
        )
        raise GTSError(f"GPU {', '.join(unknown)} does not exist on this machine; the GPUs NVML sees: {present}{hint}")

    def _log_gpus(self) -> None:
        for gpu_id, state in self._gpu_states.items():
            logger.info(
                "gpu %s: %s, %s total, %s free, %d process(es)",
                gpu_id,
                state.name,
                format_memory(state.total_memory),
                format_memory(state.free_memory),
                len(state.processes),
            )

    def _record_sweep(self) -> None:
        """What ``gts status`` needs to know beyond the runs: the sweep's size and log file name."""
        try:
            self._ledger.set_meta("sweep_runs", str(len(self.sweep)))
        except TypeError:  # an open-ended sweep (gts queue)
            self._ledger.set_meta("sweep_runs", "")
        self._ledger.set_meta("log_file", self.options.log_file or "")

    def _close_monitor(self) -> None:
        if self._monitor is not None:
            self._monitor.close()
            self._monitor = None

    def _settle_previous(self) -> None:
        """Runs a killed scheduler left marked ``running``: done, or interrupted."""
        for record in self._ledger.running():
            paths = RunPaths(record.work_dir or "", None)
            outcome = read_json(paths.outcome) if record.work_dir and paths.unsafe(records_only=True) is None else None
            if outcome and outcome.get("token") == record.token and outcome.get("status") == "succeeded":
                self._ledger.finish(
                    record.name,
                    RunStatus.SUCCEEDED,
                    exit_code=0,
                    result=json.dumps(outcome.get("result")),
                    ended_at=outcome.get("finished_at"),
                    result_file=_result_file(outcome),
                )
            else:
                self._ledger.finish(
                    record.name, RunStatus.INTERRUPTED, cause="the scheduler stopped while the run was active"
                )

    # --- the loop -------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            if self._stop_level == 0:
                self._fill()
            if not self._active and (
                self._stop_level or (self._held is None and self._exhausted and not self._retry and not self._deferred)
            ):
                return
            try:
                kind, value = self._events.get(timeout=self._seconds_to_next_deadline())
            except queue.Empty:
                kind, value = "tick", None
                if self._monitor is not None and self._active:
                    self._views()  # measure what the runs use now (their peaks teach us their needs)
            if kind == "exit":
                self._on_exit(value)
            elif kind == "signal":
                self._on_signal(value)
            self._enforce_deadlines()

    def _needs_polling(self) -> bool:
        measuring = self._monitor is not None and any(a.reservation.gpu_ids for a in self._active.values())
        return self._held is not None or measuring

    def _seconds_to_next_deadline(self) -> float | None:
        deadlines = [d for a in self._active.values() for d in (a.deadline, a.kill_at) if d is not None]
        if self._needs_polling() and self._stop_level == 0:
            if self._next_poll is None or self._next_poll <= self._clock():
                self._next_poll = self._clock() + self.options.gpu_poll_interval
            deadlines.append(self._next_poll)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - self._clock())

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
        while True:
            item = self._next()
            if item is None:
                if self._exhausted and not self._retry and not self._deferred:
                    self._report_skips()
                    self._report_idle_slots()
                return
            if not item.tries:
                reason = self._skip_reason(item.spec)
                if reason is not None:
                    name = self._name_for_log()
                    # The original's two lines, for scheduler.log; the console gets one count (_report_skips).
                    logger.info("%s receives task %s", name, item.spec.test_config_string, extra=FILE_ONLY)
                    logger.info("%s skips task %s", name, item.spec.test_config_string, extra=FILE_ONLY)
                    logger.debug("skipped %s: %s", item.spec.name, reason)
                    self._skips[reason] = self._skips.get(reason, 0) + 1
                    self._summary.skipped.append(item.spec.name)
                    self._held = None
                    self._call("on_skip", item.spec)
                    continue
            need = self._need(item)
            views = self._views()
            impossible = self._impossible(views, need)
            if impossible is not None:
                self._held = None
                self._fail_unstarted(item, impossible)
                continue
            blocked = self._host_blocked()
            view = None if blocked else choose(views, need, self.options.placement, last=self._last_slot, rng=self._rng)
            if view is None:
                self._wait(item, need, views, blocked)
                return
            self._held = None
            self._waiting_for = None
            self._report_skips()
            self._last_slot = view.index
            logger.info("%s receives task %s", view.slot.name, item.spec.test_config_string)
            self._launch(item, view.index, need)

    def _report_skips(self) -> None:
        """One line for the runs skipped since the last one started (the console shows no per-run lines)."""
        if self._skips:
            total = sum(self._skips.values())
            logger.info(
                "skipped %d run(s): %s",
                total,
                "; ".join(f"{count} because {reason}" for reason, count in self._skips.items()),
            )
            self._skips.clear()

    def _name_for_log(self) -> str:
        for index, slot in enumerate(self.slots):
            if self._running[index] < self._capacity[index]:
                return slot.name
        return self.slots[0].name

    def _report_idle_slots(self) -> None:
        for index, slot in enumerate(self.slots):
            if self._running[index] == 0 and index not in self._idle_reported:
                self._idle_reported.add(index)
                logger.info("%s finished", slot.name)

    def _skip_reason(self, spec: RunSpec) -> str | None:
        if spec.duplicate:
            return "the same config appears earlier in the sweep"
        if self.options.force_rerun:
            return None
        record = self._ledger.get(spec.name)
        paths = RunPaths(spec.work_dir, None)
        folder_exists = paths.exists() and paths.unsafe() is None  # else it runs, and is refused with the reason
        if record is not None:
            if record.status is not RunStatus.SUCCEEDED or not folder_exists:
                return None
            if record.config_hash not in (None, spec.config_hash):
                logger.warning(
                    "%s succeeded earlier with a different config (global_config changed?); "
                    "its result is not this config's, so it runs again",
                    spec.work_dir,
                )
                return None
            return "it succeeded before"
        if not folder_exists:
            return None
        outcome = read_json(paths.outcome)
        if outcome and outcome.get("status") == "succeeded" and outcome.get("config_hash") == spec.config_hash:
            self._ledger.adopt(
                name=spec.name,
                run_index=spec.index,
                config_hash=spec.config_hash,
                work_dir=spec.work_dir,
                result=json.dumps(outcome.get("result")),
                ended_at=outcome.get("finished_at"),
                params=params_text(spec.test_config),
                result_file=_result_file(outcome),
            )
            return "its folder records a success"
        if self.options.skip_existing_folders:
            return "its folder exists (skip_existing_folders)"
        return None

    # --- GPU memory -------------------------------------------------------------

    def _need(self, item: _Pending) -> int | None:
        """Bytes per GPU the run needs; EXCLUSIVE: unknown, so the whole GPU; None: no accounting."""
        if self._monitor is None:
            return None
        if item.need is not None:
            return item.need
        declared = self.sweep.memory_need(item.spec.config)
        if declared is not None:
            return declared
        if self.options.learn_gpu_memory and self._learned:
            pick = max if self.options.learn_gpu_memory == "max" else statistics.mean
            return int(pick(self._learned))
        return EXCLUSIVE if self.options.max_runs_per_gpu > 1 else None

    def _views(self) -> list[SlotView]:
        books = {}
        if self._monitor is not None:
            ids = sorted({gpu for slot in self.slots for gpu in slot.gpu_ids})
            try:
                states = self._monitor.snapshot(ids)
            except Exception as error:  # an NVMLError: a GPU fell off the bus, the driver restarts
                logger.warning("cannot read the GPUs through NVML (%s); waiting", error)
                return [
                    SlotView(i, s, self._running[i], self._capacity[i], None, 0, f"NVML error: {error}")
                    for i, s in enumerate(self.slots)
                ]
            self._gpu_states = states
            margin = self.sweep.memory_margin()
            books = book(states, [a.reservation for a in self._active.values()], margin, process_group)
        views = []
        for index, slot in enumerate(self.slots):
            gpus = [books[gpu] for gpu in slot.gpu_ids if gpu in books]
            busy = None
            for gpu_id, gpu in zip(slot.gpu_ids, gpus, strict=False):
                reason = busy_reason(
                    gpu, memory_fraction=self.options.busy_memory_fraction, utilization=self.options.busy_utilization
                )
                if reason:
                    busy = f"gpu {gpu_id}: {reason}"
                    break
            views.append(
                SlotView(
                    index=index,
                    slot=slot,
                    running=self._running[index],
                    capacity=self._capacity[index],
                    available=min(g.available for g in gpus) if gpus else None,
                    ours_on_gpus=max((g.ours for g in gpus), default=0),
                    busy=busy,
                )
            )
        return views

    def _impossible(self, views: list[SlotView], need: int | None) -> str | None:
        """Why the run can never start here (it needs more than any GPU has), or None."""
        if need is None or need == EXCLUSIVE or self._monitor is None:
            return None
        totals = [
            self._gpu_states[gpu].total_memory for v in views for gpu in v.slot.gpu_ids if gpu in self._gpu_states
        ]
        if not totals:
            return None
        largest = max(totals) - self.sweep.memory_margin()
        if need > largest:
            return (
                f"it needs {format_memory(need)} per GPU, more than any GPU here can give "
                f"({format_memory(largest)} after the {format_memory(self.sweep.memory_margin())} margin)"
            )
        return None

    def _host_blocked(self) -> str | None:
        o = self.options
        if o.max_host_cpu_percent is not None:
            percent = self._host.cpu_percent()
            if percent is not None and percent > o.max_host_cpu_percent:
                return f"host CPU utilisation is {percent:.0f}% (max_host_cpu_percent {o.max_host_cpu_percent:g})"
        if o.min_host_free_memory is not None:
            free = self._host.available_memory()
            wanted = self.sweep.host_memory_floor()
            if free < wanted:
                return f"host has {format_memory(free)} of RAM available (min_host_free_memory {format_memory(wanted)})"
        return None

    def _wait(self, item: _Pending, need: int | None, views: list[SlotView], host: str | None) -> None:
        if host is None and all(view.running >= view.capacity for view in views):
            return  # every slot is busy with our own runs: the normal case, nothing to say
        if host is not None:
            reason = host
        else:
            wanted = (
                "the whole GPU"
                if need == EXCLUSIVE
                else ("a free slot" if need is None else f"{format_memory(need)} per GPU")
            )
            states = []
            for view in views:
                if view.busy:
                    states.append(f"{view.slot.name} busy ({view.busy})")
                elif view.running >= view.capacity:
                    states.append(f"{view.slot.name} full ({view.running} of ours)")
                else:
                    states.append(f"{view.slot.name} {format_memory(view.available)} available")
            reason = f"needs {wanted}; " + "; ".join(states)
        message = f"waiting to start {item.spec.name}: {reason}"
        if message != self._waiting_for:
            self._waiting_for = message
            # Waiting for our own runs to end is the normal case; waiting for others is news.
            (logger.info if self._active and host is None else logger.warning)("%s", message)

    # --- starting and ending runs ----------------------------------------------

    def _fail_unstarted(
        self, item: _Pending, cause: str, *, slot: Slot | None = None, log_path: str | None = None, log_tail: str = ""
    ) -> None:
        """A run that failed before its process could start."""
        spec = item.spec
        slot_name = slot.name if slot is not None else self._name_for_log()
        logger.error("%s fails task %s (%s)", slot_name, spec.test_config_string, cause)
        outcome = RunOutcome(
            name=spec.name,
            work_dir=spec.work_dir,
            status=RunStatus.FAILED,
            attempts=item.tries,
            slot=None if slot is None else slot.name,
            cause=cause,
            log_path=log_path,
            log_tail=log_tail,
        )
        self._summary.record(outcome)
        self._call("on_run_end", outcome)

    def _launch(self, item: _Pending, slot_index: int, need: int | None) -> None:
        spec = item.spec
        item.tries += 1
        slot = self.slots[slot_index]
        paths = RunPaths(spec.work_dir, self.options.log_file)
        token = uuid.uuid4().hex
        attempt = self._ledger.mark_running(
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
            launch = prepare(spec=spec, slot=slot, make_task=self._make_task, paths=paths, token=token, attempt=attempt)
            child = Child(
                launch.argv,
                env=launch.env,
                cwd=launch.cwd,
                log_path=paths.log,
                on_exit=lambda: self._events.put(("exit", key)),
                token=token,
                inherit_fds=() if self._lock_fd is None else (self._lock_fd,),
            )
        except (LaunchError, OSError) as error:
            cause = f"could not start: {error}"
            log_launch_failure(paths, error)
            tail = paths.tail() or "\n".join(getattr(error, "details", "").splitlines()[-20:])
            self._ledger.finish(spec.name, RunStatus.FAILED, cause=cause, log_tail=tail or None)
            has_log = paths.log is not None and os.path.isfile(paths.log)
            self._fail_unstarted(item, cause, slot=slot, log_path=paths.log if has_log else None, log_tail=tail)
            return
        now = self._clock()
        timeout = self.options.timeout
        self._running[slot_index] += 1
        self._idle_reported.discard(slot_index)
        self._active[key] = _Active(
            item=item,
            slot_index=slot_index,
            slot=slot,
            child=child,
            paths=paths,
            token=token,
            started=now,
            deadline=None if timeout is None else now + timeout,
            reservation=Reservation(gpu_ids=slot.gpu_ids, pgid=child.pid, reserved=need or 0),
            direct=launch.direct,
        )
        self._call("on_run_start", spec, slot)

    def _drains(self, key: int, active: _Active) -> bool:
        """A stopped run whose first process ended while others of it still run (a
        shell that ran the command, a task's workers saving state) keeps its grace
        period: it ends when they are gone, or SIGKILL at ``kill_at`` ends them."""
        if active.stop_reason is None or active.kill_at is None or active.draining:
            return False
        others = active.child.others()
        if not others:
            return False
        active.draining = True

        def wait() -> None:
            # Not our children: no wait() on them; pidfds wake this thread when they are gone.
            wait_gone(others, timeout=self.options.grace_period + 60)
            self._events.put(("exit", key))

        threading.Thread(target=wait, name=f"gts-drain-{active.child.pid}", daemon=True).start()
        return True

    def _on_exit(self, key: int) -> None:
        if self._drains(key, self._active[key]):
            return
        active = self._active.pop(key)
        if self._monitor is not None and active.reservation.gpu_ids:
            self._views()  # a last look at what the run allocated
        returncode = active.child.reap()
        self._running[active.slot_index] -= 1
        duration = self._clock() - active.started
        spec, paths, item = active.spec, active.paths, active.item
        exit_code, signal_name = describe_returncode(returncode)
        unsafe = paths.unsafe(records_only=True)  # the run itself may have planted a link where our records go
        outcome = read_json(paths.outcome) if unsafe is None else None
        if outcome is not None and outcome.get("token") != active.token:
            outcome = None
        result = None
        oom = None
        tail = paths.tail()
        if outcome is not None and outcome.get("status") == "succeeded":
            status, cause, result = RunStatus.SUCCEEDED, None, outcome.get("result")
        elif active.direct and returncode == 0 and active.stop_reason is None:
            status, cause = RunStatus.SUCCEEDED, None
        elif active.direct and active.stop_reason is None:
            status, cause = (
                RunStatus.FAILED,
                (
                    f"the command failed with exit code {exit_code}"
                    if exit_code
                    else f"the command was killed by {signal_name}"
                ),
            )
        elif active.stop_reason is not None:
            status, cause = active.stop_reason, active.stop_cause
        else:
            status = RunStatus.FAILED
            cause = (outcome or {}).get("error")
            if cause is not None and (outcome or {}).get("phase") == "load":
                cause = f"the task could not be loaded in the run's process: {cause}"
            if cause is None and unsafe is not None:
                cause = f"the run folder was changed into something unsafe: {unsafe}"
            if cause is None and not paths.exists():
                cause = "the run folder disappeared"
            if cause is None and exit_code == 0:
                cause = "the process exited without recording an outcome"
            oom = detect_oom(tail)
            if oom is not None:
                cause = f"GPU out of memory ({oom})" + (f": {cause}" if cause else "")
        if active.child.strays:
            logger.warning(
                "%s left %d process(es) running outside its process group; stopped pid %s",
                spec.name,
                len(active.child.strays),
                ", ".join(map(str, active.child.strays)),
            )
        if active.child.unstoppable:
            note = "processes it started could not be stopped: pid " + ", ".join(map(str, active.child.unstoppable))
            logger.error("%s: %s", spec.name, note)
            cause = f"{cause}; {note}" if cause else note
        peak = active.reservation.peak or None
        if peak and oom is None:
            self._learned.append(peak)
        self._ledger.finish(
            spec.name,
            status,
            exit_code=exit_code,
            signal=signal_name,
            cause=cause,
            log_tail=tail,
            result=None if result is None else json.dumps(result),
            gpu_memory_peak=peak,
            pid=active.child.pid,
            result_file=_result_file(outcome) if status is RunStatus.SUCCEEDED else None,
        )
        record = RunOutcome(
            name=spec.name,
            work_dir=spec.work_dir,
            status=status,
            attempts=item.tries,
            slot=active.slot.name,
            exit_code=exit_code,
            signal=signal_name,
            cause=cause,
            log_path=paths.log,
            log_tail=tail,
            duration=duration,
            result=result,
            result_file=paths.result if status is RunStatus.SUCCEEDED and _result_file(outcome) else None,
        )
        self._summary.record(record)
        self._call("on_run_end", record)
        if status is RunStatus.SUCCEEDED:
            logger.info("%s finishes task %s", active.slot.name, spec.test_config_string)
            return
        logger.error("%s fails task %s (%s)", active.slot.name, spec.test_config_string, record.describe())
        if self._stop_level:
            return
        if oom is not None and item.oom_retries < self.options.max_oom_retries:
            item.oom_retries += 1
            grown = max(active.reservation.reserved, peak or 0)
            item.need = int(grown * OOM_GROWTH) if grown > 0 else EXCLUSIVE
            logger.info(
                "%s ran out of GPU memory; it will run again later, reserving %s (out-of-memory retry %d of %d)",
                spec.name,
                "the whole GPU" if item.need == EXCLUSIVE else format_memory(item.need),
                item.oom_retries,
                self.options.max_oom_retries,
            )
            self._deferred.append(item)
        elif (
            oom is None
            and status in (RunStatus.FAILED, RunStatus.TIMED_OUT)
            and item.tries - item.oom_retries <= self.options.max_retries
        ):
            logger.info(
                "%s will be retried (attempt %d of %d)", spec.name, item.tries + 1, self.options.max_retries + 1
            )
            self._retry.append(item)

    def _stop(self, active: _Active, reason: RunStatus, cause: str) -> None:
        """SIGTERM the run's group now, SIGKILL it when the grace period ends."""
        if active.stop_reason is None:
            active.stop_reason, active.stop_cause = reason, cause
        active.child.terminate()
        active.kill_at = self._clock() + self.options.grace_period
        active.deadline = None

    def _enforce_deadlines(self) -> None:
        now = self._clock()
        for active in self._active.values():
            if active.deadline is not None and now >= active.deadline:
                if active.child.has_exited():
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
                active.child.kill()
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
                active.stop_reason = active.stop_reason or RunStatus.INTERRUPTED
                active.child.kill()

    def _kill_everything(self) -> None:
        """Last resort when the loop ends abnormally: no child may outlive us."""
        for key, active in list(self._active.items()):
            active.child.kill()
            active.child.reap()
            del self._active[key]
            try:
                self._ledger.finish(active.spec.name, RunStatus.INTERRUPTED, cause="the scheduler stopped on an error")
            except GTSError:
                pass  # the ledger is what failed; the next start marks the run interrupted


def _result_file(outcome: dict[str, Any] | None) -> str | None:
    """The name of the file a large result was written to (the only name the runner writes)."""
    return "result.json" if outcome and outcome.get("result_file") == "result.json" else None


class _StopSignals:
    """While active, SIGINT and SIGTERM only post an event to the loop."""

    def __init__(self, events: queue.SimpleQueue[tuple[str, Any]]) -> None:
        self._events = events
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        self._events.put(("signal", signum))  # SimpleQueue.put is safe in a signal handler

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in _STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
