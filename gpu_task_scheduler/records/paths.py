"""The layout of a result root and of a run folder, owned in one place.

::

    <result_root>/
        .gts/ledger.sqlite3      the record of every run (see ledger.py)
        .gts/lock                held by the running scheduler
        <run folder>/
            worker.log           the run's stdout and stderr (``log_file``)
            ...                  whatever the task writes
            .gts/config.json     the run's resolved config
            .gts/task.pkl        the task object handed to the child process
            .gts/spec.json       what the child needs to start
            .gts/outcome.json    written by the child when main() ends
            .gts/result.json     what main() returned, when it is over 1 MiB of JSON
            .gts/logs/           logs of earlier attempts

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
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from typing import Any

META = ".gts"
# Results up to this many bytes of JSON go into the outcome file and the ledger;
# larger ones into the run's own .gts/result.json, which the ledger refers to.
MAX_INLINE_RESULT = 1 << 20


def atomic_write(path: str, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the new one, never half.

    ``durable`` also survives a power loss (fsync of the file and its folder);
    informational files skip that cost.
    """
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
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


def read_json(path: str, *, limit: int = MAX_RECORD_BYTES) -> Any | None:
    """The JSON in ``path``, or None if it is missing, unreadable, too large,
    a symbolic link or not a regular file."""
    try:
        fd = open_regular(path)
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(limit + 1)
        if len(data) > limit:
            return None
        return json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


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


@dataclass(frozen=True)
class RootPaths:
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


@dataclass(frozen=True)
class RunPaths:
    work_dir: str
    log_name: str | None  # None: the run's output is discarded, as in the original

    @property
    def meta(self) -> str:
        return os.path.join(self.work_dir, META)

    @property
    def log(self) -> str | None:
        return os.path.join(self.work_dir, self.log_name) if self.log_name else None

    @property
    def config(self) -> str:
        return os.path.join(self.meta, "config.json")

    @property
    def task(self) -> str:
        return os.path.join(self.meta, "task.pkl")

    @property
    def spec(self) -> str:
        return os.path.join(self.meta, "spec.json")

    @property
    def outcome(self) -> str:
        return os.path.join(self.meta, "outcome.json")

    @property
    def result(self) -> str:
        return os.path.join(self.meta, "result.json")

    @property
    def old_logs(self) -> str:
        return os.path.join(self.meta, "logs")

    def unsafe(self, *, records_only: bool = False) -> str | None:
        """Why writing into (or trusting) this run folder could reach outside it:
        a symbolic link, or a non-regular file, where our folders and files
        go. None when it is safe (missing paths are safe: we create them).
        ``records_only``: only what reading the run's outcome goes through."""
        if records_only:
            folders, files = [self.work_dir, self.meta], [self.outcome]
        else:
            folders = [self.work_dir, self.meta, self.old_logs]
            files = [self.config, self.task, self.spec, self.outcome]
        if self.log and not records_only:
            relative = os.path.relpath(self.log, self.work_dir)
            parts = relative.split(os.sep)
            folders += [os.path.join(self.work_dir, *parts[:i]) for i in range(1, len(parts))]
            files.append(self.log)
        for path, want_dir in [(f, True) for f in folders] + [(f, False) for f in files]:
            problem = _kind_problem(path, want_dir)
            if problem is not None:
                return problem
        return None

    def exists(self) -> bool:
        """The run folder is there, as a real folder (a symbolic link does not count)."""
        try:
            return stat.S_ISDIR(os.lstat(self.work_dir).st_mode)
        except OSError:
            return False

    def old_log(self, attempt: int) -> str:
        return os.path.join(self.old_logs, f"attempt-{attempt}-{self.log_name}")

    def tail(self, lines: int = 20, max_bytes: int = 16384) -> str:
        """The last ``lines`` lines of the run's log (reads at most ``max_bytes``)."""
        if self.log is None:
            return ""
        try:
            with os.fdopen(open_regular(self.log), "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - max_bytes))
                data = handle.read()
        except OSError:
            return ""
        text = data.decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])
