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

A framework callback puts a step's checkpoint in place and then reports that step; a run killed
between the two leaves its checkpoint a step ahead of its metrics file. So the callback keeps that
report's line beside the checkpoint until it is written, and before an attempt goes on from the
run's own checkpoint the scheduler adds that line to the metrics file (:func:`settle_pending_report`):
the attempt then goes on from the step its checkpoint holds, and that step's report is not lost.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import stat

from ..reporting import NEW_PREFIX, PENDING_REPORT
from .metrics import latest, parse_line
from .paths import RunPaths, atomic_write, open_regular, read_step

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


PENDING_BYTES = 1 << 16  # a pending report is one metrics line (a line holds at most MAX_LINE) and a name


def settle_pending_report(paths: RunPaths) -> float | None:
    """Record the report a framework callback's attempt kept beside its checkpoint and was killed
    before writing (``reporting.PENDING_REPORT``; integrations/common.py ``RunSide.commit``): once
    the checkpoint it names is in place (no ``.new-`` file of it is left: the callback writes the
    pending report after the new checkpoint is whole, and before it puts it in place), that
    checkpoint holds the step the report is of, and when the run's records end before that step,
    its line is added to the run's metrics file, where the next attempt goes on from it. The pending
    report is removed either way. Called before an attempt that goes on from the run's checkpoint
    is started, when no attempt of the run runs: the step recorded, or None."""
    if paths.unsafe() is not None:
        return None
    try:
        folder = os.open(paths.checkpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None  # no checkpoint folder (or a link planted there: nothing is trusted)
    try:
        pending = _read_pending(folder)
        with contextlib.suppress(OSError):  # whatever it is (a link, a FIFO: unlink follows none)
            os.unlink(PENDING_REPORT, dir_fd=folder)
        if pending is None:
            return None
        name, line, step = pending
        recorded = last_step(paths)
        if not _in_place(name, folder) or step <= (recorded if recorded is not None else -math.inf):
            return None
        fd = open_regular(paths.metrics, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # after a line cut short (a full disk): not joined to it
            os.write(fd, line)
        finally:
            os.close(fd)
        logger.info("%s: its checkpoint of step %g was in place, not its report: recorded now", paths.work_dir, step)
        return step
    except OSError as error:
        logger.warning("%s: could not record the report its checkpoint was kept with (%s)", paths.work_dir, error)
        return None
    finally:
        os.close(folder)


def _read_pending(folder: int) -> tuple[str, bytes, float] | None:
    """The checkpoint's name, the line and its step of the pending report in ``folder``; None where
    there is none, or none that parses (a kill while it was written: its checkpoint was not put in place)."""
    try:
        fd = os.open(PENDING_REPORT, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, PENDING_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > PENDING_BYTES:
        return None
    try:
        record = json.loads(data)
        name, text = record["checkpoint"], record["line"]
    except (ValueError, RecursionError, TypeError, KeyError):
        return None
    if not (isinstance(name, str) and isinstance(text, str)) or not name or "/" in name or name in (".", ".."):
        return None
    line = text.encode() if text.endswith("\n") and "\n" not in text[:-1] else b""
    parsed = parse_line(line.rstrip(b"\n")) if line else "no line"
    return None if isinstance(parsed, str) else (name, line, parsed[0])


def _in_place(name: str, folder: int) -> bool:
    """Whether the checkpoint ``name`` is in ``folder`` and no ``.new-`` of it (the one the callback
    had not yet put in place) is left."""
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except OSError:
        return False
    try:
        os.stat(NEW_PREFIX + name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False
