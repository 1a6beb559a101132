"""The lifeline of command runs: one keeper process per sweep instead of a watcher per run.

A command run (a ``gts queue`` line, a ``command:`` sweep) runs in one POSIX
shell, the wrapper (``prepare.py``), which runs the command and records its
success. Nothing in it watches the scheduler. The keeper does, for all of them:
a small Python process (``python -I -S``: no site, no imports of ours) started
with the sweep's first command run. Its standard input is a pipe whose other
end only the scheduler holds. When it reads EOF (the scheduler is gone, even by
SIGKILL, or has closed it at the sweep's end), it finds the sweep's runs by the
``GTS_KEEPER`` value in their environment (``/proc``) and, for each wrapper:

* freezes it (SIGSTOP) and then its children, and looks only once all are
  frozen, so nothing changes while it looks;
* reads where the wrapper is from two descriptors it was started with, both
  the read end of the run's lifeline pipe: ``GTS_FORKED_FD``, closed as soon
  as the command is started, and ``GTS_LIFELINE_FD``, closed once the command
  has ended (a descriptor number taken again by a file the wrapper opens is not
  a pipe, so it does not read as open); and from its children: the command is
  its only one, so a wrapper frozen between starting it and closing
  ``GTS_FORKED_FD`` has started it all the same;
* spares the run, and lets it go on, if its command has ended (the wrapper is
  past its wait, or the command is a zombie): the wrapper records the success
  as it would have, so a run that finished is never run again; otherwise it
  kills the run's group, its session and every process that carries its token.

Processes of the sweep that belong to no live wrapper (left behind by a run
whose wrapper had ended) are killed too. Python runs are not the keeper's:
their runner watches its own lifeline (``runner.py``).

On a system without ``/proc`` there is no keeper (:func:`available`); each
wrapper then starts its own watcher (``prepare.py``).
"""

from __future__ import annotations

import functools
import os
import select
import signal
import sys
from collections.abc import Iterable

KEEPER_ENV = "GTS_KEEPER"
FORKED_ENV = "GTS_FORKED_FD"
WRAPPER_NAME = "gts-command"  # the wrapper's $0: argv[3] of its /proc/PID/cmdline

# Run as `python -I -S -c _CODE MARKER WRAPPER_NAME`, stdin the lifeline's read end. Standalone:
# it imports nothing of ours, so it starts in ~10 ms and does not depend on the scheduler's paths.
_CODE = r"""
import os, signal, sys, time
marker, wrapper_name = sys.argv[1].encode(), sys.argv[2].encode()
holding = sys.argv[3].encode() if len(sys.argv) > 3 else None  # see Keeper(holding=...)
parent = os.getppid()  # never ended: the scheduler (it may still live, closing us)
for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(number, signal.SIG_IGN)
given = b""  # "PID START\n" lines: processes to end too (keep()), each known by its start time
try:
    while True:
        chunk = os.read(0, 4096)
        if not chunk:
            break
        given += chunk
except OSError:
    pass
me = os.getpid()

def read(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)

def stat(pid):
    try:
        fields = read("/proc/%d/stat" % pid).rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3])  # state ppid pgrp sid
    except (OSError, IndexError, ValueError):
        return None

def environ(pid):
    try:
        items = read("/proc/%d/environ" % pid).split(b"\0")
    except OSError:
        return None
    return dict(item.split(b"=", 1) for item in items if b"=" in item)

def pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != me]

def signal_all(targets, number):
    for pid in targets:
        try:
            os.kill(pid, number)
        except OSError:
            pass

def frozen(targets):
    # SIGSTOP, then wait until each is stopped, a zombie or gone (a signal takes effect a moment later)
    signal_all(targets, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    for pid in targets:
        while time.monotonic() < deadline:
            info = stat(pid)
            if info is None or info[0] in ("T", "t", "Z", "X"):
                break
            time.sleep(0.001)

def is_pipe(pid, fd):
    try:
        return os.readlink("/proc/%d/fd/%s" % (pid, fd.decode())).startswith("pipe:")
    except (OSError, ValueError):
        return False

ours = {}  # pid -> its environment, for the processes of this sweep's runs
for pid in pids():
    env = environ(pid)
    if env is not None and env.get(b"GTS_KEEPER") == marker:
        ours[pid] = env
wrappers = []
for pid, env in ours.items():
    info = stat(pid)
    try:
        argv = read("/proc/%d/cmdline" % pid).split(b"\0")
    except OSError:
        continue
    if info is not None and info[3] == pid and len(argv) > 3 and argv[3] == wrapper_name:
        wrappers.append(pid)
frozen(wrappers)
states = {pid: stat(pid) for pid in pids()}
children = {w: [p for p, info in states.items() if info is not None and info[1] == w] for w in wrappers}
frozen([p for kids in children.values() for p in kids])
spared_tokens, spared = set(), set()
killed_sessions, killed_tokens = set(), set()
for w in wrappers:
    info, env = stat(w), ours[w]
    token = env.get(b"GTS_RUN_TOKEN")
    if info is None or info[0] in ("Z", "X"):
        continue  # it has ended: what it left behind is killed below
    kids = [stat(p) for p in children[w]]
    running = any(kid is not None and kid[0] not in ("Z", "X") for kid in kids)
    waiting = is_pipe(w, env.get(b"GTS_LIFELINE_FD", b""))
    # A wrapper's only child is its command: one it has (a zombie too) was started, also when the
    # wrapper was frozen before it closed GTS_FORKED_FD (killed then, a command that had ended ran again).
    started = bool(kids) or not is_pipe(w, env.get(b"GTS_FORKED_FD", b""))
    if waiting and (not started or running):
        killed_sessions.add(w)
        killed_tokens.add(token)
    else:  # its command has ended: the wrapper records the outcome, as it would have
        spared_tokens.add(token)
        spared.update([w] + children[w])

def holds(pid):
    # Whether pid has a file open whose path holds `holding` (a Ray session's logs of ours).
    if holding is None or pid == parent:
        return False
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return False
    for fd in fds:
        try:
            if holding in os.readlink("/proc/%d/fd/%s" % (pid, fd)).encode():
                return True
        except OSError:
            pass
    return False

def doom(ours):
    states = {pid: stat(pid) for pid in pids()}
    doomed = set()
    for pid, info in states.items():
        if info is None or info[0] in ("Z", "X"):  # gone already (a zombie that init has not reaped)
            continue
        env = ours.get(pid)
        token = None if env is None else env.get(b"GTS_RUN_TOKEN")
        if info[3] in killed_sessions or info[2] in killed_sessions or token in killed_tokens:
            doomed.add(pid)
        elif (env is not None and token not in spared_tokens) or holds(pid):
            doomed.add(pid)  # a process of a run whose wrapper has ended (or of a Ray instance of ours)
    changed = True
    while changed:  # their descendants, also those that cleared their environment
        changed = False
        for pid, info in states.items():
            if info is not None and pid not in doomed and info[1] in doomed and pid not in spared:
                doomed.add(pid)
                changed = True
    return doomed

doomed = doom(ours)
for w in killed_sessions:
    try:
        os.killpg(w, signal.SIGKILL)
    except OSError:
        pass
signal_all(doomed, signal.SIGKILL)
signal_all(spared, signal.SIGCONT)
# What it killed may have been starting more (a raylet its agents): look again until nothing of
# ours that is not spared is left, for a few seconds at most. (Nothing killed: no second look, but
# for a Ray instance, whose processes may still be starting as the scheduler died: a second.)
for _ in range(40 if doomed else 10 if holding else 0):
    time.sleep(0.1)
    ours = {pid: env for pid in pids() for env in (environ(pid),) if env and env.get(b"GTS_KEEPER") == marker}
    doomed = doom(ours)
    if not doomed:
        break
    signal_all(doomed, signal.SIGKILL)
for line in given.split(b"\n"):
    try:
        pid, start = map(int, line.split())
        fields = read("/proc/%d/stat" % pid).rsplit(b")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        continue
    if pid != me and int(fields[19]) == start and fields[0] not in (b"Z", b"X") and pid not in spared:
        signal_all([pid], signal.SIGKILL)
"""


