"""The driver's side of a Slurm pool (``slurm: {pool: {nodes, allocations, time}}``): a few
allocations of whole nodes run the sweep's runs, packed as a local sweep packs them.

* **Where the driver lives.** Here, where ``gts run`` runs (the login side), as for
  job arrays: it is the ledger's one writer. SQLite over NFS or Lustre loses
  data when two hosts write one database, so no node ever opens the ledger;
  nodes only write files of their own (beats, claims, events), each written
  whole (``atomic_write``) and read by the driver alone. A driver inside the
  first allocation would die with that allocation (its time limit, a
  requeue) and take the sweep's bookkeeping with it; the login side outlives
  every allocation, and ``gts status`` on any login node reads the ledger that
  one process writes.
* **Handing runs over.** The engine starts attempts on the pool's places (up to
  ``max_queued``); each flush writes them into the shared queue
  (``poolfiles.py``), in the engine's order. No job and no job step per run:
  an agent per node (``agent.py``) takes what its slots can place.
* **Allocations.** While attempts wait, ``allocations`` jobs of ``nodes`` nodes each
  are kept queued or running (one more is submitted for each that ends or is
  warned of its time limit); an agent whose queue stays empty for
  ``idle_exit`` seconds ends, and an allocation ends with its last agent.
  ``--no-kill``: a node lost takes its own agent, not the allocation.
* **Following.** As for job arrays, the events folder tells starts and ends; one
  ``squeue`` per ``poll_interval`` for the pool's jobs and the agents' beats tell
  what no file tells. An attempt whose agent's allocation ended, was
  requeued, or whose agent fell silent is given up: its ``abandoned`` file,
  its lease waited for (``records/lease.py``), then the engine runs it again
  (``node_failure_retries``); an attempt stopped because its allocation reached
  its time limit (or was cancelled) is *handed back*: it goes on from its
  last reported step in another allocation, not counted as a retry.
* **Stopping.** A queued attempt is withdrawn (its entry deleted: the rename
  that would take it then fails); a running one gets the driver's word
  (``TOKEN.stop`` / ``TOKEN.kill``), which its agent relays.
* **Adopting.** A later start (after ``--detach``, or a driver that died) follows
  the attempts still queued, and those claimed by agents of live allocations;
  those of allocations that are gone are given up (their leases waited for)
  before anything runs again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
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
from ...recordclass import Record
from ...records.lease import LeaseTerms, wait_all_over, wait_over
from ...records.paths import UnsafePathError, atomic_write, atomic_write_json, open_regular, read_json
from ...sweep.options import SchedulerOptions
from ...sweep.slurm import PoolOptions
from ..local.prepare import TaskFactory
from ..supervisor import log_line
from . import commands
from . import task as task_module
from .commands import TaskState
from .following import Following, SlurmHandle, _running_for
from .poolfiles import PoolFiles, entry_name, give_up, job_of, left_attempts, token_of
from .shape import allocation_args, is_gpu_sweep, pool_shape, pool_slots

logger = logging.getLogger("gpu_task_scheduler")

CLOSE_WAIT = 60.0  # seconds the sweep's end waits for its allocations to end by themselves
MISSING_LOOKS = 2  # looks an attempt may be neither queued, claimed nor ended (an end being written)
HOLD = 1.0  # seconds a failed end is held before it counts: was it Slurm's doing (a cancel, a requeue)?
# Seconds an allocation whose every agent has ended may stay up before it is cancelled: its batch
# script ends a moment after its agents. (With the tests' Slurm 22.05 a step's slurmstepd now and
# then died after its agent had ended, and srun waited for it for good, keeping the job RUNNING.)
SETTLE = 5.0
# The most allocations a pool keeps at once where Slurm does not say how many nodes its partition has.
MAX_ALLOCATIONS = 10_000


class _Attempt(Record, frozen=False):
    handle: SlurmHandle
    run: dict[str, Any]
    entry: str = ""  # its queue entry's name; "" until flushed
    placed: bool = False  # its start event was read
    agent: str | None = None  # the agent that claimed it
    job: str | None = None  # the allocation it runs in (its start event's)
    missing: int = 0
    held: dict[str, Any] | None = None  # a failed end, until the pool's state says whose doing it was
    held_at: float = 0.0
    asked: str | None = None
    sent: str | None = None  # the request last written for its agent (TERM, KILL)


class _Beat(Record, frozen=False):
    record: dict[str, Any]
    changed: float  # when its count last changed (this clock)


class PoolLauncher(Following):
    following = "the Slurm pool"

    def __init__(self, task: type[GPUTask] | TaskFactory, options: SchedulerOptions, *, detach: bool = False) -> None:
        super().__init__(task, options, detach=detach)
        self._p: PoolOptions = self._s.pool or PoolOptions()
        self._files = PoolFiles(options.result_root_folder)
        self._shape = pool_shape(options, self._partition_if_known)  # open() asks Slurm again, for good
        self._attempts: dict[str, _Attempt] = {}  # token -> attempt, while the engine follows it
        self._new: list[_Attempt] = []
        self._adoptable: dict[str, tuple[str, dict[str, Any], str]] = {}  # name -> (token, run, entry)
        self._beats: dict[str, _Beat] = {}
        self._allocations: dict[str, TaskState] = {}
        self._seq = 0
        self._asked = self._p.allocations  # the size gts pool asked for, as last logged
        self._most = MAX_ALLOCATIONS  # allocations the partition can hold at once (open())
        self._said_target: str | None = None  # why the size file could not be read, as last logged
        self._drained: set[str] = set()  # allocations whose drain file the driver wrote
        self._running_since: dict[str, float] = {}  # allocations RUNNING with no agent's beat yet
        self._name = ""
        self._script = ""
        self.submissions = 0  # sbatch calls (the tests and the benchmark count them)
        self.abilities = Abilities(
            cluster_slots=True, batches=True, queue_places=True, adopts=True, runs_at_once=self.pool_slots()
        )

    def __enter__(self) -> PoolLauncher:
        return self

    # --- the sweep ------------------------------------------------------------------

    def pool_slots(self) -> int:
        return pool_slots(self._o, self._shape.runs_per_node)

    def slots(self, options: SchedulerOptions) -> list[Slot]:
        missing = commands.missing_commands()
        if missing:
            raise GTSError(f"backend: slurm needs Slurm's commands on PATH; not found: {', '.join(missing)}")
        return [Slot(f"pool{index}", ()) for index in range(self._s.max_queued)]

    def slot_gpus(self, slot: Slot) -> float:
        return float(self._asks.gpus_per_run()) if self._shape.gpus_per_node else 0.0

    def job_args(self) -> list[str]:
        return allocation_args(self._o, self._shape)

    def _partition_if_known(self) -> commands.Partition | None:
        """Before open(), which asks Slurm for good: only what the engine reads first (runs at once)
        needs it, for a GPU sweep whose nodes' GPUs the config does not say."""
        if self._p.gpus_per_node or not is_gpu_sweep(self._o):
            return None
        try:
            return commands.partition(self._s.partition)
        except GTSError:  # asked again at open(), where it is an error
            return None

    def open(self, lock_fd: int) -> None:
        problem = commands.shared_root_problem(
            self._files.root,
            commands.file_system_of(self._files.root),
            commands.partition_nodes(self._s.partition),
            socket.gethostname(),
        )
        if problem is not None:
            raise GTSError(problem)
        found = commands.partition(self._s.partition)
        if found is None or not found.nodes:
            where = f"partition {self._s.partition}" if self._s.partition else "the default partition"
            raise GTSError(f"Slurm's sinfo lists no node of {where}: a pool cannot be shaped to its nodes")
        self._shape = pool_shape(self._o, lambda: found)
        commands.test_submission(self.job_args())
        self._files.make()
        settings = read_json(self._files.settings)
        pool = settings.get("pool") if isinstance(settings, dict) else None
        pool = pool if isinstance(pool, str) and pool.isalnum() else uuid.uuid4().hex[:10]
        self._name = f"{self._s.job_name}.pool.{pool}"
        self._most = max(1, found.nodes // self._p.nodes)
        record = {
            "pool": pool,
            "max_allocations": self._most,  # what `gts pool --allocations` may ask (its nodes' count)
            "lease_every": self._o.lease_interval,
            "idle_exit": self._p.idle_exit,
            "gpus_per_node": self._shape.gpus_per_node,  # the GPUs Slurm gives each node: GPU slots
            "gpus_per_run": self._asks.gpus_per_run(),
            "slots_per_node": self._p.slots_per_node,
            "cpus_per_run": self._shape.cpus_per_run,
        }
        # The sweep's options as the agents read them (this user's only: they may hold a notify_email
        # password, and an agent runs what it unpickles).
        atomic_write(self._files.options, pickle.dumps(self._o))  # a new file of mode 0600, renamed over
        atomic_write_json(self._files.settings, record)
        for stale in (self._files.closed, self._files.target):  # a new start: the config's size again
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        self._script = self._write_script()
        self._adopt()
        self._start_following("gts-slurm-pool")
        logger.info(
            "Slurm pool: %d allocation(s) of %d node(s)%s, up to %d run(s) at once",
            self._p.allocations,
            self._p.nodes,
            f", {self._p.time} each" if self._p.time else "",
            self.pool_slots(),
        )

    def _write_script(self) -> str:
        """The allocations' batch script: an agent per node, each started again if it dies (not when
        its node is gone), until the job is warned of its time limit. A node whose agent ended by
        itself (nothing left to run) is given back to Slurm at once, as disBatch does: the job
        shrinks to the nodes still working (the batch script's own node goes with the job)."""
        drain = shlex.quote(self._files.drains) + '/"$SLURM_JOB_ID"'
        lock = shlex.quote(self._files.jobs) + '/"$SLURM_JOB_ID".lock'
        entry = "-m gpu_task_scheduler.backends.slurm.agent"
        agent = f"{shlex.quote(sys.executable)} {entry} {shlex.quote(self._files.root)}"
        # --whole: the agent's step holds every CPU (and GPU) the job holds on its node, not one: it
        # shares them out among its runs (agent.py). --gres: a step gets no GPU unless it asks.
        step = '--overlap --whole --nodes=1 --ntasks=1 --nodelist="$1" --kill-on-bad-exit=0'
        gres = f" --gres=gpu:{self._shape.gpus_per_node}" if self._shape.gpus_per_node else ""
        lines = [
            "#!/bin/bash",
            "# gpu_task_scheduler: a pool allocation; one agent per node runs the sweep's runs.",
            *self._s.setup,
            'echo "gpu_task_scheduler: allocation $SLURM_JOB_ID started $(date +%s.%N) on $SLURM_JOB_NODELIST"',
            f"rm -f {drain}",  # a requeued job starts afresh: its earlier start's warning is over
            f"trap 'touch {drain}' USR1 TERM",
            "release() {",
            '  [ "$1" = "$SLURMD_NODENAME" ] && return 0',
            "  (",
            "    flock 9",
            '    left=$(squeue -h -j "$SLURM_JOB_ID" -o %N)',
            '    nodes=$(scontrol show hostnames "$left" | grep -vx "$1" | paste -sd, -)',
            '    [ -n "$nodes" ] && scontrol update JobId="$SLURM_JOB_ID" NodeList="$nodes" >/dev/null',
            '    rm -f slurm_job_"$SLURM_JOB_ID"_resize.*',  # what scontrol writes for a resized job's shell
            f"  ) 9>{lock}",
            "}",
            "agent() {",
            "  local tries=0",
            f"  while [ ! -e {drain} ]; do",
            f"    if srun {step}{gres} {agent}; then",
            '      release "$1"',
            "      return 0",
            "    fi",
            "    tries=$((tries + 1)); [ $tries -ge 3 ] && return 1",
            "    sleep 1",
            "  done",
            "}",
            'for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do agent "$node" & done',
            'while [ -n "$(jobs -pr)" ]; do wait; done',
            f"rm -f {lock}",
            'echo "gpu_task_scheduler: allocation $SLURM_JOB_ID ended $(date +%s.%N)"',
        ]
        path = os.path.join(self._files.jobs, f"{self._name}.sh")
        atomic_write(path, ("\n".join(lines) + "\n").encode())
        return path

    def close(self) -> None:
        """The sweep is over: agents end once idle, and nothing of the pool stays queued (unless the
        sweep was detached: its agents run on through what is queued)."""
        if self._detach:
            self._end_following()
            return
        with contextlib.suppress(OSError):
            atomic_write(self._files.closed, b"")
        self._give_up_leftovers()
        self._end_following()
        deadline = time.monotonic() + CLOSE_WAIT
        live: list[str] = []
        while time.monotonic() < deadline:
            try:
                self._allocations = commands.jobs_named(self._name)
            except GTSError as error:
                logger.warning("cannot read the pool's Slurm jobs at the sweep's end: %s", error)
                return
            live = [job for job, state in self._allocations.items() if state.live]
            queued = [job for job in live if self._allocations[job].state in ("PENDING", "REQUEUED")]
            self._read_beats()
            done = queued + self._finished(self._allocations)  # nothing of the sweep runs there
            if done:
                with contextlib.suppress(GTSError):
                    commands.cancel(done)
            if not live:
                break
            time.sleep(0.2)
        if live:
            logger.info("Slurm pool: cancelling %d allocation(s) still up at the sweep's end", len(live))
            with contextlib.suppress(GTSError):
                commands.cancel(live)
            live = []  # cancelled: their agents hear no more words
        self._read_beats()
        self._write_state(final=True)
        for agent in self._files.listdir(self._files.agents):  # their allocations are over: their folders go
            if job_of(agent) not in live:
                self._files.remove_agent(agent)
        if not live:  # no agent is left to hear a word: the "abandoned" ones of agents that died go too
            for folder in (self._files.events, self._files.drains):
                for name in self._files.listdir(folder):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(folder, name))

    def _give_up_leftovers(self) -> None:
        """Attempts an earlier start left that this one did not follow: withdrawn from the queue, or
        given up where an agent runs them."""
        with self._lock:
            leftovers, self._adoptable = list(self._adoptable.values()), {}
        for leftover in leftovers:
            give_up(self._files, leftover, [])

    # --- adopting ---------------------------------------------------------------------

    def _adopt(self) -> None:
        """What an earlier start left: queued attempts and those claimed by agents of live allocations
        are followed; the claims of allocations that are gone are given up, and their leases waited
        for, before anything runs again."""
        try:
            self._allocations = commands.jobs_named(self._name)
        except GTSError as error:
            raise GTSError(f"cannot read the pool's Slurm jobs: {error}") from error
        alive = {
            job for job, state in self._allocations.items() if state.live and state.state not in ("PENDING", "REQUEUED")
        }
        self._adoptable, stale, self._seq = left_attempts(self._files, alive, self._seq)
        if stale:
            logger.info("Slurm pool: waiting for %d attempt(s) no start follows to be over", len(stale))
            wait_all_over(stale, LeaseTerms(self._o.lease_interval, self._o.grace_period))
        if self._adoptable:
            found = len(self._adoptable)
            logger.info("Slurm pool: %d run(s) of an earlier start are still queued or running: followed", found)

    # --- starting ---------------------------------------------------------------------

    def start(self, attempt: Attempt, on_exit: Callable[[], None], on_placed: OnPlaced | None = None) -> SlurmHandle:
        with self._lock:
            adopted = self._adoptable.pop(attempt.spec.name, None)
        if adopted is not None and adopted[0] != attempt.token:
            # The engine runs the run again (its ledger knows another attempt): the one an earlier
            # start left is given up and over before the new one is queued, never beside it.
            stale: list[tuple[str, str]] = []
            give_up(self._files, adopted, stale)
            logger.info("%s: its attempt of an earlier start is given up before it runs again", attempt.spec.name)
            wait_all_over(stale, LeaseTerms(self._o.lease_interval, self._o.grace_period))
        elif adopted is not None:
            handle = self._handle(attempt, adopted[1], on_exit, on_placed)
            with self._lock:
                self._attempts[attempt.token] = _Attempt(handle, adopted[1], entry=adopted[2])
            self._wake.set()
            return handle
        run = self._prepared(attempt)
        handle = self._handle(attempt, run, on_exit, on_placed)
        with self._lock:
            task = _Attempt(handle, run)
            self._attempts[attempt.token] = task
            self._new.append(task)
        return handle

    def flush(self) -> None:
        """Queue the attempts started since the last flush, in the order they started."""
        with self._lock:
            new, self._new = self._new, []
        for task in new:
            # Its entry is named before the file is written, under the lock _send_requests reads it
            # by: a stop asked meanwhile finds it queued (its word waits for the agent that takes
            # it), never "not queued" while the file appears (it ran with no one to stop it).
            with self._lock:
                asked, self._seq = task.asked, self._seq + 1
                entry = task.entry = entry_name(self._seq, task.handle.token) if asked is None else ""
            if asked is not None:  # stopped before it was queued: it never starts
                self._finish(task, Ended(returncode=-15 if asked == "TERM" else -9))
                continue
            try:
                atomic_write(os.path.join(self._files.queue, entry), json.dumps(task.run).encode(), durable=False)
            except OSError as error:
                log_line(task.run["log"], f"gpu_task_scheduler: could not queue the run in the pool: {error}\n")
                self._finish(task, Ended(returncode=1))
        if new and self._detach:  # the driver returns now: the allocations must be asked for first
            self._look()
        elif new:
            self._next_look = 0.0  # allocations for them now
            self._wake.set()

    # --- stopping -----------------------------------------------------------------------

    def request(self, token: str, signal_name: str) -> None:
        with self._lock:
            task = self._attempts.get(token)
            if task is not None and task.asked != "KILL":
                task.asked = signal_name
        self._wake.set()

    def _send_requests(self) -> None:
        # Each task with what it was asked, read once under the lock: a KILL asked while its TERM is
        # being written is sent at the next round (a 'sent' flag set after the write lost it, and
        # a run that traps SIGTERM then ran out its grace period after the second Ctrl-C).
        with self._lock:
            asked = [(task, task.asked) for task in self._attempts.values() if task.asked and task.sent != task.asked]
        for task, word in asked:
            code = -15 if word == "TERM" else -9
            if not task.entry:  # never queued
                with self._lock:
                    self._new = [other for other in self._new if other is not task]
                self._finish(task, Ended(returncode=code))
                continue
            try:
                os.unlink(os.path.join(self._files.queue, task.entry))
            except FileNotFoundError:  # an agent has it: its word
                try:
                    atomic_write(self._files.event(task.handle.token, "stop" if word == "TERM" else "kill"), b"")
                except OSError as error:
                    logger.warning("could not ask a pool agent to stop %s: %s (tried again)", task.run["name"], error)
                    continue
            else:  # withdrawn: it never starts
                self._finish(task, Ended(returncode=code))
            task.sent = word
            if task.asked != word:
                self._wake.set()  # asked again meanwhile: the next round sends it

    # --- following ----------------------------------------------------------------------

    def _read_events(self) -> None:
        names = self._files.listdir(self._files.events)
        with self._lock:
            tasks = dict(self._attempts)
        for name in names:
            token, _, kind = name.partition(".")
            task = tasks.get(token)
            if task is None or kind not in ("0.start", "0.end"):
                continue
            record = read_json(os.path.join(self._files.events, name))
            if not isinstance(record, dict) or task.handle.has_exited() or task.handle.fencing or task.held:
                continue
            if kind == "0.start":
                if not task.placed:
                    task.placed = True
                    task.job = str(record.get("job")) if record.get("job") is not None else None
                    slot = f" {record['slot']}" if isinstance(record.get("slot"), str) else ""
                    node = f"{record.get('node', '?')}{slot} (pool job {record.get('job', '?')})"
                    task.handle.node = node
                    if task.handle.on_placed is not None:
                        task.handle.on_placed(node, int(record.get("pid") or 0), _running_for(record.get("at")))
            elif "lost" in record:
                self._lose(task, str(record["lost"]), wait=task.placed or bool(record.get("signalled")))
            elif os.path.exists(self._files.event(token, "drained")) and not task.asked:
                self._finish(task, self._ended(record, handed_back=True))
            elif not task.asked and not record.get("fenced"):
                # A cancel, a requeue or a preemption of the allocation signals every process of
                # it, the run's now and then before its agent's (which then drains too late): a
                # run that failed, or that saved on SIGTERM and exited 0 (a success of a run cut
                # short), is held until a look after its end says whether the allocation still
                # runs. A success is looked at at once (one squeue); a failure after HOLD.
                task.held, task.held_at = record, time.monotonic()
                self._next_look = min(self._next_look, task.held_at + (HOLD if record.get("returncode") != 0 else 0.0))
            else:
                self._finish(task, self._ended(record))

    def _ended(self, record: dict[str, Any], *, handed_back: bool = False) -> Ended:
        fenced = record.get("fenced")
        lost = f"its pool agent was cut off from the scheduler: {fenced}" if fenced else None
        if handed_back:
            lost = "its allocation reached its time limit (or was cancelled): handed back"
        peak = record.get("gpu_peak")
        return Ended(
            gpu_peak=peak if isinstance(peak, int) and not isinstance(peak, bool) and peak > 0 else None,
            returncode=int(record.get("returncode", -9)),
            strays=tuple(record.get("strays") or ()),
            unstoppable=tuple(record.get("unstoppable") or ()),
            lost=lost,
            handed_back=handed_back,
        )

    def _look(self) -> None:
        """One squeue for the pool's jobs and a read of the agents' beats: attempts whose agent is
        gone are given up; allocations are kept as the queue needs them."""
        asked = time.monotonic()
        try:
            states = commands.jobs_named(self._name)
        except GTSError as error:
            if self._said != str(error):
                logger.warning("cannot read the pool's Slurm jobs (%s); trying again", error)
                self._said = str(error)
            return
        self._said = None
        self._allocations = states
        self._read_beats()
        claims: dict[str, str] = {}
        for agent in self._beats:
            for entry in self._files.listdir(self._files.claimed(agent)):
                token = token_of(entry)
                if token:
                    claims[token] = agent
        self._read_events()  # ends written before the listing count first
        queued = set(self._files.listdir(self._files.queue))
        with self._lock:
            tasks = [task for task in self._attempts.values() if task.entry]
        for task in tasks:
            if task.handle.has_exited() or task.handle.fencing:
                continue
            if task.held is not None:
                self._failed_or_handed_back(task, states, asked)
                continue
            claimer = claims.get(task.handle.token)
            if claimer is not None:
                task.agent, task.missing = claimer, 0
                why = self._agent_gone(claimer, states)
                if why is not None:
                    beat = self._beats[claimer].record
                    self._lose(task, why, handed_back=bool(beat.get("draining")))
            elif task.entry in queued:
                task.missing = 0
            else:
                task.missing += 1
                if task.missing >= MISSING_LOOKS:
                    self._lose(task, "its queue entry and its claim are gone without an end")
        self._drain_the_gone(states)
        requeued = self._requeued(states)
        if requeued:  # its runs were handed back; it would start again only after Slurm's delay
            logger.info("Slurm pool: allocation(s) %s requeued by Slurm; cancelling (another is asked)", requeued)
        finished = self._finished(states) + self._silent(states) + requeued
        if finished:
            words = ", ".join(finished)
            logger.info("Slurm pool: allocation(s) %s run no agent (ended, or never started); cancelling", words)
            try:
                commands.cancel(finished)
            except GTSError as error:
                logger.warning("could not cancel finished pool allocations: %s", error)
            for job in finished:
                states.pop(job, None)
        self._keep_allocations(states, bool(queued))
        self._write_state()

    def _failed_or_handed_back(self, task: _Attempt, states: dict[str, TaskState], asked: float) -> None:
        """A run that ended without being asked to stop: its own end, unless its allocation was
        being drained (handed back) or Slurm cancelled, requeued or lost it (lost: it runs again,
        a success it recorded set aside as one of a run cut short). Decided on Slurm's states
        ``asked`` for after its end was read: Slurm marks an allocation it takes down before it
        signals it, so an earlier answer may say RUNNING of one it took down."""
        assert task.held is not None
        failed = task.held.get("returncode") != 0
        if asked < task.held_at or (failed and time.monotonic() - task.held_at < HOLD):
            return
        job = job_of(task.agent) if task.agent else task.job
        draining = any(
            beat.record.get("draining") and beat.record.get("node") == task.handle.node.split()[0]
            for agent, beat in self._beats.items()
            if job_of(agent) == job and task.handle.node
        )
        if os.path.exists(self._files.event(task.handle.token, "drained")) or draining:
            self._finish(task, self._ended(task.held, handed_back=True))
            return
        state = states.get(job) if job else None
        if job is not None and (state is None or state.state != "RUNNING"):
            words = "is no longer known to Slurm" if state is None else state.state
            task_module.set_aside_success(task.run, task.handle.token)
            self._finish(
                task, Ended(returncode=int(task.held.get("returncode", -9)), lost=f"its allocation {job} {words}")
            )
            return
        self._finish(task, self._ended(task.held))

    def _silent(self, states: dict[str, TaskState]) -> list[str]:
        """Allocations Slurm has run for ``start_timeout`` seconds from which no agent has beaten:
        slurmd lost their batch step (or the setup lines hang). Cancelled, they are replaced."""
        now, found = time.monotonic(), []
        beating = {job_of(agent) for agent in self._beats}
        for job, state in states.items():
            if state.state != "RUNNING" or job in beating:
                self._running_since.pop(job, None)
                continue
            since = self._running_since.setdefault(job, now)
            if now - since >= self._s.start_timeout:
                logger.warning(
                    "Slurm pool: allocation %s has run for %gs and no agent of it started; giving it up",
                    job,
                    self._s.start_timeout,
                )
                found.append(job)
        return found

    def _drain_the_gone(self, states: dict[str, TaskState]) -> None:
        """Allocations Slurm ended, cancelled or requeued, whose agents may still be up for moments
        (Slurm signals them within KillWait): their drain file, so that they take no more runs. One
        that did, after a scancel the driver had seen, ran a run its allocation's end then killed."""
        for job in {job_of(agent) for agent in self._beats} - self._drained:
            state = states.get(job)
            if state is None or not state.live or state.state in ("PENDING", "REQUEUED"):
                with contextlib.suppress(OSError):
                    atomic_write(self._files.drain(job), b"", durable=False)
                    self._drained.add(job)  # once: not a stat of every allocation ever seen at each look

    def _requeued(self, states: dict[str, TaskState]) -> list[str]:
        """Allocations queued again after their agents ran: Slurm requeued them (a preemption, a
        node's failure, ``scontrol requeue``). Their runs were handed back or given up when their
        agents went; kept, one would start again only after Slurm's delay (BeginTime, minutes) and,
        holding whole nodes, keep the allocation asked in its place from starting until then."""
        ran = {job_of(agent) for agent in self._beats}
        return [job for job, state in states.items() if state.state in ("PENDING", "REQUEUED") and job in ran]

    def _finished(self, states: dict[str, TaskState]) -> list[str]:
        """Running allocations whose every node's agent ended by itself (nothing left to run, or
        drained) over SETTLE seconds ago: nothing of the sweep runs there any more."""
        now, found = time.monotonic(), []
        for job, state in states.items():
            if state.state != "RUNNING":
                continue
            beats = [beat for agent, beat in self._beats.items() if job_of(agent) == job]
            over = {beat.record.get("node") for beat in beats if beat.record.get("over")}
            if not over or any(not beat.record.get("over") for beat in beats):
                continue
            if any(now - beat.changed < SETTLE for beat in beats):
                continue
            try:
                nodes = commands.hostnames(state.node)
            except GTSError:
                continue
            if nodes and over.issuperset(nodes):
                found.append(job)
        return found

    def _read_beats(self) -> None:
        now = time.monotonic()
        agents = self._files.listdir(self._files.agents)
        for agent in agents:
            record = read_json(self._files.beat(agent))
            if not isinstance(record, dict):
                record = {"n": -1}
            known = self._beats.get(agent)
            if known is None or known.record.get("n") != record.get("n"):
                self._beats[agent] = _Beat(record, now)
        for agent in set(self._beats) - set(agents):
            del self._beats[agent]

    def silence(self) -> float:
        """Seconds without a beat after which an agent counts as gone (a stalled machine, a cut-off
        node): longer than a lease's period, so that its runs have stopped by then."""
        return 10.0 + LeaseTerms(self._o.lease_interval, self._o.grace_period).period

    def _agent_gone(self, agent: str, states: dict[str, TaskState]) -> str | None:
        job = job_of(agent)
        state = states.get(job)
        beat = self._beats[agent]
        node = beat.record.get("node", "?")
        if state is None or not state.live:
            return f"its allocation {job} {'is no longer known to Slurm' if state is None else 'ended ' + state.state}"
        if state.state in ("PENDING", "REQUEUED"):
            return f"Slurm requeued its allocation {job}"
        if beat.record.get("over"):
            return f"its agent on {node} ended before the run's end was written"
        silent = time.monotonic() - beat.changed
        if silent >= self.silence():
            return f"its agent on {node} (allocation {job}) has been silent for {silent:.0f}s"
        return None

    def _keep_allocations(self, states: dict[str, TaskState], queued: bool) -> None:
        """While attempts wait in the queue, keep ``allocations`` jobs queued or running (one warned of
        its time limit no longer counts: its runs are being handed back)."""
        if not queued or self._closing:
            return
        live = [
            job
            for job, state in states.items()
            if state.live and state.state != "COMPLETING" and not os.path.exists(self._files.drain(job))
        ]
        for _ in range(self._target() - len(live)):
            try:
                where = [f"--output={self._files.jobs}/%j.out", f"--chdir={self._files.jobs}"]
                job = commands.submit([f"--job-name={self._name}", *where, *self.job_args()], self._script)
            except GTSError as error:
                logger.error("could not submit a pool allocation to Slurm: %s (tried again)", error)
                return
            self.submissions += 1
            states[job] = TaskState("PENDING", "", "")
            logger.info("Slurm pool: submitted allocation %s (%d node(s))", job, self._p.nodes)

    def _target(self) -> int:
        """How many allocations to keep: what ``gts pool --allocations`` last asked, else the config's.
        The file is opened regular-only, never following a link: a FIFO put there would block a
        plain open() for good, and the driver with it (runs would end unheard, signals unheeded)."""
        try:
            fd = open_regular(self._files.target)
        except FileNotFoundError:
            return self._p.allocations
        except OSError as error:
            return self._target_unread(error)
        try:
            text = os.read(fd, 32).decode("ascii").strip()
        except (OSError, UnicodeDecodeError) as error:
            return self._target_unread(error)
        finally:
            os.close(fd)
        number = ascii_int(text)
        if number is None or not 1 <= number <= self._most:
            return self._target_unread(ValueError(f"{text!r} is no number of allocations from 1 to {self._most}"))
        if number != self._asked:
            logger.info("Slurm pool: keeping %d allocation(s) while runs wait (gts pool)", number)
            self._asked = number
        return number

    def _target_unread(self, error: Exception) -> int:
        words = str(error) if isinstance(error, UnsafePathError) else f"{self._files.target}: {error}"
        if words != self._said_target:
            logger.warning("Slurm pool: the asked size is not read (%s); keeping the config's", words)
            self._said_target = words
        return self._p.allocations

    def _write_state(self, *, final: bool = False) -> None:
        """The pool as ``gts status`` shows it: each allocation, its agents, their slots and runs."""
        allocations = []
        for job, state in sorted(self._allocations.items(), key=lambda item: int(item[0])):
            if not state.live and not final:
                continue
            agents = [
                {
                    "node": beat.record.get("node"),
                    "slots": [slot.get("name") for slot in beat.record.get("slots") or []],
                    "running": sorted(run.get("name", "?") for run in (beat.record.get("running") or {}).values()),
                    "draining": bool(beat.record.get("draining")),
                }
                for agent, beat in sorted(self._beats.items())
                if job_of(agent) == job and not beat.record.get("over")
            ]
            allocations.append({"job": job, "state": state.state, "nodes": state.node, "agents": agents})
        record = {"at": time.time(), "over": final, "submissions": self.submissions, "allocations": allocations}
        with contextlib.suppress(OSError):
            atomic_write_json(self._files.state, record, durable=False)

    # --- ends ---------------------------------------------------------------------------

    def _lose(self, task: _Attempt, why: str, *, wait: bool = True, handed_back: bool = False) -> None:
        """Give the attempt up: withdrawn if still queued, else its agent stops it; its lease is
        waited for, then it ends (lost, or handed back)."""
        task.handle.fencing = True
        terms = LeaseTerms(self._o.lease_interval, self._o.grace_period)

        def fence() -> None:
            how = "it had not started"
            withdrawn = False
            try:
                atomic_write(self._files.event(task.handle.token, "abandoned"), b"", durable=True)
                if task.entry:
                    os.unlink(os.path.join(self._files.queue, task.entry))
                    withdrawn = True
            except OSError:
                pass
            if wait and not withdrawn:
                how = wait_over(task.run["lease"], task.handle.token, terms)
            if withdrawn:  # no agent will ever see it: its word can go
                with contextlib.suppress(OSError):
                    os.unlink(self._files.event(task.handle.token, "abandoned"))
            self._finish(task, Ended(returncode=-9, lost=f"{why}; given up, {how}", handed_back=handed_back))

        threading.Thread(target=fence, name=f"gts-pool-fence-{task.handle.token[:8]}", daemon=True).start()

    def _finish(self, task: _Attempt, ended: Ended) -> None:
        handle = task.handle
        with self._lock:
            if handle.has_exited():
                return
            self._attempts.pop(handle.token, None)
            handle.ended = ended
            handle.over.set()
        # Not its "abandoned" word: the agent that may still hold it deletes that once it let it go.
        for kind in ("0.start", "0.end", "stop", "kill", "drained"):
            with contextlib.suppress(OSError):
                os.unlink(self._files.event(handle.token, kind))
        handle.on_exit()
