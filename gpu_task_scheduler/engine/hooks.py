"""Callbacks around runs, the loop's inbox, and stop signals turned into events."""

from __future__ import annotations

import logging
import queue
import signal
import threading
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
    with one that advances a fake clock instead of waiting."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()

    def put(self, kind: str, value: Any = None) -> None:
        self._queue.put((kind, value))

    def get(self, timeout: float | None) -> tuple[str, Any]:
        return self._queue.get(timeout=timeout)


class StopSignals:
    """While active (in the main thread), SIGINT, SIGTERM and SIGHUP (or ``signals``) only post an event."""

    def __init__(self, inbox: Inbox, signals: Sequence[int] = STOP_SIGNALS) -> None:
        self._inbox = inbox
        self._signals = signals
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        self._inbox.put("signal", signum)  # SimpleQueue.put is safe in a signal handler

    @property
    def installed(self) -> bool:
        """Whether the signals are ours now (only the main thread can take them)."""
        return bool(self._previous)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in self._signals:
                self._previous[signum] = signal.signal(signum, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
