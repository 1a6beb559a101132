"""Starting, watching and stopping one child process per run.

Every child is the leader of a new session (and so of its own process
group): stopping a run signals the whole group, so processes the run started
itself (data loaders, shell pipelines) stop with it. Each child also gets the
read end of a *lifeline* pipe whose write end only the scheduler holds; when
the scheduler dies, even by SIGKILL, the kernel closes that end and the
child's runner kills its group (see ``runner.py``). Nothing outlives the
scheduler.

Processes that leave the group (``setpgrp()``, daemons) are found through the
run's session and the run token in their environment (``gpu_task_scheduler/proctree.py``) and
stopped with the group; those that could not be stopped are reported.

A child is started with ``posix_spawn`` (``Popen`` where that cannot be done).
Completion is an event: every child's pidfd is in one epoll set, which the
scheduler's loop waits on (``reaper.py``; a ``waitid`` thread per child where
there are no pidfds), so the loop hears of an exit the moment it happens. Neither reaps: the
child stays a zombie until the scheduler reaps it, so the group id cannot be
reused by another process while we still signal it.
"""

from __future__ import annotations

import fcntl
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...proctree import TOKEN_ENV, kill_all, last_pid, run_processes, start_time, wait_gone
from ...records.paths import open_regular
from .keeper import FORKED_ENV, KEEPER_ENV, Keeper
from .reaper import REAPER, Reaper

if TYPE_CHECKING:  # imported where posix_spawn is missing (2 ms of a start with it)
    import subprocess

_RECENT = 30.0  # seconds after its start in which a run's pids are all above its first
_KNOWN_LIMIT = 1 << 16  # pids of other runs remembered by the stray scans (see Child._known)

LIFELINE_ENV = "GTS_LIFELINE_FD"
CWD_ENV = "GTS_CWD"  # where a command run's wrapper changes to (it is started where we are)
CONTROL_ENV = "GTS_CONTROL_FD"  # the warm process's control socket (forkserver.serve)
STOP_WORD = b"S"  # written on a warm command run's lifeline before its stop signal (forkserver.py)
ADOPTED_WORD = b"A"  # the first byte on a warm run's lifeline: the scheduler has made it its child


def open_log(log_path: str | None) -> int:
    """A run's log opened for its output (appended to; no link followed), or /dev/null for none."""
    if log_path:
        return open_regular(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)


_LOW_END = 10  # the child's descriptors 0-9 are placed by _spawn's actions (dash names only one digit)
# Popen resets these to their defaults in the child (Python ignores SIGPIPE); so do we.
_DEFAULT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name))


def _spawn(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    log_fd: int,
    placed: Sequence[tuple[int, int]],
    pass_fds: Sequence[int],
) -> int:
    """Start ``argv`` as the leader of a new session with ``posix_spawn`` (a vfork, not a copy of
    this process), stdin from /dev/null, stdout and stderr to ``log_fd``, each ``(ours, theirs)``
    of ``placed`` as descriptor ``theirs``, and of our other descriptors only ``pass_fds`` open
    (as they are numbered here). NotImplementedError where that cannot be done."""
    here = os.getcwd()
    if not hasattr(os, "POSIX_SPAWN_DUP2") or (cwd != here and os.path.realpath(cwd) != here):
        raise NotImplementedError  # posix_spawn cannot change the directory
    # The actions run in order, in the child: a descriptor of ours numbered where an earlier action
    # puts another (0-2, or 3-9 for ``placed``) would be lost before it is moved. With standard
    # input closed here, the lifeline's pipe got descriptor 0, /dev/null took its place, and every
    # run read its lifeline's end at once and died. Each is moved out of the way first (above 9).
    lifted: list[int] = []

    def clear(fd: int) -> int:
        if fd >= _LOW_END:
            return fd
        lifted.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _LOW_END))
        return lifted[-1]

    try:
        log_fd = clear(log_fd)
        placed = [(clear(ours), theirs) for ours, theirs in placed]
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, log_fd, 1),
            (os.POSIX_SPAWN_DUP2, log_fd, 2),
            *((os.POSIX_SPAWN_DUP2, ours, theirs) for ours, theirs in placed),  # dup2 clears close-on-exec
        ]
        # Our descriptors are close-on-exec (PEP 446), so the child gets only these. Only the
        # loop's thread starts runs, so no other start sees them inheritable meanwhile.
        for fd in pass_fds:
            os.set_inheritable(fd, True)
        try:
            spawn = os.posix_spawn if os.path.isabs(argv[0]) else os.posix_spawnp
            return spawn(argv[0], argv, env, file_actions=actions, setsid=True, setsigdef=_DEFAULT_SIGNALS)
        except TypeError as error:  # a Python without setsid=
            raise NotImplementedError from error
        finally:
            for fd in pass_fds:
                os.set_inheritable(fd, False)
    finally:
        for fd in lifted:
            os.close(fd)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


