"""A run's TensorBoard event files as its metric stream, with no change to its code.

The config names a folder per run (``metrics: {tensorboard: '{work_dir}/lightning_logs'}``, read
by ``sweep/metrics_source.py``); the event files found under it, at any depth, are read as the run
writes them, and each scalar becomes a line of the run's metrics file (``{"step": 12, "val_loss":
0.23}``, the tag as the metric's name), which early stopping, ``gts status``, the web view and the
results read as they read the lines ``report()`` writes. Both the old form of a scalar
(``simple_value``: PyTorch's ``SummaryWriter``, tensorboardX, Lightning) and the new one (a scalar
tensor: TensorFlow 2, Keras) are read.

An event file is a sequence of TFRecords (a length, its CRC-32C, the ``Event`` protocol buffer,
its CRC-32C), each parsed with TensorBoard's own ``Event`` message. They are read here, not
through TensorBoard's ``EventFileLoader``, because that loader can only read a file from its start
through a descriptor it keeps open: a run that wrote 1,500 event files held 1,500 descriptors in
the scheduler, and under the usual limit of 1,024 the scalars of it and of other runs were lost.
Here a file is opened for one look and closed after it, and the next look goes on at the offset
of the first record not read, so a run holds no descriptor between looks, however many files it
writes.

What keeps it safe and bounded:

* the folder is walked without following links (a linked folder inside it is not fed), over at
  most :data:`MAX_ENTRIES` entries a look; an event file is opened with ``open_regular`` (never a
  link, never blocking on a FIFO), and a file replaced by another is read from its start;
* one look reads at most :data:`MAX_EVENTS` events and :data:`MAX_READ` bytes of a file: a run that
  writes faster is fed a look or two late, instead of holding the scheduler; a record of over
  :data:`MAX_RECORD` bytes (an image, a histogram: never a scalar) is passed over unread;
* a record whose checksum fails ends what is read of that file (said once): what came before it
  is fed;
* event files last written before the attempt started are an earlier attempt's, left alone;
* the event's step is the step: an event whose step is none (below 0 or above 2**53:
  ``finite.step_problem``) is left out, and a scalar tagged ``step`` (the name a metrics line keeps
  for its step) is fed as ``step_tag``; each said once;
* an event whose step is below one already fed (a second writer behind the first) is left out,
  since a metrics file's steps never go back.

A run fed this way never waits for a verdict (it does not call ``report()``), so early stopping can
stop it, a look or two after the record reaches the disk, but a pausing method cannot pause it at
an exact step: such a config is refused.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..finite import step_problem
from ..reporting import TIME_KEY
from .metrics import plausible_time
from .paths import open_regular, write_all

MAX_EVENTS = 20_000  # events of one run read in one look
MAX_ENTRIES = 10_000  # folder entries walked in one look
MAX_READ = 4 << 20  # bytes of one file read in one look
MAX_RECORD = 1 << 20  # a record larger than this is passed over unread (a scalar event takes ~100 bytes)
EVENTS_NAME = "tfevents"  # every TensorBoard writer puts it in its files' names: events.out.tfevents.<time>.<host>...
# A tag named as a metrics line's own key (its step, its time) is fed under another name.
RESERVED = {"step": "step_tag", TIME_KEY: "time_tag"}


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # the Castagnoli polynomial, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C, rotated and offset ("masked").

    >>> hex(masked_crc32c(b"123456789"))  # its CRC-32C is 0xe3069283, the check value
    '0xc78ab0e5'
    """
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class DataLoss(ValueError):
    """A record of an event file failed its checksum, or is not an ``Event``."""


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
    """One event file: where the next look goes on (the offset of its first record not read), and
    which file it is (a file replaced by another is read from its start). No descriptor is kept."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.identity: tuple[int, int] | None = None
        self.broken = False  # a record failed its checksum: nothing more of it is read

    def records(self, budget: int) -> Iterator[bytes]:
        """The whole records written since the last look (at most ``budget``, and what
        :data:`MAX_READ` bytes hold), each an ``Event``'s bytes, checked. OSError: it cannot be
        opened now (tried again at the next look); DataLoss: it is broken from here."""
        if self.broken:
            return
        fd = open_regular(self.path)
        try:
            info = os.fstat(fd)
            if self.identity != (info.st_dev, info.st_ino) or info.st_size < self.offset:
                self.identity, self.offset = (info.st_dev, info.st_ino), 0  # another file, or rewritten
            os.lseek(fd, self.offset, os.SEEK_SET)
            data = _read(fd, min(MAX_READ, info.st_size - self.offset))
        finally:
            os.close(fd)
        at = 0
        while budget > 0 and len(data) - at >= 12:
            header = data[at : at + 8]
            if struct.unpack("<I", data[at + 8 : at + 12])[0] != masked_crc32c(header):
                self.broken = True
                raise DataLoss(f"{self.path}: a record's length fails its checksum at byte {self.offset}")
            (length,) = struct.unpack("<Q", header)
            end = at + 12 + length + 4
            if length > MAX_RECORD:  # passed over unchecked, once it is all written
                if end <= len(data):
                    self.offset, at = self.offset + end - at, end
                    continue
                if self.offset + (end - at) <= info.st_size:
                    self.offset += end - at  # the next look reads on after it
                return
            if end > len(data):
                return  # not all written yet: read at the next look
            body = data[at + 12 : at + 12 + length]
            if struct.unpack("<I", data[end - 4 : end])[0] != masked_crc32c(body):
                self.broken = True
                raise DataLoss(f"{self.path}: a record fails its checksum at byte {self.offset}")
            at = end
            self.offset += 12 + length + 4
            budget -= 1
            yield body


def _read(fd: int, count: int) -> bytes:
    """``count`` bytes from ``fd`` (fewer at its end)."""
    parts, left = [], count
    while left > 0:
        part = os.read(fd, left)
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


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
        self.bad_steps = 0  # events whose step is none (below 0 or above 2**53)
        self.renamed: set[str] = set()  # tags fed under another name (RESERVED)
        self._unwritten: list[str] = []  # lines a failed write left: written first at the next look
        self.news: list[str] = []  # problems not said yet (said())
        self._said: set[str] = set()

    def look(self, budget: int = MAX_EVENTS) -> int:
        """Feed what was written since the last look (at most ``budget`` events); the lines written.

        A look that runs out of descriptors (or memory) is undone: its files are read again at the
        next look from where they were, since feeding the others' later steps now would leave the
        unread ones' earlier steps behind for good (a metrics file's steps never go back)."""
        from tensorboard.compat.proto.event_pb2 import Event

        self._discover()
        found: dict[float, dict[str, float]] = {}
        read: list[tuple[_File, int, tuple[int, int] | None]] = []  # each file read, and where it was
        for file in self._files.values():
            if file is None or file.broken or budget <= 0:
                continue
            read.append((file, file.offset, file.identity))
            try:
                for record in file.records(budget):
                    budget -= 1
                    try:
                        event = Event.FromString(record)
                    except Exception as error:  # protobuf's DecodeError: checked bytes of no Event
                        file.broken = True
                        raise DataLoss(f"{file.path}: a record is no event ({error})") from None
                    self._take(event, found)
            except DataLoss as error:  # what came before it is fed
                self._note(f"an event file could not be read further: {error}", "broken")
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                    for was, offset, identity in read:
                        was.offset, was.identity = offset, identity
                    self._note(f"no descriptor left to read {file.path} ({error}): its look is made again later", "fds")
                    return 0
                if not isinstance(error, FileNotFoundError):  # gone: nothing more to read of it
                    self._note(f"{file.path} is not read ({error})", "unread")
        return self._write(found)

    def _take(self, event: Any, found: dict[float, dict[str, float]]) -> None:
        """The scalars of ``event`` that are fed, into ``found`` (by step)."""
        if not event.summary.value:
            return
        problem = step_problem(event.step)
        if problem is not None:
            self.bad_steps += 1
            self._note(
                f"an event at step {event.step} is left out: {problem} (a step is a number from 0 to 2**53)", "step"
            )
            return
        for value in event.summary.value:
            number = scalar(value)
            if number is None or not math.isfinite(number) or not self.wants(value.tag):
                continue
            tag = RESERVED.get(value.tag, value.tag)
            if tag != value.tag and value.tag not in self.renamed:
                self.renamed.add(value.tag)
                self._note(
                    f"the scalar tagged {value.tag!r} is fed as {tag!r} (a metrics line's {value.tag!r} is its step)"
                )
            entry = found.setdefault(float(event.step), {})
            entry[tag] = number
            if plausible_time(event.wall_time):  # the step's time: the latest of its scalars' events
                entry[TIME_KEY] = max(entry.get(TIME_KEY, 0.0), event.wall_time)

    def started_at(self, started: float) -> None:
        """The attempt started at ``started``, earlier than this feed was made (a cluster's attempt
        followed again): files left alone as an earlier attempt's are looked at again by that."""
        since = started - 1.0
        if since < self._since:
            self._since = since
            self._files = {path: file for path, file in self._files.items() if file is not None}

    def resume_after(self, step: float) -> None:
        """The attempt was fed up to ``step`` already (a cluster's attempt a restarted scheduler
        follows again: its metrics file goes on): events up to it are not fed again. Its files
        are read from their start, so that a step written as the scheduler died is not lost; a
        tag logged at ``step`` after that feed is left out with it."""
        self._last_step = max(self._last_step, math.nextafter(step, math.inf))

    def close(self) -> None:
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
                            self._files[entry.path] = self._known(entry)
                        if entries >= MAX_ENTRIES:
                            break
            except OSError:
                continue  # not there yet, or gone

    def _known(self, entry: os.DirEntry[str]) -> _File | None:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError as error:
            self._note(f"{entry.path} is not read: {error}", "stat")
            return None
        if not stat.S_ISREG(info.st_mode) or info.st_mtime < self._since:
            return None
        return _File(entry.path)

    def _write(self, found: dict[float, dict[str, float]]) -> int:
        lines = self._unwritten
        for step in sorted(found):
            if step < self._last_step:
                self.left_out += len(found[step]) - (TIME_KEY in found[step])
                continue
            self._last_step = step
            shown: float | int = int(step) if step.is_integer() else step
            lines.append(json.dumps({"step": shown, **found[step]}) + "\n")
        self._unwritten = []
        if lines:
            try:
                fd = os.open(
                    self.metrics_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
                )
                try:
                    write_all(fd, "".join(lines).encode())
                finally:
                    os.close(fd)
            except OSError:
                self._unwritten = lines  # written at the next look: what was read is not read again
                raise
        return len(lines)

    def failed_to_write(self, error: OSError) -> None:
        self._note(f"its metrics file could not be written ({error}): tried again at the next look", "write")

    def _note(self, problem: str, kind: str | None = None) -> None:
        """Say ``problem`` once per ``kind`` of problem (by default, its words) of this feed."""
        kind = problem if kind is None else kind
        if kind not in self._said:
            self._said.add(kind)
            self.news.append(problem)

    def said(self) -> list[str]:
        """The problems found since the last call, each kind once per feed."""
        news, self.news = self.news, []
        return news
