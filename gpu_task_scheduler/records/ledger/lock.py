"""The sweep lock: one scheduler per result root, and who holds it.

A :class:`SweepLock` (an ``flock`` on the result root folder) stops two schedulers from working on
the same result root; the kernel drops it when its holder dies, so a killed scheduler never leaves
a stale lock behind. :func:`scheduler_state` tells whether a live scheduler holds a root without
touching the lock (``gts status``, ``gts stop``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import time

from ...errors import LedgerError, SchedulerBusyError
from ...finite import ascii_int
from ..paths import RootPaths, open_regular, root_records_problem

logger = logging.getLogger("gpu_task_scheduler")

# Seconds the runs of a killed scheduler get to end by themselves before a new one stops them.
NATURAL_END = 2.0


class SweepLock:
    """An exclusive lock on a result root, released by the kernel when the last holder dies.

    The lock is an ``flock`` on the result root *folder* itself, not on a file
    under ``.gts/``: deleting ``.gts`` (or the lock file) mid-sweep cannot free
    it. Every run's process inherits the locked descriptor (:attr:`fd`), so
    the root stays locked while any process of a run lives, also one whose
    scheduler was killed and that outlived its lifeline (stopped, stuck in a
    system call, exec'd). ``.gts/lock`` names the holder, for messages only.

    A scheduler that finds the root locked by such leftovers of a dead
    scheduler (same host, holder pid gone) stops them, if they carry a run
    token (they are runs of this root), and takes the lock; anything else
    holding it is named in a :class:`SchedulerBusyError`.
    """

    def __init__(self, paths: RootPaths, *, leftover_timeout: float = 10.0) -> None:
        self._paths = paths
        self._leftover_timeout = leftover_timeout
        self.fd: int | None = None
        self._meta_fd: int | None = None

    def acquire(self) -> None:
        problem = root_records_problem(self._paths)
        if problem is not None:
            raise LedgerError(problem)
        os.makedirs(self._paths.meta, exist_ok=True)
        fd = os.open(self._paths.root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
        try:
            if not self._try_lock(fd):
                self._take_over_from_leftovers(fd)
            self._meta_fd = self._lock_meta()
            self._write_holder()
        except BaseException:
            os.close(fd)
            if self._meta_fd is not None:
                os.close(self._meta_fd)
                self._meta_fd = None
            raise
        self.fd = fd

    def _lock_meta(self) -> int:
        """Lock ``.gts`` itself too, by the folder we open (no link followed): two roots can only
        share one ledger folder through a mount, and then the second scheduler stops here."""
        flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self._paths.meta, flags)
        except OSError as error:
            raise LedgerError(f"cannot open {self._paths.meta!r} ({error.strerror}); refusing to use it") from None
        if not self._try_lock(fd):
            os.close(fd)
            raise SchedulerBusyError(
                f"the records folder {self._paths.meta!r} is in use by another scheduler (the same folder is "
                "reachable from another result root, e.g. through a mount): two sweeps never share one ledger"
            )
        return fd

    @staticmethod
    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def holder(self) -> str:
        """Who holds the lock, as its holder wrote it (for messages only)."""
        try:
            with os.fdopen(open_regular(self._paths.lock), "rb") as handle:
                return handle.read(4096).decode("utf-8", "replace").strip() or "unknown"
        except OSError:
            return "unknown"

    def _take_over_from_leftovers(self, fd: int) -> None:
        from ...proctree import TOKEN_ENV, WARM_ENV, environ_has, holders, kill_all, wait_gone

        holder = self.holder()
        busy = SchedulerBusyError(
            f"another scheduler is already running on {self._paths.root!r} ({holder}); "
            "wait for it to finish or stop it first"
        )
        pid, host = _parse_holder(holder)
        if pid is None or host != os.uname().nodename or _pid_alive(pid):
            raise busy
        # The runs of a killed scheduler end by themselves within moments (their lifeline), each
        # first finishing the record of a main() that returned. So: wait for that; then ask those
        # still there to stop as the scheduler would (SIGCONT for a stopped one, then SIGTERM, which
        # a run that is recording holds until its record is written); SIGKILL only what is left after
        # that, so that no run whose main() returned is cut off before its record. flock has no timed
        # wait, hence the polling.
        if self._wait_for_lock(fd, NATURAL_END):
            return
        others: list[int] = []
        for signals, wait in (((signal.SIGCONT, signal.SIGTERM), self._leftover_timeout), ((signal.SIGKILL,), 5.0)):
            processes = holders(self._paths.root)
            # A run forked warm shows its warm process's first environment: its mark, not a token.
            ours = [p for p in processes if environ_has(p, TOKEN_ENV) or environ_has(p, WARM_ENV)]
            others = [p for p in processes if p not in ours]
            if ours:
                logger.warning(
                    "the scheduler that held %s (%s) is gone, but %d process(es) of its runs are still "
                    "alive: sending %s to pid %s",
                    self._paths.root,
                    holder,
                    len(ours),
                    " and ".join(signal.Signals(s).name for s in signals),
                    ", ".join(map(str, ours)),
                )
                for signum in signals:
                    kill_all(ours, signum)
                wait_gone(ours, timeout=wait)
            if self._wait_for_lock(fd, 1.0 if others else wait):
                return
        if not self._try_lock(fd):
            still = [p for p in holders(self._paths.root) if p != os.getpid()] or others
            raise SchedulerBusyError(
                f"{self._paths.root!r} is still locked although its scheduler ({holder}) is gone: held by "
                f"pid {', '.join(map(str, still)) or 'unknown'}; stop those processes and start again"
            ) from None

    def _wait_for_lock(self, fd: int, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        delay = 0.005
        while not self._try_lock(fd):
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        return True

    def _write_holder(self) -> None:
        # The host as socket.gethostname() names it (gethostname(2) is uname's nodename), without
        # importing socket (2 ms of every start).
        text = f"pid {os.getpid()} on host {os.uname().nodename}\n".encode()
        try:
            lock_fd = open_regular(self._paths.lock, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except OSError:
            return  # informational only
        try:
            os.write(lock_fd, text)
        finally:
            os.close(lock_fd)

    def release(self) -> None:
        if self.fd is not None:
            try:
                fd = open_regular(self._paths.lock, os.O_WRONLY | os.O_TRUNC)
                os.close(fd)
            except OSError:
                pass
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
        if self._meta_fd is not None:
            os.close(self._meta_fd)
            self._meta_fd = None

    def __enter__(self) -> SweepLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def scheduler_state(root: str) -> tuple[bool | None, str]:
    """``(running, holder)``: whether a live scheduler holds the result root, read
    without touching the lock (``/proc/locks`` lists every ``flock`` with the pid
    that took it), and who it is. ``running`` is None when this cannot be known
    here (no ``/proc/locks``, or a holder on another host)."""
    running, _, holder = scheduler_process(root)
    return running, holder


def scheduler_process(root: str) -> tuple[bool | None, int | None, str]:
    """``scheduler_state`` with the holder's pid (None when it cannot be told)."""
    holder = SweepLock(RootPaths(root)).holder()
    try:
        info = os.stat(root)
        with open("/proc/locks") as handle:
            table = handle.read().splitlines()
    except OSError:
        pid, host = _parse_holder(holder)
        if pid is None or host != os.uname().nodename:
            return None, None, holder
        return _pid_alive(pid), pid, holder
    wanted = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in table:
        fields = line.split()
        pid = ascii_int(fields[4]) if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == wanted else None
        if pid is not None:  # held; by a live scheduler, or only by its leftovers
            return _pid_alive(pid), pid, holder
    return False, None, holder


def _parse_holder(text: str) -> tuple[int | None, str | None]:
    """``pid 12 on host h`` -> ``(12, 'h')``."""
    parts = text.split()
    pid = ascii_int(parts[1]) if len(parts) == 5 and parts[0] == "pid" and parts[2:4] == ["on", "host"] else None
    return (pid, parts[4]) if pid is not None else (None, None)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
