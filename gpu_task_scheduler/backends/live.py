"""What a result root's backends run without a scheduler, and what they show of themselves: the one
seam ``gts status``, the web view and the report ask through.

A start with ``--detach`` (Slurm's job arrays and pools) leaves runs queued or running on the
cluster with no scheduler on the root; they are running, not stale, and the next start follows
them. Each backend that can leave runs behind answers here from its own records; the reports know
no backend's files. (Ray's runs end with their driver: it has none to tell.)
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, NamedTuple

from ..errors import GTSError
from ..records.paths import META, read_json

logger = logging.getLogger("gpu_task_scheduler")

ASKED_EVERY = 5.0  # seconds one root's answer is reused (a web view asks every second; squeue is shared)


class Left(NamedTuple):
    """What a detached start left on a cluster: runs that wait for a machine, and runs on one."""

    queued: int = 0
    running: int = 0

    @property
    def total(self) -> int:
        return self.queued + self.running


_answers: dict[str, tuple[float, Left]] = {}


def left_on_cluster(root: str) -> Left:
    """The runs of this root a detached start left queued or running on a cluster: a job array's
    tasks (asked of squeue: pending, or running), and a pool's attempts (in its queue, or claimed by
    an agent that beats). Without a scheduler, the ledger cannot tell the two apart (a run placed
    after the driver left is recorded as it was queued): ``gts status`` splits its counts by this."""
    if not os.path.isdir(os.path.join(root, META, "slurm")):
        return Left()
    asked = _answers.get(root)
    if asked is not None and time.monotonic() - asked[0] < ASKED_EVERY:
        return asked[1]
    from .slurm.live import live_tasks
    from .slurm.poolfiles import PoolFiles

    try:
        states = [state.state for _, state in live_tasks(root)]
    except GTSError as error:
        logger.warning("cannot ask Slurm about the runs of %s: %s", root, error)
        states = []
    pending = sum(1 for state in states if state == "PENDING")
    queued, claimed = PoolFiles(root).live_attempts()
    left = Left(queued=pending + queued, running=len(states) - pending + claimed)
    _answers[root] = (time.monotonic(), left)
    return left


def shown(root: str, *, running: bool) -> dict[str, Any]:
    """What the root's backends show of themselves beside its runs (``gts status``'s report):
    a Slurm pool's allocations, their nodes, slots and runs, as its driver last wrote them (while a
    scheduler runs, or at its end)."""
    from .slurm.poolfiles import PoolFiles

    pool = read_json(PoolFiles(root).state)
    return {"pool": pool} if isinstance(pool, dict) and (running or pool.get("over")) else {}
