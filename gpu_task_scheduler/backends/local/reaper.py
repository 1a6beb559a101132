"""Hearing every run's end: the runs' pidfds in one epoll set.

A pidfd (Linux 5.3 and later) becomes readable when its process ends, so one
epoll instance watches every run at once. The reaper never reaps: the child
stays a zombie until the engine reaps it, so its pid (also its process
group's and session's id) cannot be reused while the engine may still signal
it. Where pidfds are missing (macOS, old kernels) :meth:`Reaper.watch` says so
and the caller watches with a thread.

Who waits on the epoll set:

* the scheduler's own loop, for the local launcher (a *driven* reaper): the
  epoll descriptor is one of the descriptors the loop's inbox sleeps on, and
  :meth:`Reaper.dispatch` runs on the loop's thread when it is readable. A
  run's end then reaches the loop without a thread in between: no wake-up of
  another thread and no hand-over of the interpreter lock per run (in a sweep
  of short runs those were a tenth of the scheduler's CPU time);
* otherwise one thread of the reaper's own (:data:`REAPER`: a run supervisor
  on a cluster node, tests that start children without a loop), started at
  the first watch, which idles in ``epoll_wait`` while nothing is watched.

Callbacks must not block (``LocalHandle.exited`` hands a slow case to a
thread of its own), and run one after another.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Callable

logger = logging.getLogger("gpu_task_scheduler")


class Reaper:
    def __init__(self, *, driven: bool = False) -> None:
        """``driven``: its owner waits on :meth:`fileno` and calls :meth:`dispatch`; no thread."""
        self._lock = threading.Lock()
        self._watched: dict[int, Callable[[], None]] = {}  # pidfd -> what to call when its process ends
        self._epoll: select.epoll | None = None
        self._driven = driven
        self._thread: threading.Thread | None = None

    def _set(self) -> select.epoll:
        if self._epoll is None:
            self._epoll = select.epoll()  # close-on-exec: no run inherits it
        return self._epoll

    @property
    def driven(self) -> bool:
        """Whether ends are heard on its owner's thread (:meth:`dispatch`), not on a thread of its own."""
        return self._driven

    def fileno(self) -> int:
        """A descriptor that is readable while a watched process has ended (for a driven reaper's owner)."""
        with self._lock:
            return self._set().fileno()

    def watch(self, pid: int, on_exit: Callable[[], None]) -> bool:
        """Call ``on_exit()`` once ``pid``, our child, has ended: from :meth:`dispatch` (a driven
        reaper) or on the reaper's thread. False if this system has no pidfds: then nothing was done."""
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is None or not hasattr(select, "epoll"):
            return False
        try:
            pidfd = pidfd_open(pid)
        except OSError:  # ENOSYS (an old kernel), or a sandbox that forbids it
            return False
        with self._lock:
            self._watched[pidfd] = on_exit
            # A thread blocked in epoll_wait on this set sees a descriptor added meanwhile (epoll(7)).
            self._set().register(pidfd, select.EPOLLIN)
            if not self._driven and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, name="gts-reaper", daemon=True)
                self._thread.start()
        return True

    def dispatch(self, timeout: float = 0.0) -> None:
        """Call ``on_exit()`` of every watched process that has ended, on this thread; wait up to
        ``timeout`` seconds for one (-1: for ever)."""
        epoll = self._epoll
        if epoll is None:
            return
        try:
            ready = epoll.poll(timeout)
        except (OSError, ValueError):  # closed meanwhile (close(), at the sweep's end)
            return
        for pidfd, _ in ready:
            with self._lock:
                on_exit = self._watched.pop(pidfd, None)
                if on_exit is None:
                    continue
                epoll.unregister(pidfd)
            os.close(pidfd)
            try:
                on_exit()
            except Exception:  # the others must still be heard
                logger.exception("reporting the end of a run failed")

    def _run(self) -> None:
        while self._epoll is not None:  # the process's reaper is never closed; a closed one's thread ends
            self.dispatch(-1)

    def close(self) -> None:
        """Stop watching (a driven reaper whose owner is done: its children were reaped without it)."""
        with self._lock:
            for pidfd in self._watched:
                os.close(pidfd)
            self._watched.clear()
            if self._epoll is not None:
                self._epoll.close()
                self._epoll = None


# One per process, with a thread: for children started where no loop waits on a reaper of its own.
REAPER = Reaper()
