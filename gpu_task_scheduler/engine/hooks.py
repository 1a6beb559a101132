"""Callbacks around runs, the loop's inbox, and stop signals turned into events."""

from __future__ import annotations

import logging
import math
import os
import queue
import select
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..gpu.devices import Slot
from ..sweep.expand import RunSpec
from .summary import RunOutcome, SweepSummary

logger = logging.getLogger("gpu_task_scheduler")

# SIGHUP (the terminal closed) stops the sweep as gracefully as Ctrl-C.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Hooks:
    """Callbacks around runs; the scheduler logs and ignores exceptions they raise."""

    def on_run_start(self, spec: RunSpec, slot: Slot) -> None:
        pass

    def on_run_end(self, outcome: RunOutcome) -> None:
        pass

    def on_skip(self, spec: RunSpec) -> None:
        pass

    def on_sweep_end(self, summary: SweepSummary) -> None:
        pass

    def close(self) -> None:
        """Release what the hook holds (the live status line's ticker); called once the sweep ends."""


class HookList(Hooks):
    """Several hooks, then plain functions (``on_run_end=`` of ``GPUTaskScheduler``), in order.

    A hook that raises is logged and the others still run; a function's
    exception reaches the engine, which logs it the same way.
    """

    def __init__(self, hooks: Sequence[Hooks] = (), **functions: Callable[..., Any] | None) -> None:
        self._hooks = list(hooks)
        self._functions = functions

    def _each(self, name: str, *args: Any) -> None:
        for hook in self._hooks:
            try:
                getattr(hook, name)(*args)
            except Exception:
                logger.exception("the %s callback raised; the sweep goes on", name)
        function = self._functions.get(name)
        if function is not None:
            function(*args)

    def on_run_start(self, spec: RunSpec, slot: Slot) -> None:
        self._each("on_run_start", spec, slot)

    def on_run_end(self, outcome: RunOutcome) -> None:
        self._each("on_run_end", outcome)

    def on_skip(self, spec: RunSpec) -> None:
        self._each("on_skip", spec)

    def on_sweep_end(self, summary: SweepSummary) -> None:
        self._each("on_sweep_end", summary)

    def close(self) -> None:
        for hook in self._hooks:
            close = getattr(hook, "close", None)  # hooks need not subclass Hooks
            if close is not None:
                close()


class Inbox:
    """The loop's events: ``("exit", key)``, ``("signal", signum)``, ``("wake", None)``.

    ``get`` blocks until one arrives or ``timeout`` seconds pass (queue.Empty).
    Posting is safe from any thread and from a signal handler. Tests replace it
    with one that advances a fake clock instead of waiting.

    A launcher may also give the inbox descriptors to wait on (:meth:`watch`: the
    local launcher's set of its runs' pidfds). ``get`` then sleeps in ``poll``
    on them and on a wake-up pipe, and calls a descriptor's ``on_ready()`` on
    the loop's thread when it is readable, which posts the events; a post from
    another thread (or a signal handler) while the loop sleeps writes to the
    pipe. Without such descriptors ``get`` is a plain queue's."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._sources: dict[int, Callable[[], None]] = {}
        self._poller: select.poll | None = None  # once something is watched
        self._wake: tuple[int, int] | None = None  # the pipe that ends a sleep in poll
        self._sleeping = False  # get() is in poll, or about to be: a post must write to the pipe
        self._old_wakeup: int | None = None  # the signal wake-up fd before ours (watch), put back at close

    def put(self, kind: str, value: Any = None) -> None:
        self._queue.put((kind, value))  # SimpleQueue.put is safe in a signal handler
        if self._sleeping and self._wake is not None:
            try:
                os.write(self._wake[1], b"\0")
            except OSError:  # full of wake-ups already (or closed at the end): the loop wakes anyway
                pass

    def watch(self, fd: int, on_ready: Callable[[], None]) -> bool:
        """Wait on ``fd`` too, calling ``on_ready()`` on the loop's thread when it is readable (which
        posts what happened); True (an inbox that cannot returns False, and the caller waits itself)."""
        if self._poller is None:
            self._wake = os.pipe()
            for end in self._wake:
                os.set_blocking(end, False)
            self._poller = select.poll()
            self._poller.register(self._wake[0], select.POLLIN)
            # A signal the OS hands to another thread of ours (a launcher's, a feed's) does not
            # interrupt the poll below, and Python runs its handler only once the main thread is
            # back in the interpreter: with no deadline, a SIGINT then waited for good (seen: `gts
            # run` ignored SIGHUP for 30 s). The wake-up fd has the C handler write to our pipe.
            try:
                self._old_wakeup = signal.set_wakeup_fd(self._wake[1])
            except ValueError:  # not the main thread: no handler of ours runs here anyway
                self._old_wakeup = None
        self._poller.register(fd, select.POLLIN)
        self._sources[fd] = on_ready
        return True

    def interrupt_fd(self) -> int | None:
        """A descriptor that is readable once a signal with a handler of ours came (its wake-up fd)
        and the loop has not woken since: a launcher that blocks the loop's thread for long (the
        first warm start) waits on it too, and gives up its wait, so that a Ctrl-C is acted on at
        once. None where the inbox has no such pipe (nothing is watched)."""
        return None if self._wake is None else self._wake[0]

    def unwatch(self, fd: int) -> None:
        if self._sources.pop(fd, None) is not None and self._poller is not None:
            self._poller.unregister(fd)

    def close(self) -> None:
        """Release the wake-up pipe (the loop is over)."""
        if self._wake is not None:
            if self._old_wakeup is not None:
                try:
                    signal.set_wakeup_fd(self._old_wakeup)
                except ValueError:
                    pass
                self._old_wakeup = None
            for end in self._wake:
                os.close(end)
            self._wake, self._poller = None, None
            self._sources.clear()

    def get(self, timeout: float | None) -> tuple[str, Any]:
        if not self._sources:
            return self._queue.get(timeout=timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self._queue.get_nowait()
            except queue.Empty:
                pass
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._sleeping = True
            try:
                try:  # posted after the look above, before _sleeping was set: no wake-up was written
                    return self._queue.get_nowait()
                except queue.Empty:
                    pass
                assert self._poller is not None
                ready = self._poller.poll(None if wait is None else math.ceil(wait * 1000))
            finally:
                self._sleeping = False
            for fd, _ in ready:
                if self._wake is not None and fd == self._wake[0]:
                    try:
                        while os.read(fd, 4096):
                            pass
                    except BlockingIOError:
                        pass
                else:
                    on_ready = self._sources.get(fd)
                    if on_ready is not None:
                        on_ready()
            if not ready and deadline is not None and time.monotonic() >= deadline:
                try:
                    return self._queue.get_nowait()
                except queue.Empty:
                    raise queue.Empty from None


class StopSignals:
    """While active (in the main thread), SIGINT, SIGTERM and SIGHUP (or ``signals``) only post an event.

    A signal the process was started with ignored stays ignored: ``nohup gts run ...`` (SIGHUP), a
    background job of a shell without job control (SIGINT). The user asked for the sweep to outlive
    the terminal; taking SIGHUP over stopped it when the terminal closed."""

    def __init__(self, inbox: Inbox, signals: Sequence[int] = STOP_SIGNALS) -> None:
        self._inbox = inbox
        self._signals = signals
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        self._inbox.put("signal", signum)  # Inbox.put is safe in a signal handler

    @property
    def installed(self) -> bool:
        """Whether the signals are ours now (only the main thread can take them)."""
        return bool(self._previous)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in self._signals:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
