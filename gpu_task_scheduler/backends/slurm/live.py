"""The attempts a result root handed to Slurm that are still queued or running there, read from
its records (``.gts/slurm/``) and Slurm's own listing: what a start follows instead of submitting
again, and what ``gts status`` counts."""

from __future__ import annotations

import logging
import os
from typing import Any

from ...proctree import wait_gone
from ...records.paths import META, read_json
from . import commands
from .commands import TaskState

logger = logging.getLogger("gpu_task_scheduler")


def live_tasks(root: str, *, settled: bool = False) -> list[tuple[dict[str, Any], TaskState]]:
    """The attempts handed to Slurm from this root (``.gts/slurm/``) that are still queued or running
    there, with their states (none when Slurm cannot be asked). ``settled``: once the submissions
    still in flight on this machine have been answered (a start that follows what is live)."""
    folder = os.path.join(root, META, "slurm")
    batches: dict[str, tuple[str, list[Any]]] = {}  # job name -> (batch, its runs)
    try:
        listed = os.listdir(folder)
    except OSError:
        return []
    for batch in listed:
        record = read_json(os.path.join(folder, batch, "batch.json"))
        if isinstance(record, dict) and isinstance(record.get("job_name"), str):
            batches[record["job_name"]] = (batch, record.get("runs") or [])
    if not batches or commands.missing_commands():
        return []
    # An array an earlier start was still submitting when it was killed is waited for, so that it
    # is followed, not submitted a second time beside it (sbatch outlives the scheduler that ran it).
    in_flight = commands.submissions_in_flight(batches) if settled else []
    if in_flight:
        logger.info("Slurm: waiting for %d submission(s) of an earlier start to be answered", len(in_flight))
        wait_gone(in_flight, timeout=commands.CALL_TIMEOUT + 5)
    found = []
    # By the arrays' names, not their ids: a scheduler killed right after sbatch answered never wrote the id.
    for name, tasks in commands.states_by_name(batches).items():
        batch, runs = batches[name]
        for task, state in tasks.items():
            job, _, index = task.partition("_")
            run = runs[int(index)] if index.isascii() and index.isdigit() and int(index) < len(runs) else None
            if state.live and isinstance(run, dict) and isinstance(run.get("name"), str):
                found.append(({**run, "job": job, "index": int(index), "batch": batch}, state))
    return found
