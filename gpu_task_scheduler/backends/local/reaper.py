"""One thread that hears every run's end: the runs' pidfds in one poll set.

A thread per child blocked in ``waitid`` costs a thread start for every run
and a thread for every running one. With pidfds (Linux 5.3 and later) one
thread watches them all: a pidfd becomes readable when its process ends. The
reaper never reaps: the child stays a zombie until the engine reaps it, so
its pid (also its process group's and session's id) cannot be reused while
the engine may still signal it. Where pidfds are missing (macOS, old
kernels) :meth:`Reaper.watch` says so and the caller watches with a thread.

Callbacks run on the reaper's thread, one after another: they must not block
(``LocalHandle.exited`` hands a slow case to a thread of its own).
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Callable

logger = logging.getLogger("gpu_task_scheduler")


class Reaper:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, Callable[[], None]] = {}  # pidfd -> what to call when its process ends
        self._wake: tuple[int, int] | None = None  # a pipe that makes the thread look at _watched again
        self._thread: threading.Thread | None = None

    def watch(self, pid: int, on_exit: Callable[[], None]) -> bool:
        """Call ``on_exit()`` (on the reaper's thread) once ``pid``, our child, has ended.
        False if this system has no pidfds: then nothing was done."""
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is None:
            return False
        try:
            pidfd = pidfd_open(pid)
        except OSError:  # ENOSYS (an old kernel), or a sandbox that forbids it
            return False
        with self._lock:
            self._watched[pidfd] = on_exit
            if self._thread is None or not self._thread.is_alive():
                if self._wake is None:
                    self._wake = os.pipe()
                    os.set_blocking(self._wake[1], False)
                self._thread = threading.Thread(target=self._run, name="gts-reaper", daemon=True)
                self._thread.start()
            else:
                assert self._wake is not None
                try:
                    os.write(self._wake[1], b"\0")
                except BlockingIOError:
                    pass  # the pipe is full of wake-ups already: the thread will look
        return True

    def _run(self) -> None:
        assert self._wake is not None
        poller = select.poll()
        poller.register(self._wake[0], select.POLLIN)
        polled: set[int] = set()
        while True:
            with self._lock:
                for pidfd in self._watched.keys() - polled:
                    poller.register(pidfd, select.POLLIN)
                    polled.add(pidfd)
            for fd, _ in poller.poll():
                if fd == self._wake[0]:
                    os.read(fd, 4096)
                    continue
                poller.unregister(fd)
                polled.discard(fd)
                with self._lock:
                    on_exit = self._watched.pop(fd)
                os.close(fd)
                try:
                    on_exit()
                except Exception:  # the thread must live on for the other runs
                    logger.exception("reporting the end of a run failed")


# One per process: its thread idles in poll() while no run is watched.
REAPER = Reaper()
