"""Finding every process a run started, also those that left its process group.

A run's processes normally share its process group, and signalling the group
stops them all. A process that calls ``setpgrp()`` or daemonises (double fork
and ``setsid()``) leaves it. Three ways find those anyway (Linux ``/proc``):

* the run's *session*: ``setpgrp()`` changes the group, not the session;
* the run's *token*: every run's environment carries ``GTS_RUN_TOKEN``, which
  its descendants inherit, also across ``setsid()`` and double forks;
* the runner is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): orphaned
  descendants are re-parented to it instead of to init, so while the runner
  lives its process tree holds every descendant, whatever its environment.

Only processes started after the run's first process are looked at closely
(their start time, from ``/proc/PID/stat``). For a run that started a moment
ago, only pids above its first process's are looked at at all: Linux hands
out pids in increasing order until they wrap around at ``pid_max``, and the
last pid it handed out (``/proc/loadavg``) tells whether that happened since.
Elsewhere (no ``/proc``) the functions find nothing and the process group is
all we stop.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Container, Iterable

from .finite import ascii_int

TOKEN_ENV = "GTS_RUN_TOKEN"
WARM_ENV = "GTS_WARM"  # the mark of a warm process (backends/local/zygote.py), and so of its forks
_PROC = "/proc"


def _read(path: str) -> bytes:
    """A small /proc file's content (unbuffered: one open, reads, one close); OSError if it is gone."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _stat(pid: int) -> tuple[int, int, int, str] | None:
    """``(ppid, session, start time in ticks, state)`` of a process, or None if it is gone."""
    try:
        data = _read(f"{_PROC}/{pid}/stat")
    except OSError:
        return None
    fields = data.rsplit(b")", 1)[-1].split()
    try:  # after the name: state ppid pgrp session ... starttime is field 22 (index 19 here)
        return int(fields[1]), int(fields[3]), int(fields[19]), fields[0].decode()
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    info = _stat(pid)
    return None if info is None else info[2]


def _environ(pid: int) -> list[bytes]:
    try:
        return _read(f"{_PROC}/{pid}/environ").split(b"\0")
    except OSError:
        return []


def environ_has(pid: int, name: str) -> bool:
    """Whether the process's environment (as it started) has the variable ``name``."""
    prefix = name.encode() + b"="
    return any(item.startswith(prefix) for item in _environ(pid))


# Up to this many pids handed out since a run's first process, each is looked up by its number
# (a missing one costs one failed open) instead of listing all of /proc.
_RANGE_LOOKUP = 256


def _pids(above: int = 0, upto: int | None = None) -> Iterable[int]:
    """The pids above ``above``: those up to ``upto`` (the last one handed out), when that is known
    and few, else every process in /proc. A number may also be a thread's id (see ``_leader``)."""
    if upto is not None and above > 0 and 0 <= upto - above <= _RANGE_LOOKUP:
        return range(above + 1, upto + 1)
    try:
        return [pid for pid in map(ascii_int, os.listdir(_PROC)) if pid is not None and pid > above]
    except OSError:
        return []


def _leader(pid: int) -> bool:
    """Whether ``pid`` is a process, not a thread of one (``/proc/TID`` answers too, unlisted)."""
    try:
        status = _read(f"{_PROC}/{pid}/status")
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith(b"Tgid:"):
            return int(line.split()[1]) == pid
    return False


def last_pid() -> int | None:
    """The pid Linux handed out last (None where that cannot be read)."""
    try:
        return int(_read(f"{_PROC}/loadavg").split()[4])
    except (OSError, IndexError, ValueError):
        return None


