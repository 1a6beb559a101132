"""The supervisor of one attempt on a machine the scheduler does not own (a Ray task, a Slurm job).

The backends differ in how the scheduler's word reaches the supervisor (a Ray
actor, a file on the shared file system) and how it reports back; what it
does with its run is the same, and is here:

* :func:`cannot_run`: whether this machine sees what the run needs (its folder,
  the directory the sweep was started from);
* :func:`start_run`: the run's process, as the local backend starts it
  (:class:`~.local.process.Child`: its own session, its log, the lifeline that
  ends the run if the supervisor dies), forked from the node's warm process
  where the supervisor keeps one (:class:`NodeWarmStarts`: a pool's agent, a Ray worker);
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
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..engine.launcher import Attempt
from ..records.lease import LeaseHolder, LeaseTerms
from ..records.paths import RunPaths
from .local.keeper import Keeper
from .local.keeper import available as keeper_available
from .local.launcher import LocalHandle
from .local.prepare import Launch, Preload, warm_candidate
from .local.process import Child
from .local.reaper import REAPER

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
        # What a warm start needs (a pool's agent forks Python runs from a warm process of its node).
        "command": launch.command,
        "spec_file": launch.spec_file,
        "preload": None if launch.preload is None else [launch.preload.module, launch.preload.main_file],
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


class NodeWarmStarts:
    """The warm starts of one machine's supervisor that starts many attempts, each from a thread of
    its own (a pool's agent), or many one after another (a Ray worker): the local backend's
    (``local/zygote.py``: a warm process that has imported what the runs import, never touched a
    GPU, forked per attempt). An array task starts one attempt and keeps none: a warm process
    would only pay the imports first.

    Every call runs on one thread of its own, which lives as long as this object: a warm process
    asks for a signal at its parent's death, and Linux sends it when the *thread* that started it
    ends (a run's thread would take the warm process with it). Its forks become children of the
    process (a subreaper's children go to its first thread), as locally."""

    def __init__(self, imports: tuple[str, ...], *, ready_wait: float) -> None:
        from .local.zygote import WarmStarts

        self._warm = WarmStarts(REAPER, (), imports, ready_wait=ready_wait)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gts-warm")

    def start(
        self, launch: Launch, paths: RunPaths, token: str, on_exit: Callable[[], None], cpus: tuple[int, ...]
    ) -> Child | None:
        """The attempt forked warm (a child of this process), or None: it starts cold (the log says why)."""
        if not warm_candidate(launch):
            return None
        return self._thread.submit(self._warm.start, launch, paths, token, on_exit, REAPER, cpus).result()

    def learned(self, paths: RunPaths) -> None:
        self._thread.submit(self._warm.learned, paths).result()

    def close(self) -> None:
        self._thread.submit(self._warm.close).result()
        self._thread.shutdown()


def start_run(
    run: Mapping[str, Any], gpus: str, cpus: tuple[int, ...] = (), warm: NodeWarmStarts | None = None
) -> tuple[LocalHandle, threading.Event]:
    """Start the run's process with ``gpus`` as its ``CUDA_VISIBLE_DEVICES`` (and ``cpus``, where
    given, as the CPUs it and its children may use), forked from ``warm`` where it can be; the event
    is set when it has ended. Raises OSError (the caller logs it: the run fails, as locally)."""
    env = dict(os.environ)
    env.update(run["env"])
    env["CUDA_VISIBLE_DEVICES"] = gpus
    argv = list(run["argv"])
    if argv and argv[0] == run["python"]:  # the driver's interpreter: this machine's may live elsewhere
        argv[0] = sys.executable
    handle = LocalHandle(reports_outcome=run["reports_outcome"], grace_period=run["grace_period"])
    ended = threading.Event()
    if warm is not None:
        preload = run.get("preload")
        launch = Launch(
            argv,
            env,
            run["cwd"],
            direct=not run["reports_outcome"],
            spec_file=run.get("spec_file"),
            preload=Preload(preload[0], preload[1], ()) if preload else None,
            command=run.get("command"),
        )
        paths = RunPaths(run["work_dir"], run["log"])
        forked = warm.start(launch, paths, run["token"], handle.exited_to(ended.set), cpus)
        if forked is not None:
            handle.child, handle.pid = forked, forked.pid
            handle.after_reap = lambda: warm.learned(paths)
            return handle, ended
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
