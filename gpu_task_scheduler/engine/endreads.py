"""What a run reported, read in full when it ends: off the loop's thread when that is long.

The ledger keeps a summary of every metric a run reported (its last value and step, its lowest and
highest), which needs the whole metrics file. A run that wrote a million lines at once made that
read hold the loop for 6-20 s: the other runs' ends waited (and their durations were recorded as
that much longer), and free slots stayed idle. So a file over ``INLINE_BYTES`` is read by a thread
of its own while the loop goes on; the run's end is recorded once it is read (its exit is posted
to the loop again), its duration up to when its exit was first heard of. Until then the run keeps
its slot, and the ledger records it running: a scheduler killed meanwhile leaves it to the next
start, which settles it as any run a killed scheduler left.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from ..records.metrics import MetricsReader, read_all
from ..records.paths import RunPaths

INLINE_BYTES = 256 << 10  # read on the loop's thread up to this size (some 5,000 lines: ~30 ms)


class EndReads:
    def __init__(self, repost: Callable[[int], None], clock: Callable[[], float] = time.monotonic) -> None:
        """``repost(key)``: post attempt ``key``'s exit to the loop again (from the reading thread)."""
        self._repost, self._clock = repost, clock
        self._noticed: dict[int, float] = {}
        self._read: dict[int, MetricsReader | None] = {}

    def ready(self, key: int, paths: RunPaths) -> bool:
        """Whether attempt ``key``'s end can be recorded now. False: its metrics file is long, and a
        thread reads it (unless the run's records are not safe to read), then reposts the exit."""
        if key in self._read:
            return True
        if key in self._noticed:
            return False  # being read
        self._noticed[key] = self._clock()
        try:
            large = os.lstat(paths.metrics).st_size > INLINE_BYTES
        except OSError:
            large = False
        if not large:
            self._read[key] = None  # read with the rest of its end, on the loop
            return True

        def read() -> None:
            reader = None
            try:
                reader = read_all(paths.metrics) if paths.problems()[0] is None else None
            finally:  # whatever happened, the end is recorded
                self._read[key] = reader
                self._repost(key)

        threading.Thread(target=read, name=f"gts-metrics-{key}", daemon=True).start()
        return False

    def take(self, key: int) -> tuple[MetricsReader | None, float]:
        """Attempt ``key``'s metrics if they were read here (None: read them with its end), and when
        its exit was first heard of."""
        return self._read.pop(key, None), self._noticed.pop(key)
