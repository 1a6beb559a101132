"""GPU memory reservations shared by every scheduler on this machine, whoever started it.

A run reserves its declared memory when it starts and holds the reservation
until NVML shows its processes using that memory. One scheduler keeps its own
runs from double-booking free memory that way; several schedulers on one
machine must also see each other's reservations, or two sweeps each see a free
80 GiB GPU, each start three 20 GiB runs, and the GPU runs out of memory a
second later, when the runs allocate.

No daemon: each scheduler publishes its reservations in a file of its own in
one directory that every user can write to (``/dev/shm/gts-gpu-reservations``,
or ``/tmp/...`` where there is no ``/dev/shm``; ``GTS_RESERVATIONS_DIR``
names another, e.g. for a test), and reads the others' files when it places a
run. A reservation counts only as long as what it names is true:

* its scheduler is alive: the pid in the file runs, started at the time the
  file says (a reused pid does not count) and belongs to the file's owner;
* it is on this host (a directory shared over the network is not trusted for
  other hosts, whose pids cannot be checked here);
* its run has not allocated it yet: what NVML shows the run's process group
  using on the GPU is subtracted, as for our own runs.

So a scheduler killed with kill -9 blocks no one beyond the next read. Its
own stale files are removed by the next scheduler of the same user; other
users' stale files are ignored (a sticky directory lets only their owner
delete them).

Every file in the directory is someone else's input: none is followed through
a symbolic link, none is read unless it is a small regular file, its fields are
checked for type and range, and one that fails is ignored with one warning,
never an error. Nothing read from it is ever used as a path. A hostile user on
the machine can do no more than publish reservations for live processes of
their own, which is no more than allocating the memory would do.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import stat
import time
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from .host import process_stat

logger = logging.getLogger("gpu_task_scheduler")

DIR_ENV = "GTS_RESERVATIONS_DIR"
_NAME = "gts-gpu-reservations"
_MAX_FILE = 256 << 10
_MAX_ENTRIES = 4096
_VERSION = 1
STARTING = 0  # the pgid of a reservation whose run is being started (it counts whole)
_OPEN = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class Held(NamedTuple):
    """One run's reservation on one GPU, as published."""

    gpu_uuid: str
    reserved: int  # bytes
    pgid: int  # the run's process group (what NVML's processes are matched by); STARTING before it exists
    run: str  # the run's folder name, for `gts gpus`


class Publisher(NamedTuple):
    """One live scheduler's published reservations (another's, or ours)."""

    pid: int
    user: str
    uid: int
    root: str  # its result root, as text for people: never opened
    reservations: tuple[Held, ...]


def default_directory() -> str:
    configured = os.environ.get(DIR_ENV)
    if configured:
        return configured
    base = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    return os.path.join(base, _NAME)


def _start_ticks(pid: int) -> tuple[int, int] | None:
    """``(start time in clock ticks, owner uid)`` of a live process, or None."""
    process = process_stat(pid)
    if process is None or process[0] in ("Z", "X"):
        return None
    try:
        return process[2], os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


_LOCK_WAIT = 2.0  # seconds; a lock held longer (a stuck or hostile holder) is given up on


