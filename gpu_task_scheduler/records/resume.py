"""Where a run's next attempt goes on from: one record in its folder, whatever moment the scheduler
died at.

Two files say it, and they are read in this order (:func:`last_step`):

1. the run's current metrics file (``.gts/metrics.jsonl``): the last step its current attempt
   reported, which its checkpoint holds (the protocol: save, then report);
2. when the current attempt reported nothing yet, ``.gts/resumed-from``: the step that attempt went
   on from (:func:`note_resume`, written before the attempt is recorded in the ledger).

An attempt that goes on from its own checkpoint keeps both true at every moment: its metrics file
is moved aside (``.gts/logs/attempt-N-metrics.jsonl``) only by the launcher, and its step is the
marker's. A population-based training member that copies another's snapshot does not: its
checkpoint then holds the *donor's* step, while its own metrics file still ends at its own. So an
exploit moves the member's metrics file aside itself, in the same step as it writes the donor's step
as the marker (:func:`go_on_from`), after the donor's snapshot is in place and before the member's
new attempt is committed: from then on nothing but the marker says where the member is.
"""

from __future__ import annotations

import logging
import os

from .metrics import latest
from .paths import RunPaths, atomic_write, read_step

logger = logging.getLogger("gpu_task_scheduler")

RESUMED_FROM = "resumed-from"  # in a run's .gts: the step its current attempt went on from


def last_step(paths: RunPaths) -> float | None:
    """The last step the run reported (its metrics file's last good line), or, when its last
    attempt reported nothing, the step that attempt went on from (a resumed attempt killed before
    its first report must not make the next one start again from step 0); None: from step 0."""
    if paths.unsafe() is not None:
        return None
    found = latest(paths.metrics)
    return found[0] if found is not None else went_on_from(paths)


def went_on_from(paths: RunPaths) -> float | None:
    """The step the run's current attempt went on from, as recorded at its start (None: step 0). For
    an attempt of an earlier start that a restarted scheduler follows (it still runs on a cluster):
    its metrics file holds what it reported since, so :func:`last_step` would say where it *is*,
    and an attempt taken to have resumed there reports "again" every step before it, and its
    reports there are taken for late ones (no judgement; a run waiting for one waits in vain)."""
    if paths.unsafe() is not None:
        return None
    return read_step(os.path.join(paths.meta, RESUMED_FROM))


def note_resume(paths: RunPaths, step: float | None) -> None:
    """Record the step the attempt about to start goes on from (none: it starts afresh)."""
    marker = os.path.join(paths.meta, RESUMED_FROM)
    try:
        if step is None:
            os.unlink(marker)
        elif paths.unsafe() is None:
            os.makedirs(paths.meta, exist_ok=True)
            atomic_write(marker, repr(float(step)).encode(), durable=False)
    except FileNotFoundError:
        pass
    except OSError as error:
        logger.warning("%s: could not record the step it resumes from (%s)", paths.work_dir, error)


def go_on_from(paths: RunPaths, step: float, attempt: int) -> None:
    """The run's checkpoint now holds ``step``, not what its metrics file says (a copy of another
    run's snapshot was put in place): its metrics file is kept as attempt ``attempt``'s (the one that
    reported it; the launcher would have moved it there at the next attempt's start) and ``step`` is
    recorded as where the next attempt goes on from. Raises OSError when either cannot be done: the
    caller must not start the attempt then (it would go on from the wrong step)."""
    problem = paths.unsafe()
    if problem is not None:
        raise OSError(f"the run folder is not safe to use: {problem}")
    if os.path.lexists(paths.metrics):
        os.makedirs(paths.old_logs, exist_ok=True)
        os.replace(paths.metrics, paths.old_metrics(attempt))
    os.makedirs(paths.meta, exist_ok=True)
    atomic_write(os.path.join(paths.meta, RESUMED_FROM), repr(float(step)).encode(), durable=True)
