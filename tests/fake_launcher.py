"""A world without processes for engine tests: a fake clock, an inbox that advances it, and a launcher.

Each run "runs" for ``config["seconds"]`` of fake time and then ends as its config says:
``exit`` (0: success, recorded in an outcome file as the runner would; else that exit code),
``oom`` (a CUDA out-of-memory line in its log), ``trap_term`` (it ignores SIGTERM: only SIGKILL
ends it), ``term_takes`` (seconds it needs after SIGTERM to stop), ``hang_until_attempt``
(attempts before this one never end by themselves), ``noticed_after`` (seconds between the end
and its report reaching the loop, as when the scheduler was suspended). Nothing waits on the
wall clock: when the loop would sleep, the clock jumps to the next thing that happens.
"""

import heapq
import itertools
import os
import queue

from gpu_task_scheduler.engine.launcher import Abilities, BaseLauncher, Ended
from gpu_task_scheduler.records.protocol import Outcome

OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"


class FakeWorld(BaseLauncher):
    abilities = Abilities()  # it starts attempts, and does nothing else a launcher may

    def __init__(self):
        self.now = 0.0
        self._timed = []  # (time, seq, callback)
        self._ready = []  # events posted now
        self._seq = itertools.count()
        self.starts = []  # (time, run name, slot name)
        self.stops = []  # (time, run name, "term" or "kill")

    # the clock
    def clock(self):
        return self.now

    def at(self, when, callback):
        heapq.heappush(self._timed, (when, next(self._seq), callback))

    # the inbox
    def put(self, kind, value=None):
        self._ready.append((kind, value))

    def get(self, timeout):
        until = None if timeout is None else self.now + timeout
        while not self._ready:
            if self._timed and (until is None or self._timed[0][0] <= until):
                when, _, callback = heapq.heappop(self._timed)
                self.now = max(self.now, when)
                callback()
                continue
            if until is None:
                raise AssertionError("the loop waits with nothing running and no deadline: it would hang")
            self.now = until
            raise queue.Empty
        return self._ready.pop(0)

    # the launcher
    def open(self, lock_fd):
        self.lock_fd = lock_fd

    def close(self):  # the launcher's and the inbox's (this world is both)
        self.closed = True

    def start(self, attempt, on_exit, on_placed=None):
        if attempt.spec.config.get("refuse"):
            from gpu_task_scheduler.engine.launcher import LaunchError

            raise LaunchError("refused by the fake launcher")
        os.makedirs(attempt.paths.meta, exist_ok=True)
        handle = FakeHandle(self, attempt, on_exit)
        self.starts.append((self.now, attempt.spec.name, attempt.slot.name))
        return handle


class FakeHandle:
    _pids = itertools.count(10_000_000)

    def __init__(self, world, attempt, on_exit):
        self.world, self.attempt, self._on_exit = world, attempt, on_exit
        self.pid = next(self._pids)
        self.reports_outcome = True
        config = attempt.spec.config
        self.config = config
        self.returncode = None
        self._generation = 0
        open(os.path.join(attempt.spec.work_dir, "ready"), "w").close()
        hangs = attempt.number < config.get("hang_until_attempt", 0)
        self._end_at(world.now + (1e9 if hangs else config.get("seconds", 1.0)), natural=True)

    def _end_at(self, when, *, natural, returncode=None):
        self._generation += 1
        generation = self._generation
        self.exit_time = when

        def end():
            if generation != self._generation or self.returncode is not None:
                return
            self.returncode = returncode if not natural else self._natural_end()
            self.world.at(self.world.now + self.config.get("noticed_after", 0.0), self._on_exit)

        self.world.at(when, end)

    def _natural_end(self):
        config, paths = self.config, self.attempt.paths
        code = config.get("exit", 0)
        if config.get("oom"):
            with open(paths.log, "a") as log:
                log.write(OOM_LINE)
            return 1
        status = "succeeded" if code == 0 else "failed"
        Outcome(
            status=status,
            token=self.attempt.token,
            config_hash=self.attempt.spec.config_hash,
            result={"name": self.attempt.spec.name} if code == 0 else None,
            phase=None if code == 0 else "main",
            error=None if code == 0 else f"SystemExit: {code}",
        ).write(paths.outcome)
        return code

    def stop(self):
        self.world.stops.append((self.world.now, self.attempt.spec.name, "term"))
        if self.returncode is None and not self.config.get("trap_term"):
            self._end_at(self.world.now + self.config.get("term_takes", 0.0), natural=False, returncode=-15)

    def kill(self):
        self.world.stops.append((self.world.now, self.attempt.spec.name, "kill"))
        if self.returncode is None:
            self._end_at(self.world.now, natural=False, returncode=-9)

    def has_exited(self):
        return self.returncode is not None or self.world.now >= self.exit_time

    def reap(self):
        return Ended(returncode=self.returncode if self.returncode is not None else -9)
