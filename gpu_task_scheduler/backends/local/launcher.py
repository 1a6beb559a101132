"""The local launcher: each attempt is a process on this machine.

A Python task runs in ``python -c <runner boot>`` (``runner.py``) with its
pickled task object, and a command that runs Python (``command: [python, train.py, ...]``) as
that script; with ``prewarm`` (the default) either is forked from the sweep's warm process, which
imported what the runs import (``zygote.py``). Any other command (``gts queue``) runs in a small
POSIX sh wrapper that keeps the lifeline. Either way the process leads its own session
and process group, holds the root's lock descriptor (so the root stays locked
while any run of it lives), and is stopped as a whole (``process.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...engine.launcher import Abilities, Attempt, BaseLauncher, Ended, LaunchError, OnPlaced
from ...gpu_task import GPUTask
from ...proctree import wait_gone
from ...records.paths import RunPaths
from .keeper import Keeper
from .keeper import available as keeper_available
from .prepare import Launch, TaskFactory, class_factory, log_launch_failure, prepare_attempt, warm_candidate
from .process import Child
from .reaper import REAPER, Reaper

if TYPE_CHECKING:  # imported at the first Python run: a sweep of other commands never needs it (socket, 2 ms)
    from .zygote import WarmStarts

_DRAIN_SLACK = 60.0  # seconds beyond the grace period a stopped run's processes are waited for


class LocalLauncher(BaseLauncher):
    abilities = Abilities(watches=True)  # the loop waits on its runs' pidfds itself (attach)

    def __init__(
        self,
        task: type[GPUTask] | TaskFactory,
        *,
        grace_period: float = 10.0,
        prewarm: bool = False,
        warm_imports: tuple[str, ...] = (),
    ) -> None:
        """``task``: a GPUTask subclass (built as ``task(config, work_dir)`` per run) or a factory of
        tasks. ``prewarm``: fork Python runs from a warm process (``zygote.py``) that imports
        ``warm_imports`` and what the runs are seen to import."""
        self._make_task = class_factory(task) if isinstance(task, type) else task
        self._lock_fd: int | None = None
        self._grace_period = grace_period
        self._prewarm = prewarm
        self._warm_imports = warm_imports
        self._warm_starts: WarmStarts | None = None  # the Python commands' warm process, from the first one on
        self._keeper: Keeper | None = None  # the command runs' lifeline, from the first one on
        self._reaper = REAPER  # who hears the runs' ends: the loop itself once attach() was called
        self._inbox: Any = None

    def open(self, lock_fd: int) -> None:
        self._lock_fd = lock_fd

    def attach(self, inbox: Any) -> None:
        """The loop's inbox: where it can wait on descriptors (Inbox.watch), the loop waits on the runs'
        pidfds itself and hears of their ends on its own thread (reaper.py); else a thread does."""
        watch = getattr(inbox, "watch", None)
        if watch is None:
            return
        reaper = Reaper(driven=True)
        if watch(reaper.fileno(), reaper.dispatch):
            self._reaper, self._inbox = reaper, inbox
        else:
            reaper.close()

    def close(self) -> None:
        """Discard the runners still waiting: the sweep is over."""
        if self._warm_starts is not None:
            self._warm_starts.close()
            self._warm_starts = None
        if self._keeper is not None:
            self._keeper.close()
            self._keeper = None
        if self._inbox is not None:  # every run has been reaped: nothing is left to hear of
            self._inbox.unwatch(self._reaper.fileno())
            self._reaper.close()
            self._reaper, self._inbox = REAPER, None

    def start(self, attempt: Attempt, on_exit: Callable[[], None], on_placed: OnPlaced | None = None) -> LocalHandle:
        paths = attempt.paths
        inherit = () if self._lock_fd is None else (self._lock_fd,)
        try:
            launch = prepare_attempt(attempt, self._make_task)
            handle = LocalHandle(reports_outcome=not launch.direct, grace_period=self._grace_period)
            forked = self._forked(launch, attempt, handle.exited_to(on_exit), inherit)
            if forked is not None:
                handle.child = forked
                handle.after_reap = self._learn_from(paths)
            else:
                handle.child = Child(
                    launch.argv,
                    env=launch.env,
                    cwd=launch.cwd,
                    log_path=paths.log,
                    on_exit=handle.exited_to(on_exit),
                    token=attempt.token,
                    inherit_fds=inherit,
                    keeper=self._keeper_for(launch),
                    reaper=self._reaper,
                )
        except (LaunchError, OSError) as error:
            log_launch_failure(paths, error)
            raise
        handle.pid = handle.child.pid
        return handle

    def _forked(
        self, launch: Launch, attempt: Attempt, on_exit: Callable[[], None], inherit: tuple[int, ...]
    ) -> Child | None:
        """A Python attempt (a GPUTask run, or a command running Python) forked from the warm process
        (None: it starts cold)."""
        if not self._prewarm or not warm_candidate(launch):
            return None
        if self._warm_starts is None:
            from .zygote import WarmStarts

            interrupt = getattr(self._inbox, "interrupt_fd", lambda: None)()  # a Ctrl-C ends the first wait
            self._warm_starts = WarmStarts(self._reaper, inherit, self._warm_imports, interrupt=interrupt)
        return self._warm_starts.start(launch, attempt.paths, attempt.token, on_exit, self._reaper)

    def _learn_from(self, paths: RunPaths) -> Callable[[], None]:
        warm_starts = self._warm_starts
        assert warm_starts is not None
        return lambda: warm_starts.learned(paths)

    def _keeper_for(self, launch: Launch) -> Keeper | None:
        """The sweep's keeper, for a command run (none for a Python run: its runner keeps its lifeline)."""
        if not launch.direct or not keeper_available():
            return None
        if self._keeper is None:
            self._keeper = Keeper()
        return self._keeper


class LocalHandle:
    child: Child
    pid: int
    keeper: Keeper | None = None  # a keeper of this run's own (a remote supervisor's), ended after the reap
    after_reap: Callable[[], None] | None = None  # a forked run's: the warm starts learn what it imported

    def __init__(self, *, reports_outcome: bool, grace_period: float) -> None:
        self.reports_outcome = reports_outcome
        self._grace_period = grace_period
        self._stopping = False
        self._killed = False

    def exited_to(self, on_exit: Callable[[], None]) -> Callable[[], None]:
        return lambda: self.exited(on_exit)

    def exited(self, on_exit: Callable[[], None]) -> None:
        """The first process ended (the reaper's callback, on the loop's thread or the reaper's own:
        must not block). A run that was asked to
        stop and whose other processes still run (a shell that ran the command, workers saving
        state) keeps its grace period: its exit is reported when they are gone, or when kill()
        has ended them; a thread of its own waits for that."""
        others = self.child.others() if self._stopping and not self._killed else []
        if not others:
            on_exit()
            return

        def drain() -> None:
            wait_gone(others, timeout=self._grace_period + _DRAIN_SLACK)  # not our children: pidfds
            on_exit()

        threading.Thread(target=drain, name=f"gts-drain-{self.pid}", daemon=True).start()

    def stop(self) -> None:
        self._stopping = True
        self.child.terminate()

    def kill(self) -> None:
        self._killed = True
        self.child.kill()

    def has_exited(self) -> bool:
        return self.child.has_exited()

    def reap(self) -> Ended:
        returncode = self.child.reap()
        if self.keeper is not None:
            self.keeper.close()
            self.keeper = None
        if self.after_reap is not None:
            self.after_reap()
        return Ended(returncode=returncode, strays=tuple(self.child.strays), unstoppable=tuple(self.child.unstoppable))
