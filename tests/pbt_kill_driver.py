"""``gts`` that kills itself (SIGKILL, as ``kill -9`` would) at one named point of a population-based
training exploit, the first time this start reaches it with an exploit whose donor's step is not the
member's own last step (the one that resumes from a step its own records do not say): a test holds
the moment exactly, with no sleep to guess it by.

    python pbt_kill_driver.py POINT NOTE run configs/pbt.yaml --plain

POINT, in the order an exploit goes (engine/pauses.py):

* ``decided``: the exploit's decision committed to the ledger (the member not yet told to pause);
* ``owed``: the member paused and recorded so, a slot free, nothing of the exploit done yet;
* ``installed``: the donor's snapshot in place of the member's checkpoint;
* ``set-aside``: the member's metrics file kept aside, the donor's step written as where it goes on;
* ``committed``: the member's new attempt committed with the exploit's ``resumed`` event;
* ``prepared``: the new attempt's folder prepared (its log rotated), its process about to start.

And for any pausing method (PBT's exploits and turns, promotion ASHA's rungs), on any backend:

* ``pausing``: a pause committed to the ledger, the run not yet told (a pool's run then waits at
  its report for its word, on its node, while no scheduler runs);
* ``exploit-pause``: the same, for an exploit's pause only (not a turn's).

Before it dies it writes ``{"point": ..., "name": ...}`` (the member) to NOTE.
"""

import json
import os
import signal
import sys

from gpu_task_scheduler.backends.local import prepare
from gpu_task_scheduler.cli.main import main
from gpu_task_scheduler.engine import pauses, running
from gpu_task_scheduler.records import checkpoints
from gpu_task_scheduler.records.ledger import Ledger
from gpu_task_scheduler.records.paths import RunPaths
from gpu_task_scheduler.records.resume import last_step
from gpu_task_scheduler.records.status import RunStatus
from gpu_task_scheduler.tuning.pbt import EXPLOIT

POINT = NOTE = ""  # set by main()
decided: list[str] = []  # the member whose exploit this start decided first
exploiting: list[str] = []  # the member whose exploit this start is making


def die(name: str) -> None:
    with open(NOTE, "w", encoding="utf-8") as handle:
        json.dump({"point": POINT, "name": name}, handle)
    os.kill(os.getpid(), signal.SIGKILL)


def after(owner, attribute, point, name_of):
    """Wrap ``owner.attribute``: at ``point``, die once it returned, for the member ``name_of`` names."""
    original = getattr(owner, attribute)

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        name = name_of(args, kwargs, result)
        if POINT == point and name is not None:
            die(name)
        return result

    setattr(owner, attribute, wrapped)


def _decided(args, kwargs, result):
    self, spec, step = args[:3]
    if result is not None and result[1] == EXPLOIT and not decided:
        if self._methods[spec.stage].exploit_of(spec.name).step != step:
            decided.append(spec.name)
    return None


original_resuming = pauses.Pauses.resuming


def resuming(self, spec):
    exploit = getattr(self._methods[spec.stage], "exploit_of", lambda name: None)(spec.name)
    if exploit is not None and exploit.step != last_step(RunPaths(spec.work_dir, None)) and not exploiting:
        if POINT == "owed":
            die(spec.name)
        exploiting[:] = [spec.name]
    return original_resuming(self, spec)


original_halt = running.Running._halt


def halt(self, active, status, cause, marker):
    if POINT == "pausing" and status is RunStatus.PAUSED:
        die(active.spec.name)
    if POINT == "exploit-pause" and status is RunStatus.PAUSED and str(cause).startswith("exploits "):
        die(active.spec.name)
    return original_halt(self, active, status, cause, marker)


def _if_member(name):
    return name if exploiting and name == exploiting[0] else None


if __name__ == "__main__":  # imported (pytest's doctest collection), it changes nothing
    POINT, NOTE = sys.argv[1], sys.argv[2]
    after(pauses.Pauses, "reached", "", _decided)
    after(Ledger, "commit", "decided", lambda args, kwargs, result: decided[0] if decided else None)
    pauses.Pauses.resuming = resuming
    running.Running._halt = halt
    after(checkpoints, "install", "installed", lambda args, kwargs, result: exploiting[0] if exploiting else None)
    after(pauses, "go_on_from", "set-aside", lambda args, kwargs, result: exploiting[0] if exploiting else None)
    after(Ledger, "mark_running", "committed", lambda args, kwargs, result: _if_member(kwargs["name"]))
    after(prepare, "_prepare_folder", "prepared", lambda args, kwargs, result: _if_member(args[0].name))
    sys.exit(main(sys.argv[3:]))
