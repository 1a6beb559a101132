"""What the machine can take now: slots, GPU memory, reservations, learned needs, host limits.

The engine asks :meth:`Capacity.place` where a run may start; it answers with
a slot, or why the run must wait (the waiting message), or why it can never
start here. The engine tells it when a run starts (:meth:`take`) and ends
(:meth:`release`); everything about GPUs (NVML reads, memory accounting,
busy GPUs, learning what runs use) stays in here. The arithmetic is in
``placement.py`` (pure); this class owns the state and the NVML reads.
"""

from __future__ import annotations

import logging
import operator
import os
import time
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..errors import GTSError
from .devices import Slot, discover_slots, format_memory, gpu_ids, open_monitor
from .host import HostProbe, process_stat
from .nvml import GpuMonitor, GpuState
from .placement import (
    WHOLE_GPU,
    Need,
    Reservation,
    SlotView,
    WholeGpu,
    book,
    busy_reason,
    choose,
    reserved_bytes,
)
from .shared import STARTING, Held, Publisher, SharedReservations, process_user
from .usage import GpuClock, Usage

if TYPE_CHECKING:
    from random import Random


class SchedulerOptions(Protocol):
    """What capacity reads of a sweep's options (``sweep/options.py``'s SchedulerOptions has it):
    the options are read, never built, here, and gpu/ does not depend on sweep/."""

    @property
    def slots(self) -> tuple[Slot, ...] | None: ...

    @property
    def result_root_folder(self) -> str: ...

    @property
    def max_runs_per_gpu(self) -> int: ...

    @property
    def share_gpu_reservations(self) -> bool: ...

    @property
    def cpu_fallback(self) -> int: ...

    @property
    def max_host_cpu_percent(self) -> float | None: ...

    @property
    def min_host_free_memory(self) -> int | None: ...

    @property
    def min_free_gpu_memory(self) -> int | None: ...

    @property
    def memory_margin(self) -> int: ...

    @property
    def learn_gpu_memory(self) -> str | None: ...

    @property
    def placement(self) -> str: ...

    @property
    def busy_memory_fraction(self) -> float | None: ...

    @property
    def busy_utilization(self) -> float | None: ...

    @property
    def idle_holder_after(self) -> float: ...

    def memory_need(self, config: Mapping[str, Any]) -> int | None: ...


logger = logging.getLogger("gpu_task_scheduler")


class Placement(NamedTuple):
    view: SlotView | None = None  # where it starts
    impossible: str | None = None  # it can never start here: why
    waiting: str | None = None  # it waits: why (None when the slots are simply full of our runs)
    news: bool = False  # the wait is for something other than our own runs


def process_group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None  # not in our PID namespace, or gone


def owning_group(pid: int, groups: Container[int]) -> int | None:
    """The process group in ``groups`` that ``pid`` belongs to, or that one of its ancestors
    belongs to (a process that left its run's group, e.g. a daemon, while the run's runner,
    its subreaper, still lives); otherwise its own group."""
    own = process_group(pid)
    if own in groups:
        return own
    ancestor: int | None = pid
    for _ in range(64):
        process = process_stat(ancestor) if ancestor else None
        ancestor = process[1] if process else None
        if not ancestor or ancestor <= 1:
            break
        group = process_group(ancestor)
        if group in groups:
            return group
    return own


def available_words(available: int | None) -> str:
    """What a slot has for a new run, never as a negative size: memory held by others beyond
    the free memory and the margin leaves it none.

    >>> available_words(-60 * 2**30)
    'no memory available'
    """
    if available is not None and available <= 0:
        return "no memory available"
    return f"{format_memory(available)} available"


def _duration(seconds: float) -> str:
    """Coarse on purpose: a waiting message is logged again only when it changes."""
    if seconds < 60:
        return "under a minute"
    if seconds < 7200:
        return f"{seconds // 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Released(NamedTuple):
    """What :meth:`Capacity.release` knows of a run that ended."""

    reserved: Need  # what it had reserved
    peak: int | None  # the most GPU memory it was seen to use on one GPU
    usage: Usage  # what its attempt cost (gpu/usage.py), all of it
    unsaved: Usage  # the part of ``usage`` not handed to the saver yet (the ledger adds it at the end)


