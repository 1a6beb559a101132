"""What the Slurm backend's two launchers share (job arrays, ``launcher.py``; pools, ``pool.py``):
the handle of an attempt that runs on a node, the thread that follows the attempts through the
files their supervisors write and one ``squeue`` per ``poll_interval``, the attempts an earlier
start left to adopt, and a run prepared for a supervisor on another machine."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ...engine.launcher import Attempt, BaseLauncher, Ended, LaunchError, OnPlaced
from ...gpu_task import GPUTask
from ...sweep.options import SchedulerOptions
from ...sweep.slurm import SlurmOptions
from ..local.prepare import TaskFactory, class_factory, log_launch_failure, prepare_attempt
from ..supervisor import remote_run
from .resources import Resources

logger = logging.getLogger("gpu_task_scheduler")

EVENT_EVERY = 0.2  # seconds between two listings of the events folder
LOOK_GAP = 0.5  # seconds at least between two squeues, also those an end asks for at once (slurmctld is shared)
REAP_WAIT = 120.0  # seconds a killed attempt's end is waited for when the sweep is given up


class Following(BaseLauncher):
    """A launcher whose attempts run on Slurm's nodes, followed by a thread of its own. Subclasses
    say what one turn of it does (``_send_requests``, ``_read_events``, ``_look``) and keep what an
    earlier start left in ``_adoptable`` (run name -> (token, ...))."""

    following = "the sweep's Slurm tasks"  # in the words of a failure of the following thread

    def __init__(self, task: type[GPUTask] | TaskFactory, options: SchedulerOptions, *, detach: bool) -> None:
        self._make_task = class_factory(task) if isinstance(task, type) else task
        self._o, self._s = options, options.slurm or SlurmOptions()  # (None unless backend slurm)
        self._asks = Resources(options)  # what each job asks Slurm for
        self._detach = detach
        self._lock = threading.RLock()
        self._adoptable: dict[str, tuple[Any, ...]] = {}
        self._ids = iter(range(1, 1 << 62))
        self._wake = threading.Event()
        self._closing = False
        self._follower: threading.Thread | None = None
        self._next_look = 0.0  # when the next squeue is due (an end Slurm may have caused sets it to now)
        self._looked = -LOOK_GAP
        self._said: str | None = None  # the last error squeue gave (said once)

    def __exit__(self, *exc: object) -> None:
        self._end_following()

    def _start_following(self, name: str) -> None:
        self._follower = threading.Thread(target=self._follow, name=name, daemon=True)
        self._follower.start()

    def _end_following(self) -> None:
        self._closing = True
        self._wake.set()
        if self._follower is not None and self._follower is not threading.current_thread():
            self._follower.join(timeout=30)

    def live_attempt(self, name: str) -> str | None:
        with self._lock:
            found = self._adoptable.get(name)
            return None if found is None else str(found[0])

    def _prepared(self, attempt: Attempt) -> dict[str, Any]:
        """What a supervisor on a node needs to run the attempt (its folder prepared here); raises
        LaunchError or OSError (the run's log says why)."""
        try:
            launch = prepare_attempt(attempt, self._make_task)
        except (LaunchError, OSError) as error:
            log_launch_failure(attempt.paths, error)
            raise
        return {**remote_run(attempt, launch, self._o.grace_period), "name": attempt.spec.name}

    def _handle(
        self, attempt: Attempt, run: dict[str, Any], on_exit: Callable[[], None], on_placed: OnPlaced | None
    ) -> SlurmHandle:
        return SlurmHandle(
            self,
            attempt.token,
            pid=-next(self._ids),
            reports_outcome=run["reports_outcome"],
            on_exit=on_exit,
            on_placed=on_placed,
        )

    def request(self, token: str, signal_name: str) -> None:
        raise NotImplementedError

    def _send_requests(self) -> None:
        raise NotImplementedError

    def _read_events(self) -> None:
        raise NotImplementedError

    def _look(self) -> None:
        raise NotImplementedError

    def _follow(self) -> None:
        while not self._closing:
            try:
                self._send_requests()
                self._read_events()
                now = time.monotonic()
                if now >= self._next_look and now - self._looked >= LOOK_GAP:
                    self._next_look, self._looked = now + self._s.poll_interval, now
                    self._look()
            except Exception:  # never let the following thread die: the engine waits on it
                logger.exception("following %s failed; trying again", self.following)
            self._wake.wait(EVENT_EVERY)
            self._wake.clear()


def _running_for(started_at: object) -> float:
    """Seconds since a task's start event's ``at`` (the node's clock; 0 when there is none, or when
    the clocks disagree so that it reads as in the future): an attempt a restarted scheduler follows
    keeps the clock its timeout counts on. Clocks a cluster keeps in step (NTP) differ by far less
    than a timeout; a node clock ahead of this one shortens it by as much."""
    if isinstance(started_at, bool) or not isinstance(started_at, (int, float)) or not math.isfinite(started_at):
        return 0.0
    return max(0.0, time.time() - started_at)


class _Requests(Protocol):
    def request(self, token: str, signal_name: str) -> None: ...


class SlurmHandle:
    """One attempt as a task of a Slurm job array (or in a pool, see ``pool.py``)."""

    def __init__(
        self,
        launcher: _Requests,
        token: str,
        *,
        pid: int,
        reports_outcome: bool,
        on_exit: Callable[[], None],
        on_placed: OnPlaced | None,
    ) -> None:
        self.pid = pid  # none here: its process runs on a node
        self.token = token
        self.reports_outcome = reports_outcome
        self.on_exit, self.on_placed = on_exit, on_placed
        self.node: str | None = None
        self.ended: Ended | None = None
        self.fencing = False  # given up: its end comes once its lease is over
        self.over = threading.Event()  # set with ``ended``
        self._launcher = launcher

    def stop(self) -> None:
        self._launcher.request(self.token, "TERM")

    def kill(self) -> None:
        self._launcher.request(self.token, "KILL")

    def has_exited(self) -> bool:
        return self.ended is not None

    def reap(self) -> Ended:
        """Its end; called before the exit report only when the engine gives up on the sweep (it
        killed the attempt): waits for the kill to be heard of, within bounds."""
        if not self.over.wait(timeout=REAP_WAIT):
            return Ended(returncode=-9, lost=f"no end heard from Slurm within {REAP_WAIT:g}s of killing it")
        assert self.ended is not None
        return self.ended
