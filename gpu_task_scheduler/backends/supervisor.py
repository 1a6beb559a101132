"""The supervisor of one attempt on a machine the scheduler does not own (a Ray task, a Slurm job).

The backends differ in how the scheduler's word reaches the supervisor (a Ray
actor, a file on the shared file system) and how it reports back; what it
does with its run is the same, and is here:

* :func:`cannot_run`: whether this machine sees what the run needs (its folder,
  the directory the sweep was started from);
* :func:`start_run`: the run's process, as the local backend starts it
  (:class:`~.local.process.Child`: its own session, its log, the lifeline that
  ends the run if the supervisor dies);
* :func:`keep_lease`: the attempt's lease (``records/lease.py``), renewed after
  each word from the scheduler that the attempt is still wanted; the run is
  stopped (SIGTERM, the grace period, SIGKILL) once there has been no such word
  for ``fence_after``, so that it never runs beside its retry.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..engine.launcher import Attempt
from ..records.lease import LeaseHolder, LeaseTerms
from .local.keeper import Keeper
from .local.keeper import available as keeper_available
from .local.launcher import LocalHandle
from .local.prepare import Launch
from .local.process import Child

# The scheduler's word on an attempt: whether it is still wanted (raises when there is no answer;
# the argument is how many seconds an answer may take).
Word = Callable[[float], bool]


def remote_run(attempt: Attempt, launch: Launch, grace_period: float) -> dict[str, Any]:
    """What a supervisor on another machine needs to run the prepared attempt (JSON-compatible)."""
    paths = attempt.paths
    return {
        "argv": launch.argv,
        # What the run needs beyond the environment of the machine that runs it.
        "env": {key: value for key, value in launch.env.items() if os.environ.get(key) != value},
        "cwd": launch.cwd,
        "log": None if paths.log is None else os.path.abspath(paths.log),
        "token": attempt.token,
        "reports_outcome": not launch.direct,
        "grace_period": grace_period,
        "python": sys.executable,
        "work_dir": os.path.abspath(attempt.spec.work_dir),
        "config_file": os.path.abspath(paths.config),
        "lease": os.path.abspath(paths.lease),
    }


def cannot_run(run: Mapping[str, Any], node: str) -> str | None:
    """Why this machine cannot run the attempt (it does not see the run folder, or the directory
    the sweep was started from), or None."""
    if not os.path.isfile(run["config_file"]):
        return (
            f"{node} does not see the run folder {run['work_dir']} that the scheduler prepared: the result "
            "root must be on a filesystem every machine of the cluster sees, at the same path"
        )
    if not os.path.isdir(run["cwd"]):
        return (
            f"{node} has no directory {run['cwd']}, where the sweep was started (runs start there): start "
            "the sweep from a directory every machine sees, at the same path"
        )
    return None


def start_run(run: Mapping[str, Any], gpus: str, cpus: tuple[int, ...] = ()) -> tuple[LocalHandle, threading.Event]:
    """Start the run's process with ``gpus`` as its ``CUDA_VISIBLE_DEVICES`` (and ``cpus``, where
    given, as the CPUs it and its children may use); the event is set when it has ended. Raises
    OSError (the caller logs it: the run fails, as locally)."""
    env = dict(os.environ)
    env.update(run["env"])
    env["CUDA_VISIBLE_DEVICES"] = gpus
    argv = list(run["argv"])
    if argv and argv[0] == run["python"]:  # the driver's interpreter: this machine's may live elsewhere
        argv[0] = sys.executable
    handle = LocalHandle(reports_outcome=run["reports_outcome"], grace_period=run["grace_period"])
    ended = threading.Event()
    # A command's wrapper is kept by a keeper of its own here (the driver's is on another machine).
    keeper = Keeper() if not run["reports_outcome"] and keeper_available() else None
    mask = _bound_to(cpus)
    try:
        handle.child = Child(
            argv,
            env=env,
            cwd=run["cwd"],
            log_path=run["log"],
            on_exit=handle.exited_to(ended.set),
            token=run["token"],
            keeper=keeper,
        )
    except BaseException:
        if keeper is not None:
            keeper.close()
        raise
    finally:
        if mask is not None:  # this thread's own again: only the child keeps the run's CPUs
            os.sched_setaffinity(0, mask)
    handle.keeper = keeper
    handle.pid = handle.child.pid
    return handle, ended


def _bound_to(cpus: tuple[int, ...]) -> set[int] | None:
    """Bind this thread to ``cpus`` for the child it starts next, which inherits its thread's mask
    (Linux: affinity is per thread); the mask it had, to restore, or None where nothing changed."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    mask = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        return None
    return mask


def keep_lease(
    word: Word,
    lease: LeaseHolder,
    terms: LeaseTerms,
    handle: LocalHandle,
    ended: threading.Event,
    log: str | None,
    fenced: list[str],
    *,
    given_up: str,
) -> None:
    """Renew the lease after each word from the scheduler; stop the run (grace, then kill) once there
    has been none for ``terms.fence_after``, or the scheduler gave the attempt up (``given_up``: how
    that reads in the run's log). Why it stopped the run is appended to ``fenced``."""
    renewed = time.monotonic()
    while not ended.wait(terms.renew_every):
        deadline = renewed + terms.fence_after  # a slow answer (a loaded machine) still counts until then
        try:
            wanted = word(max(0.05, deadline - time.monotonic()))
            if wanted:
                lease.renew()
                renewed = time.monotonic()
                continue
            reason = given_up
        except Exception as error:  # no answer (a partition), the driver gone, or the file system failing
            if time.monotonic() < deadline:
                continue
            reason = (
                f"no word from the scheduler, or no renewal of the run's lease, for {terms.fence_after:g}s "
                f"({type(error).__name__})"
            )
        fenced.append(reason)
        log_line(
            log,
            f"gpu_task_scheduler: {reason}: stopping the run (SIGTERM, then SIGKILL after "
            f"{terms.grace_period:g}s), so that it never runs beside its retry\n",
        )
        handle.stop()
        if not ended.wait(terms.grace_period):
            handle.kill()
        return


def log_line(path: str | None, text: str) -> None:
    """Append to the run's log (best effort: the supervisor's words must not end it)."""
    if path:
        try:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(text)
        except OSError:
            pass