def _lock(fd: int, seconds: float) -> None:
    """flock, giving up after ``seconds`` (another user could hold it forever)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise OSError("held by another process for too long") from None
            time.sleep(0.002)


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except PermissionError:
        return True  # another user's
    except (ProcessLookupError, OSError):
        return False
    return True


def process_user(pid: int) -> str:
    """The name of the user a process runs as ("?" when it cannot be told)."""
    try:
        return _user(os.stat(f"/proc/{pid}").st_uid)
    except OSError:
        return "?"


def _user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


class SharedReservations:
    """This scheduler's file in the shared directory, and a reader of everyone else's."""

    def __init__(self, root: str, directory: str | None = None, *, publishing: bool = True) -> None:
        """``publishing=False``: only read the others' records (``gts gpus``); nothing is created or removed."""
        self.directory = directory or default_directory()
        self._root = os.path.abspath(root)
        self._pid = os.getpid()
        self._uid = os.getuid()
        self._host = os.uname().nodename  # socket.gethostname()'s, without importing socket
        own = _start_ticks(self._pid)
        self._start = own[0] if own else 0
        self._name = f"{self._uid}-{self._pid}-{self._start}.json"
        self._published: tuple[Held, ...] | None = None
        self._warned: set[str] = set()
        self._dir_fd: int | None = None
        self._publishing = publishing
        self.problem: str | None = None
        try:
            self._dir_fd = self._open_directory()
        except OSError as error:
            self.problem = f"{self.directory}: {error.strerror or error}"
        except ValueError as error:
            self.problem = str(error)
        if self.problem is not None and publishing:
            logger.warning(
                "GPU reservations are not shared with other schedulers on this machine (%s); set %s to a "
                "directory every user of these GPUs can write to",
                self.problem,
                DIR_ENV,
            )

    def _open_directory(self) -> int:
        try:
            if not self._publishing:
                raise FileExistsError  # only look
            os.mkdir(self.directory, 0o700)
        except FileExistsError:
            pass
        else:  # ours: open to every user, and sticky (only a file's owner may replace or delete it)
            os.chmod(self.directory, 0o1777)
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
        info = os.fstat(fd)
        if info.st_uid != self._uid and not info.st_mode & stat.S_ISVTX:
            os.close(fd)
            raise ValueError(
                f"{self.directory} belongs to another user and is not sticky: its owner could replace "
                "this scheduler's reservations"
            )
        return fd

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Machine-wide: reading the others' reservations, choosing and publishing ours happen as one
        step, so two schedulers placing runs at the same moment never book the same memory."""
        fd = -1
        if self._dir_fd is not None:
            try:
                fd = os.open(".lock", os.O_RDONLY | os.O_CREAT | _OPEN, 0o444, dir_fd=self._dir_fd)
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError("not a regular file")
                _lock(fd, _LOCK_WAIT)
            except OSError as error:
                if fd >= 0:
                    os.close(fd)
                    fd = -1
                self._warn_once("lock", f"cannot lock {self.directory}/.lock ({error}); placing without it")
        try:
            yield
        finally:
            if fd >= 0:
                os.close(fd)  # closing drops the lock

    def close(self) -> None:
        if self._dir_fd is None:
            return
        if self._publishing:
            try:
                os.unlink(self._name, dir_fd=self._dir_fd)
            except OSError:
                pass
        os.close(self._dir_fd)
        self._dir_fd = None

    # --- ours ---------------------------------------------------------------------------

    def publish(self, reservations: Iterable[Held]) -> None:
        """Replace this scheduler's published reservations (atomically: readers see old or new)."""
        held = tuple(reservations)
        if self._dir_fd is None or not self._publishing or held == self._published:
            return
        record = {
            "version": _VERSION,
            "host": self._host,
            "pid": self._pid,
            "start": self._start,
            "uid": self._uid,
            "user": _user(self._uid),
            "root": self._root,
            "reservations": [h._asdict() for h in held],
        }
        data = json.dumps(record).encode()
        tmp = f".{self._name}.{os.urandom(4).hex()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(tmp, flags, 0o644, dir_fd=self._dir_fd)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            try:
                os.rename(tmp, self._name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
            except OSError:
                os.unlink(tmp, dir_fd=self._dir_fd)
                raise
        except OSError as error:
            self._warn_once("publish", f"cannot publish this scheduler's GPU reservations in {self.directory}: {error}")
            return
        self._published = held

    # --- everyone else's ----------------------------------------------------------------

    def others(self) -> list[Publisher]:
        """Every other live scheduler's reservations on this host (stale and damaged files are skipped)."""
        if self._dir_fd is None:
            return []
        try:
            names = os.listdir(self._dir_fd)
        except OSError as error:
            self._warn_once("list", f"cannot read {self.directory}: {error}")
            return []
        found = []
        for name in names:
            if name == self._name or not name.endswith(".json") or name.startswith("."):
                continue
            publisher = self._read(name)
            if publisher is not None:
                found.append(publisher)
        return found

    def _read(self, name: str) -> Publisher | None:
        assert self._dir_fd is not None
        try:
            fd = os.open(name, _OPEN, dir_fd=self._dir_fd)
        except OSError:
            return None  # gone meanwhile, or a link (ELOOP): nothing to read
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_FILE:
                self._warn_once(name, f"{self.directory}/{name} is not a small regular file; ignored")
                return None
            data = os.read(fd, _MAX_FILE + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            record = _parse(json.loads(data), info.st_uid)
        except (ValueError, TypeError, KeyError, RecursionError) as error:
            self._warn_once(name, f"{self.directory}/{name} is not a reservation record ({error}); ignored")
            return None
        if record is None:
            return None  # another host's
        pid, start, publisher = record
        live = tuple(h for h in publisher.reservations if h.pgid == STARTING or _group_exists(h.pgid))
        publisher = publisher._replace(reservations=live)
        if _start_ticks(pid) != (start, info.st_uid):  # its scheduler is gone (or the pid is another's now)
            if info.st_uid == self._uid and self._publishing:
                try:
                    os.unlink(name, dir_fd=self._dir_fd)  # our own user's: clean it up
                except OSError:
                    pass
            return None
        return publisher

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("%s", message)


def _parse(record: object, owner: int) -> tuple[int, int, Publisher] | None:
    """A published record, checked field by field; None for another host's; ValueError if damaged."""
    if not isinstance(record, dict) or record.get("version") != _VERSION:
        raise ValueError("unknown format")
    if record["host"] != os.uname().nodename:
        return None
    pid, start, uid = record["pid"], record["start"], record["uid"]
    for value in (pid, start, uid):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError("bad process fields")
    if uid != owner:
        raise ValueError(f"it claims user {uid} but belongs to user {owner}")
    user, root, entries = record["user"], record["root"], record["reservations"]
    if not isinstance(user, str) or not isinstance(root, str) or not isinstance(entries, list):
        raise ValueError("bad fields")
    if len(entries) > _MAX_ENTRIES:
        raise ValueError("too many reservations")
    held = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise ValueError("bad reservation")
        gpu, reserved, pgid, run = entry["gpu_uuid"], entry["reserved"], entry["pgid"], entry["run"]
        if not isinstance(gpu, str) or not isinstance(run, str):
            raise ValueError("bad reservation")
        for value in (reserved, pgid):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 62:
                raise ValueError("bad reservation")
        held.append(Held(gpu[:256], reserved, pgid, run[:512]))
    return pid, start, Publisher(pid=pid, user=user[:64], uid=uid, root=root[:4096], reservations=tuple(held))