class Leftover(NamedTuple):
    """A process of a run that ended, still holding memory on a GPU."""

    pid: int
    gpu_id: str
    used: int
    run: str

    def describe(self) -> str:
        return f"pid {self.pid} holds {format_memory(self.used)} on gpu {self.gpu_id}"


def read_gpus(monitor: GpuMonitor, ids: Sequence[str]) -> dict[str, GpuState]:
    """Each listed GPU's state; a GPU NVML does not know is an error that lists those it does."""
    states, unknown = {}, []
    for gpu_id in ids:
        try:
            states[gpu_id] = monitor.state(gpu_id)
        except Exception as error:  # the bindings' NVMLError subclasses
            # NVML's words for an id it does not have ("Invalid Argument", "Not Found") say
            # less than the list of ids below; any other error is named.
            absent = type(error).__name__ in ("NVMLError_InvalidArgument", "NVMLError_NotFound")
            unknown.append(gpu_id if absent else f"{gpu_id} ({error})")
    if not unknown:
        return states
    try:
        present = "; ".join(f"{s.index}: {s.name}, {format_memory(s.total_memory)}" for s in monitor.all())
    except Exception as error:
        present = f"unknown ({error})"
    hint = (
        "; CUDA_VISIBLE_DEVICES is set, so ids count within it"
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None
        else ""
    )
    raise GTSError(
        f"GPU {', '.join(unknown)} does not exist on this machine; the GPUs NVML sees: {present or 'none'}{hint}"
    )


def check_slots(options: SchedulerOptions, *, nvml: ModuleType | None = None) -> list[Slot]:
    """The slots a local start would find, checked as it checks them (``"gpu": "all"`` without a
    GPU, a listed GPU that does not exist), for a dry run: holds nothing, writes nothing."""
    monitor, why = (None, "")
    if options.slots is None or any(not slot.is_cpu for slot in options.slots):
        monitor, why = open_monitor(nvml)
    try:
        slots = discover_slots(options.slots, cpu_fallback=options.cpu_fallback, monitor=monitor, why_no_monitor=why)
        if monitor is not None:
            read_gpus(monitor, gpu_ids(slots))
        return slots
    finally:
        if monitor is not None:
            monitor.close()


