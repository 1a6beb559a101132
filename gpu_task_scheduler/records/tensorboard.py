"""A run's TensorBoard event files as its metric stream, with no change to its code.

The config names a folder per run (``metrics: {tensorboard: '{work_dir}/lightning_logs'}``, read
by ``sweep/metrics_source.py``); the
event files found under it, at any depth, are read with TensorBoard's own loader
(``tensorboard.backend.event_processing.event_file_loader``) as the run writes them, and each
scalar becomes a line of the run's metrics file (``{"step": 12, "val_loss": 0.23}``, the tag as the
metric's name), which early stopping, ``gts status``, the web view and the results read as they
read the lines ``report()`` writes. Both the old form of a scalar (``simple_value``: PyTorch's
``SummaryWriter``, tensorboardX, Lightning) and the new one (a scalar tensor: TensorFlow 2, Keras)
are read.

What keeps it safe and bounded:

* the folder is walked without following links, over at most :data:`MAX_ENTRIES` entries a look;
  an event file is opened with ``open_regular`` (never a link, never blocking on a FIFO) and read
  through that descriptor, so a file swapped for a FIFO cannot hang the reader;
* one look reads at most :data:`MAX_EVENTS` events of a run: a run that writes faster is fed a
  look or two late, instead of holding the scheduler;
* event files last written before the attempt started are an earlier attempt's, left alone;
* an event whose step is below one already fed (a second writer behind the first) is left out,
  since a metrics file's steps never go back.

A run fed this way never waits for a verdict (it does not call ``report()``), so early stopping can
stop it, a look or two after the record reaches the disk, but a pausing method cannot pause it at
an exact step: such a config is refused.
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
from collections.abc import Callable
from typing import Any

from .paths import open_regular

MAX_EVENTS = 20_000  # events of one run read in one look
MAX_ENTRIES = 10_000  # folder entries walked in one look
EVENTS_NAME = "tfevents"  # every TensorBoard writer puts it in its files' names: events.out.tfevents.<time>.<host>...


def scalar(value: Any) -> float | None:
    """A summary value's number, if it is a scalar (old form or new)."""
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if not value.HasField("tensor"):
        return None
    plugin = value.metadata.plugin_data.plugin_name
    if plugin not in ("", "scalars"):
        return None
    from tensorboard.util import tensor_util

    try:
        array = tensor_util.make_ndarray(value.tensor)
    except (ValueError, TypeError):
        return None
    if array.size != 1 or array.dtype.kind not in "fiu":
        return None
    return float(array.reshape(()))


class _File:
    """One event file, read through a descriptor of our own (the loader opens ``/proc/self/fd/N``:
    the same file, whatever the path becomes)."""

    def __init__(self, path: str) -> None:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        self.fd = open_regular(path)
        self.loader = EventFileLoader(f"/proc/self/fd/{self.fd}")

    def close(self) -> None:
        os.close(self.fd)


class EventFeed:
    """One attempt's TensorBoard folder, fed into its metrics file a look at a time."""

    def __init__(
        self, folder: str, wants: Callable[[str], bool], metrics_path: str, *, started: float | None = None
    ) -> None:
        """``wants(tag)``: whether a scalar of that tag is fed (the config's ``tags``)."""
        self.folder, self.wants, self.metrics_path = folder, wants, metrics_path
        # Files last written before this attempt started are an earlier attempt's (a second off: clocks).
        self._since = (time.time() if started is None else started) - 1.0
        self._files: dict[str, _File | None] = {}  # None: left alone (an earlier attempt's, or unreadable)
        self._last_step = float("-inf")
        self.left_out = 0  # events below a step already fed
        self.problem: str | None = None

    def look(self, budget: int = MAX_EVENTS) -> int:
        """Feed what was written since the last look (at most ``budget`` events); the lines written."""
        self._discover()
        found: dict[float, dict[str, float]] = {}
        for file in self._files.values():
            if file is None or budget <= 0:
                continue
            try:
                for event in file.loader.Load():
                    budget -= 1
                    for value in event.summary.value:
                        number = scalar(value)
                        if number is not None and math.isfinite(number) and self.wants(value.tag):
                            found.setdefault(float(event.step), {})[value.tag] = number
                    if budget <= 0:
                        break
            except Exception as error:  # a corrupt record: what came before it is fed
                self._note(f"an event file could not be read further: {error}")
        return self._write(found)

    def close(self) -> None:
        for file in self._files.values():
            if file is not None:
                file.close()
        self._files.clear()

    def _discover(self) -> None:
        entries = 0
        stack = [self.folder]
        while stack and entries < MAX_ENTRIES:
            folder = stack.pop()
            try:
                with os.scandir(folder) as listing:
                    for entry in listing:
                        entries += 1
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif EVENTS_NAME in entry.name and entry.path not in self._files:
                            self._files[entry.path] = self._open(entry)
                        if entries >= MAX_ENTRIES:
                            break
            except OSError:
                continue  # not there yet, or gone

    def _open(self, entry: os.DirEntry[str]) -> _File | None:
        try:
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode) or info.st_mtime < self._since:
                return None
            return _File(entry.path)
        except OSError as error:
            self._note(f"{entry.path} is not read: {error}")
            return None

    def _write(self, found: dict[float, dict[str, float]]) -> int:
        lines = []
        for step in sorted(found):
            if step < self._last_step:
                self.left_out += len(found[step])
                continue
            self._last_step = step
            shown: float | int = int(step) if step.is_integer() else step
            lines.append(json.dumps({"step": shown, **found[step]}) + "\n")
        if lines:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(self.metrics_path, flags, 0o644)
            try:
                os.write(fd, "".join(lines).encode())
            finally:
                os.close(fd)
        return len(lines)

    def _note(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem
