"""The runs still to start, in the order they start.

Retries of failed runs first (their slot just freed, their inputs are warm),
then the sweep's next run, then, once the sweep has no more, the runs that ran
out of GPU memory, each with the larger need it will reserve. The head of the
queue is *held* until it starts: a run that waits for room keeps its place.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from ..gpu.devices import format_memory
from ..gpu.placement import Need, WholeGpu
from ..sweep.expand import NOT_READY, RunSpec
from ..sweep.options import SchedulerOptions
from .decide import Classified, Next, after_exit

logger = logging.getLogger("gpu_task_scheduler")


@dataclass
class Pending:
    spec: RunSpec
    tries: int = 0  # attempts of this run in this start()
    oom_retries: int = 0
    need: Need = None  # the memory estimate raised after an out-of-memory failure


class RunQueue:
    def __init__(self, runs: Iterator[RunSpec]) -> None:
        self._runs = runs
        self._exhausted = False
        self._retry: collections.deque[Pending] = collections.deque()
        self._deferred: collections.deque[Pending] = collections.deque()
        self.held: Pending | None = None

    def head(self) -> Pending | None:
        """The next run to start (the same one until :meth:`pop`), or None if there is none yet."""
        if self.held is None:
            if self._retry:
                self.held = self._retry.popleft()
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

    @property
    def taking(self) -> bool:
        """Whether more runs may come: the sweep goes on, or runs wait to be retried."""
        return not self._exhausted or bool(self._retry or self._deferred)

    @property
    def empty(self) -> bool:
        return self.held is None and not self.taking

    def ended(
        self,
        item: Pending,
        end: Classified,
        options: SchedulerOptions,
        *,
        reserved: Need,
        peak: int | None,
        stopping: bool,
    ) -> None:
        """A run that did not succeed: queue it again if :func:`decide.after_exit` says so."""
        step = after_exit(
            end,
            tries=item.tries,
            oom_retries=item.oom_retries,
            reserved=reserved,
            peak=peak,
            max_retries=options.max_retries,
            max_oom_retries=options.max_oom_retries,
            stopping=stopping,
        )
        self.requeue(item, step, max_retries=options.max_retries, max_oom_retries=options.max_oom_retries)

    def requeue(self, item: Pending, step: Next, *, max_retries: int, max_oom_retries: int) -> None:
        """Act on :func:`decide.after_exit`'s answer for a run that did not succeed."""
        spec = item.spec
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
        elif step.action == "retry":
            logger.info("%s will be retried (attempt %d of %d)", spec.name, item.tries + 1, max_retries + 1)
            self._retry.append(item)