def run_processes(
    *,
    token: str,
    session: int,
    since: int | None,
    exclude: Iterable[int] = (),
    above: int = 0,
    upto: int | None = None,
    other_sessions: Container[int] = (),
    known: dict[int, int] | None = None,
) -> list[int]:
    """Live processes of one run: in its session, carrying its token, or descended from either.

    ``since``: the start time (ticks) of the run's first process; older processes are skipped.
    ``above``: only pids above this one can be the run's (see the module's notes); ``upto``: the
    last pid handed out (``last_pid()``, read as the scan begins).
    ``other_sessions``: the sessions of other live runs. A process in one of them is that run's
    (no process can join a session it did not start, and a run's first process leads its own), so
    its environment is not read: with many short runs at once, most processes started since this
    run's first are theirs. ``known``: pid -> the other run's session it was found in, filled in
    here and kept by the caller for as long as no pid was handed out twice (until the pids wrap
    around): such a pid is not looked at again.
    """
    skip = set(exclude) | {os.getpid()}
    needle = f"{TOKEN_ENV}={token}".encode()
    parents: dict[int, int] = {}
    found: set[int] = set()
    ranged = isinstance(candidates := _pids(above, upto), range)
    known = {} if known is None else known
    for pid in candidates:
        if pid in skip or pid in other_sessions or known.get(pid, session) != session:
            continue  # another live run's first process (it leads that run's session), or known to be in one
        info = _stat(pid)
        if info is None or info[3] in ("Z", "X"):
            continue
        ppid, sid, started, _ = info
        if since is not None and started < since:
            continue
        if sid != session and sid in other_sessions:
            known[pid] = sid
        parents[pid] = ppid
        if sid == session or (sid not in other_sessions and needle in _environ(pid)):
            found.add(pid)
    changed = True
    while changed:  # children of what we found (a daemon that cleared its environment)
        changed = False
        for pid, ppid in parents.items():
            if pid not in found and ppid in found:
                found.add(pid)
                changed = True
    if ranged:  # what was looked up by number may be a thread of a process found as well
        found = {pid for pid in found if _leader(pid)}
    return sorted(found)


def descendants(pid: int, *, zombies: bool = True) -> list[int]:
    """Every descendant of ``pid`` (through ``/proc/PID/task/*/children``);
    ``zombies=False`` leaves out those that have ended but are not reaped yet."""
    result: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = os.listdir(f"{_PROC}/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"{_PROC}/{parent}/task/{task}/children") as handle:
                    children = [int(child) for child in handle.read().split()]
            except OSError:
                continue
            result.extend(children)
            stack.extend(children)
    return result if zombies else [child for child in result if _alive(child)]


def kill_all(pids: Iterable[int], signum: int = signal.SIGKILL) -> list[int]:
    """Signal each process; return those we may not signal (another user's)."""
    refused = []
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
        except PermissionError:
            refused.append(pid)
    return refused


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait (bounded) until the processes are gone; return those still alive.

    They are not our children (they were re-parented), so ``waitpid`` cannot
    wait for them: a pidfd per process can (Linux 5.3+), and elsewhere a short
    poll of ``/proc``. Called only after SIGKILL, which the kernel carries out
    at once unless a process is stuck in the kernel.
    """
    deadline = time.monotonic() + timeout
    remaining = [pid for pid in pids if _alive(pid)]
    if remaining and hasattr(os, "pidfd_open"):
        poller = select.poll()
        fds: dict[int, int] = {}
        try:
            for pid in remaining:
                try:
                    fd = os.pidfd_open(pid)
                except OSError:
                    continue
                fds[fd] = pid
                poller.register(fd, select.POLLIN)
            while fds:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for fd, _ in poller.poll(left * 1000):
                    poller.unregister(fd)
                    os.close(fd)
                    del fds[fd]
        finally:
            for fd in fds:
                os.close(fd)
        return [pid for pid in remaining if _alive(pid)]
    delay = 0.001
    while remaining and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
        remaining = [pid for pid in remaining if _alive(pid)]
    return remaining


def _alive(pid: int) -> bool:
    info = _stat(pid)
    return info is not None and info[3] not in ("Z", "X")


def holders(path: str) -> list[int]:
    """Processes that have ``path`` open (any of their descriptors)."""
    target = os.path.realpath(path)
    found = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        try:
            fds = os.listdir(f"{_PROC}/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{_PROC}/{pid}/fd/{fd}") == target:
                    found.append(pid)
                    break
            except OSError:
                continue
    return found


def _prctl(option: int, value: int) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def become_subreaper(on: bool = True) -> bool:
    """Make this process adopt its orphaned descendants (Linux), or no longer (``on`` False); False
    where that is not possible."""
    return _prctl(36, int(on))  # PR_SET_CHILD_SUBREAPER


def parent_of(pid: int) -> int | None:
    """The parent of process ``pid``, or None if it is gone."""
    info = _stat(pid)
    return None if info is None else info[0]


def signal_on_parent_death(signum: int) -> bool:
    """Have the kernel send ``signum`` when our parent dies (Linux). Unlike a thread
    watching a pipe, this survives ``exec`` and closing every descriptor."""
    return _prctl(1, signum)  # PR_SET_PDEATHSIG
