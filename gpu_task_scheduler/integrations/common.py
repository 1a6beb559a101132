"""The run's side of the protocol, shared by every framework callback: what to report, where to
save, what to resume from, and what the run is told.

A callback saves its framework's checkpoint under :func:`checkpoint_path` (by a rename, so that a
kill leaves the old checkpoint or the new one, never half of one), then calls
:meth:`RunSide.report`, which says whether training goes on. A paused or pruned run ends its
training loop cleanly: ``main()`` returns (or the command exits) and the scheduler records it
``paused`` or ``pruned``, never ``failed``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .. import reporting

# Where each callback keeps its checkpoint in the run's checkpoint folder (``<run>/.gts/checkpoint``).
LIGHTNING = "lightning.ckpt"
XGBOOST = "xgboost.ubj"
LIGHTGBM = "lightgbm.txt"
KERAS = re.compile(r"keras-epoch-(\d+)\.weights\.h5")  # the epochs done; the newest is kept
TRAINER = re.compile(r"checkpoint-(\d+)")  # the Trainer's folders, by global step
TRAINER_WHOLE = "trainer_state.json"  # the Trainer writes it last: a folder holding it is whole


def checkpoint_left(folder: str) -> str | None:
    """The checkpoint a run left in its checkpoint folder ``folder``: a callback's file, the newest
    whole ``checkpoint-N`` of the Trainer, the newest Keras epoch; else the folder itself when it
    holds anything (a script's own files), None when it is empty or missing."""
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    for name in (LIGHTNING, XGBOOST, LIGHTGBM):
        if name in names:
            return os.path.join(folder, name)
    numbered = [(int(m.group(1)), name) for name in names if (m := KERAS.fullmatch(name))]
    trainer = newest_trainer_checkpoint(folder, names)
    if trainer is not None:
        numbered.append(trainer)
    if numbered:
        return os.path.join(folder, max(numbered)[1])
    return folder if names else None


def newest_trainer_checkpoint(folder: str, names: list[str]) -> tuple[int, str] | None:
    """The newest whole ``checkpoint-N`` of the Trainer among ``names`` (in ``folder``): its step
    and name, or None."""
    whole = [
        (int(match.group(1)), name)
        for name in names
        if (match := TRAINER.fullmatch(name)) and os.path.isfile(os.path.join(folder, name, TRAINER_WHOLE))
    ]
    return max(whole) if whole else None


def in_sweep() -> bool:
    """Whether this process is a run of a sweep (the scheduler set ``GTS_METRICS_FILE``)."""
    return bool(os.environ.get(reporting.METRICS_ENV))


def checkpoint_dir() -> str | None:
    """The run's checkpoint folder (``GTS_CHECKPOINT_DIR``), created if missing; None outside a sweep."""
    folder = os.environ.get(reporting.CHECKPOINT_ENV)
    if not folder or not in_sweep():
        return None
    os.makedirs(folder, exist_ok=True)
    return folder


def checkpoint_path(name: str) -> str | None:
    """Where a framework's checkpoint named ``name`` lives in the run's checkpoint folder."""
    folder = checkpoint_dir()
    return None if folder is None else os.path.join(folder, name)


def resume_step() -> float | None:
    """The step this attempt goes on from (``GTS_RESUME_STEP``), or None on a fresh start."""
    step = reporting._resume_step()
    return step if in_sweep() and step >= 0 else None


def say(message: str) -> None:
    """One line in the run's log (its stderr), whatever logging the framework set up."""
    print(f"gpu_task_scheduler: {message}", file=sys.stderr, flush=True)


def numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics ``report()`` takes: finite scalars, from floats, ints, NumPy scalars and one-element
    arrays and tensors; strings, lists, booleans, larger tensors and NaNs are left out."""
    found: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, (bool, str, bytes)) or value is None:
            continue
        size = getattr(value, "numel", None) or getattr(value, "size", None)
        if size is not None and not isinstance(value, (int, float)):
            count = size() if callable(size) else size
            if count != 1:
                continue
            item = getattr(value, "item", None)  # a one-element array or tensor: its element
            value = item() if callable(item) else value
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            found[str(name)] = number
    return found


class RunSide:
    """One run's protocol state for a framework callback.

    ``framework`` names it in the log; ``resume_hint`` tells a user who forgot the resume call
    what to write."""

    def __init__(self, framework: str, resume_hint: str) -> None:
        self.framework, self.resume_hint = framework, resume_hint
        self.active = in_sweep()
        self.stopped: str | None = None  # "paused" or "pruned", once report() said so
        self.cause: str | None = None
        self._last = -math.inf
        self._pending: str | None = None  # the pending report written by commit(), until report()

    def check_resumed(self, resumed: bool) -> None:
        """Say so in the run's log when the scheduler gave a step to go on from and the framework
        was not given the checkpoint: the run then trains again from scratch."""
        step = resume_step()
        if step is None or resumed:
            return
        say(
            f"this attempt should go on from step {step:g} (GTS_RESUME_STEP) but {self.framework} was not "
            f"given the run's checkpoint, so it trains again from the start: {self.resume_hint}"
        )

    def report(self, step: float, metrics: Mapping[str, Any]) -> bool:
        """Report ``metrics`` at ``step`` (after saving its checkpoint): True to train on, False when the
        scheduler paused or stopped the run (its cause is in :attr:`cause`, and in the run's log)."""
        pending, self._pending = self._pending, None
        try:
            return self._report(step, metrics)
        finally:  # the report is written (or it never will be): nothing pends
            if pending is not None:
                with contextlib.suppress(OSError):
                    os.unlink(pending)

    def commit(self, path: str, step: float, metrics: Mapping[str, Any]) -> None:
        """Put the checkpoint written whole at ``saved(path)`` in place of ``path``, the checkpoint of
        ``step`` whose ``metrics`` :meth:`report` reports next. Until it does, the report's line is
        kept beside the checkpoint (``reporting.PENDING_REPORT``): a run killed between the two
        leaves a checkpoint ahead of its records, and the scheduler records that line for it before
        the next attempt goes on from the checkpoint (records/resume.py), which then says the step
        the checkpoint holds, and no step's report is lost."""
        self.pend(path, step, metrics)
        os.replace(saved(path), path)

    def pend(self, path: str, step: float, metrics: Mapping[str, Any]) -> None:
        """Keep the line :meth:`report` writes next beside the checkpoint ``path`` of ``step``, until
        it is written (see :meth:`commit`; for a framework that puts its checkpoint in place itself)."""
        line = self._line(step, metrics)
        if line is None:
            return
        pending = os.path.join(os.path.dirname(path), reporting.PENDING_REPORT)
        record = json.dumps({"checkpoint": os.path.basename(path), "line": line}).encode()
        fd = os.open(pending, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            os.write(fd, record)  # one small write; a half-written one is no JSON, and ignored
        finally:
            os.close(fd)
        self._pending = pending

    def _line(self, step: float, metrics: Mapping[str, Any]) -> str | None:
        """The metrics line :meth:`report` would write for ``step`` (None: it writes none)."""
        found = numbers(metrics)
        if not self.active or self.stopped is not None or not found or step <= self._last:
            return None
        return reporting.metrics_line(_step(step), found)

    def _report(self, step: float, metrics: Mapping[str, Any]) -> bool:
        if not self.active or self.stopped is not None:
            return self.stopped is None
        found = numbers(metrics)
        if not found or step <= self._last:  # nothing to report, or a step reported already
            return True
        self._last = step
        try:
            reporting.report(_step(step), **found)
        except reporting.Paused as told:
            self.stopped, self.cause = "paused", str(told)
        except reporting.Pruned as told:
            self.stopped, self.cause = "pruned", str(told)
        else:
            return True
        say(f"{self.stopped}: {self.cause}; {self.framework} ends its training here")
        return False


def saved(path: str) -> str:
    """Where to write the checkpoint that :meth:`RunSide.commit` puts at ``path``: beside it, with the same
    ending (frameworks choose the format by it), so that a kill leaves the old one or the new one."""
    folder, name = os.path.split(path)
    return os.path.join(folder, reporting.NEW_PREFIX + name)


def _step(step: float) -> float:
    return int(step) if float(step).is_integer() else step


def resumable(name: str) -> str | None:
    """The checkpoint ``name`` to resume from: its path when the scheduler gave a step to go on from
    and the file is there; None on a fresh start (said in the log when a checkpoint was expected)."""
    path = checkpoint_path(name)
    step = resume_step()
    if path is None or step is None:
        return None
    if os.path.exists(path):
        return path
    say(f"this attempt should go on from step {step:g} but there is no checkpoint {path}: it starts afresh")
    return None


def rounds_left(name: str, num_boost_round: int, model_key: str, done: Callable[[str], int]) -> dict[str, Any]:
    """A boosting library's ``train()`` arguments: ``num_boost_round`` alone on a fresh start; when the
    attempt goes on from the checkpoint ``name``, the rounds left to reach it and the checkpoint as
    ``model_key`` (``done(path)``: how many rounds it holds)."""
    path = resumable(name)
    if path is None:
        return {"num_boost_round": num_boost_round}
    return {"num_boost_round": max(0, num_boost_round - done(path)), model_key: path}


def rounds(every: Any) -> int:
    """A callback's ``every``: a whole number of rounds, 1 or more (ValueError otherwise)."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"GTSCallback(every={every!r}): give a whole number of rounds, 1 or more")
    return every
