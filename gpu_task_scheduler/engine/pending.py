"""The runs still to start, in the order they start.

Retries of failed runs first (their slot just freed, their inputs are warm),
then runs of a later stage whose dependencies have just settled, then the
sweep's next run, then, once the sweep has no more, the runs that ran out of
GPU memory, each with the larger need it will reserve. The head of the queue
is *held* until it starts: a run that waits for room keeps its place. A run
that waits for runs of an earlier stage is *parked*, out of the way of the
runs behind it, until the last of them settles (:class:`Waits` keeps track).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator

from ..gpu.devices import format_memory
from ..gpu.placement import Need, WholeGpu
from ..records.ledger import Ledger
from ..records.status import RunStatus
from ..sweep.expand import Sweep
from ..sweep.options import SchedulerOptions
from ..sweep.spec import NOT_READY, RunSpec
from .decide import Classified, Next, after_exit

logger = logging.getLogger("gpu_task_scheduler")


class Pending:
    """A run of the queue and what this start() has learnt of it (a plain class: one is made per
    run, and a dataclass's generated methods cost every start their compilation)."""

    __slots__ = (
        "spec",
        "tries",
        "oom_retries",
        "lost_retries",
        "handbacks",
        "need",
        "decided",
        "waiting_on",
        "resume",
        "resume_step",
    )

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.tries = 0  # attempts of this run in this start()
        self.oom_retries = 0
        self.lost_retries = 0  # attempts run again because their machine went away
        self.handbacks = 0  # ... because it was taken back on schedule (a pool allocation's time limit)
        self.need: Need = None  # the memory estimate raised after an out-of-memory failure
        self.decided = False  # before_run() said it runs (asked once, also when it waits for dependencies)
        self.waiting_on: set[str] | None = None  # while parked: the runs it still waits for
        self.resume = False  # its next attempt goes on from the last one's checkpoint (decide.Decision.resume)
        # The step its next attempt goes on from when it is not the last one's last step (a
        # population-based training member that copied another's checkpoint goes on from that one's).
        self.resume_step: float | None = None


class RunQueue:
    def __init__(self, runs: Iterator[RunSpec]) -> None:
        self._runs = runs
        self._exhausted = False
        self._retry: collections.deque[Pending] = collections.deque()
        self._ready: collections.deque[Pending] = collections.deque()  # parked runs whose wait is over
        self._deferred: collections.deque[Pending] = collections.deque()
        self._parked: dict[str, list[Pending]] = {}  # a run's name -> the parked runs that wait for it
        self._parked_count = 0
        self.held: Pending | None = None

    def head(self) -> Pending | None:
        """The next run to start (the same one until :meth:`pop`), or None if there is none yet."""
        if self.held is None:
            if self._retry:
                self.held = self._retry.popleft()
            elif self._ready:
                self.held = self._ready.popleft()
            elif not self._exhausted:
                spec = next(self._runs, None)
                if spec is None:
                    self._exhausted = True
                elif spec is not NOT_READY:
                    self.held = Pending(spec)
            if self.held is None and self._exhausted and self._deferred:
                self.held = self._deferred.popleft()
        return self.held

    def pop(self) -> None:
        """The held run started (or was skipped, or failed): the next one moves up."""
        self.held = None

    def park(self, item: Pending, waiting_on: set[str]) -> None:
        """The held run waits for these runs to settle (:meth:`settled`); the next one moves up."""
        item.waiting_on = set(waiting_on)
        for name in waiting_on:
            self._parked.setdefault(name, []).append(item)
        self._parked_count += 1
        self.held = None

    def settled(self, name: str, *, ok: bool) -> None:
        """The run ``name`` settled: the runs that waited only for it come back; if it did not
        succeed, every run that waits for it comes back at once (to be blocked)."""
        for item in self._parked.pop(name, ()):
            if item.waiting_on is None:  # released already
                continue
            item.waiting_on.discard(name)
            if not ok or not item.waiting_on:
                item.waiting_on = None
                self._parked_count -= 1
                self._ready.append(item)

    def stranded(self) -> list[Pending]:
        """Parked runs when nothing else can ever come (what they wait for will not settle): taken
        out of the queue. None in a correct sweep; the engine blocks them rather than wait forever."""
        if self.held is not None or self.taking_besides_parked or not self._parked_count:
            return []
        items = {id(item): item for items in self._parked.values() for item in items if item.waiting_on is not None}
        self._parked.clear()
        self._parked_count = 0
        for item in items.values():
            item.waiting_on = None
        return list(items.values())

    def left(self, *, expand: bool = True) -> Iterator[RunSpec]:
        """The runs still in the queue, never started, for the summary of a sweep that stopped
        (drain, stop): consumes the queue. ``expand=False``: only those taken from the sweep
        already (a search's next runs would be asked of its sampler)."""
        items = [self.held] if self.held is not None else []
        items += [*self._retry, *self._ready, *self._deferred]
        items += list({id(i): i for waiting in self._parked.values() for i in waiting if i.waiting_on}.values())
        self.held = None
        for taken in (self._retry, self._ready, self._deferred, self._parked):
            taken.clear()
        self._parked_count = 0
        yield from (item.spec for item in items)
        while expand and not self._exhausted:
            spec = next(self._runs, None)
            if spec is None:
                self._exhausted = True
            elif spec is not NOT_READY:
                yield spec

    @property
    def taking_besides_parked(self) -> bool:
        return not self._exhausted or bool(self._retry or self._ready or self._deferred)

    @property
    def taking(self) -> bool:
        """Whether more runs may come: the sweep goes on, or runs wait to be retried or for their dependencies."""
        return self.taking_besides_parked or self._parked_count > 0

    @property
    def empty(self) -> bool:
        return self.held is None and not self.taking

    def next_step(
        self,
        item: Pending,
        end: Classified,
        options: SchedulerOptions,
        *,
        reserved: Need,
        peak: int | None,
        stopping: bool,
    ) -> Next:
        """What follows a run that ended: :func:`decide.after_exit`'s answer, acted on by :meth:`requeue`."""
        return after_exit(
            end,
            tries=item.tries,
            oom_retries=item.oom_retries,
            reserved=reserved,
            peak=peak,
            max_retries=options.max_retries,
            max_oom_retries=options.max_oom_retries,
            stopping=stopping,
            lost_retries=item.lost_retries,
            max_lost_retries=options.node_failure_retries,
            handbacks=item.handbacks,
        )

    def requeue(self, item: Pending, step: Next, options: SchedulerOptions) -> bool:
        """Act on :meth:`next_step`'s answer for a run that did not succeed: whether it runs again."""
        spec = item.spec
        max_retries, max_oom_retries = options.max_retries, options.max_oom_retries
        max_lost_retries = options.node_failure_retries
        if step.action == "defer":
            item.oom_retries += 1
            item.need = step.need
            size = "the whole GPU" if isinstance(step.need, WholeGpu) else format_memory(step.need)
            logger.info(
                "%s ran out of GPU memory; it will run again later, reserving %s (out-of-memory retry %d of %d)",
                spec.name,
                size,
                item.oom_retries,
                max_oom_retries,
            )
            self._deferred.append(item)
        elif step.action == "lost":
            item.lost_retries += 1
            logger.warning(
                "%s will run again on another machine (%d of %d such retries)",
                spec.name,
                item.lost_retries,
                max_lost_retries,
            )
            self._retry.append(item)
        elif step.action == "handback":
            item.handbacks += 1
            logger.info("%s goes on from its last reported step in another allocation", spec.name)
            self._retry.append(item)
        elif step.action == "retry":
            logger.info("%s will be retried (attempt %d of %d)", spec.name, item.tries + 1, max_retries + 1)
            self._retry.append(item)
        return step.action != "done"


class Waits:
    """How the runs that later stages wait for have settled in this start.

    Only runs of a stage that another follows are tracked, so a sweep without
    stages keeps nothing here. A run is *seen* when it reaches the head of the
    queue; a run of a later stage comes after every run it waits for in the
    sweep's order, so a dependency not seen by then is not part of this start
    (``gts retry`` of some runs): the ledger says whether it succeeded before.
    """

    def __init__(self, sweep: Sweep, ledger: Ledger) -> None:
        self._followed = sweep.followed
        self._ledger = ledger
        self._seen: set[str] = set()
        self._ok: set[str] = set()
        self._failed: dict[str, str] = {}  # name -> how it ended, in words

    def tracks(self, spec: RunSpec) -> bool:
        return bool(self._followed) and spec.stage in self._followed

    def seen(self, spec: RunSpec) -> None:
        if self.tracks(spec):
            self._seen.add(spec.name)

    def settle(self, spec: RunSpec, failure: str | None = None) -> bool:
        """``spec`` succeeded (``failure`` None) or will not; True when later runs wait for its stage."""
        if not self.tracks(spec):
            return False
        if failure is None:
            self._ok.add(spec.name)
        else:
            self._failed[spec.name] = failure
        return True

    def check(self, spec: RunSpec) -> tuple[set[str], str | None]:
        """``(runs it still waits for, None)``, or ``(empty, why it is blocked)``."""
        waiting: set[str] = set()
        for name in spec.after:
            if name in self._ok:
                continue
            if name in self._failed:
                return set(), f"its dependency {name} {self._failed[name]}"
            if name in self._seen:
                waiting.add(name)
                continue
            known = self._ledger.known(name)
            if known is not None and known.status is RunStatus.SUCCEEDED:
                self._ok.add(name)
                continue
            how = "has not run" if known is None else f"ended {known.status.value}"
            return set(), f"its dependency {name} {how}, and this start does not run it"
        return waiting, None


def failure_words(status: RunStatus, cause: str | None) -> str:
    """How a run that others wait for ended, for their cause: ``failed (exit code 1)``, ``is blocked``."""
    words = {
        RunStatus.BLOCKED: "is blocked",
        RunStatus.TIMED_OUT: "timed out",
        RunStatus.PRUNED: "was stopped early",
        RunStatus.PAUSED: "is paused",
    }.get(status, str(status))
    first = (cause or "").strip().splitlines()[0][:200] if cause and cause.strip() else ""
    return f"{words} ({first})" if first and status is not RunStatus.BLOCKED else words
