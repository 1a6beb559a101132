"""Pre-warmed runners: a slot's next process is started while its current run works.

A Python run's process spends most of its start importing: the interpreter,
this package, the task's module (PyTorch takes seconds). So when a run starts
on a slot, the launcher starts a runner for the slot's *next* run at once
(``runner.run_warm``): it imports the task's module, then waits on a control
socket. When the slot frees, its next run is handed over (its start record and
its log descriptor, ``SCM_RIGHTS``) and starts in milliseconds.

What keeps this safe:

* a warm runner is started with its slot's environment (``CUDA_VISIBLE_DEVICES``
  fixed at spawn) and is used only by a run on that slot whose environment and
  imports are the same; anything else gets a fresh process and the warm one is
  discarded. Until its run arrives it does nothing but import: it touches no
  GPU (importing PyTorch does not initialise CUDA) and writes nothing;
* it is a child like any run: it leads its own session, holds the lifeline
  and the root's lock, and dies with the scheduler;
* what it prints while importing goes to a temporary file and is copied to
  the top of its run's log, so a run's log holds everything its process said;
* the user's module-level code runs once per process, as with a fresh one;
* it is discarded (SIGKILL to its group, reaped) when the sweep ends, and a
  warm runner that dies before it gets a run is simply not used.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from collections.abc import Callable, Sequence

from ...gpu.devices import Slot
from ...records.paths import RunPaths, open_regular
from .prepare import Launch, Preload, runner_argv
from .process import Child
from .reaper import REAPER, Reaper


class WarmRunner:
    def __init__(
        self, slot: Slot, launch: Launch, preload: Preload, inherit_fds: Sequence[int], reaper: Reaper = REAPER
    ) -> None:
        self.slot, self.env, self.preload = slot.name, launch.env, preload
        self._lock = threading.Lock()
        self._dead = False
        self._on_exit: Callable[[], None] | None = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with tempfile.TemporaryFile() as output:  # what it prints while importing
                self.child = Child(
                    runner_argv(preload),
                    env=launch.env,
                    cwd=launch.cwd,
                    log_path=None,
                    on_exit=self._exited,
                    inherit_fds=inherit_fds,
                    output=output.fileno(),
                    control=theirs.fileno(),
                    reaper=reaper,
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._control = ours

    def _exited(self) -> None:
        """Its process ended (the reaper's callback): to the run's handle once it has one; else it is
        no longer usable."""
        with self._lock:
            self._dead = True
            on_exit = self._on_exit
        if on_exit is not None:
            on_exit()

    def fits(self, launch: Launch) -> bool:
        return launch.env == self.env and launch.preload == self.preload and launch.spec_file is not None

    def hand_over(self, launch: Launch, paths: RunPaths, on_exit: Callable[[], None]) -> bool:
        """Give the run to this process; False (and nothing changed) if it died meanwhile."""
        assert launch.spec_file is not None
        if paths.log:  # as for a fresh process: no link followed, appended to
            log = open_regular(paths.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        else:
            log = os.open(os.devnull, os.O_WRONLY)
        try:
            with self._lock:
                # Its end may not have been heard yet (the loop hears ends when it next waits).
                if self._dead or self.child.has_exited():
                    return False
                self._on_exit = on_exit
            try:
                socket.send_fds(self._control, [launch.spec_file.encode("utf-8", "surrogateescape")], [log])
            except OSError:  # it died after our look: its end is reported to on_exit, as a failed attempt
                pass
            return True
        finally:
            os.close(log)
            self._control.close()

    def discard(self) -> None:
        """End it: the sweep is over, or the slot's next run cannot use it."""
        self._control.close()
        self.child.kill()
        self.child.reap()
