"""What each run costs: its share of the GPUs' busy time (GPU-seconds) and of their energy.

A GPU is busy while one of our runs holds it. Its busy time is split between
the runs that hold it at each moment: by the memory NVML last saw each of them
use there (runs packed on one GPU share its time as they share its memory), or
equally while nothing was measured (no NVML, or nothing allocated yet). A slot
of two GPUs costs two GPU-seconds a second. So the runs' GPU-seconds add up to
the GPUs' busy time, however runs were packed.

Energy comes from NVML's energy counter (``nvmlDeviceGetTotalEnergyConsumption``:
millijoules since the driver loaded, Volta and later): what a GPU drew between
two looks is split as its time is. It counts what the whole GPU drew, other
users' processes included; a GPU without the counter gives no energy (None),
never a guess.

The split is piecewise constant: the shares measured at one look hold until the
next (every ``gpu_poll_interval`` while runs hold GPUs), and a look is taken as
each run starts and ends, so the split changes exactly when the set of runs
does. :class:`GpuClock` is pure arithmetic over the looks it is given; the
Capacity feeds it (``capacity.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple


class Usage(NamedTuple):
    """What one run's attempt cost: GPU-seconds, and joules (None where no GPU of it counts energy)."""

    gpu_seconds: float
    joules: float | None = None


class _Held:
    __slots__ = ("gpu_ids", "count", "weights", "seconds", "joules", "saved_seconds", "saved_joules")

    def __init__(self, gpu_ids: tuple[str, ...], count: float) -> None:
        self.gpu_ids, self.count = gpu_ids, count
        self.weights: dict[str, int] = {}  # gpu id -> bytes last measured there
        self.seconds = 0.0
        self.joules: float | None = None
        self.saved_seconds = 0.0
        self.saved_joules = 0.0


class GpuClock:
    """Each running run's GPU-seconds and joules so far, accrued between looks.

    ``begin`` a run on its GPUs (or, on a cluster, with a count of GPUs no look
    here can see: it costs that many GPU-seconds a second), ``look`` now and then
    with what NVML measured, ``end`` it for its total. ``spent`` is every
    GPU-second accrued here so far, the current interval included.

    >>> now = [0.0]
    >>> clock = GpuClock(lambda: now[0])
    >>> clock.begin(1, ("0",)); clock.begin(2, ("0",))
    >>> now[0] = 10.0
    >>> clock.look({1: {"0": 3}, 2: {"0": 1}})  # equal shares until memory was measured
    >>> now[0] = 20.0
    >>> clock.end(1)  # 5 s of the first 10, 3/4 of the next 10
    Usage(gpu_seconds=12.5, joules=None)
    >>> now[0] = 30.0
    >>> clock.end(2)  # 5 + 2.5, then alone for 10
    Usage(gpu_seconds=17.5, joules=None)
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._held: dict[int, _Held] = {}
        self._at = clock()
        self._energy: dict[str, int] = {}  # gpu id -> its counter (mJ) at the last look
        self.total = 0.0  # GPU-seconds accrued up to the last look, by every run this clock saw

    def __len__(self) -> int:
        return len(self._held)

    def begin(
        self, key: int, gpu_ids: Iterable[str], energy: Mapping[str, int | None] | None = None, *, count: float = 0.0
    ) -> None:
        self._accrue(energy)
        ids = tuple(gpu_ids)
        if ids or count > 0:
            self._held[key] = _Held(ids, 0.0 if ids else count)

    def look(
        self, used: Mapping[int, Mapping[str, int]] | None = None, energy: Mapping[str, int | None] | None = None
    ) -> None:
        """Accrue up to now with the shares measured last; then take ``used`` (run -> gpu id -> bytes
        measured now) as the shares from here on."""
        self._accrue(energy)
        if used is not None:
            for key, held in self._held.items():
                held.weights = {gpu: int(used.get(key, {}).get(gpu, 0) or 0) for gpu in held.gpu_ids}

    def end(self, key: int, energy: Mapping[str, int | None] | None = None) -> Usage:
        """The run ended: its GPU-seconds and joules, all of them (saved or not)."""
        self._accrue(energy)
        held = self._held.pop(key, None)
        if held is None:
            return Usage(0.0)
        return Usage(held.seconds, held.joules)

    def unsaved(self) -> dict[int, Usage]:
        """What each running run accrued since the last call (for the ledger: what a kill -9 would lose)."""
        self._accrue(None)
        deltas = {}
        for key, held in self._held.items():
            seconds = held.seconds - held.saved_seconds
            joules = None if held.joules is None else held.joules - held.saved_joules
            if seconds > 0 or joules:
                deltas[key] = Usage(seconds, joules)
            held.saved_seconds, held.saved_joules = held.seconds, held.joules or 0.0
        return deltas

    def saved(self, key: int) -> Usage:
        """What ``unsaved`` already handed out for a run (its end's total less this is what is left to save)."""
        held = self._held.get(key)
        return Usage(0.0) if held is None else Usage(held.saved_seconds, held.saved_joules)

    def spent(self) -> float:
        """Every GPU-second accrued so far, up to this moment."""
        dt = max(0.0, self._clock() - self._at)
        return self.total + dt * sum(len(held.gpu_ids) or held.count for held in self._held.values())

    def gpus(self) -> list[str]:
        """The GPUs our runs hold (whose energy counters a look reads)."""
        return sorted({gpu for held in self._held.values() for gpu in held.gpu_ids})

    def _accrue(self, energy: Mapping[str, int | None] | None) -> None:
        now = self._clock()
        dt = max(0.0, now - self._at)
        self._at = now
        drawn: dict[str, float] = {}
        for gpu, counter in (energy or {}).items():
            last = self._energy.get(gpu)
            if counter is None:
                self._energy.pop(gpu, None)
                continue
            self._energy[gpu] = counter
            if last is not None and counter >= last:  # a driver reload resets the counter: that interval is lost
                drawn[gpu] = (counter - last) / 1000.0
        sharing: dict[str, list[_Held]] = {}
        for held in self._held.values():
            if not held.gpu_ids:
                held.seconds += dt * held.count
                self.total += dt * held.count
            for gpu in held.gpu_ids:
                sharing.setdefault(gpu, []).append(held)
        for gpu, holders in sharing.items():
            weights = [held.weights.get(gpu, 0) for held in holders]
            whole = sum(weights)
            shares = [w / whole for w in weights] if whole > 0 else [1.0 / len(holders)] * len(holders)
            joules = drawn.get(gpu)
            for held, share in zip(holders, shares, strict=True):
                held.seconds += dt * share
                if joules is not None:
                    held.joules = (held.joules or 0.0) + joules * share
            self.total += dt
