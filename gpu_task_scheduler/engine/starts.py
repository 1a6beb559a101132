"""Which run starts next, and where; and what a run that will not run again in this start lets go on.

The queue (``pending.py``) says which run is next in the sweep's order; here it is decided
(``decide.before_run``: skip, adopt or run, with what the root records of it), held until the runs
of earlier stages it waits for settle (``Waits``), and placed on the capacity (``gpu/capacity.py``).
The loop starts what :meth:`Starts.next` gives it; everything else a run that does not start needs
(its skip or block recorded, the waiting message for ``gts status --watch``) is done here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..gpu.capacity import Capacity
from ..gpu.placement import Need
from ..records.known import RootIndex
from ..records.prior import Prior, read_prior
from ..records.status import RunStatus
from ..sweep.expand import RunSpec, Sweep
from .decide import Decision, before_run
from .outcomes import Records
from .pending import Pending, RunQueue, Waits, failure_words
from .summary import SweepSummary

if TYPE_CHECKING:  # made by the early_stop rules' Stopper, where a sweep pauses runs (their math: 4 ms a start)
    from .pauses import Pauses

logger = logging.getLogger("gpu_task_scheduler")


class Starts:
    def __init__(self, sweep: Sweep, records: Records, known: RootIndex, pauses: Pauses | None = None) -> None:
        """``pauses``: the sweep's pausing early_stop methods, which resume paused runs before anything new."""
        self._sweep, self._options, self._records, self._known = sweep, sweep.options, records, known
        runs = sweep.runs(known.foreign)
        if pauses and pauses.draws_at_random and sweep.search is None:  # a grid's order must not decide
            runs = pauses.drawn(runs)
        self.queue = RunQueue(runs)
        self._waits = Waits(sweep, records.ledger)
        self._waiting_for: str | None = None  # the last "waiting to start ..." said
        self._pauses = pauses if pauses else None
        self._paused_skips: set[str] = set()  # runs skipped as paused in this start (one may resume)

    def next(self, capacity: Capacity) -> tuple[Pending, int, Need] | None:
        """The run to start now, the index of its slot and what it reserves there; None when none
        can start now (none is left for now, or the next one waits for room). A paused run its
        method promotes comes first."""
        queue = self.queue
        if self._pauses is not None and self._pauses.copying:  # a snapshot is copied: nothing beside it
            return None
        while True:
            promoted = self._pauses.owed() if self._pauses is not None else None
            if promoted is not None:
                return self._resume(promoted, capacity)
            item = queue.head()
            if item is None:
                # No more new configurations (a search's next may only wait for a free slot): the
                # methods' brackets take no more, and may promote now.
                if self._pauses is not None and not queue.taking_besides_parked and self._pauses.close():
                    continue
                return None
            self._waits.seen(item.spec)
            # A run of a later stage is decided once the runs it depends on settled: one that ran
            # again in this start makes its earlier success stale (decide.before_run).
            if item.spec.after and not self._ready(item):
                continue
            if not item.tries and not item.decided:
                if self._skipped(item, capacity):
                    queue.pop()
                    continue
                item.decided = True
            placed = self._place(item, capacity)
            if placed is None:
                return None
            queue.pop()
            if placed[0] < 0:  # it can never start
                continue
            if self._pauses is not None:
                self._pauses.began(item.spec)  # a new configuration of a pausing method (one it knows goes on)
                self._current(item)
            return item, *placed

    def _place(self, item: Pending, capacity: Capacity) -> tuple[int, Need] | None:
        """Where ``item`` starts: its slot's index and what it reserves (slot -1: it can never start,
        recorded failed); None: it waits for room."""
        records = self._records
        need = capacity.need(item.spec.config, item.need)
        placement = capacity.place(item.spec.name, need)
        if placement.impossible is not None:
            records.not_started(item.spec, item.tries, placement.impossible, capacity.free_slot_name())
            self.settle(item.spec, RunStatus.FAILED, placement.impossible)
            return -1, need
        if placement.view is None:
            if placement.waiting is not None and placement.waiting != self._waiting_for:
                self._waiting_for = placement.waiting  # waiting for our own runs is the normal case
                (logger.warning if placement.news else logger.info)("%s", placement.waiting)
                records.ledger.set_meta("waiting", placement.waiting)  # for `gts status --watch`
            return None
        if self._waiting_for is not None:
            records.ledger.set_meta("waiting", "")
        self._waiting_for = None
        records.report_skips()
        logger.info("%s receives task %s", placement.view.slot.name, item.spec.test_config_string)
        return placement.view.index, need

    def _resume(self, spec: RunSpec, capacity: Capacity) -> tuple[Pending, int, Need] | None:
        """Start a paused run its method promoted, from its checkpoint (None: it waits for room)."""
        assert self._pauses is not None
        item = Pending(spec)
        item.resume = item.decided = True
        placed = self._place(item, capacity)
        if placed is None:
            return None
        if placed[0] < 0:  # it can never start here now (recorded failed, ended for its method): what is next
            return self.next(capacity)
        words = self._pauses.resume_words(spec.name)
        try:
            item.resume_step = self._pauses.resuming(spec)
        except OSError as error:  # the copy of another run's checkpoint failed: it waits, as if no room
            logger.warning("%s: could not copy the checkpoint it resumes from (%s); tried again", spec.name, error)
            return None
        logger.info("%s %s", spec.name, words)
        self._pauses.resumed(spec)
        self._current(item)
        if spec.name in self._paused_skips:  # it runs in this start after all: its attempt's end is its outcome
            self._paused_skips.discard(spec.name)
            self._records.summary.outcomes.pop(spec.name, None)
        return item, *placed

    def _current(self, item: Pending) -> None:
        """A population-based training member starts with its values of now (a copied member's)."""
        assert self._pauses is not None
        values = self._pauses.values(item.spec.name)
        config = {**item.spec.config, **(values or {})}
        if config != item.spec.config:
            import dataclasses  # here: only a copied member's start needs it (5 ms)

            item.spec = dataclasses.replace(item.spec, config=config)

    def filled(self, capacity: Capacity, *, running: bool, queue_places: bool) -> bool:
        """What follows starting all that could start: runs that can never start are blocked, and a
        slot that ran its last run says it finished (not places in a cluster's queue: not worth a
        line each). True when paused runs no method promotes were settled: the runs that waited for
        them may start (or be blocked) now, so the caller fills again."""
        released = False
        if not running:
            if self._pauses is not None and self.queue.head() is None:
                for spec in self._pauses.stuck():  # no method promotes them now: what waits for them goes on
                    released = True
                    self._settle_waits(spec, RunStatus.PAUSED, "not promoted by its early_stop method")
                    if self._sweep.search is not None:  # told its value at the highest rung it reached
                        self._sweep.settled(spec, RunStatus.PAUSED.value, self._records.ledger.get(spec.name))
            if released:
                return True
            for item in self.queue.stranded():  # cannot happen in a sweep built by Sweep; never wait forever
                self._block(item.spec, "its dependencies never settled in this start")
        if not self.queue.taking:
            self._records.report_skips()
            # A pausing method may still give an idle slot a promoted run while others run: the
            # slot has finished only once nothing runs (it said so, then received a task).
            if running and self._pauses is not None:
                return False
            for slot in capacity.newly_idle():
                if not queue_places:
                    logger.info("%s finished", slot.name)
        return False

    def settle(self, spec: RunSpec, status: RunStatus, cause: str | None = None) -> None:
        """``spec`` will not run again in this start: the runs waiting for it go on (or are blocked).
        A paused run is not settled: its method may resume it (``filled`` settles those it never does)."""
        if self._pauses is not None:
            if status is RunStatus.PAUSED:
                self._pauses.paused(spec)
                self._sweep.paused(spec)  # a search samples on; it is told once it is settled for good
                return
            if status is not RunStatus.INTERRUPTED:  # an interrupted run goes on at the next start
                self._pauses.ended(spec.name)
        self._settle_waits(spec, status, cause)
        if self._sweep.search is not None:  # the sampler learns how it ended
            self._sweep.settled(spec, status.value, self._records.ledger.get(spec.name))

    def _settle_waits(self, spec: RunSpec, status: RunStatus, cause: str | None) -> None:
        ok = status is RunStatus.SUCCEEDED
        if self._waits.settle(spec, None if ok else failure_words(status, cause)):
            self.queue.settled(spec.name, ok=ok)

    def count_never_started(self, summary: SweepSummary, most: int = 100_000) -> None:
        """A sweep stopped or drained: the runs it would still have run, for its summary (the first
        ``most`` of the queue looked at, read-only)."""
        for looked, spec in enumerate(self.queue.left(expand=self._sweep.search is None)):
            if looked == most:
                summary.not_started_more = True
                break
            if spec.name not in summary.outcomes and self._decide(spec)[1].action == "run":
                summary.not_started.append(spec.name)

    def _ready(self, item: Pending) -> bool:
        """Whether the held run of a later stage may start now; if not, it is parked or blocked."""
        waiting, blocked = self._waits.check(item.spec)
        if blocked is not None:
            self.queue.pop()
            self._block(item.spec, blocked)
            return False
        if waiting:
            self.queue.park(item, waiting)
            return False
        return True

    def _block(self, spec: RunSpec, cause: str) -> None:
        self._records.report_skips()
        self._records.blocked(spec, cause)
        self.settle(spec, RunStatus.BLOCKED, cause)

    def _decide(self, spec: RunSpec) -> tuple[Prior, Decision]:
        prior = read_prior(spec, self._known)
        o = self._options
        return prior, before_run(
            prior,
            force_rerun=o.force_rerun,
            skip_existing_folders=o.skip_existing_folders,
            keep_changed=o.on_config_change == "keep",
            rerun_pruned=self._sweep.rerun_pruned,
        )

    def _skipped(self, item: Pending, capacity: Capacity) -> bool:
        spec = item.spec
        if self._pauses is not None and (rung := self._pauses.paused_at(spec.name)) is not None:
            record = self._records.ledger.get(spec.name)
            if record is not None and record.status is RunStatus.RUNNING:
                # An attempt of an earlier start still runs on a cluster (settle_running left it so),
                # told to pause before that start was killed: followed, and paused (Stopper.held).
                return False
            reason = f"it is paused at rung {rung:g}; it resumes if it is promoted"
            prior = read_prior(spec, self._known)
            self._records.skipped(
                spec, prior, Decision("skip", reason, "paused"), capacity.free_slot_name(), paused=record
            )
            self._pauses.paused(spec)
            self._sweep.paused(spec)
            self._paused_skips.add(spec.name)
            return True
        prior, decision = self._decide(spec)
        if decision.warning:
            logger.warning("%s %s", spec.work_dir, decision.warning)
        if decision.action == "run":
            item.resume = decision.resume
            return False
        self._records.skipped(spec, prior, decision, capacity.free_slot_name())
        if self._pauses is not None:  # a run its method knows is done: it waits for nothing
            self._pauses.ended(spec.name)
        if not prior.duplicate:  # a duplicate settles with the earlier run of the same name
            if prior.record is not None and prior.record.status is RunStatus.PRUNED:  # dependents stay blocked
                full = self._records.ledger.get(spec.name)
                self.settle(spec, RunStatus.PRUNED, full.cause if full is not None else None)
            else:
                self.settle(spec, RunStatus.SUCCEEDED)
        return True
