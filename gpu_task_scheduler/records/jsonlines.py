"""Append-only files of JSON lines under the result root (a search's trials, Optuna's journal),
read as hostile input.

Each line is one record, written whole and fsynced before what it records happens. So:

* a last line without its newline was cut short by a crash (or a full disk) while it was
  written: what it records never happened. It is dropped, and with ``repair`` cut off the file,
  so that the next append starts a line of its own instead of gluing itself to the fragment (and
  turning both into one damaged line);
* any other line that is not a JSON object was damaged, or written by hand: the records are
  refused with :class:`DamagedRecordError`, naming the file and the line, instead of acting on
  what is left (a trial forgotten would break the search's budget, one told twice its sampler);
* a symbolic link, a FIFO or a device in the file's place is refused without blocking
  (:func:`open_regular`), like the ledger.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from ..errors import DamagedRecordError
from .paths import open_regular

_CHUNK = 1 << 20


def _lines(fd: int) -> Iterator[tuple[int, bytes]]:
    """(offset, line) for each line of ``fd``, the last one without its newline if it has none."""
    offset, pending = 0, b""
    while chunk := os.read(fd, _CHUNK):
        pending += chunk
        start = 0
        while (end := pending.find(b"\n", start)) >= 0:
            yield offset, pending[start : end + 1]
            offset += end + 1 - start
            start = end + 1
        pending = pending[start:]
    if pending:
        yield offset, pending


def read_records(path: str, *, repair: bool = False, what: str = "records") -> list[dict[str, Any]]:
    """Every whole record of ``path`` (none when it is missing); see the module's notes.
    ``what``: the file's role, for messages (``"the search's trials"``)."""
    try:
        fd = open_regular(path, os.O_RDWR if repair else os.O_RDONLY)
    except FileNotFoundError:
        return []
    records: list[dict[str, Any]] = []
    try:
        for number, (offset, line) in enumerate(_lines(fd), start=1):
            if not line.endswith(b"\n"):  # the last line, cut short
                if repair:
                    os.ftruncate(fd, offset)
                    os.fsync(fd)
                break
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # not JSON, or not UTF-8
                record = None
            if not isinstance(record, dict):
                raise DamagedRecordError(
                    f"{path}, which holds {what}, is damaged at line {number} ({line[:60]!r}): restore it from a "
                    "backup, or use another result root; nothing was run"
                )
            records.append(record)
    finally:
        os.close(fd)
    return records
