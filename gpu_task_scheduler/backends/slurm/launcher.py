"""The driver's side of the Slurm backend: the sweep's runs as job arrays, followed to their ends.

* **Submitting.** The engine starts every run that is ready (up to
  ``max_queued``; its slots here are places in Slurm's queue, not GPUs), and
  then calls :meth:`SlurmLauncher.flush`: the attempts started since the last
  flush become one job array (several where Slurm's MaxArraySize asks), each
  task one attempt, run by ``task.py`` on the node Slurm chose, with the GPUs
  Slurm gave it. Retries and runs of later stages become arrays of their own
  as they become ready. How many run at once is ``max_parallel``, shared out
  across the arrays (``throttle.py``).
* **Following.** One thread of the driver reads the events the tasks write
  under the root (a listing of one folder, several times a second: the file
  system, not slurmctld) and looks at ``squeue`` every ``poll_interval``
  seconds (one call for the whole sweep) for what no file tells: a task that
  Slurm requeued, cancelled, or lost with its node. A run's clock starts when
  its task starts it.
* **Losing a task.** A task that ended (or was requeued) without its run's end
  is given up: its ``abandoned`` file is written (a requeued task that starts
  again then leaves its run alone), its job task cancelled, and its lease
  waited for (``records/lease.py``); only then does the engine read the
  outcome file (a run that finished meanwhile is recorded as succeeded) and run
  it again, up to ``node_failure_retries`` times. A SIGTERM the scheduler did
  not send (a preemption, a requeue) counts as such a loss; one near the job's
  time limit is a timeout.
* **Stopping.** ``stop`` sends SIGTERM to the task (``scancel --signal=TERM
  --full``), whose supervisor stops its run with the grace period; ``kill``
  asks the supervisor to kill its run at once (SIGUSR2); a task that has not
  started (no start file, and ``squeue``, asked again then, still lists it as
  queued) is cancelled. Calls
  are batched per array, at most a few a second. When the sweep ends nothing
  of it is left in Slurm's queue, unless it was detached.
* **Adopting.** Each array's attempts are written down under the root
  (``.gts/slurm/<batch>/batch.json`` and its job id); a later start (after
  ``--detach``, or a driver that died) follows the tasks that are still queued
  or running instead of submitting their runs again
  (:meth:`SlurmLauncher.live_attempt`).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ...engine.launcher import Abilities, Attempt, Ended, OnPlaced
from ...errors import GTSError
from ...finite import ascii_int
from ...gpu.devices import Slot
from ...gpu_task import GPUTask
from ...recordclass import Record, field
from ...records.lease import LeaseTerms, wait_over
from ...records.paths import META, atomic_write, read_json
from ...records.status import RunStatus
from ...sweep.options import SchedulerOptions
from ..local.prepare import TaskFactory
from ..supervisor import log_line
from . import commands, throttle
from . import task as task_module
from .commands import TaskState
from .following import Following, SlurmHandle, _running_for
from .live import live_tasks

logger = logging.getLogger("gpu_task_scheduler")

END_LAG = 2  # squeue looks after a task's end before its missing end file means it is lost (a late NFS view)
CLOSE_WAIT = 60.0  # seconds the sweep's end waits for Slurm to be done with its tasks
SETTLE = 5.0  # ... of which a task that ended may stay listed before it is cancelled
HELD_WAIT = 30.0  # seconds an end no signal came before waits while Slurm lists its task as live
# Slurm's states of a task it took down: a requeue (PENDING again, or held), a preemption, a cancel
TAKEN_DOWN = frozenset(
    {
        "PENDING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "SPECIAL_EXIT",
        "PREEMPTED",
        "NODE_FAIL",
        "CANCELLED",
        "BOOT_FAIL",
    }
)


def held_end_verdict(state: TaskState | None, looks: int, held_for: float) -> str | None:
    """Whether an attempt that ended with no signal its supervisor saw was taken down by Slurm
    ("lost": a success it recorded is of a run cut short, and it runs again) or ended by itself
    ("end"), from Slurm's state of its task ``looks`` squeue looks (``held_for`` seconds) after
    its end was read; None: not known yet, look again.

    A requeue or a preemption signals every process of the job, the run's now and then before
    its supervisor's (slurmstepd signals them one by one, and may be descheduled between two on a
    loaded machine). Slurm's state then says it, once it is past COMPLETING: a requeued task passes
    through COMPLETING as a task that ended does, for as long as slurmd takes to end its
    processes (seconds, under load), so such a state is waited out (up to ``HELD_WAIT``, for a
    task Slurm would list for good). RUNNING is not one: slurmctld marks a task it takes down
    before it signals it. A task not listed may be a moment's gap in squeue's answer: looked at
    again ``END_LAG`` times, as one still RUNNING. (A success was once taken after 2 looks at a live task:
    a run requeued 0.7 s in was recorded succeeded.)"""
    if state is None:
        return "end" if looks >= END_LAG else None  # purged (MinJobAge) after it ended, or not yet listed
    if state.state in TAKEN_DOWN:
        return "lost"
    if state.state == "RUNNING":  # Slurm took it down: it would have said so before it signalled
        return "end" if looks >= END_LAG else None  # listed a moment longer, or for good (slurmstepd died)
    if state.live:
        return "end" if held_for >= HELD_WAIT else None
    return "end"  # COMPLETED, FAILED, OUT_OF_MEMORY, TIMEOUT...: Slurm saw it end


class _Task(Record, frozen=False):
    """One attempt handed to Slurm: its array task, and what is known of it."""

    handle: SlurmHandle
    run: dict[str, Any]  # what task.py needs (batch.json's entry)
    batch: str = ""
    job: str | None = None
    index: int = -1
    placed: int = -1  # the incarnation (restart count) whose start was seen; -1: not started
    gone_looks: int = 0  # squeue looks since its task was seen over without an end file
    ran: bool = False  # squeue saw it started (a later PENDING is a requeue)
    running_since: float | None = None  # when squeue first said RUNNING (this clock), until its start is read
    held_end: dict[str, Any] | None = None  # an end with no signal seen, until squeue says whether Slurm killed it
    held_at: float = 0.0  # when it was read (this clock)
    held_looks: int = 0  # squeue looks since
    asked: str | None = None  # "TERM" or "KILL" once the engine asked
    sent: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return f"{self.job}_{self.index}"


class SlurmLauncher(Following):
    """Runs each attempt as a task of a Slurm job array; a context manager (nothing to release
    but the thread that follows the tasks)."""

    def __init__(self, task: type[GPUTask] | TaskFactory, options: SchedulerOptions, *, detach: bool = False) -> None:
        super().__init__(task, options, detach=detach)
        self._root = os.path.abspath(options.result_root_folder)
        self._folder = os.path.join(self._root, META, "slurm")
        self._events = os.path.join(self._folder, "events")
        self._tasks: dict[str, _Task] = {}  # token -> task, while the engine follows it
        self._new: list[_Task] = []  # started since the last flush
        self._arrays: dict[str, list[_Task]] = {}  # job -> its tasks by index (submission order)
        self._throttles: dict[str, tuple[int, bool]] = {}  # job -> (its %N, held)
        self._ended: dict[str, float] = {}  # task -> when its attempt's end was heard, while Slurm may list it
        # run name -> (token, its batch entry, its task's state) of an earlier start's live attempts
        self._adoptable: dict[str, tuple[str, dict[str, Any], TaskState]] = {}
        self._states: dict[str, TaskState] = {}
        self._array_size = 1001
        self._waiting_words = ""  # why tasks wait in Slurm's queue, as last logged
        self.submissions = 0  # sbatch calls that queued runs (the tests count them)
        # Its slots are places in Slurm's queue, handed over as job arrays at each flush; attempts a
        # detached start left there are followed; a search asks as many runs ahead as may run at once.
        self.abilities = Abilities(
            cluster_slots=True,
            batches=True,
            queue_places=True,
            adopts=True,
            runs_at_once=self._s.max_parallel or self._s.max_queued,
        )

    def __enter__(self) -> SlurmLauncher:
        return self

    # --- the sweep ------------------------------------------------------------------

    def slots(self, options: SchedulerOptions) -> list[Slot]:
        missing = commands.missing_commands()
        if missing:
            raise GTSError(f"backend: slurm needs Slurm's commands on PATH; not found: {', '.join(missing)}")
        self._asks.gpus_per_run()  # slots of different sizes: an error now, before anything is written
        return [Slot(f"slurm{index}", ()) for index in range(self._s.max_queued)]

    def slot_gpus(self, slot: Slot) -> float:
        return float(self._asks.gpus_per_run())

    def open(self, lock_fd: int) -> None:
        """Check what Slurm and the file system must offer (before anything is submitted), then
        find the tasks an earlier start left queued or running."""
        problem = commands.shared_root_problem(
            self._root,
            commands.file_system_of(self._root),
            commands.partition_nodes(self._s.partition),
            socket.gethostname(),
        )
        if problem is not None:
            raise GTSError(problem)
        commands.test_submission(self._asks.sbatch_args())
        config = commands.show_config()
        self._array_size = commands.max_array_size(config)
        memory = commands.memory_problem(config, mem=self._s.mem, extra=self._s.extra)
        if memory is not None:
            logger.warning("%s", memory)
        os.makedirs(self._events, exist_ok=True)
        self._find_live_tasks()
        self._start_following("gts-slurm")
        logger.info(
            "Slurm: partition %s; %s at once; %s per run",
            self._s.partition or "(the default)",
            self._s.max_parallel or "as many as Slurm allows",
            ", ".join(self._asks.per_run()) or "Slurm's defaults",
        )

    def close(self) -> None:
        """The sweep is over: nothing of it stays queued (unless it was detached)."""
        if self._detach:
            self._end_following()
            return
        with self._lock:
            left = [task for task in self._tasks.values() if task.job is not None]
            jobs = set(self._arrays)
            # An earlier start's tasks of runs this start did not run (they had ended meanwhile).
            stale = [f"{run['job']}_{run['index']}" for _, run, _ in self._adoptable.values()]
        if left or stale:
            try:
                commands.cancel(_by_array(left) + stale)
            except GTSError as error:
                logger.warning("could not cancel the sweep's last Slurm tasks: %s", error)
        self._end_following()
        # A task that reported its end is still COMPLETING for a moment: the sweep returns once Slurm
        # is done with every task of it. One still listed a while later is cancelled: its run has
        # ended (in the test suite, Slurm 22.05 now and then kept such a task RUNNING for good, its
        # step gone without a word to slurmctld).
        cancelled = False
        deadline = time.monotonic() + CLOSE_WAIT
        try:
            while live := [name for name, state in commands.states(jobs).items() if state.live]:
                if time.monotonic() >= deadline:
                    break
                if not cancelled and time.monotonic() >= deadline - CLOSE_WAIT + SETTLE:
                    logger.info("Slurm still lists %d ended task(s) of the sweep; cancelling them", len(live))
                    commands.cancel(live)
                    cancelled = True
                time.sleep(0.2)
        except GTSError as error:
            live = [str(error)]
        if live:
            logger.warning("Slurm still lists tasks of the sweep %gs after its end: %s", CLOSE_WAIT, live[:10])

    # --- starting ---------------------------------------------------------------------

    def start(self, attempt: Attempt, on_exit: Callable[[], None], on_placed: OnPlaced | None = None) -> SlurmHandle:
        with self._lock:
            adopted = self._adoptable.pop(attempt.spec.name, None)
        if adopted is not None and adopted[0] != attempt.token:
            self._give_up_adopted(attempt.spec.name, adopted[0], adopted[1])
            adopted = None
        if adopted is not None:
            run, state = adopted[1], adopted[2]
            handle = self._handle(attempt, run, on_exit, on_placed)
            task = _Task(handle, run, batch=run["batch"], job=run["job"], index=run["index"])
            with self._lock:
                self._tasks[attempt.token] = task
                self._arrays.setdefault(run["job"], []).append(task)
                if self._s.max_parallel and run["job"] not in self._throttles:
                    # Its throttle is not known here: it counts as using all of max_parallel while it has
                    # tasks to start; a held one (an earlier start's retry) is released as budget frees up.
                    held = state.state == "PENDING" and state.reason == "JobHeldUser"
                    self._throttles[run["job"]] = (self._s.max_parallel, held)
            self._wake.set()
            return handle
        run = self._prepared(attempt)
        handle = self._handle(attempt, run, on_exit, on_placed)
        with self._lock:
            task = _Task(handle, run)
            self._tasks[attempt.token] = task
            self._new.append(task)
        return handle

    def flush(self) -> None:
        """Submit the attempts started since the last flush: one array per MaxArraySize of them."""
        with self._lock:
            new, self._new = self._new, []
        for first in range(0, len(new), self._array_size):
            chunk = new[first : first + self._array_size]
            try:
                self._submit(chunk)
            except (GTSError, OSError) as error:
                for task in chunk:  # these attempts fail; the engine retries them as max_retries says
                    log_line(task.run["log"], f"gpu_task_scheduler: could not submit the run to Slurm: {error}\n")
                    self._finish(task, Ended(returncode=1))
                logger.error("could not submit %d run(s) to Slurm: %s", len(chunk), error)

    def _submit(self, chunk: list[_Task]) -> None:
        batch = uuid.uuid4().hex[:12]
        folder = os.path.join(self._folder, batch)
        os.makedirs(folder)
        runs = []
        for index, task in enumerate(chunk):
            task.batch, task.index = batch, index
            runs.append(task.run)
        record = {
            "job_name": f"{self._s.job_name}.{batch}",  # found by it after a crash before the job id was written
            "runs": runs,
            "events": self._events,
            "lease_every": self._o.lease_interval,
            "time": self._s.time,
            "time_seconds": self._asks.time_seconds(),
            "signal_lead": self._asks.signal_lead(),
        }
        batch_file = os.path.join(folder, "batch.json")
        atomic_write(batch_file, json.dumps(record).encode())
        script = os.path.join(folder, "job.sh")
        lines = ["#!/bin/bash", "# gpu_task_scheduler: each task of this job array runs one attempt of a run."]
        lines += list(self._s.setup)
        entry = "-m gpu_task_scheduler.backends.slurm.task"
        lines.append(f"exec {shlex.quote(sys.executable)} {entry} {shlex.quote(batch_file)}")
        atomic_write(script, ("\n".join(lines) + "\n").encode())
        with self._lock:
            share, held = self._share_for_new(len(chunk))
        array = f"0-{len(chunk) - 1}" + (f"%{share}" if share else "")
        args = [
            f"--job-name={record['job_name']}",
            f"--array={array}",
            f"--output={folder}/%a.out",
            "--open-mode=append",
            f"--chdir={folder}",
            *(["--hold"] if held else []),
            *self._asks.sbatch_args(),
        ]
        job = commands.submit(args, script)
        self.submissions += 1
        with self._lock:
            for task in chunk:
                task.job = job
                task.run.update(job=job, index=task.index, batch=batch)
            self._arrays[job] = chunk
            if self._s.max_parallel:
                self._throttles[job] = (max(share, 1), held)
        logger.info(
            "submitted %d run(s) to Slurm as job array %s%s",
            len(chunk),
            job,
            " (held until runs of earlier arrays end)" if held else (f" (%{share} at a time)" if share else ""),
        )
        self._wake.set()

    def _share_for_new(self, size: int) -> tuple[int, bool]:
        """The throttle of a new array of ``size`` tasks, and whether it starts held."""
        budget = self._s.max_parallel
        if not budget:
            return 0, False
        share = min(size, throttle.free(self._array_states(), budget))
        return (share, False) if share else (1, True)

    # --- stopping -----------------------------------------------------------------------

    def request(self, token: str, signal_name: str) -> None:
        """The engine asks to stop (TERM) or kill (KILL) an attempt: sent by the following thread."""
        with self._lock:
            task = self._tasks.get(token)
            if task is not None and task.asked != "KILL":
                task.asked = signal_name
        self._wake.set()

    def _send_requests(self) -> None:
        with self._lock:
            asked = [task for task in self._tasks.values() if task.asked and task.asked not in task.sent]
            unsubmitted = [task for task in asked if task.job is None]
        for task in unsubmitted:  # never handed to Slurm: it never starts
            with self._lock:
                self._new = [other for other in self._new if other is not task]
            self._finish(task, Ended(returncode=-15 if task.asked == "TERM" else -9))
        asked = [task for task in asked if task.job is not None]
        try:
            self._look_again_before_cancelling(asked)
            asked = [task for task in asked if not task.handle.has_exited()]  # its end was just read
            queued = [task for task in asked if task.placed < 0 and not task.ran]
            running = [task for task in asked if task.placed >= 0 or task.ran]
            commands.cancel(_by_array(queued))  # not started: taken out of the queue
            # A stop: SIGTERM to all of it (the supervisor stops its run with the grace period). A kill:
            # SIGUSR2 to the supervisor alone, which kills its run and still reports and releases the
            # lease (SIGKILL to the supervisor too would leave the lease to expire before a retry).
            commands.cancel(_by_array([task for task in running if task.asked == "TERM"]), "TERM")
            killed = _by_array([task for task in running if task.asked == "KILL"])
            commands.cancel(killed, task_module.KILL_SIGNAL, supervisor_only=True)
        except GTSError as error:
            logger.warning("could not stop Slurm tasks: %s (tried again)", error)
            return
        for task in asked:
            assert task.asked is not None
            task.sent.add(task.asked)

    def _look_again_before_cancelling(self, asked: list[_Task]) -> None:
        """A task not seen started may have started since the last look: its start file is
        written once its run runs, and squeue was asked up to ``poll_interval`` ago. A plain
        ``scancel`` of a task whose run runs ends it on Slurm's terms (SIGTERM to each of its
        processes, Slurm's KillWait, not the grace period); a run whose command outlived a
        signal its children got could end 0 and be recorded succeeded (seen twice in CI). So
        the start files and squeue are read again now: only tasks squeue still lists as queued
        are cancelled outright; the rest are stopped as running ones are."""
        if all(task.placed >= 0 or task.ran for task in asked):
            return
        self._read_events()
        unseen = [task for task in asked if task.placed < 0 and not task.ran and not task.handle.has_exited()]
        if not unseen:
            return
        states = commands.states({task.job for task in unseen if task.job is not None})
        for task in unseen:
            state = states.get(task.name)
            if state is not None and state.live and state.state not in ("PENDING", "REQUEUED"):
                task.ran = True  # RUNNING, or on its way (CONFIGURING) or out (COMPLETING)

    # --- following ----------------------------------------------------------------------

    def _read_events(self) -> None:
        try:
            names = os.listdir(self._events)
        except OSError:
            return
        with self._lock:
            tasks = dict(self._tasks)
        for name in names:
            token, _, rest = name.partition(".")
            task = tasks.get(token)
            if task is None or rest == "abandoned":
                continue
            text, _, kind = rest.partition(".")
            incarnation = ascii_int(text)
            if incarnation is None or kind not in ("start", "end"):
                continue
            self._on_event(task, incarnation, kind, read_json(os.path.join(self._events, name)))

    def _on_event(self, task: _Task, incarnation: int, kind: str, record: Any) -> None:
        if not isinstance(record, dict) or task.handle.has_exited() or task.handle.fencing:
            return
        if kind == "start":
            if incarnation > task.placed >= 0:  # requeued: its earlier start is over
                self._cut_short(task)
                self._lose(task, f"Slurm requeued its job {task.name} (a preemption, or its node failed)")
            elif task.placed < 0:
                task.placed = incarnation
                node = f"{record.get('node', '?')} job {record.get('job', task.name)}"
                task.handle.node = node
                if task.handle.on_placed is not None:
                    task.handle.on_placed(node, int(record.get("pid") or 0), _running_for(record.get("at")))
            return
        if incarnation < max(task.placed, 0):
            return  # an earlier start's end: its loss was seen already
        if "lost" in record:
            self._lose(task, str(record["lost"]), wait=task.placed >= 0 or bool(record.get("signalled")))
            return
        if record.get("signalled") and not task.asked and not record.get("limit"):
            self._lose(task, f"Slurm stopped its job {task.name} (a preemption, a requeue, or a cancel outside gts)")
            return
        if not task.asked and not record.get("limit"):
            # A run may have ended because Slurm signalled it (a requeue or a preemption signals
            # every process of the job, and the run's SIGTERM can come before its supervisor's, which
            # then saw none): it failed, or it saved on SIGTERM and exited 0, recording a success of
            # a run cut short. squeue says, at once. Held until then, also when its end file is read
            # again (each look reads the files first: the end was recorded unchecked before). A
            # success was once taken at once: a run requeued 1.2 s in was recorded succeeded.
            if task.held_end is None:
                task.held_end, task.held_at = record, time.monotonic()
                self._next_look = 0.0
            return
        self._end(task, record)

    def _end(self, task: _Task, record: dict[str, Any]) -> None:
        fenced = record.get("fenced")
        limit = record.get("limit")
        self._finish(
            task,
            Ended(
                returncode=int(record.get("returncode", -9)),
                strays=tuple(record.get("strays") or ()),
                unstoppable=tuple(record.get("unstoppable") or ()),
                lost=None if not fenced else f"its job {task.name} was cut off from the scheduler: {fenced}",
                stopped=(RunStatus.TIMED_OUT, str(limit)) if limit and not task.asked else None,
            ),
        )

    def _look(self) -> None:
        """squeue, once for the whole sweep: what no file tells; then the arrays' throttles."""
        with self._lock:
            jobs = {task.job for task in self._tasks.values() if task.job is not None}
            jobs.update(name.partition("_")[0] for name in self._ended)
        if not jobs:
            return
        try:
            states = commands.states(jobs)
        except GTSError as error:
            if self._said != str(error):
                logger.warning("cannot read the sweep's Slurm tasks (%s); trying again", error)
                self._said = str(error)
            return
        self._said = None
        self._cancel_lingering(states)
        self._read_events()  # ends written before the squeue answer count first
        with self._lock:
            self._states = states
            tasks = [task for task in self._tasks.values() if task.job is not None]
        waiting: dict[str, int] = {}
        for task in tasks:
            if task.handle.has_exited() or task.handle.fencing:
                continue
            state = states.get(task.name)
            if task.held_end is not None:  # its end: was it Slurm's doing?
                self._failed_or_lost(task, state)
                continue
            if state is not None and state.live:
                task.gone_looks = 0
                queued = state.state in ("PENDING", "REQUEUED")
                # Requeued: queued again once started (BeginTime: Slurm's delay before a requeued job).
                if queued and (task.placed >= 0 or task.ran or state.reason == "BeginTime"):
                    self._cut_short(task)
                    self._lose(task, f"Slurm requeued its job {task.name} (a preemption, or its node failed)")
                elif queued:
                    waiting[state.reason] = waiting.get(state.reason, 0) + 1
                else:
                    task.ran = True
                    self._started_or_lost(task, state)
                continue
            task.gone_looks += 1
            if task.gone_looks < END_LAG:
                continue
            self._ended_without_end_file(task, state)
        self._say_waiting(waiting)
        if self._s.max_parallel:
            self._apply_throttles()

    def _started_or_lost(self, task: _Task, state: TaskState) -> None:
        """A task Slurm runs whose supervisor has not said it started within ``start_timeout`` is
        given up (and its run runs again): slurmd lost its batch step. (Seen with the tests' Slurm
        22.05 under load: "Launching batch job" and never "done with job", the task RUNNING for good,
        nothing of it running.) The supervisor says so within a second of its setup lines."""
        if task.placed >= 0 or state.state != "RUNNING":
            task.running_since = None
            return
        now = time.monotonic()
        if task.running_since is None:
            task.running_since = now
        elif now - task.running_since >= self._s.start_timeout:
            self._lose(
                task,
                f"Slurm has run its job {task.name} for {self._s.start_timeout:g}s and its supervisor never "
                "started (slurmd lost its batch step, or the setup lines hang)",
            )

    def _cancel_lingering(self, states: dict[str, TaskState]) -> None:
        """A task whose attempt's end was heard leaves Slurm's list within moments; one still listed
        SETTLE seconds later is cancelled. Its run is over, and the task would hold its place under
        the array's throttle (and its allocation) for good: the sweep's queued tasks would never
        start. (In the test suite, Slurm 22.05's proctrack/linuxproc plugin now and then crashed a
        task's slurmstepd after its run had ended, leaving the task RUNNING with nothing behind it.)"""
        now, lingering = time.monotonic(), []
        with self._lock:
            for name, heard in list(self._ended.items()):
                state = states.get(name)
                if state is None or not state.live:
                    del self._ended[name]
                elif now - heard >= SETTLE:
                    lingering.append(name)
                    del self._ended[name]
        if lingering:
            logger.info("Slurm still lists %d task(s) whose run ended; cancelling them: %s", len(lingering), lingering)
            try:
                commands.cancel(lingering)
            except GTSError as error:
                logger.warning("could not cancel Slurm tasks whose run ended: %s", error)

    def _failed_or_lost(self, task: _Task, state: TaskState | None) -> None:
        """A run ended with no signal its supervisor saw: Slurm's state of its task says whether
        Slurm requeued, preempted or cancelled it (lost: it runs again, a success it recorded set
        aside) or the run ended by itself (:func:`held_end_verdict`)."""
        assert task.held_end is not None
        verdict = held_end_verdict(state, task.held_looks, time.monotonic() - task.held_at)
        task.held_looks += 1
        if verdict == "lost":
            assert state is not None
            requeued = state.state in ("PENDING", "SPECIAL_EXIT") or state.state.startswith("REQUEUE")
            why = "requeued" if requeued else state.state.lower().replace("_", " ")
            self._cut_short(task)
            self._lose(task, f"Slurm {why} its job {task.name} while its run ran")
        elif verdict == "end":
            if state is not None and state.live:
                waited = time.monotonic() - task.held_at
                logger.info("Slurm still lists task %s %s %.0fs after its run ended", task.name, state.state, waited)
            self._end(task, task.held_end)

    def _cut_short(self, task: _Task) -> None:
        task_module.set_aside_success(task.run, task.handle.token)

    def _ended_without_end_file(self, task: _Task, state: TaskState | None) -> None:
        words = "is no longer known to Slurm" if state is None else f"ended {state.state}"
        if task.asked:
            # Stopped as asked. Slurm saying the job ended means its processes are gone (it says so
            # once it has killed them): no lease to wait for, unless Slurm lost its node or forgot it.
            confirmed = state is not None and state.state not in ("NODE_FAIL", "BOOT_FAIL")
            self._lose(task, f"its job {task.name} {words}", lost=False, wait=not confirmed)
        elif task.placed >= 0 or state is None or state.state not in ("COMPLETED", "FAILED", "OUT_OF_MEMORY"):
            self._lose(task, f"its job {task.name} {words} before its run reported an end")
        else:  # the batch script failed before the run started: the setup lines, say
            output = os.path.join(self._folder, task.batch, f"{task.index}.out")
            log_line(
                task.run["log"],
                f"gpu_task_scheduler: Slurm job {task.name} {words} before the run started; its output "
                f"({output}):\n{_tail(output)}\n",
            )
            self._finish(task, Ended(returncode=1))

    def _say_waiting(self, waiting: dict[str, int]) -> None:
        words = ", ".join(f"{count} pending ({reason})" for reason, count in sorted(waiting.items()))
        if words and words != self._waiting_words:
            logger.info("Slurm: %s", words)
        self._waiting_words = words

    def _array_states(self) -> list[throttle.Array]:
        arrays = []
        for job, tasks in self._arrays.items():
            if job not in self._throttles:
                continue
            running = pending = 0
            for task in tasks:
                state = self._states.get(task.name)
                if task.handle.has_exited() or task.handle.fencing:
                    continue
                if state is None or state.state == "PENDING":
                    pending += 1 if task.placed < 0 else 0
                elif state.live:
                    running += 1
            share, held = self._throttles[job]
            arrays.append(throttle.Array(job, running, pending, share, held))
        return arrays

    def _apply_throttles(self) -> None:
        assert self._s.max_parallel
        with self._lock:
            changes = throttle.changes(self._array_states(), self._s.max_parallel)
        for change in changes:
            try:
                share, held = self._throttles[change.job]
                if change.throttle is not None:
                    commands.set_throttle(change.job, change.throttle)
                    share = change.throttle
                if change.held is not None:
                    commands.hold(change.job, change.held)
                    held = change.held
                self._throttles[change.job] = (share, held)
            except GTSError as error:
                logger.warning("could not share max_parallel across the sweep's arrays: %s", error)
                return

    def _give_up_adopted(self, name: str, token: str, run: dict[str, Any]) -> None:
        """The engine runs ``name`` again (its ledger knows another attempt) while an earlier start's
        Slurm task of it is still queued or running: that task is told abandoned (it never starts,
        or stops), cancelled, and its lease waited for, before the new attempt is handed to Slurm,
        never beside it. It was dropped, and Slurm ran it as well."""
        logger.info("%s: its Slurm task of an earlier start is given up before it runs again", name)
        try:
            atomic_write(os.path.join(self._events, f"{token}.abandoned"), b"", durable=True)
            commands.cancel([f"{run['job']}_{run['index']}"])
        except (GTSError, OSError) as error:
            logger.warning("%s: could not cancel its Slurm task of an earlier start: %s", name, error)
        wait_over(run["lease"], token, LeaseTerms(self._o.lease_interval, self._o.grace_period))

    # --- ends ---------------------------------------------------------------------------

    def _lose(self, task: _Task, why: str, *, wait: bool = True, lost: bool = True) -> None:
        """Give the attempt up: it never starts (again), its lease is waited for, then it ends."""
        task.handle.fencing = True
        terms = LeaseTerms(self._o.lease_interval, self._o.grace_period)

        def fence() -> None:
            how = "it had not started"
            try:
                atomic_write(os.path.join(self._events, f"{task.handle.token}.abandoned"), b"", durable=True)
                if task.job is not None and (self._states.get(task.name) is None or self._states[task.name].live):
                    commands.cancel([task.name])
            except (GTSError, OSError) as error:
                logger.warning("%s: could not cancel Slurm task %s: %s", task.run["name"], task.name, error)
            if wait:
                how = wait_over(task.run["lease"], task.handle.token, terms)
            if lost:
                self._finish(task, Ended(returncode=-9, lost=f"{why}; given up, {how}"))
            else:
                self._finish(task, Ended(returncode=-15 if task.asked == "TERM" else -9))

        threading.Thread(target=fence, name=f"gts-slurm-fence-{task.handle.token[:8]}", daemon=True).start()

    def _finish(self, task: _Task, ended: Ended) -> None:
        handle = task.handle
        with self._lock:
            if handle.has_exited():
                return
            self._tasks.pop(handle.token, None)
            if task.job is not None:
                self._ended[task.name] = time.monotonic()
            handle.ended = ended
            handle.over.set()
        files = [f"{handle.token}.{n}.{kind}" for n in range(max(task.placed, 0) + 1) for kind in ("start", "end")]
        for name in [f"{handle.token}.abandoned", *files]:
            try:
                os.unlink(os.path.join(self._events, name))
            except OSError:
                pass
        handle.on_exit()

    # --- adopting ---------------------------------------------------------------------

    def _find_live_tasks(self) -> None:
        """Attempts an earlier start handed to Slurm that are still queued or running there."""
        for run, state in live_tasks(self._root, settled=True):
            self._adoptable[run["name"]] = (run["token"], run, state)
        if self._adoptable:
            found = len(self._adoptable)
            logger.info("Slurm: %d run(s) of an earlier start are still queued or running: followed", found)


def _by_array(tasks: list[_Task]) -> list[str]:
    """The tasks as ``JOB_[i,j-k]``, one per array."""
    indexes: dict[str, list[int]] = {}
    for task in tasks:
        if task.job is not None:
            indexes.setdefault(task.job, []).append(task.index)
    return [commands.task_list(job, found) for job, found in indexes.items()]


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(handle.readlines()[-lines:]).rstrip()
    except OSError:
        return "(none)"
