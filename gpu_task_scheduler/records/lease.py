"""Leases: an attempt on another machine is known to be over before its run starts again.

A run on a machine the scheduler does not own (a Ray node, a Slurm job) can
outlive the moment the scheduler hears that its machine went away: the
cluster's word that a node is gone comes before that node's processes are
actually gone, or the node is only cut off and its processes run on. A retry
started at once would run the same run twice side by side, and its side
effects (files, checkpoints, uploads) would happen twice.

So every such attempt holds a *lease*: ``<run>/.gts/lease``, on the file
system that the scheduler and every machine share, which the attempt's
supervisor renews every ``renew_every`` seconds, each time after it heard
from the scheduler. A supervisor that has not renewed for ``fence_after``
seconds (the scheduler does not answer, or the file system does not take
the write) stops its run: SIGTERM, the grace period, SIGKILL. When the run's
processes are gone it marks the lease released.

The scheduler retries a lost attempt only once :func:`wait_over` says it is
over: its lease was never taken (the run never started), is released, or
was not renewed for :attr:`LeaseTerms.period` seconds, which is longer than
the supervisor's ``fence_after`` plus the grace period plus a slack of two
renewals: by then a supervisor cut off from everything has stopped its run.
Time is measured on the scheduler's own monotonic clock from the moment it
last *saw* the lease change, so the machines' clocks need not agree. The
outcome file is read after that, as always: an attempt that finished in the
meantime is recorded as succeeded and not run again.

A supervisor starts its run only after it took the lease *and* then heard
from the scheduler that the attempt is still wanted; the scheduler gives an
attempt up (so that no later word reaches it) before it reads the lease. So
a lease that the scheduler reads as never taken belongs to an attempt that
can no longer start.

One writer (the supervisor, :class:`LeaseHolder`) and one reader (the
scheduler, :func:`wait_over`); the Ray backend uses both, and so will any
other backend whose runs live on machines the scheduler does not own.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from ..recordclass import Record
from .paths import atomic_write, read_json

HELD, RELEASED = "held", "released"


class LeaseTerms(Record):
    """How an attempt's lease is kept (seconds)."""

    renew_every: float  # the supervisor renews this often, after hearing from the scheduler
    grace_period: float  # what a stop gives the run between SIGTERM and SIGKILL

    @property
    def fence_after(self) -> float:
        """A supervisor that has not renewed for this long stops its run."""
        return 3 * self.renew_every

    @property
    def period(self) -> float:
        """A lease not renewed for this long belongs to an attempt that is over."""
        return self.fence_after + self.grace_period + 2 * self.renew_every + 1.0


class LeaseHolder:
    """The supervisor's side: take, renew, release (each an atomic replace of the lease file)."""

    def __init__(self, path: str, token: str) -> None:
        self.path, self.token = path, token
        self._renewals = 0

    def renew(self) -> None:
        """Take or renew the lease; raises OSError when the file system does not take it."""
        self._renewals += 1
        self._write(HELD)

    def release(self) -> None:
        """The attempt's processes are gone: a retry need not wait."""
        try:
            self._write(RELEASED)
        except OSError:
            pass  # then the scheduler waits for the lease to expire

    def _write(self, state: str) -> None:
        record = {"token": self.token, "renewals": self._renewals, "state": state, "pid": os.getpid()}
        atomic_write(self.path, json.dumps(record).encode(), durable=False)


def lease_state(path: str, token: str) -> tuple[str, int] | None:
    """``(state, renewals)`` of ``token``'s lease at ``path``; None when it holds none (never
    taken, or another attempt's)."""
    record = read_json(path)
    if not isinstance(record, dict) or record.get("token") != token:
        return None
    state, renewals = record.get("state"), record.get("renewals")
    if state not in (HELD, RELEASED) or not isinstance(renewals, int):
        return None
    return state, renewals


def wait_all_over(
    leases: list[tuple[str, str]],
    terms: LeaseTerms,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait until each attempt ``(path, token)`` is over, as :func:`wait_over` decides for one, all
    at once: a scheduler that starts again after a kill waits once for every attempt the killed one
    left, not for one after another."""
    seen: dict[int, tuple[tuple[str, int], float]] = {}  # its lease as last seen, and since when
    waiting = list(range(len(leases)))
    while waiting:
        now = clock()
        still = []
        for index in waiting:
            path, token = leases[index]
            state = lease_state(path, token)
            if state is None and index not in seen:
                continue  # never taken: it had not started
            if state is not None and state[0] == RELEASED:
                continue
            if state is not None and (index not in seen or seen[index][0] != state):
                seen[index] = (state, now)
            elif now - seen[index][1] >= terms.period:
                continue  # not renewed for the lease's period: over
            still.append(index)
        waiting = still
        if waiting:
            sleep(min(terms.renew_every / 2, 0.5))


def wait_over(
    path: str,
    token: str,
    terms: LeaseTerms,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Wait until the attempt ``token`` is over; say how it was known (for the run's record)."""
    started = last_change = clock()
    seen: tuple[str, int] | None = None
    while True:
        state = lease_state(path, token)
        now = clock()
        if state is None and seen is None:
            return "it had not started"
        if state is not None and state[0] == RELEASED:
            return f"its processes ended {now - started:.1f}s later"
        if state is not None and state != seen:  # a lease that vanished (deleted by hand) still waits
            seen, last_change = state, now
        elif now - last_change >= terms.period:
            return f"its lease expired {now - started:.1f}s later (not renewed for {terms.period:g}s)"
        sleep(min(terms.renew_every / 2, 0.5))