class Child:
    """A running child process, leader of its own process group."""

    # The sessions of this process's children that are not reaped yet (each child leads one, with
    # its pid as the session's id, which stays ours until the child is reaped): a scan for one
    # run's processes skips what is plainly another's (proctree.run_processes).
    _sessions: set[int] = set()
    # pid -> the session of another run it was found in, by the scans of runs that started since
    # the pids last wrapped around (no pid was handed out twice meanwhile, so it is still that
    # run's process, or gone): proctree.run_processes does not look at it again. Forgotten when
    # the last pid handed out went down, or when no scan looked for _RECENT seconds (in which,
    # as for a recent run's own scan, the pids cannot have gone all the way round unseen).
    _known: dict[int, int] = {}
    _latest = 0
    _looked_at = 0.0

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        cwd: str,
        log_path: str | None,
        on_exit: Callable[[], Any],
        token: str = "",
        inherit_fds: Sequence[int] = (),
        output: int | None = None,
        control: int | None = None,
        keeper: Keeper | None = None,
        reaper: Reaper = REAPER,
        marked: bool = True,
    ) -> None:
        """``output``: a descriptor for stdout and stderr instead of ``log_path``'s file (ours to
        close); ``control``: a socket the child finds in ``$GTS_CONTROL_FD`` (a pre-warmed runner's);
        ``keeper``: the keeper of a command run's wrapper (keeper.py), which gets the lifeline twice
        (``$GTS_LIFELINE_FD`` and ``$GTS_FORKED_FD``) and the keeper's mark; ``reaper``: who hears
        its end (the process's own reaper thread by default; the local launcher's loop-driven one);
        ``marked``: its environment carries its token (proctree's scans find its processes by it)."""
        read_end, self._lifeline = os.pipe()
        env = dict(env)
        # In the child the lifeline (and control socket) get low descriptors: the shell that runs
        # a command reads the lifeline with a redirection, and dash takes only one digit there (the
        # scheduler's own are often above 9). Where posix_spawn cannot be used, they keep theirs.
        low = sorted(set(range(3, _LOW_END)) - set(inherit_fds))
        second = control
        if keeper is not None:  # a command run's wrapper (prepare.py): started here, it changes directory
            keeper.ensure()
            second = os.dup(read_end)
            env[KEEPER_ENV] = keeper.marker
            env[FORKED_ENV] = str(low[1])
            env[CWD_ENV], cwd = cwd, os.getcwd()
        placed = [(read_end, low[0])] + ([] if second is None else [(second, low[1])])
        env[LIFELINE_ENV] = str(low[0])
        if control is not None:
            env[CONTROL_ENV] = str(low[1])
        self.token = token or os.urandom(16).hex()
        if marked:  # not a warm process's: its forks (other runs) show its first environment in /proc
            env[TOKEN_ENV] = self.token
        self.strays: list[int] = []  # processes of the run found outside its group, and stopped
        self.unstoppable: list[int] = []  # ... and those that could not be stopped
        # The run folder was checked; O_NOFOLLOW and a regular-file check close the gap to now.
        log = os.dup(output) if output is not None else open_log(log_path)
        self._popen: subprocess.Popen | None = None
        try:
            self.pid = _spawn(list(argv), env, cwd, log, placed, inherit_fds)
        except NotImplementedError:
            import subprocess

            env[LIFELINE_ENV] = str(read_end)
            if control is not None:
                env[CONTROL_ENV] = str(control)
            if keeper is not None:
                env[FORKED_ENV] = str(second)
            self._popen = subprocess.Popen(
                list(argv),
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(read_end, *inherit_fds, *([] if second is None else [second])),
                close_fds=True,
            )
            self.pid = self._popen.pid
        except BaseException:
            os.close(self._lifeline)
            raise
        finally:
            os.close(read_end)
            if keeper is not None and second is not None:
                os.close(second)
            os.close(log)
        self._follow(on_exit, reaper)

    @classmethod
    def adopted(
        cls, pid: int, *, lifeline: int, token: str, on_exit: Callable[[], Any], reaper: Reaper = REAPER
    ) -> Child:
        """A child started otherwise (a fork of a warm process, made ours: forkserver.py), leader of
        its own session, holding the read end of ``lifeline`` (whose write end is now ours)."""
        child = cls.__new__(cls)
        child.pid, child._lifeline, child.token, child._popen = pid, lifeline, token, None
        child.strays, child.unstoppable = [], []
        child.stop_word = True  # a command's: its success is recorded by itself, unless stopped
        os.set_blocking(lifeline, False)  # the stop word never waits on a full pipe
        child._follow(on_exit, reaper)
        return child

    stop_word = False  # tell the run on its lifeline that it is being stopped (a warm run: forkserver.py)

    def _follow(self, on_exit: Callable[[], Any], reaper: Reaper) -> None:
        Child._sessions.add(self.pid)
        # When it started (ticks), read at the first scan for its processes, not here: a scan comes
        # before it is reaped, while /proc still has it, and reading /proc/PID/stat of a child that
        # is just starting up cost the loop more than the rest of the start.
        self._since: int | None = None
        self._spawned = time.monotonic()
        self._returncode: int | None = None
        self._watcher: threading.Thread | None = None
        if self._popen is not None or not reaper.watch(self.pid, on_exit):
            self._watcher = threading.Thread(target=self._watch, args=(on_exit,), name=f"gts-watch-{self.pid}")
            self._watcher.daemon = True
            self._watcher.start()

    def _watch(self, on_exit: Callable[[], Any]) -> None:
        if hasattr(os, "waitid"):
            try:
                os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                pass
        else:  # macOS has no waitid; reaping here is the only way to wait
            self._wait()
        on_exit()

    def _wait(self) -> int:
        if self._popen is not None:
            return self._popen.wait()
        if self._returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self._returncode = os.waitstatus_to_exitcode(status)
        return self._returncode

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to every process of the run's group."""
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # the group is already gone

    def _processes(self) -> list[int]:
        """The run's live processes other than its first (a scan of /proc; see proctree)."""
        # Right after the start, pids above ours are all a run can have, unless the pids wrapped
        # around since; a run that has lived a while gets a full scan, however its pids went.
        latest = last_pid()
        recent = time.monotonic() - self._spawned < _RECENT and latest is not None and latest >= self.pid
        now = time.monotonic()
        if latest is None or latest < Child._latest or now - Child._looked_at > _RECENT:
            Child._known = {}  # the pids may have wrapped around: nothing is known
        elif len(Child._known) > _KNOWN_LIMIT:
            Child._known = {}
        Child._latest, Child._looked_at = latest or 0, now
        return run_processes(
            token=self.token,
            session=self.pid,
            since=self._started_at(),
            exclude=(self.pid,),
            above=self.pid - 1 if recent else 0,
            upto=latest,
            other_sessions=Child._sessions - {self.pid},
            known=Child._known if recent else None,
        )

    def _started_at(self) -> int | None:
        if self._since is None:
            self._since = start_time(self.pid)  # not reaped yet: its stat is there, ended or not
        return self._since

    def _outside_group(self) -> list[int]:
        return [pid for pid in self._processes() if _pgid(pid) != self.pid]

    def has_exited(self) -> bool:
        """The run's first process has ended (its exit event may still be on its way)."""
        if hasattr(os, "waitid"):
            try:
                return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
            except ChildProcessError:
                return True
        assert self._popen is not None  # where there is no waitid, children are started by Popen
        return self._popen.poll() is not None

    def others(self) -> list[int]:
        """Live processes of the run other than its first one (in its group or not)."""
        return self._processes()

    def terminate(self) -> None:
        """SIGTERM to the run's group and to its processes outside the group (a warm run is told
        first, so that it does not record a success: its command's wrapper traps the signal)."""
        if self.stop_word and self._lifeline >= 0:
            try:
                os.write(self._lifeline, STOP_WORD)
            except OSError:
                pass  # it has ended: nothing to record any more
        self.signal_group(signal.SIGTERM)
        kill_all(self._outside_group(), signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the run's group and every process of the run outside it."""
        self.signal_group(signal.SIGKILL)
        self._kill_strays()

    def _kill_strays(self) -> None:
        found = self._processes()
        if not found:
            return
        # A process still in the group has had the group's SIGKILL and may just not have died yet
        # (the command wrapper's watcher, killed as the wrapper exits): killed again, not reported.
        outside = [pid for pid in found if _pgid(pid) not in (None, self.pid)]  # None: gone meanwhile
        self.strays.extend(pid for pid in outside if pid not in self.strays)
        refused = kill_all(found)
        alive = wait_gone([pid for pid in found if pid not in refused], timeout=5)
        self.unstoppable = sorted(set(refused + alive))

    def reap(self) -> int:
        """After the exit event: kill what the run left behind, reap, and return the returncode.

        The run's first process is reaped last: until then its pid, which is
        also the id of the run's session, cannot be taken by another process."""
        self.kill()
        Child._sessions.discard(self.pid)  # from here on, its pid may be another process's
        returncode = self._wait()
        if self._watcher is not None:
            self._watcher.join()
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1
        return returncode
