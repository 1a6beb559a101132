"""The states of a run, as the ledger records them and summaries report them."""

from __future__ import annotations

import enum


class RunStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    INTERRUPTED = "interrupted"
    BLOCKED = "blocked"  # not run: a run of an earlier stage it depends on did not succeed
    PRUNED = "pruned"  # stopped early by the sweep's early_stop rule: not a failure, not run again
    # Paused at a rung by a pausing early_stop method: holds no slot; resumed from its checkpoint if
    # it is promoted (tuning/trials.py), else it stays paused, as a pruned run stays pruned.
    PAUSED = "paused"

    def __str__(self) -> str:
        return self.value


# Shown, never recorded: a run recorded running whose attempt waits in a cluster's queue (a Slurm
# pool's, an array task pending, Ray's) for a machine; its node is '' until it is placed there.
QUEUED = "queued"

# Where a run's result and metrics are looked for, as a start's summary and `gts status` say it to a
# run that succeeded and left neither.
NOTHING_LEFT = (
    "a result is what main() returns, or a command's result.json in its run folder; a metric is what it reports"
)
