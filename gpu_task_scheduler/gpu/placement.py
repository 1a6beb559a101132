"""Which slot gets the next run: memory accounting and placement policies.

Pure logic over a snapshot, so it is tested without hardware. A GPU's
*available* memory is what NVML reports free, minus what our runs have
reserved but not allocated yet, minus a safety margin:

    available = free - sum(max(0, reserved - allocated) for our runs on it) - margin

Reserving at launch and releasing only as NVML shows the run's processes
allocating means that several runs started at the same moment never
double-book the same free memory, without any fixed "put interval".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from ..recordclass import Record
from .devices import Slot, format_memory
from .nvml import GpuState

if TYPE_CHECKING:
    from random import Random


class WholeGpu:
    """The need of a run whose memory use is not known yet, on a GPU several runs may
    share: it reserves the whole GPU until an estimate has been learned."""

    def __repr__(self) -> str:
        return "WHOLE_GPU"


WHOLE_GPU = WholeGpu()
Need = int | WholeGpu | None  # bytes per GPU; WHOLE_GPU; None: no memory accounting (one run per slot)


class Reservation(NamedTuple):
    """One active run of ours, as the memory accounting sees it."""

    gpu_ids: tuple[str, ...]
    pgid: int  # the run's process group: NVML's processes are matched to runs by it
    reserved: int | WholeGpu  # bytes per GPU (0: no accounting)


class GpuBook(NamedTuple):
    """A GPU's memory from our point of view."""

    state: GpuState
    available: int
    foreign_used: int  # used by processes that are not our runs
    ours: int  # how many of our runs use it
    others_pending: int = 0  # reserved by other schedulers' runs, not allocated yet


class SlotView(Record):
    index: int
    slot: Slot
    running: int
    capacity: int
    available: int | None  # bytes a new run may use (min over the slot's GPUs); None without NVML
    ours_on_gpus: int  # runs of ours on the slot's GPUs, from any slot
    busy: str | None  # why other users make it unusable now
    others_pending: int = 0  # bytes other schedulers' runs reserved on its GPUs and not allocated yet


def book(
    states: Mapping[str, GpuState],
    runs: Iterable[Reservation],
    margin: int,
    pgid_of: Callable[[int], int | None],
    others: Iterable[Reservation] = (),
) -> tuple[dict[str, GpuBook], dict[int, dict[str, int]]]:
    """Every GPU's account, and what each run of ours (by process group) has allocated on each of
    its GPUs. ``others``: other schedulers' runs on this machine, whose unallocated reservations
    are taken off the free memory as ours are (see gpu/shared.py)."""
    runs, others = list(runs), list(others)
    ours_by_pgid = {run.pgid for run in runs}
    tracked = ours_by_pgid | {run.pgid for run in others}
    books = {}
    used_by: dict[int, dict[str, int]] = {run.pgid: {} for run in runs}
    for gpu_id, state in states.items():
        foreign = 0
        allocated: dict[int, int] = {}
        for process in state.processes:
            owner = pgid_of(process.pid)
            if owner in tracked:
                allocated[owner] = allocated.get(owner, 0) + (process.used_memory or 0)
            if owner not in ours_by_pgid:
                foreign += process.used_memory or 0
        pending = 0
        ours = 0
        for run in runs:
            if gpu_id not in run.gpu_ids:
                continue
            ours += 1
            used = allocated.get(run.pgid, 0)
            used_by[run.pgid][gpu_id] = used
            pending += max(0, reserved_bytes(run.reserved, state) - used)
        others_pending = sum(
            max(0, reserved_bytes(run.reserved, state) - allocated.get(run.pgid, 0))
            for run in others
            if gpu_id in run.gpu_ids
        )
        books[gpu_id] = GpuBook(
            state=state,
            available=state.free_memory - pending - others_pending - margin,
            foreign_used=foreign,
            ours=ours,
            others_pending=others_pending,
        )
    return books, used_by


def reserved_bytes(reserved: int | WholeGpu, state: GpuState) -> int:
    """A reservation on one GPU in bytes (the whole GPU's memory for ``WHOLE_GPU``)."""
    return state.total_memory if isinstance(reserved, WholeGpu) else reserved


def busy_reason(gpu: GpuBook, *, memory_fraction: float | None, utilization: float | None) -> str | None:
    state = gpu.state
    if memory_fraction is not None and state.total_memory and gpu.foreign_used / state.total_memory > memory_fraction:
        return (
            f"other users' processes use {format_memory(gpu.foreign_used)} of "
            f"{format_memory(state.total_memory)} (busy_memory_fraction {memory_fraction:g})"
        )
    if utilization is not None and state.utilization is not None and gpu.ours == 0 and state.utilization >= utilization:
        return f"utilisation is {state.utilization}% without any run of ours (busy_utilization {utilization:g})"
    return None


def fits(view: SlotView, need: Need) -> bool:
    """Whether a run needing ``need`` may start on the slot now. Even a run of unknown need gets
    no GPU without memory available: one that other processes fill beyond the margin would only
    run out of it (``Capacity.need`` gives ``min_free_gpu_memory`` as the need of such a run)."""
    if view.running >= view.capacity or view.busy is not None:
        return False
    if isinstance(need, WholeGpu):
        return view.ours_on_gpus == 0 and (view.available is None or view.available > 0)
    if view.available is None:
        return True
    return view.available > 0 if need is None else need <= view.available


def choose(
    views: Sequence[SlotView], need: Need, policy: str, *, last: int = -1, rng: Random | None = None
) -> SlotView | None:
    """The slot for a run needing ``need`` bytes per GPU (None: unknown, no accounting).

    * ``first_fit``: the first slot in config order (the original's behaviour);
    * ``round_robin``: the next fitting slot after the one chosen ``last``;
    * ``random``: any fitting slot;
    * ``most_free``: the fitting slot with the most available memory.
    """
    candidates = [view for view in views if fits(view, need)]
    if not candidates:
        return None
    if policy == "round_robin":
        later = [view for view in candidates if view.index > last]
        return (later or candidates)[0]
    if policy == "random":
        if rng is None:
            import random  # here: only this policy draws (the import would cost every start 0.7 ms)

            rng = random.Random()
        return rng.choice(candidates)
    if policy == "most_free":
        return sorted(candidates, key=lambda view: -(view.available if view.available is not None else -1))[0]
    return candidates[0]