class Capacity:
    def __init__(
        self,
        options: SchedulerOptions,
        *,
        nvml: ModuleType | None = None,
        host: HostProbe | None = None,
        slots: Sequence[Slot] | None = None,
        slot_gpus: Callable[[Slot], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Finds the slots on this machine; raises GTSError if there are none (and holds nothing then).
        ``slots``: a cluster's instead (a launcher's, see engine/launcher.py), one run each, placed by
        the cluster on GPUs this machine cannot see: no NVML here; ``slot_gpus`` says how many GPUs
        an attempt on each asks its cluster for (its GPU-seconds are its duration times that)."""
        self._o = options
        self._slot_gpus = slot_gpus
        self.usage = GpuClock(clock)  # each run's GPU-seconds and energy (gpu/usage.py)
        self._save_usage: Callable[[dict[str, Usage]], None] | None = None
        self._host = host or HostProbe()
        self._monitor: GpuMonitor | None = None
        self._shared: SharedReservations | None = None
        why = ""
        if slots is None and (options.slots is None or any(not slot.is_cpu for slot in options.slots)):
            self._monitor, why = open_monitor(nvml)
            if self._monitor is None and options.slots is not None:
                ids = gpu_ids(options.slots)
                logger.warning(
                    "GPU %s could not be checked: %s. The runs start on them anyway (CUDA decides "
                    "whether they exist), one run per slot, without memory checks",
                    ", ".join(ids),
                    why,
                )
        try:
            self.slots: list[Slot] = (
                list(slots)
                if slots is not None
                else discover_slots(
                    options.slots, cpu_fallback=options.cpu_fallback, monitor=self._monitor, why_no_monitor=why
                )
            )
            packing = self._monitor is not None
            self._capacity = [1 if s.is_cpu or not packing else options.max_runs_per_gpu for s in self.slots]
            self._running = [0] * len(self.slots)
            self._gpu_ids = gpu_ids(self.slots)
            self._states: dict[str, GpuState] = self._read_gpus() if self._monitor is not None else {}
        except BaseException:
            self.close()
            raise
        self._reservations: dict[int, Reservation] = {}
        self._counted_views: dict[tuple[int, int], SlotView] = {}  # (slot, our runs on it), without NVML
        self._names: dict[int, str] = {}  # pgid -> run name, for other schedulers' `gts gpus`
        self._starting: Reservation | None = None  # placed, its process not started yet
        self.others: list[Publisher] = []  # other schedulers' reservations, as last read
        if self._monitor is not None and self._gpu_ids and options.share_gpu_reservations:
            self._shared = SharedReservations(options.result_root_folder)
        self._peaks: dict[int, int] = {}
        self._seen: dict[int, dict[int, str]] = {}  # pgid -> {pid: gpu id} of its processes NVML showed
        self._ending: dict[int, dict[int, str]] = {}  # the same for runs that ended, until reaped
        self.leftovers: dict[int, Leftover] = {}  # pid -> what a run that ended left holding GPU memory
        self._idle: dict[tuple[str, int], float] = {}  # (gpu id, pid) of others' processes -> idle since
        self._learned: list[int] = []
        self._last_slot = -1
        self._rng: Random | None = None  # made when the random placement first draws
        self._idle_reported: set[int] = set(range(len(self.slots)))  # a slot that ran nothing finished nothing
        if options.max_host_cpu_percent is not None:
            self._host.cpu_percent()  # start the first measuring interval

    def close(self) -> None:
        if self._shared is not None:
            self._shared.close()
            self._shared = None
        if self._monitor is not None:
            self._monitor.close()
            self._monitor = None

    def _read_gpus(self) -> dict[str, GpuState]:
        assert self._monitor is not None
        return read_gpus(self._monitor, self._gpu_ids)

    def log_gpus(self) -> None:
        for gpu_id, state in self._states.items():
            logger.info(
                "gpu %s: %s, %s total, %s free, %d process(es)",
                gpu_id,
                state.name,
                format_memory(state.total_memory),
                format_memory(state.free_memory),
                len(state.processes),
            )

    # --- needs --------------------------------------------------------------------

    def need(self, config: Mapping[str, Any], raised: Need = None) -> Need:
        """Bytes per GPU a run needs: raised after an out-of-memory failure, declared, learned
        (also with one run per GPU: a GPU that other processes fill gets no run that could not fit
        there), else the whole GPU (when runs share GPUs) or None (no accounting)."""
        if self._monitor is None:
            return None
        if raised is not None:
            return raised
        declared = self._o.memory_need(config)
        if declared is not None:
            return declared
        if self._o.learn_gpu_memory and self._learned:
            import statistics  # here: its import (fractions, decimal) would cost every start 3 ms

            pick = max if self._o.learn_gpu_memory == "max" else statistics.mean
            learned = int(pick(self._learned))
            if self._states:  # an estimate (maybe from other GPUs, in an earlier start) never makes a run impossible
                learned = min(learned, max(s.total_memory for s in self._states.values()) - self._o.memory_margin)
            return learned
        if self._o.max_runs_per_gpu > 1:
            return WHOLE_GPU
        return self._o.min_free_gpu_memory  # None: any memory available at all

    def learned_before(self, peaks: Iterable[int]) -> None:
        """Peaks the result root recorded for runs of earlier starts (see ``learn``)."""
        self._learned.extend(peak for peak in peaks if peak > 0)

    # --- placing ------------------------------------------------------------------

    def views(self) -> list[SlotView]:
        """Each slot now: our runs on it, the memory a new run may use, whether others make it busy.
        Reading NVML also measures what our runs have allocated (their peaks teach us their needs)."""
        if self._monitor is None:  # only our own counts change: the views are the ones built before
            return [self._counted_view(index) for index in range(len(self.slots))]
        try:
            states = self._monitor.snapshot(self._gpu_ids)
        except Exception as error:  # an NVMLError: a GPU fell off the bus, the driver restarts
            logger.warning("cannot read the GPUs through NVML (%s); waiting", error)
            return [
                SlotView(i, s, self._running[i], self._capacity[i], None, 0, f"NVML error: {error}")
                for i, s in enumerate(self.slots)
            ]
        self._states = states
        others = self._other_reservations(states)
        groups = self._reservations.keys()
        owners: dict[int, int | None] = {}

        def owner(pid: int) -> int | None:
            owners[pid] = owning_group(pid, groups)
            return owners[pid]

        books, used = book(states, self._reservations.values(), self._o.memory_margin, owner, others)
        for pgid, per_gpu in used.items():
            self._peaks[pgid] = max([self._peaks.get(pgid, 0), *per_gpu.values()])
        self.usage.look(used, self._energy(self.usage.gpus()))
        for gpu_id, state in states.items():
            for process in state.processes:
                group = owners.get(process.pid)
                if group in self._reservations:
                    self._seen.setdefault(group, {})[process.pid] = gpu_id
        self._check_leftovers(states)
        self._watch_idle_holders(states, owners)
        views = []
        for index, slot in enumerate(self.slots):
            gpus = [books[gpu] for gpu in slot.gpu_ids if gpu in books]
            busy = None
            for gpu_id, gpu in zip(slot.gpu_ids, gpus, strict=False):
                reason = busy_reason(
                    gpu, memory_fraction=self._o.busy_memory_fraction, utilization=self._o.busy_utilization
                )
                held = [left for left in self.leftovers.values() if left.gpu_id == gpu_id]
                if held and not reason:
                    reason = "; ".join(
                        f"{format_memory(left.used)} still held by pid {left.pid}, which run {left.run} left behind"
                        for left in held
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
                    others_pending=max((g.others_pending for g in gpus), default=0),
                )
            )
        return views

    def _counted_view(self, index: int) -> SlotView:
        """A slot's view without NVML: its count of our runs is all there is to it (the views are
        frozen, so one per slot and count serves every placement: 16 slots took 47 us to build
        at each placement)."""
        running = self._running[index]
        view = self._counted_views.get((index, running))
        if view is None:
            view = SlotView(index, self.slots[index], running, self._capacity[index], None, 0, None)
            self._counted_views[(index, running)] = view
        return view

    def _other_reservations(self, states: Mapping[str, GpuState]) -> list[Reservation]:
        """Other schedulers' reservations on our GPUs (by UUID: they may name GPUs otherwise)."""
        if self._shared is None:
            return []
        self.others = self._shared.others()
        ids = {state.uuid: gpu_id for gpu_id, state in states.items()}
        return [
            Reservation((ids[held.gpu_uuid],), held.pgid, held.reserved)
            for publisher in self.others
            for held in publisher.reservations
            if held.gpu_uuid in ids
        ]

    def _publish(self) -> None:
        """Our runs' reservations, for the other schedulers on this machine."""
        if self._shared is None:
            return
        runs = list(self._reservations.items())
        if self._starting is not None:
            runs.append((STARTING, self._starting))
        held = []
        for pgid, run in runs:
            for gpu_id in run.gpu_ids:
                state = self._states.get(gpu_id)
                if state is None:
                    continue
                reserved = reserved_bytes(run.reserved, state)
                if reserved > 0:
                    held.append(Held(state.uuid, reserved, pgid, self._names.get(pgid, "")))
        self._shared.publish(held)

    def _seeded(self) -> Random:
        """The random placement's draws, the same in every start (seed 0)."""
        if self._rng is None:
            import random  # here: only the random placement draws (the import costs a start 0.7 ms)

            self._rng = random.Random(0)
        return self._rng

    def place(self, name: str, need: Need) -> Placement:
        self._starting = None
        if self._shared is None or need is None:
            return self._place(name, need)
        with self._shared.locked():  # no other scheduler reads, places or publishes meanwhile
            placement = self._place(name, need)
            if placement.view is not None:
                self._starting = Reservation(placement.view.slot.gpu_ids, STARTING, need)
                self._names[STARTING] = name
                self._publish()
            return placement

    def _place(self, name: str, need: Need) -> Placement:
        # Every slot busy with our own runs and no GPU to read (the loop asks again after each
        # start): no view can fit, so none is built.
        full = self._monitor is None and all(map(operator.ge, self._running, self._capacity))
        views = [] if full else self.views()
        impossible = self._impossible(need)
        if impossible is not None:
            return Placement(impossible=impossible)
        host = self._host_blocked()
        rng = self._seeded() if self._o.placement == "random" else None
        view = None if host or full else choose(views, need, self._o.placement, last=self._last_slot, rng=rng)
        if view is not None:
            self._last_slot = view.index
            return Placement(view=view)
        if host is None and (full or all(v.running >= v.capacity for v in views)):
            return Placement()  # every slot is busy with our own runs: the normal case, nothing to say
        if host is not None:
            reason = host
        else:
            wanted = (
                "the whole GPU"
                if isinstance(need, WholeGpu)
                else ("a free slot" if need is None else f"{format_memory(need)} per GPU")
            )
            states = []
            for v in views:
                if v.busy:
                    states.append(f"{v.slot.name} busy ({v.busy})")
                elif v.running >= v.capacity:
                    states.append(f"{v.slot.name} full ({v.running} of ours)")
                else:
                    shared = (
                        f" ({format_memory(v.others_pending)} reserved by other sweeps)" if v.others_pending else ""
                    )
                    states.append(f"{v.slot.name} {available_words(v.available)}{shared}")
            reason = f"needs {wanted}; " + "; ".join(states)
            idle = self.idle_holders(dict.fromkeys(gpu for v in views for gpu in v.slot.gpu_ids))
            if idle:
                reason += "; idle processes holding memory: " + "; ".join(idle)
        news = host is not None or not self._reservations or any(v.others_pending for v in views)
        return Placement(waiting=f"waiting to start {name}: {reason}", news=news)

    def _impossible(self, need: Need) -> str | None:
        """Why a run can never start here (it needs more than any GPU has), or None."""
        if not isinstance(need, int) or isinstance(need, bool) or not self._states:
            return None
        largest = max(state.total_memory for state in self._states.values()) - self._o.memory_margin
        if need > largest:
            return (
                f"it needs {format_memory(need)} per GPU, more than any GPU here can give "
                f"({format_memory(largest)} after the {format_memory(self._o.memory_margin)} margin)"
            )
        return None

    def _host_blocked(self) -> str | None:
        o = self._o
        if o.max_host_cpu_percent is not None:
            percent = self._host.cpu_percent()
            if percent is not None and percent > o.max_host_cpu_percent:
                return f"host CPU utilisation is {percent:.0f}% (max_host_cpu_percent {o.max_host_cpu_percent:g})"
        if o.min_host_free_memory is not None:
            free = self._host.available_memory()
            if free < o.min_host_free_memory:
                return (
                    f"host has {format_memory(free)} of RAM available "
                    f"(min_host_free_memory {format_memory(o.min_host_free_memory)})"
                )
        return None

    # --- runs starting and ending --------------------------------------------------

    def _energy(self, gpu_ids: Iterable[str]) -> dict[str, int | None]:
        """The GPUs' energy counters now (none without NVML)."""
        monitor = self._monitor
        return {} if monitor is None else {gpu: monitor.energy(gpu) for gpu in gpu_ids}

    def gpus_of(self, slot: Slot) -> float:
        """The GPUs a run on ``slot`` holds (on a cluster: asks its cluster for)."""
        return float(len(slot.gpu_ids)) or (self._slot_gpus(slot) if self._slot_gpus is not None else 0.0)

    def save_usage_to(self, save: Callable[[dict[str, Usage]], None]) -> None:
        """Hand what running runs accrued to ``save`` (run name -> usage since the last save) at each
        :meth:`measure`, so that a kill -9 loses at most one poll interval of it."""
        self._save_usage = save

    def take(self, slot_index: int, pgid: int, need: Need, name: str = "") -> None:
        gpus = self.slots[slot_index].gpu_ids
        self.usage.begin(pgid, gpus, self._energy(gpus))
        self._running[slot_index] += 1
        self._idle_reported.discard(slot_index)
        reserved = need if need is not None else 0
        self._reservations[pgid] = Reservation(self.slots[slot_index].gpu_ids, pgid, reserved)
        self._names[pgid] = name
        self._starting = None
        self._publish()

    @property
    def measuring(self) -> bool:
        """Runs of ours hold GPUs: looked at now and then, through NVML to learn what they use,
        and to save the GPU-seconds they accrued."""
        return len(self.usage) > 0 and any(r.gpu_ids for r in self._reservations.values())

    def measure(self) -> None:
        if not self.measuring:
            return
        if self._monitor is not None:
            self.views()
        if self._save_usage is not None:
            deltas = self.usage.unsaved()
            if deltas:
                self._save_usage({self._names.get(key, ""): usage for key, usage in deltas.items()})

    def release(self, slot_index: int, pgid: int, duration: float = 0.0) -> Released:
        """The run on ``slot_index`` ended after ``duration`` seconds: what it had reserved, the peak it
        was seen to use, what it cost. Call before the run's processes are reaped, so that a last look
        still finds them."""
        slot = self.slots[slot_index]
        if self._monitor is not None and slot.gpu_ids:
            self.views()  # a last look at what it allocated
        saved = self.usage.saved(pgid)
        usage = self.usage.end(pgid, self._energy(slot.gpu_ids))
        if not slot.gpu_ids and self._slot_gpus is not None:  # a cluster's slot: the GPUs it asked for
            usage = Usage(max(0.0, duration) * self._slot_gpus(slot))
            self.usage.total += usage.gpu_seconds
        unsaved = Usage(
            usage.gpu_seconds - saved.gpu_seconds, None if usage.joules is None else usage.joules - (saved.joules or 0)
        )
        self._running[slot_index] -= 1
        reservation = self._reservations.pop(pgid, None)
        self._ending[pgid] = self._seen.pop(pgid, {})
        self._names.pop(pgid, None)
        self._publish()
        peak = self._peaks.pop(pgid, 0) or None
        return Released(reservation.reserved if reservation else None, peak, usage, unsaved)

    def left_behind(self, pgid: int, run: str) -> list[Leftover]:
        """After the run's processes were reaped (and its strays killed): those NVML showed holding
        GPU memory during the run that still hold it. Their GPUs count as busy until they let go."""
        seen = self._ending.pop(pgid, {})
        if not seen or self._monitor is None:
            return []
        try:
            states = self._monitor.snapshot(sorted(set(seen.values())))
        except Exception:  # an NVMLError: nothing can be told now
            return []
        found = []
        for gpu_id, state in states.items():
            for process in state.processes:
                if seen.get(process.pid) == gpu_id and (process.used_memory or 0) > 0:
                    left = Leftover(process.pid, gpu_id, process.used_memory or 0, run)
                    self.leftovers[process.pid] = left
                    found.append(left)
        return found

    def _watch_idle_holders(self, states: Mapping[str, GpuState], owners: Mapping[int, int | None]) -> None:
        """Note since when other users' processes hold memory on a GPU that computes nothing
        (NVML's utilisation is per GPU: 0 % means none of its processes is working)."""
        now = time.monotonic()
        seen = set()
        for gpu_id, state in states.items():
            if state.utilization != 0:
                continue
            for process in state.processes:
                if owners.get(process.pid) not in self._reservations and (process.used_memory or 0) > 0:
                    seen.add((gpu_id, process.pid))
                    self._idle.setdefault((gpu_id, process.pid), now)
        for key in set(self._idle) - seen:
            del self._idle[key]

    def idle_holders(self, gpu_ids: Iterable[str]) -> list[str]:
        """Other users' processes that have held memory on these GPUs at 0 % utilisation for
        ``idle_holder_after`` seconds or more, in words (pid, user, memory, how long)."""
        now, found = time.monotonic(), []
        for gpu_id in gpu_ids:
            state = self._states.get(gpu_id)
            for process in state.processes if state is not None else ():
                since = self._idle.get((gpu_id, process.pid))
                if since is not None and now - since >= self._o.idle_holder_after:
                    found.append(
                        f"pid {process.pid} ({process_user(process.pid)}) has held "
                        f"{format_memory(process.used_memory or 0)} on gpu {gpu_id} at 0% utilisation "
                        f"for {_duration(now - since)}"
                    )
        return found

    def _check_leftovers(self, states: Mapping[str, GpuState]) -> None:
        for pid, left in list(self.leftovers.items()):
            state = states.get(left.gpu_id)
            if state is not None and not any(p.pid == pid and (p.used_memory or 0) > 0 for p in state.processes):
                del self.leftovers[pid]
                logger.info("pid %d no longer holds memory on gpu %s (left behind by %s)", pid, left.gpu_id, left.run)

    def learn(self, peak: int) -> None:
        """A run's peak, for estimating the needs of runs that declare none (not after running out of memory)."""
        self._learned.append(peak)

    def free_slot_name(self) -> str:
        """A slot with room (the original logged skips as "<slot> receives/skips task")."""
        for index, slot in enumerate(self.slots):
            if self._running[index] < self._capacity[index]:
                return slot.name
        return self.slots[0].name

    def newly_idle(self) -> list[Slot]:
        """Slots with nothing running that were not reported idle yet."""
        idle = []
        for index, slot in enumerate(self.slots):
            if self._running[index] == 0 and index not in self._idle_reported:
                self._idle_reported.add(index)
                idle.append(slot)
        return idle
