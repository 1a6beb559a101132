"""Host conditions for starting a run: CPU utilisation and free RAM; processes (Linux /proc)."""

from __future__ import annotations

from collections.abc import Callable


def process_stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, parent pid, start time in clock ticks)`` of a process, or None when it is gone.
    (The run's own process has its own reader, ``proctree.py``: it imports no
    more of the package than it must.)"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[-1].split()  # after the name, which may hold anything
        return fields[0].decode(), int(fields[1]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


class HostProbe:
    """CPU utilisation since the previous call, and available memory."""

    def __init__(self, read: Callable[[str], str] = _read) -> None:
        self._read = read
        self._last: tuple[int, int] | None = None

    def _cpu_times(self) -> tuple[int, int]:
        fields = [int(x) for x in self._read("/proc/stat").splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    def cpu_percent(self) -> float | None:
        """Busy share of all cores since the last call (None on the first call)."""
        now = self._cpu_times()
        last, self._last = self._last, now
        if last is None or now[0] == last[0]:
            return None
        return 100.0 * (1 - (now[1] - last[1]) / (now[0] - last[0]))

    def available_memory(self) -> int:
        for line in self._read("/proc/meminfo").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
        raise OSError("MemAvailable missing from /proc/meminfo")
