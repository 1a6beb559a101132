"""The live view of a running sweep: a status line on a terminal, nothing extra otherwise.

On a terminal, one line at the bottom is redrawn at every start and end of a
run: counts, what runs on each slot, elapsed time and an ETA from the mean
duration of the runs so far. Off a terminal (CI, ``nohup``, a pipe) the
scheduler's ordinary log lines are the whole story.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Dict, List, Optional, TextIO

from .devices import Slot
from .ledger import RunStatus
from .scheduler import Hooks
from .summary import RunOutcome, SweepSummary
from .sweep import RunSpec


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class LiveStatus(Hooks):
    def __init__(self, total: int, stream: Optional[TextIO] = None) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self.running: Dict[str, str] = {}  # run name -> slot name
        self.done = self.failed = self.skipped = 0
        self.durations: List[float] = []
        self.parallel = 1  # the most runs seen running at once: the sweep's parallelism, for the ETA

    def line(self) -> str:
        finished = self.done + self.failed + self.skipped
        pending = max(0, self.total - finished - len(self.running))
        elapsed = time.monotonic() - self.started
        eta = "?"
        if self.durations and pending + len(self.running):
            mean = sum(self.durations) / len(self.durations)
            eta = _clock(mean * (pending + len(self.running)) / self.parallel)
        per_slot: Dict[str, int] = {}
        for slot in self.running.values():
            per_slot[slot] = per_slot.get(slot, 0) + 1
        on = " ".join(f"{slot}:{count}" for slot, count in sorted(per_slot.items())) or "-"
        return (f"[gts] {self.done} done, {self.failed} failed, {len(self.running)} running, {pending} pending, "
                f"{self.skipped} skipped | {on} | {_clock(elapsed)} elapsed, ETA {eta}")

    def _draw(self) -> None:
        self.stream.write("\r\033[K" + self.line())
        self.stream.flush()

    def on_run_start(self, spec: RunSpec, slot: Slot) -> None:
        self.running[spec.name] = slot.name
        self.parallel = max(self.parallel, len(self.running))
        self._draw()

    def on_run_end(self, outcome: RunOutcome) -> None:
        self.running.pop(outcome.name, None)
        if outcome.status is RunStatus.SUCCEEDED:
            self.done += 1
        else:
            self.failed += 1
        if outcome.duration is not None:
            self.durations.append(outcome.duration)
        self._draw()

    def on_skip(self, spec: RunSpec) -> None:
        self.skipped += 1
        self._draw()

    def on_sweep_end(self, summary: SweepSummary) -> None:
        self.stream.write("\r\033[K" + self.line() + "\n")
        self.stream.flush()

    def log_handler(self) -> logging.Handler:
        """A console handler that prints log lines above the status line."""
        return _AboveStatus(self)


class _AboveStatus(logging.StreamHandler):
    def __init__(self, status: LiveStatus) -> None:
        super().__init__(status.stream)
        self._status = status

    def emit(self, record: logging.LogRecord) -> None:
        self.stream.write("\r\033[K")
        super().emit(record)
        self._status._draw()