@functools.cache
def available() -> bool:
    """Whether this system has what the keeper reads (Linux ``/proc``): looked at once, not at
    each run's start (twice, each a ``stat``)."""
    return os.path.isdir("/proc/self/fd") and hasattr(os, "posix_spawn")


class Keeper:
    """The keeper process of one sweep (or of one remote supervisor's run): see the module's notes.

    ``marker`` goes into the environment of every command run it keeps; :meth:`ensure` starts the
    process (again, if something killed it); :meth:`close` ends it, once no run it keeps lives."""

    def __init__(self, *, holding: str | None = None) -> None:
        """``holding``: also end the processes that have a file open whose path holds this text
        (a Ray instance's session folder: its processes rewrite their titles over the environment,
        where the mark is, and some start after the scheduler could tell the keeper their pids)."""
        self.marker = os.urandom(12).hex()
        self._holding = holding
        self._pid: int | None = None
        self._write_end = -1

    def ensure(self) -> None:
        """The keeper is running (started now if it was not, or had died)."""
        if self._pid is not None:
            try:
                if os.waitid(os.P_PID, self._pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                    return  # alive
            except ChildProcessError:
                pass
            self._end()  # killed by someone: reap it, and start another for the same runs
        read_end, write_end = os.pipe()
        try:
            actions = [
                (os.POSIX_SPAWN_DUP2, read_end, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
            ]
            argv = [sys.executable, "-I", "-S", "-c", _CODE, self.marker, WRAPPER_NAME]
            if self._holding is not None:
                argv.append(self._holding)
            self._pid = os.posix_spawn(sys.executable, argv, dict(os.environ), file_actions=actions, setsid=True)
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self._write_end = write_end

    @property
    def pid(self) -> int | None:
        """The keeper process's pid (None before :meth:`ensure`)."""
        return self._pid

    def keep(self, pids: Iterable[int]) -> None:
        """End these processes too, once the keeper reads its end: processes that carry no mark it
        can read (one that rewrites its title with setproctitle writes over its /proc environ, as
        Ray's do). Each is known by its start time, so that no other process that gets its pid later
        is hit. Those already gone are skipped."""
        lines = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as handle:
                    lines.append(f"{pid} {int(handle.read().rsplit(b')', 1)[1].split()[19])}\n")
            except (OSError, ValueError, IndexError):
                continue
        if lines and self._write_end >= 0:
            try:
                os.write(self._write_end, "".join(lines).encode())
            except OSError:  # the keeper was killed: the next ensure() starts another
                pass

    def close(self) -> None:
        """End the keeper: it looks once more (finding no run, when every run has been reaped), and
        exits; it is waited for, so no process is left behind."""
        if self._write_end >= 0:
            os.close(self._write_end)
            self._write_end = -1
        self._end(timeout=10.0)

    def _end(self, timeout: float = 0.0) -> None:
        pid, self._pid = self._pid, None
        if pid is None:
            return
        if self._write_end >= 0:
            os.close(self._write_end)
            self._write_end = -1
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = None
        if pidfd is not None:
            try:
                if not select.select([pidfd], [], [], timeout)[0]:
                    os.kill(pid, signal.SIGKILL)  # it never takes this long: do not wait for ever
            finally:
                os.close(pidfd)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
