"""The layout of a result root and of a run folder, owned in one place.

::

    <result_root>/
        .gts/ledger.sqlite3      the record of every run (see records/ledger/)
        .gts/lock                held by the running scheduler
        <run folder>/
            worker.log           the run's stdout and stderr (``log_file``)
            ...                  whatever the task writes
            .gts/config.json     the run's resolved config
            .gts/task.pkl        the task object handed to the child process
            .gts/spec.json       what the child needs to start
            .gts/outcome.json    written by the child when main() ends
            .gts/lease           renewed while a run on another machine lives (lease.py)
            .gts/metrics.jsonl   what the run reports as it trains (metrics.py)
            .gts/pruned          why the scheduler stopped the run early (early_stop)
            .gts/judged          the last ASHA rung at which the run was let go on
            .gts/pause           why the scheduler pauses the run (a pausing early_stop method)
            .gts/result.json     what main() returned, when it is over 1 MiB of JSON
            .gts/checkpoint/     the run's checkpoints (GTS_CHECKPOINT_DIR), across its attempts
            .gts/logs/           logs of earlier attempts (and what a fresh start set aside)

Everything under a result root is treated as hostile: a run (or anyone who
can write there) may plant a symbolic link or a FIFO where we read or write.
So nothing here follows a symbolic link under the root (:meth:`RunPaths.unsafe`
checks a run folder with ``lstat`` before anything is written into it, and
files are opened with ``O_NOFOLLOW``), and nothing opens a file that is not a
regular one (``O_NONBLOCK`` on open, then ``fstat``), so a FIFO can neither
hang the scheduler nor stand in for a record.
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import re
import stat
from typing import Any, NamedTuple

# The layout's pure names live in layout.py (the config layer checks with them); here with the I/O.
from ..layout import MAX_NAME_BYTES as MAX_NAME_BYTES
from ..layout import META as META
from ..layout import log_name_problem as log_name_problem
from ..recordclass import Record
from .logtext import last_lines

# Results up to this many bytes of JSON go into the outcome file and the ledger;
# larger ones into the run's own .gts/result.json, which the ledger refers to.
MAX_INLINE_RESULT = 1 << 20


def _new_temporary(folder: str) -> tuple[int, str]:
    """A new file ``.tmp-XXXX`` in ``folder``, as ``tempfile.mkstemp`` makes it (created, never
    opened through a link, mode 0600) without importing tempfile (1.5 ms of each start)."""
    for _ in range(100):
        path = os.path.join(folder, f".tmp-{os.urandom(8).hex()}")
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", folder)


def step_name(step: float) -> str:
    """A step as text: ``9`` for 9.0, ``2.5`` for 2.5 (``GTS_RESUME_STEP``, a snapshot's folder)."""
    return str(int(step)) if float(step).is_integer() and abs(step) < 2**53 else repr(float(step))


def atomic_write(path: str, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the new one, never half.

    ``durable`` also survives a power loss (fsync of the file and its folder);
    informational files skip that cost.
    """
    folder = os.path.dirname(path) or "."
    fd, tmp = _new_temporary(folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if not durable:
        return
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_json(path: str, value: Any, *, durable: bool = True) -> None:
    atomic_write(path, json.dumps(value, indent=1, sort_keys=True).encode("utf-8"), durable=durable)


class UnsafePathError(OSError):
    """A path under the result root is a symbolic link or not a regular file."""


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def open_regular(path: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """``os.open`` that refuses a symbolic link and anything but a regular file,
    without ever blocking on a FIFO or a device."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafePathError(errno.ELOOP, "is a symbolic link; not following it", path) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePathError(errno.EINVAL, "is not a regular file", path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


# Records of ours are small; a larger file under that name is not one of ours.
MAX_RECORD_BYTES = 64 << 20


_CHUNK = 1 << 16  # bytes per read: a buffer this size comes from the heap, not a fresh mapping


def read_json(path: str, *, limit: int = MAX_RECORD_BYTES) -> Any | None:
    """The JSON in ``path``, or None if it is missing, unreadable, too large,
    a symbolic link or not a regular file."""
    try:
        fd = open_regular(path)
        try:
            # Plain reads of the descriptor: a file object would cost three more system calls,
            # and read(limit + 1) a buffer of the limit's size (64 MiB) for a record of 100 bytes.
            chunks, size = [], 0
            while size <= limit and (chunk := os.read(fd, min(_CHUNK, limit + 1 - size))):
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
        if size > limit:
            return None
        return json.loads(b"".join(chunks).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def read_step(path: str) -> float | None:
    """The step written in ``path``: a finite number, 0 or more; None for anything else (missing, a
    FIFO or a link, which are never opened blocking or followed, ``nan``, ``inf``, ``-3``)."""
    try:
        fd = open_regular(path)
        try:
            step = float(os.read(fd, 64))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    return step if math.isfinite(step) and step >= 0 else None


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write less, on a full disk or a signal)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _kind_problem(path: str, want_dir: bool) -> str | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"{path} cannot be checked ({error.strerror})"
    if stat.S_ISLNK(info.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"{path} is a symbolic link (to {target!r}); refusing to follow it"
    if want_dir and not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a folder"
    if not want_dir and not stat.S_ISREG(info.st_mode):
        return f"{path} is not a regular file"
    return None


# SQLite opens no file whose path (plus its "-journal" suffix) is over 512 bytes.
MAX_LEDGER_PATH = 504


def ledger_path_problem(root: str) -> str | None:
    """Why SQLite could not open the ledger of ``root`` (its path is too long), or None.

    SQLite resolves symbolic links and the current folder itself, so the real
    absolute path is what counts; no link or ``chdir`` gets around it."""
    real = os.path.realpath(root)
    size = len(real.encode("utf-8", "surrogateescape"))
    limit = MAX_LEDGER_PATH - len("/.gts/ledger.sqlite3")
    if size > limit:
        return (
            f"the result root's real path is {size} bytes long; SQLite, which keeps the ledger, opens no "
            f"file under a folder path longer than {limit} bytes: choose a shorter result_root_folder"
        )
    return None


def result_root_problem(root: str) -> str | None:
    """Why ``root`` cannot be a result root (something else than a folder is there, or SQLite
    could not open a ledger under it), or None. Asked where a sweep opens its root, before
    anything runs or is written."""
    if os.path.exists(root) and not os.path.isdir(root):
        return f"{root!r} exists and is not a folder"
    return ledger_path_problem(root)


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a run folder under a result root, or None. A name the sweep
    makes is always one plain path component (sweep/naming.py); one read from a ledger, a
    search's records, a command line or a file is checked with this before it is joined to the
    root: it passes exactly when the sweep could have made it.

    >>> name_problem("lr-0.1,") is None
    True
    >>> name_problem("../../outside")
    "the run name '../../outside' holds a path separator"
    >>> name_problem(".gts")
    "the run name '.gts' is the folder of the result root's own records"
    """
    if not isinstance(name, str) or not name:
        return f"the run name {name!r} is not a non-empty string"
    if name in (".", ".."):
        return f"the run name {name!r} would be the result root or its parent"
    if name == META:
        return f"the run name {name!r} is the folder of the result root's own records"
    if "/" in name:
        return f"the run name {name!r} holds a path separator"
    if "\0" in name:
        return f"the run name {name!r} holds NUL"
    if _CONTROL.search(name):
        return f"the run name {name!r} holds a control character"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"the run name {name[:40]!r}... is over {MAX_NAME_BYTES} bytes"
    return None


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # what sweep/naming.py escapes in every name it makes


def root_records_problem(paths: RootPaths) -> str | None:
    """Why the result root's records cannot be trusted, or None. ``.gts`` must be a real folder:
    a symbolic link there would let two result roots share one ledger while each holds only
    its own root's lock. The ledger and SQLite's files beside it must be regular files (or
    absent): SQLite would block forever opening a FIFO, and read a device."""
    problem = _kind_problem(paths.meta, want_dir=True)
    if problem is not None:
        if "symbolic link" in problem:
            problem += " (a linked .gts would let two result roots share one ledger)"
        return problem
    for suffix in ("", "-wal", "-shm", "-journal"):
        problem = _kind_problem(paths.ledger + suffix, want_dir=False)
        if problem is not None:
            return problem
    return None


class RootPaths(NamedTuple):
    root: str

    @property
    def meta(self) -> str:
        return os.path.join(self.root, META)

    @property
    def ledger(self) -> str:
        return os.path.join(self.meta, "ledger.sqlite3")

    @property
    def lock(self) -> str:
        return os.path.join(self.meta, "lock")

    @property
    def stop_request(self) -> str:
        return os.path.join(self.meta, "stop-request")

    @property
    def control(self) -> str:
        return os.path.join(self.meta, "control")


class RunPaths(Record):
    """Where a run's files go. A run's start and end ask for them about 40 times, so the records
    folder is joined once per object and the files' names are appended to it, instead of an
    ``os.path.join`` at each ask."""

    work_dir: str
    log_name: str | None  # None: the run's output is discarded, as in the original

    @functools.cached_property
    def meta(self) -> str:
        return os.path.join(self.work_dir, META)

    @functools.cached_property
    def log(self) -> str | None:
        return os.path.join(self.work_dir, self.log_name) if self.log_name else None

    @property
    def config(self) -> str:
        return f"{self.meta}{os.sep}config.json"

    @property
    def task(self) -> str:
        return f"{self.meta}{os.sep}task.pkl"

    @property
    def spec(self) -> str:
        return f"{self.meta}{os.sep}spec.json"

    @property
    def outcome(self) -> str:
        return f"{self.meta}{os.sep}outcome.json"

    @property
    def metrics(self) -> str:
        """What the run reports as it trains, one JSON object a line (see metrics.py)."""
        return f"{self.meta}{os.sep}metrics.jsonl"

    @property
    def checkpoint(self) -> str:
        """The run's checkpoint folder (``GTS_CHECKPOINT_DIR``): the run's to write, kept across its
        attempts; an attempt that starts afresh finds it empty (an earlier one's is kept aside)."""
        return f"{self.meta}{os.sep}checkpoint"

    @property
    def pruned(self) -> str:
        """Written by the scheduler when it stops the run early: why (``report()`` raises ``Pruned``)."""
        return f"{self.meta}{os.sep}pruned"

    @property
    def pause(self) -> str:
        """Written by the scheduler when a pausing method pauses the run at a rung: why
        (``report()`` raises ``Paused``)."""
        return f"{self.meta}{os.sep}pause"

    @property
    def judged(self) -> str:
        """The highest ASHA rung the scheduler judged the run at and let it go on (``report()`` waits
        for it at a rung)."""
        return f"{self.meta}{os.sep}judged"

    @property
    def lease(self) -> str:
        """The attempt's lease, kept by a run on another machine (see lease.py)."""
        return f"{self.meta}{os.sep}lease"

    @property
    def result(self) -> str:
        return f"{self.meta}{os.sep}result.json"

    @property
    def old_logs(self) -> str:
        return f"{self.meta}{os.sep}logs"

    def unsafe(self, *, records_only: bool = False) -> str | None:
        """Why writing into (or trusting) this run folder could reach outside it:
        a symbolic link, or a non-regular file, where our folders and files
        go. None when it is safe (missing paths are safe: we create them).
        ``records_only``: only what reading the run's outcome goes through."""
        records_problem, problem = self.problems(records_only=records_only)
        return records_problem if records_only else problem

    def problems(self, *, records_only: bool = False) -> tuple[str | None, str | None]:
        """``unsafe(records_only=True)`` and ``unsafe()`` in one pass (a run's end needs both)."""
        checks = [(self.work_dir, True), (self.meta, True), (self.outcome, False)]  # the records' first
        for path, want_dir in checks:
            problem = _kind_problem(path, want_dir)
            if problem is not None:
                return problem, problem
        if records_only:
            return None, None
        folders = [self.old_logs, self.checkpoint]
        files = [self.config, self.task, self.spec, self.metrics, self.pruned, self.judged, self.pause]
        if self.log:
            relative = os.path.relpath(self.log, self.work_dir)
            parts = relative.split(os.sep)
            folders += [os.path.join(self.work_dir, *parts[:i]) for i in range(1, len(parts))]
            files.append(self.log)
        for path, want_dir in [(f, True) for f in folders] + [(f, False) for f in files]:
            problem = _kind_problem(path, want_dir)
            if problem is not None:
                return None, problem
        return None, None

    def exists(self) -> bool:
        """The run folder is there, as a real folder (a symbolic link does not count)."""
        try:
            return stat.S_ISDIR(os.lstat(self.work_dir).st_mode)
        except OSError:
            return False

    @classmethod
    def recorded(cls, root: str, name: object, log_name: object = None) -> RunPaths:
        """The folder of a run a ledger records, found from the root as given now (the ledger's
        ``work_dir`` may be relative to wherever the sweep started). A ledger is as hostile as
        anything else under the root: a name that is not one path component, or a log name
        that leaves the run folder, raises :class:`UnsafePathError` instead of reaching outside."""
        problem = name_problem(name)
        if problem is None and log_name is not None:
            wrong = log_name_problem(log_name)
            problem = None if wrong is None else f"the ledger's log_file {log_name!r} is not {wrong}"
        if problem is not None:
            raise UnsafePathError(errno.EINVAL, f"{problem}; not reading it", root)
        assert isinstance(name, str) and (log_name is None or isinstance(log_name, str))
        return cls(os.path.join(root, name), log_name)

    def old_log(self, attempt: int) -> str:
        return os.path.join(self.old_logs, f"attempt-{attempt}-{self.log_name}")

    def old_metrics(self, attempt: int) -> str:
        return os.path.join(self.old_logs, f"attempt-{attempt}-metrics.jsonl")

    def old_checkpoint(self, attempt: int) -> str:
        return os.path.join(self.old_logs, f"attempt-{attempt}-checkpoint")

    def tail(self, lines: int = 20, max_bytes: int = 16384) -> str:
        """The last ``lines`` lines of the run's log (reads at most ``max_bytes``), as a terminal
        shows them: a progress bar's line rewritten by carriage returns is its last state."""
        if self.log is None:
            return ""
        try:
            fd = open_regular(self.log)
            try:
                data = os.pread(fd, max_bytes, max(0, os.fstat(fd).st_size - max_bytes))
            finally:
                os.close(fd)
        except OSError:
            return ""
        text = last_lines(data, lines).decode("utf-8", "replace")
        return text[:-1] if text.endswith("\n") else text
