"""The running runs' TensorBoard folders fed into their metrics files, by a thread of their own.

A run whose config says ``metrics: {tensorboard: ...}`` (``sweep/metrics_source.py``) gets an
``EventFeed`` (``records/tensorboard.py``) when it starts. A thread looks at every fed run each
:data:`INTERVAL` seconds, reading at most a bounded number of events a run, so the loop never
waits on an event file; a record reaches the metrics file (and so early stopping) within about
``INTERVAL`` plus the stopper's look of reaching the disk. When a run ends its feed has one last
look (bounded too) before the stopper's last read, so what it logged last counts.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from ..finite import finite_number
from ..records.ledger.record import RunRecord
from ..records.metrics import latest
from ..records.paths import RunPaths, read_json
from ..records.tensorboard import EventFeed
from ..sweep.expand import RunSpec
from ..sweep.metrics_source import TensorBoardSource

INTERVAL = 0.25  # seconds between looks at the fed runs' event files

logger = logging.getLogger("gpu_task_scheduler")


def _feed(
    source: TensorBoardSource, name: str, values: dict[str, Any], paths: RunPaths, started: float | None
) -> EventFeed | None:
    """The feed of run ``name``'s TensorBoard folder (``values`` fill its template) into its metrics
    file, for its attempt handed over at ``started`` (None: unknown; from now)."""
    from ..sweep.templates import fill

    try:
        folder = fill(source.folder, values)
    except (KeyError, IndexError, AttributeError, ValueError) as error:
        logger.warning("%s: metrics: tensorboard %r cannot be filled in (%s)", name, source.folder, error)
        return None
    folder = os.path.join(os.getcwd(), folder)  # a relative one, as the run sees it: from the launcher's folder
    feed = EventFeed(folder, source.wants, paths.metrics, started=started if finite_number(started) else None)
    # An attempt with metrics already is one a restarted scheduler follows again (a cluster's), or
    # one that ended unwatched: fed up to its last line (read from their start, its files would feed
    # those steps twice).
    fed_before = latest(paths.metrics)
    if fed_before is not None:
        feed.resume_after(fed_before[0])
    return feed


def feed_unwatched_end(source: TensorBoardSource, record: RunRecord) -> None:
    """A run's attempt that ended while no scheduler watched it (one on a cluster, settled at the next
    start: ``records/prior.settle_running``): what it logged since the last look of the scheduler
    that died is fed into its metrics file before its end is recorded, as a watched run's last
    look is. Its values come from its folder's config (written at its start)."""
    if not record.work_dir:
        return
    paths = RunPaths(record.work_dir, None)
    if paths.unsafe(records_only=True) is not None:
        return
    config = read_json(paths.config)
    values = {**(config if isinstance(config, dict) else {}), "work_dir": record.work_dir, "run_name": record.name}
    values["run_index"] = record.run_index
    feed = _feed(source, record.name, values, paths, record.started_at)
    if feed is None:
        return
    Feeds._look(record.name, _Fed(feed))
    feed.close()


class _Fed:
    def __init__(self, feed: EventFeed) -> None:
        self.feed, self.lock = feed, threading.Lock()


class Feeds:
    def __init__(self, source: TensorBoardSource, started_of: Callable[[str], float | None]) -> None:
        """``started_of(name)``: when the run's attempt was handed over, as the ledger records it (an
        attempt a restarted scheduler follows again keeps its first moment: Ledger.mark_running)."""
        self._source, self._started_of = source, started_of
        self._fed: dict[str, _Fed] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, spec: RunSpec, paths: RunPaths) -> None:
        """``spec``'s attempt started: its TensorBoard folder is fed into its metrics file from now on."""
        values = {**spec.config, "work_dir": spec.work_dir, "run_name": spec.name, "run_index": spec.index}
        # Its files are those written since it was handed over: for an attempt a restarted scheduler
        # follows again, that is before this start, and one that ended while no scheduler watched
        # (its end read before any word of its start) is still read whole at finish().
        feed = _feed(self._source, spec.name, values, paths, self._started_of(spec.name))
        if feed is None:
            return
        with self._lock:
            self._fed[spec.name] = _Fed(feed)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="gts-tensorboard", daemon=True)
                self._thread.start()
        self._wake.set()

    def placed(self, name: str, started: float) -> None:
        """``name``'s attempt started on its machine at ``started`` (wall clock): one a restarted
        scheduler follows again started before the feed was made, and its files written since
        then are its own (one not written in the second before the restart was left alone)."""
        with self._lock:
            fed = self._fed.get(name)
        if fed is not None:
            with fed.lock:
                fed.feed.started_at(started)
        self._wake.set()

    def finish(self, name: str) -> None:
        """``name`` ended: one last look at its event files, then it is fed no more."""
        with self._lock:
            fed = self._fed.pop(name, None)
        if fed is None:
            return
        with fed.lock:
            self._look(name, fed)
            fed.feed.close()

    def _run(self) -> None:
        while True:
            self._wake.wait(INTERVAL)
            self._wake.clear()
            with self._lock:
                fed = list(self._fed.items())
                if not fed:
                    self._thread = None
                    return
            for name, one in fed:
                with one.lock:
                    if self._fed.get(name) is one:  # not finished meanwhile
                        self._look(name, one)

    @staticmethod
    def _look(name: str, fed: _Fed) -> None:
        try:
            fed.feed.look()
        except OSError as error:  # its metrics file could not be written: said once
            fed.feed.failed_to_write(error)
        for problem in fed.feed.said():
            logger.warning("%s: metrics: tensorboard: %s", name, problem)
