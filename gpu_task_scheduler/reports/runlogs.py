"""``gts logs``: a run's log by name, prefix or index; following it live; the failed runs' tails.

Read-only, through the ledger and the run folders. A log is opened as every
file under a result root is: never through a symbolic link, and only when it
is a regular file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import BinaryIO

from ..errors import ConfigError, GTSError
from ..records.ledger.lock import scheduler_state
from ..records.ledger.record import RunRecord
from ..records.logtext import last_lines, shown
from ..records.paths import RunPaths, UnsafePathError, open_regular
from ..records.status import RunStatus
from ..results import open_ledger

FOLLOW_POLL = 0.1  # seconds between looks at a followed log


def find_run(records: list[RunRecord], wanted: str) -> RunRecord:
    """The run named ``wanted``: a folder name, a unique prefix of one, or a run index."""
    exact = [r for r in records if r.name == wanted]
    if exact:
        return exact[0]
    if wanted.isascii() and wanted.isdigit():
        by_index = [r for r in records if r.run_index == int(wanted)]
        if by_index:
            return by_index[0]
    matches = [r for r in records if r.name.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        shown = ", ".join(r.name for r in matches[:8]) + (", ..." if len(matches) > 8 else "")
        raise ConfigError(f"{wanted!r} names {len(matches)} runs: {shown}; give more of the name")
    some = ", ".join(r.name for r in records[:8]) + (", ..." if len(records) > 8 else "")
    raise ConfigError(f"no run is named {wanted!r} or starts so; runs: {some or 'none recorded'}")


def not_started(root: str, wanted: str, recorded_sweep: str | None) -> str | None:
    """The name of a run of the root's recorded sweep that ``wanted`` names and that has no record
    yet (it has not started), or None."""
    import json

    from ..sweep.expand import Sweep

    try:
        config = json.loads(recorded_sweep or "")
        config["scheduler_config"]["result_root_folder"] = root
        names = (spec.name for spec in Sweep(config).runs())
        return next((name for name in names if name == wanted or name.startswith(wanted)), None)
    except Exception:  # no record, or one this version cannot read: nothing more to say
        return None


def _log_paths(root: str, wanted: str | None = None) -> tuple[list[RunRecord], str]:
    ledger = open_ledger(root)
    try:
        records = ledger.records()
        log_file = ledger.get_meta("log_file") or ""
        recorded_sweep = ledger.get_meta("sweep_config")
    finally:
        ledger.close()
    if wanted is not None and not any(r.name == wanted or r.name.startswith(wanted) for r in records):
        pending = not_started(root, wanted, recorded_sweep)
        if pending is not None:
            raise GTSError(f"{pending} has not started yet (it is pending): it has no log yet")
    if not log_file:
        raise GTSError(f"the runs of {root} keep no log (log_file is null in its scheduler_config)")
    return records, log_file


def _log_of(root: str, record: RunRecord, log_file: str) -> str:
    """The run's log file; a name or log_file in the ledger that would leave the root is an error."""
    try:
        path = RunPaths.recorded(root, record.name, log_file).log
    except UnsafePathError as error:
        raise GTSError(f"{root}: {error.strerror}") from None
    assert path is not None
    return path


def _tail(handle: BinaryIO, lines: int | None) -> bytes:
    """The log's last ``lines`` lines (None: all of it), as a terminal shows them (records/logtext.py)."""
    if lines is None:
        return shown(handle.read())
    handle.seek(0, os.SEEK_END)
    size, block, data = handle.tell(), 1 << 16, b""
    position = size
    while position > 0 and data.count(b"\n") <= lines:
        position = max(0, position - block)
        handle.seek(position)
        data = handle.read(size - position)
    handle.seek(size)
    return last_lines(data, lines)


def _open(path: str) -> BinaryIO | None:
    try:
        return os.fdopen(open_regular(path), "rb")
    except FileNotFoundError:
        return None
    except OSError as error:
        raise GTSError(f"cannot read {path}: {error}") from None


def show_log(
    root: str,
    run: str,
    write: Callable[[bytes], None],
    *,
    lines: int | None = None,
    follow: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> RunRecord:
    """Write the run's log (its last ``lines``); ``follow``: then what it adds, until the run ends."""
    records, log_file = _log_paths(root, run)
    record = find_run(records, run)
    path = _log_of(root, record, log_file)
    handle = _open(path)
    if handle is None and not follow:
        raise GTSError(f"{record.name} has no log yet ({path})")
    ledger = None
    try:
        if handle is not None:
            write(_tail(handle, lines))
        if not follow:
            return record
        ledger = open_ledger(root)  # once: a follow looks at the run's state ten times a second
        identity = None if handle is None else os.fstat(handle.fileno()).st_ino
        while True:
            if handle is not None:
                chunk = handle.read()
                if chunk:
                    write(chunk)
                    continue
            current = ledger.get(record.name)
            if current is None or not _active(root, current):
                if handle is not None:  # what it wrote between our last read and its end
                    write(handle.read())
                return current or record
            try:
                inode = os.lstat(path).st_ino
            except OSError:
                inode = None
            if inode is not None and inode != identity:  # a new attempt started a new log
                if handle is not None:
                    handle.close()
                handle, identity = _open(path), inode
                continue
            sleep(FOLLOW_POLL)
    finally:
        if handle is not None:
            handle.close()
        if ledger is not None:
            ledger.close()


def _active(root: str, record: RunRecord) -> bool:
    """The run may still write to its log: it is recorded running and a scheduler holds the root."""
    return record.status is RunStatus.RUNNING and scheduler_state(root)[0] is not False


def failed_tails(root: str, write: Callable[[bytes], None], *, lines: int = 20) -> int:
    """The last ``lines`` of every failed (or timed-out) run's log, each under a header; how many."""
    ledger = open_ledger(root)
    try:
        log_file = ledger.get_meta("log_file") or ""
        if not log_file:
            raise GTSError(f"the runs of {root} keep no log (log_file is null in its scheduler_config)")
        # Only the failed runs are read from the ledger (a root of 300,000 runs has a few thousand).
        failed = list(ledger.iter_records("status IN ('failed', 'timed_out')"))
    finally:
        ledger.close()
    for record in failed:
        cause = f" ({record.cause})" if record.cause else ""
        write(f"==> {record.name}: {record.status.value}{cause} <==\n".encode("utf-8", "replace"))
        try:
            handle = _open(_log_of(root, record, log_file))
        except GTSError as error:  # one hostile row hides no other run's log
            write(f"(not read: {error})\n".encode("utf-8", "replace"))
            continue
        if handle is None:
            write(b"(no log)\n")
            continue
        with handle:
            text = _tail(handle, lines)
        write(text if text.endswith(b"\n") or not text else text + b"\n")
    return len(failed)
