"""The event loop: start runs where capacity allows, react to exits, deadlines and signals.

One thread (the caller's) makes every decision and every ledger write; the
launcher's exit reports and signal handlers only post events to the inbox.
The loop sleeps in ``inbox.get`` until an event arrives or the nearest
deadline passes (a run's timeout, the end of a grace period, the next look at
the GPUs while runs wait for memory or are measured), so a slot gets its next
run the moment the last one ends.

What to decide is in ``decide.py`` (pure), which run comes next in
``pending.py``, where it fits in ``gpu/capacity.py``, how its process starts
in the launcher, what is written down about it in ``outcomes.py``; this
module is the order of events around them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from queue import Empty
from types import ModuleType
from typing import Any

from ..errors import GTSError
from ..gpu.capacity import Capacity
from ..gpu.host import HostProbe
from ..gpu.placement import Need
from ..records.control import CONTROL_SIGNAL, taking_requests
from ..records.known import RootIndex
from ..records.lease import LeaseTerms
from ..records.ledger import Ledger
from ..records.ledger.lock import SweepLock
from ..records.ledger.record import RunRecord
from ..records.paths import RootPaths, RunPaths
from ..records.prior import settle_running
from ..records.resume import last_step, note_resume, settle_pending_report, went_on_from
from ..records.status import RunStatus
from ..sweep.expand import Sweep
from .changes import settle_changes
from .decide import classify
from .endreads import EndReads
from .hooks import Hooks, Inbox, StopSignals
from .launcher import Attempt, Launcher, LaunchError
from .outcomes import Records, read_exit
from .pending import Pending
from .running import Active, Running
from .starts import Starts
from .summary import SweepSummary

logger = logging.getLogger("gpu_task_scheduler")


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
        detach: bool = False,
    ) -> None:
        """``detach``: hand what can start now to the cluster and return, leaving it running there (a
        launcher that adopts attempts: they outlive their scheduler there, as on Slurm); a later start
        adopts it."""
        self.sweep, self.options, self._launcher = sweep, sweep.options, launcher
        self._hooks, self._nvml, self._clock, self._host = hooks or Hooks(), nvml, clock, host
        self.inbox = inbox or Inbox()
        self._end_reads = EndReads(lambda key: self.inbox.put("exit", key), clock)
        self._summary = SweepSummary(keep_succeeded=keep_succeeded)
        self._running = Running(self.options, clock, self._summary)  # and whether the sweep is stopped
        self._keys = iter(range(1 << 62))
        self._capacity: Capacity | None = None
        self._next_poll: float | None = None
        self._abilities = launcher.abilities
        self._detach = detach

    def setup(self) -> Capacity:
        """Find the slots on this machine; raises GTSError (and writes nothing) if there are none."""
        if self._capacity is None:
            slots = self._launcher.slots(self.options) if self._abilities.cluster_slots else None
            gpus = self._launcher.slot_gpus if slots else None
            self._capacity = Capacity(self.options, nvml=self._nvml, host=self._host, slots=slots, slot_gpus=gpus)
        return self._capacity

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
            # `gts stop` finds this scheduler through the lock: its signal is ours before the lock is.
            with (
                StopSignals(self.inbox, (CONTROL_SIGNAL,)) as control,
                SweepLock(root) as lock,
                taking_requests(root.root, control.installed),
            ):
                assert lock.fd is not None
                self._launcher.open(lock.fd)  # every run holds the lock too: the root stays locked while one lives
                with Ledger(root) as ledger:
                    self._records = Records(ledger, self._summary, self._hooks)
                    try:
                        if self._abilities.watches:  # the loop waits on what the launcher watches (its runs' pidfds)
                            self._launcher.attach(self.inbox)
                        if self.options.learn_gpu_memory:  # what this root's runs were seen to use before
                            capacity.learned_before(ledger.recorded_peaks())
                        # An attempt a cluster still runs is followed; one that holds a lease is over first.
                        terms = LeaseTerms(self.options.lease_interval, self.options.grace_period)
                        live = self._launcher.live_attempt if self._abilities.adopts else None
                        settle_running(ledger, live, terms, unwatched_ends_fed(self.sweep))
                        # What runs at once: a search asks no more ahead, a larger population takes turns.
                        at_once = self._abilities.runs_at_once
                        self.sweep.parallel = at_once or len(capacity.slots) * max(1, self.options.max_runs_per_gpu)
                        self._running.open(self.sweep, ledger, root.root, capacity)  # early_stop, budget
                        # Runs that succeeded with another config: checked before the sweep is recorded.
                        take_over = settle_changes(self.sweep, ledger, root.root)
                        self._records.sweep_starting(self.sweep)
                        known = RootIndex(ledger, root.root, take_over=take_over)
                        self.sweep.lookup = ledger.get
                        pauses = self._running.stopper.pauses if self._running.stopper is not None else None
                        self._starts = Starts(self.sweep, self._records, known, pauses)
                        self._queue = self._starts.queue
                        self.sweep.follow(lambda: self.inbox.put("wake"))
                        with StopSignals(self.inbox):
                            self._loop()
                        if not self._running.level and not self._running.draining and not self._detach:
                            self._records.sweep_completed(self.sweep)
                        else:
                            self._starts.count_never_started(self._summary)
                    finally:
                        self._records.flush()
                        self._records.record_provenance(wait=True)
                        self._running.kill_everything(self._records)
                        self._launcher.close()
                        self.inbox.close()
        finally:
            capacity.close()
        self._summary.duration = self._clock() - started
        self._records.call("on_sweep_end", self._summary)
        return self._summary

    # --- the loop -------------------------------------------------------------

    def _loop(self) -> None:
        ledger = self._records.ledger
        while True:
            if self._starting:
                with ledger.batch():  # skips and adoptions share a transaction; each start commits
                    self._fill()
                if self._abilities.batches:  # a cluster's batch of what just started (Slurm's job arrays)
                    self._launcher.flush()
                if self._detach:
                    self._running.leave_to_the_cluster()
                    return
            if not self._running and (self._running.level or self._running.draining or self._queue.empty):
                return
            try:
                event: tuple[str, Any] | None = self.inbox.get(self._seconds_to_next_deadline())
            except Empty:
                event = None
                self.setup().measure()  # what the runs use now (their peaks teach us their needs)
            with ledger.batch():  # the ends of runs that ended together: one commit
                while event is not None:
                    kind, value = event
                    if kind == "exit":
                        self._on_exit(value)
                        # Its slot's next run now, not after the other ends waiting here. Not on a cluster
                        # that takes its starts in batches (Slurm's arrays): the next turn fills and flushes.
                        if self._starting and not self._abilities.batches:
                            self._fill()
                    elif kind == "placed":
                        self._on_placed(*value)
                    elif kind == "signal":
                        self._running.on_signal(value)
                    try:
                        event = self.inbox.get(0)
                    except Empty:
                        event = None
                self._running.look_at_metrics(self._records)
                self._running.enforce_deadlines()

    @property
    def _starting(self) -> bool:
        """Whether new runs may start (no stop, no drain, budget left)."""
        return self._running.may_start()

    def _seconds_to_next_deadline(self) -> float | None:
        deadlines = self._running.deadlines()
        if (self._queue.held is not None or self.setup().measuring) and self._running.level == 0:
            if self._next_poll is None or self._next_poll <= self._clock():
                self._next_poll = self._clock() + self.options.gpu_poll_interval
            deadlines.append(self._next_poll)
        return None if not deadlines else max(0.0, min(deadlines) - self._clock())

    def _fill(self) -> None:
        while True:  # again when what was filled let waiting runs go on (Starts.filled)
            while self._starting and (start := self._starts.next(self.setup())) is not None:
                self._launch(*start)
            if not self._starts.filled(
                self.setup(), running=bool(self._running), queue_places=self._abilities.queue_places
            ):
                return

    # --- starting and ending runs ----------------------------------------------

    def _launch(self, item: Pending, slot_index: int, need: Need) -> None:
        spec, slot = item.spec, self.setup().slots[slot_index]
        paths = RunPaths(spec.work_dir, self.options.log_file)
        live = self._launcher.live_attempt(spec.name) if self._abilities.adopts else None
        token = live or os.urandom(16).hex()  # a live attempt of an earlier start is followed, not run twice
        if live is not None:
            logger.info("%s: following its attempt that is still queued or running on the cluster", spec.name)
        resume_step = resume_from(item, paths, following=live is not None)
        item.tries += 1
        number = self._records.starting(spec, slot, token, queued=self._abilities.cluster_slots)
        key = next(self._keys)
        try:
            handle = self._launcher.start(
                Attempt(spec, slot, paths, token, number, resume_step),
                lambda: self.inbox.put("exit", key),
                lambda node, pid, since=0.0: self.inbox.put("placed", (key, node, pid, since)),
            )
        except (LaunchError, OSError) as error:
            tail = paths.tail() or "\n".join(getattr(error, "details", "").splitlines()[-20:])
            cause = f"could not start: {error}"
            self._records.not_started(spec, item.tries, cause, slot.name, slot=slot, paths=paths, tail=tail)
            self._starts.settle(spec, RunStatus.FAILED, cause)
            return
        now, timeout = self._clock(), self.options.timeout
        placed = handle.pid > 0  # a run on another machine has no pid here; its clock starts once placed
        if placed:
            self._records.ledger.set_pid(spec.name, handle.pid)  # whose GPU memory `gts status --watch` shows
        self.setup().take(slot_index, handle.pid, need, spec.name)
        deadline = None if timeout is None or not placed else now + timeout
        self._running.add(key, Active(item, slot_index, slot, handle, paths, token, now, deadline, resume_step))
        self._records.run_started(spec, slot)

    def _on_placed(self, key: int, node: str, pid: int, since: float) -> None:
        """A run on another machine started there ``since`` seconds ago (from a launcher with cluster slots)."""
        active = self._running.get(key)
        if active is not None:
            self._running.placed(active, since)
            self._records.ledger.set_node(active.spec.name, node, pid, since)
            logger.info("%s runs on %s (pid %d there)", active.spec.name, node, pid)

    def _on_exit(self, key: int) -> None:
        active = self._running.get(key)
        assert active is not None
        self._running.exiting(active)
        if not self._end_reads.ready(key, active.paths):
            active.exited, active.deadline, active.term_at, active.kill_at = True, None, None, None
            return  # a long metrics file is read off the loop; its exit is posted again once it is
        reader, exited_at = self._end_reads.take(key)
        self._running.pop(key)
        capacity, handle, item = self.setup(), active.handle, active.item
        duration = exited_at - active.started
        released = capacity.release(active.slot_index, handle.pid, duration)  # before reaping
        reserved, peak = released.reserved, released.peak
        ended = handle.reap()
        peak = peak or ended.gpu_peak  # measured on its node (a Slurm pool's agent), not here
        leftovers = capacity.left_behind(handle.pid, active.spec.name)
        exit = read_exit(
            active.paths, active.token, ended, reports_outcome=handle.reports_outcome, stopped=active.stopped
        )
        end = classify(exit.facts)
        if peak and end.oom is None:
            capacity.learn(peak)
        step = None
        if end.status is not RunStatus.SUCCEEDED:
            step = self._queue.next_step(
                item, end, self.options, reserved=reserved, peak=peak, stopping=self._running.level > 0
            )
        self._records.ended(
            active.spec,
            active.slot,
            active.paths,
            exit,
            end,
            ended,
            attempts=item.tries,
            pid=handle.pid if handle.pid > 0 else None,
            peak=peak,
            duration=duration,
            reader=reader,
            gpu_leftover="; ".join(left.describe() for left in leftovers) or None,
            again=step is not None and step.action != "done",
            usage=released,
        )
        if step is None:
            self._starts.settle(active.spec, end.status)
        elif not self._queue.requeue(item, step, self.options):
            self._starts.settle(active.spec, end.status, end.cause)

    # --- stopping -----------------------------------------------------------------


def unwatched_ends_fed(sweep: Sweep) -> Callable[[RunRecord], None] | None:
    """For a sweep whose runs' metrics are their TensorBoard files: what an attempt that ended while no
    scheduler watched logged after the last look is fed before its end is recorded at the start."""
    if sweep.tensorboard is None:
        return None
    from .feeds import feed_unwatched_end

    source = sweep.tensorboard
    return lambda record: feed_unwatched_end(source, record)


def resume_from(item: Pending, paths: RunPaths, *, following: bool = False) -> float | None:
    """The step ``item``'s attempt about to start goes on from, recorded in its folder (None: from
    step 0): an attempt that goes on from an earlier one's checkpoint, the step that one reported
    last; a population-based training member that copied another's checkpoint, that one's step.
    ``following``: the attempt is an earlier start's, still live on a cluster: the step recorded at
    its start, not where it is now (nothing is recorded again)."""
    if following:
        return went_on_from(paths)
    step = item.resume_step
    if step is None and (item.resume or item.tries):
        settle_pending_report(paths)  # a checkpoint put in place as its attempt was killed: its report
        step = last_step(paths)
    item.resume_step = None  # a later attempt of it goes on from its own last step
    note_resume(paths, step)
    return step
