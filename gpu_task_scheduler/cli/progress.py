"""The live view of a running sweep: a status line on a terminal, nothing extra otherwise.

On a terminal, one line at the bottom shows the counts (done, failed,
interrupted, stopped early, running, pending, skipped), elapsed time, an ETA from the mean
duration of the runs so far, and which run is on which slot. It is redrawn
at every start and end of a run and at least once a second in between, cut
to the terminal's width (a line that wraps cannot be redrawn in place), and
ends with a newline when the sweep ends. Log lines print above it.

Off a terminal (CI, ``nohup``, a pipe) or with ``TERM=dumb`` there is no
status line: the scheduler's ordinary log lines are the whole story
(:func:`wanted` decides).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
from typing import TextIO

from ..engine.hooks import Hooks
from ..engine.summary import RunOutcome, SweepSummary
from ..gpu.devices import Slot
from ..records.status import RunStatus
from ..reports.status import clock_text
from ..sweep.expand import RunSpec

_CLEAR = "\r\033[K"


def wanted(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal that can redraw a line."""
    try:
        return stream.isatty() and os.environ.get("TERM", "") not in ("dumb", "unknown")
    except (AttributeError, ValueError):  # closed, or not a file
        return False


class LiveStatus(Hooks):
    def __init__(
        self, total: int, stream: TextIO | None = None, *, tick: float = 1.0, width: int | None = None
    ) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self.running: dict[str, str] = {}  # run name -> slot name, in start order
        self.done = self.failed = self.interrupted = self.pruned = self.skipped = 0
        self.paused: set[str] = set()  # paused by a pausing early_stop method: its method may resume them
        self._skipped: set[str] = set()  # a skipped run may start after all (a paused one its method resumes)
        self.durations: list[float] = []
        self.parallel = 1  # the most runs seen running at once: the sweep's parallelism, for the ETA
        self._tick = tick
        self._width = width
        self._lock = threading.RLock()  # the ticker and the log handler both write the line
        self._closed = False
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # --- the line ---------------------------------------------------------------------

    def line(self) -> str:
        finished = self.done + self.failed + self.interrupted + self.pruned + self.skipped + len(self.paused)
        pending = max(0, self.total - finished - len(self.running))
        elapsed = time.monotonic() - self.started
        eta = "?"
        if self.durations and pending + len(self.running):
            mean = sum(self.durations) / len(self.durations)
            eta = clock_text(mean * (pending + len(self.running)) / self.parallel)
        per_slot: dict[str, list[str]] = {}
        for name, slot in self.running.items():
            per_slot.setdefault(slot, []).append(name)
        where = " | ".join(f"{slot}: {' '.join(names)}" for slot, names in sorted(per_slot.items()))
        counts = f"{self.done} done, {self.failed} failed, "
        if self.interrupted:
            counts += f"{self.interrupted} interrupted, "
        if self.pruned:
            counts += f"{self.pruned} stopped early, "
        if self.paused:
            counts += f"{len(self.paused)} paused, "
        counts += f"{len(self.running)} running, {pending} pending, {self.skipped} skipped"
        return f"[gts] {counts} | {clock_text(elapsed)} elapsed, ETA {eta}" + (f" | {where}" if where else "")

    def _columns(self) -> int:
        """The line's room: ``COLUMNS`` when set, else the terminal's width; 80 where a terminal
        reports 0 columns (some CI consoles, a serial line), which would cut the line to nothing."""
        if self._width is not None:
            return self._width
        columns = os.environ.get("COLUMNS", "")
        if columns.isascii() and columns.isdigit() and int(columns) > 0:
            return int(columns)
        try:
            width = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, ValueError, OSError):
            width = shutil.get_terminal_size(fallback=(80, 24)).columns
        return width if width > 0 else 80

    def _fitted(self) -> str:
        text, room = self.line(), max(10, self._columns() - 1)  # the last column would wrap on some terminals
        return text if len(text) <= room else text[: room - 1] + "…"

    def _draw(self) -> None:
        with self._lock:
            if self._closed:
                return
            self.stream.write(_CLEAR + self._fitted())
            self.stream.flush()

    def _ticking(self) -> None:
        while not self._stop.wait(self._tick):
            self._draw()

    def _start_ticking(self) -> None:
        if self._ticker is None and not self._closed:
            self._ticker = threading.Thread(target=self._ticking, name="gts-status", daemon=True)
            self._ticker.start()

    def close(self) -> None:
        """End the line with a newline and stop redrawing (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self.stream.write(_CLEAR + self._fitted() + "\n")
            self.stream.flush()
            self._closed = True
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join()

    # --- the sweep's events -------------------------------------------------------------

    def on_run_start(self, spec: RunSpec, slot: Slot) -> None:
        self.running[spec.name] = slot.name
        self.paused.discard(spec.name)  # resumed
        if spec.name in self._skipped:  # skipped as paused, then resumed
            self._skipped.discard(spec.name)
            self.skipped -= 1
        self.parallel = max(self.parallel, len(self.running))
        self._start_ticking()
        self._draw()

    def on_run_end(self, outcome: RunOutcome) -> None:
        self.running.pop(outcome.name, None)
        if outcome.status is RunStatus.SUCCEEDED:
            self.done += 1
        elif outcome.status is RunStatus.INTERRUPTED:
            self.interrupted += 1
        elif outcome.status is RunStatus.PRUNED:
            self.pruned += 1
        elif outcome.status is RunStatus.PAUSED:
            self.paused.add(outcome.name)
        else:
            self.failed += 1
        if outcome.duration is not None and outcome.status not in (
            RunStatus.INTERRUPTED,
            RunStatus.PRUNED,
            RunStatus.PAUSED,
        ):
            self.durations.append(outcome.duration)
        self._draw()

    def on_skip(self, spec: RunSpec) -> None:
        self.skipped += 1
        self._skipped.add(spec.name)
        self._draw()

    def on_sweep_end(self, summary: SweepSummary) -> None:
        self.close()

    def log_handler(self) -> logging.Handler:
        """A console handler that prints log lines above the status line."""
        return _AboveStatus(self)


class _AboveStatus(logging.StreamHandler):
    def __init__(self, status: LiveStatus) -> None:
        super().__init__(status.stream)
        self._status = status

    def emit(self, record: logging.LogRecord) -> None:
        with self._status._lock:
            if not self._status._closed:
                self.stream.write(_CLEAR)
            super().emit(record)
            self._status._draw()


def live_status(total: int, choice: bool | None) -> LiveStatus | None:
    """The status line for a sweep of ``total`` runs, if ``choice`` is True, or None (the
    default) and stderr is a terminal where the application has not set up logging of its
    own (our redrawn line would mix with its lines)."""
    if choice is None:
        logger = logging.getLogger("gpu_task_scheduler")
        choice = wanted(sys.stderr) and not logging.getLogger().handlers and logger.level == logging.NOTSET
    return LiveStatus(total) if choice else None
