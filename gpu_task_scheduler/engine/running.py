"""The runs that are running, and how each is stopped: its timeout, the grace period after SIGTERM,
early stopping's verdicts, a sweep-wide stop.

The loop (``loop.py``) starts runs and hears them end; what it keeps of each meanwhile is an
:class:`Active` here, and every deadline it sleeps until comes from here. A stop is asked of a
run's handle (SIGTERM, then SIGKILL once the grace period is over); a Python run stopped early is
first told so through a file, so that its next ``report()`` raises ``Pruned`` and it can save.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..gpu.devices import Slot
from ..records.control import CONTROL_SIGNAL, take_stop_request
from ..records.paths import RunPaths, atomic_write
from ..records.status import RunStatus
from ..sweep.expand import RunSpec
from ..sweep.options import SchedulerOptions
from .launcher import Handle
from .outcomes import Records
from .pending import Pending
from .summary import SweepSummary

if TYPE_CHECKING:  # imported where a sweep has early_stop rules (they and their math cost a start 4 ms)
    from ..gpu.capacity import Capacity
    from ..records.ledger import Ledger
    from ..sweep.expand import Sweep
    from .budget import BudgetWatch
    from .feeds import Feeds
    from .stopper import Stopper

logger = logging.getLogger("gpu_task_scheduler")


class Active:
    """A run that is running (a plain class, as Pending)."""

    __slots__ = (
        "item",
        "slot_index",
        "slot",
        "handle",
        "paths",
        "token",
        "started",
        "deadline",
        "stopped",
        "kill_at",
        "term_at",
        "exited",
        "resume_step",
    )

    def __init__(
        self,
        item: Pending,
        slot_index: int,
        slot: Slot,
        handle: Handle,
        paths: RunPaths,
        token: str,
        started: float,
        deadline: float | None,
        resume_step: float | None = None,
    ) -> None:
        self.item, self.slot_index, self.slot, self.handle = item, slot_index, slot, handle
        self.paths, self.token, self.started, self.deadline = paths, token, started, deadline
        self.stopped: tuple[RunStatus, str] | None = None  # (TIMED_OUT, INTERRUPTED, PRUNED or PAUSED, cause)
        self.kill_at: float | None = None
        self.term_at: float | None = None  # pruned or paused Python run: SIGTERM then, unless report() ended it
        self.exited = False  # it has ended; its end is recorded once its metrics are read (engine/endreads.py)
        self.resume_step = resume_step  # the step it went on from (its earlier attempts' curve up to it)

    @property
    def spec(self) -> RunSpec:
        return self.item.spec


class Running:
    """The running runs, by the loop's key for each, and every deadline they set; and whether the
    sweep is being stopped (``level``: 1 stopping, 2 killing) or drained (no new run)."""

    def __init__(self, options: SchedulerOptions, clock: Callable[[], float], summary: SweepSummary) -> None:
        self._options, self._clock, self._summary = options, clock, summary
        self._active: dict[int, Active] = {}
        self.stopper: Stopper | None = None  # the sweep's early_stop rules at work (none without)
        self.feeds: Feeds | None = None  # the runs' TensorBoard folders read as their metrics (metrics: tensorboard)
        self._next_look: float | None = None
        self.level = 0
        self.draining = False  # `gts stop --drain`, or the budget is spent: no new runs; the running ones finish
        self.budget: BudgetWatch | None = None  # scheduler_config's budget at work (engine/budget.py)

    def __len__(self) -> int:
        return len(self._active)

    def open(self, sweep: Sweep, ledger: Ledger, root: str, capacity: Capacity) -> None:
        """The sweep starts on its root: its early_stop rules and its budget at work, and the runs'
        GPU-seconds kept in the ledger as they accrue."""
        if sweep.stopping:
            from .stopper import Stopper

            self.stopper = Stopper(sweep, ledger, root)
        if sweep.tensorboard is not None:
            from .feeds import Feeds

            self.feeds = Feeds(sweep.tensorboard, lambda name: getattr(ledger.get(name), "started_at", None))
        capacity.save_usage_to(ledger.add_usage)
        budget = self._options.budget
        if budget is not None and budget.gpu_hours is not None:
            from .budget import BudgetWatch

            self.budget = BudgetWatch(budget.gpu_hours, ledger.gpu_seconds_spent(), capacity.usage.spent)
            if not any(capacity.gpus_of(slot) for slot in capacity.slots):
                logger.warning(
                    "budget: gpu_hours counts GPU-hours, and no slot of this sweep has a GPU: it is never spent"
                )

    def add(self, key: int, active: Active) -> None:
        self._active[key] = active
        if self.feeds is not None:  # before the stopper looks: what it reads comes from there
            self.feeds.watch(active.spec, active.paths)
        if self.stopper is not None:
            self.stopper.watch(active.spec, active.paths, active.resume_step)
            held = self.stopper.held(active.spec.name)
            if held is not None:  # a followed attempt its method paused before a restart: paused now
                self._pause(active, held.cause)
            elif self.stopper.owes_a_look(active.spec.name):
                # An earlier attempt's reports not judged yet (its scheduler was killed first): judged
                # at once, not at the next look, so that what they decide (a late exploit) reaches
                # the run before it trains on past them (a warm start reports within milliseconds).
                self._next_look = self._clock()

    def exiting(self, active: Active) -> None:
        """``active``'s process ended: what it reported last (its event files' last records, fed now)
        counts for the others; one we stopped (Ctrl-C, a timeout) may not have reported yet."""
        if self.feeds is not None:
            self.feeds.finish(active.spec.name)
        if self.stopper is not None:
            self.stopper.ended(active.spec.name, stopped=active.stopped is not None)

    def get(self, key: int) -> Active | None:
        return self._active.get(key)

    def pop(self, key: int) -> Active:
        return self._active.pop(key)

    def deadlines(self) -> list[float]:
        """When something is due: a timeout, the end of a grace period, the next look at the metrics."""
        due = [d for a in self._active.values() for d in (a.deadline, a.kill_at, a.term_at) if d is not None]
        if self.stopper is not None and self.stopper.watching:
            if self._next_look is None:
                self._next_look = self._clock() + self.stopper.interval
            due.append(self._next_look)
        return due

    def placed(self, active: Active, since: float) -> None:
        """It started on its machine ``since`` seconds ago: its clock (timeout, duration) starts then,
        not while it was queued on the cluster, and an attempt a restarted scheduler follows keeps
        the time it ran before."""
        active.started = self._clock() - since
        if self.feeds is not None:  # its event files are those written since it started there
            self.feeds.placed(active.spec.name, time.time() - since)
        if self._options.timeout is not None and active.stopped is None:
            active.deadline = active.started + self._options.timeout

    # --- stopping ---------------------------------------------------------------------

    def look_at_metrics(self, records: Records) -> None:
        """What running runs reported since the last look, judged by the sweep's early_stop rules."""
        if self.stopper is None or self._next_look is None or self._clock() < self._next_look:
            return
        self._next_look = None
        verdicts, judged = [], []
        for active in self._active.values():
            if active.stopped is None:
                verdict = self.stopper.look(active.spec.name)
                if verdict is not None:
                    verdicts.append((active, verdict))
                elif (rung := self.stopper.take_judged(active.spec.name)) is not None:
                    judged.append((active, rung))
        if verdicts or judged:
            records.ledger.commit()  # every verdict is on disk before anything acts on it
        for active, rung in judged:
            _tell(active, active.paths.judged, repr(rung))
        for active, verdict in verdicts:
            if verdict.pause:
                self._pause(active, verdict.cause)
            else:
                from .stopper import cause_of

                cause = cause_of(verdict)
                logger.info("%s is stopped early: %s", active.spec.name, cause)
                self._halt(active, RunStatus.PRUNED, cause, active.paths.pruned)

    def _pause(self, active: Active, cause: str) -> None:
        logger.info("%s pauses: %s", active.spec.name, cause)
        self._halt(active, RunStatus.PAUSED, cause, active.paths.pause)

    def _halt(self, active: Active, status: RunStatus, cause: str, marker: str) -> None:
        """Stop (``PRUNED``) or pause (``PAUSED``) a run: a Python run's next report() raises Pruned or
        Paused (SIGTERM after the grace period if it does not report again); a command gets SIGTERM now."""
        if _tell(active, marker, cause) and active.handle.reports_outcome:
            active.stopped = (status, cause)
            active.deadline = None
            active.term_at = self._clock() + self._options.grace_period
        else:
            self.stop(active, status, cause)

    def stop(self, active: Active, reason: RunStatus, cause: str) -> None:
        """SIGTERM the run now, SIGKILL it when the grace period ends."""
        if active.exited:
            return  # it ended before it was stopped: its own exit says how
        active.stopped = active.stopped or (reason, cause)
        active.handle.stop()
        active.kill_at = self._clock() + self._options.grace_period
        active.deadline = active.term_at = None

    # --- a sweep-wide stop: a signal, or `gts stop` from another shell ---------------------

    def may_start(self) -> bool:
        """Whether a new run may start now: no stop, no drain, and the budget (if any) not spent. A
        spent budget drains the sweep: the runs running finish, and nothing else starts."""
        if self.level or self.draining:
            return False
        spent = self.budget.exhausted() if self.budget is not None else None
        if spent is None:
            return True
        self._summary.budget_spent = spent
        logger.warning("%s: starting no more runs; %d running run(s) may finish", spent, len(self._active))
        self.draining = True
        return False

    def on_signal(self, signum: int) -> None:
        if signum == CONTROL_SIGNAL:  # `gts stop`: what it asks is in the root's request file
            mode = take_stop_request(self._options.result_root_folder)
            name = {"stop": "gts stop", "drain": "gts stop --drain", "now": "gts stop --now"}[mode]
            if mode == "drain":
                self._drain(name)
            else:
                self._stop_all(name, at_once=mode == "now")
            return
        self._stop_all(signal.Signals(signum).name, at_once=self.level > 0)

    def _drain(self, name: str) -> None:
        self._summary.interrupted_by = self._summary.interrupted_by or name
        if not self.draining and not self.level:
            logger.warning("%s: starting no more runs; %d running run(s) may finish", name, len(self._active))
        self.draining = True

    def _stop_all(self, name: str, *, at_once: bool) -> None:
        self._summary.interrupted_by = self._summary.interrupted_by or name
        self.level = 2 if at_once else self.level + 1
        cause = f"interrupted by {name}"
        if self.level == 1:
            logger.warning(
                "%s: starting no more runs; stopping %d running run(s) "
                "(SIGTERM, then SIGKILL after %gs). Press Ctrl-C again to stop at once.",
                "received " + name if name.startswith("SIG") else name,
                len(self._active),
                self._options.grace_period,
            )
            for active in self._active.values():
                self.stop(active, RunStatus.INTERRUPTED, cause)
            return
        logger.warning(
            "%s: killing %d run(s) now", f"received {name} again" if name.startswith("SIG") else name, len(self._active)
        )
        for active in self._active.values():
            if not active.exited:
                active.stopped = active.stopped or (RunStatus.INTERRUPTED, cause)
                active.kill_at = active.term_at = None
                active.handle.kill()

    def leave_to_the_cluster(self) -> None:
        """``detach``: the runs handed to the cluster run on there; the ledger keeps them as running,
        and the next start of this root follows them (Launcher.live_attempt)."""
        logger.warning(
            "detached: %d run(s) queued or running on the cluster; `gts status` shows them, and `gts run` "
            "on this root again follows them (and starts what was not ready yet)",
            len(self._active),
        )
        self._summary.detached = len(self._active)
        self._active.clear()

    def enforce_deadlines(self) -> None:
        now, options = self._clock(), self._options
        for active in self._active.values():
            if active.term_at is not None and now >= active.term_at and active.stopped is not None:
                logger.warning(
                    "%s did not report again within %gs of being %s; sending SIGTERM",
                    active.spec.name,
                    options.grace_period,
                    "paused" if active.stopped[0] is RunStatus.PAUSED else "stopped early",
                )
                self.stop(active, *active.stopped)
            elif active.deadline is not None and now >= active.deadline:
                if active.handle.has_exited():
                    # It ended while we were not looking (the scheduler was stopped, or
                    # busy): its own exit status says how, not the clock we read late.
                    active.deadline = None
                    continue
                self.stop(active, RunStatus.TIMED_OUT, f"timed out after {options.timeout:g}s")
            elif active.kill_at is not None and now >= active.kill_at:
                logger.warning(
                    "%s did not stop within %gs of SIGTERM; sending SIGKILL", active.spec.name, options.grace_period
                )
                active.handle.kill()
                active.kill_at = None

    def kill_everything(self, records: Records) -> None:
        """Last resort when the loop ends abnormally: no run may outlive us."""
        for key, active in list(self._active.items()):
            active.handle.kill()
            active.handle.reap()
            del self._active[key]
            records.abandoned(active.spec)


def _tell(active: Active, path: str, text: str) -> bool:
    """Write one of the files the scheduler tells a running run something through (atomically,
    never through a link the run planted)."""
    if active.paths.unsafe() is not None:
        return False
    try:
        atomic_write(path, text.encode("utf-8"), durable=False)
    except OSError as error:
        logger.warning("%s: could not write %s (%s)", active.spec.name, path, error)
        return False
    return True
