"""One node of a Slurm pool: takes the sweep's attempts from the shared queue and runs them here.

``python -m gpu_task_scheduler.backends.slurm.agent ROOT`` is what each
node of a pool allocation runs (one ``srun`` step per node, started by the
allocation's batch script, see ``pool.py``). The agent:

* finds its slots as a local sweep does: one per GPU (or group of
  ``gpus_per_run``) of those Slurm gave the job on this node, several runs per
  GPU by memory through NVML (:class:`~...gpu.capacity.Capacity`: declared or
  learned needs, ``max_runs_per_gpu``), or ``slots_per_node`` without GPUs;
* takes the oldest attempt in ``queue/`` while a slot can place it, by renaming
  its entry into ``claimed/`` (one winner per entry, see ``poolfiles.py``);
* supervises each in a thread of its own, exactly as an array task does
  (``task.supervise``: the lease, the outcome file, the start and end events);
* forks each Python run (a ``python`` command, a ``GPUTask``) from a warm process of its own
  node that has imported what the runs import, as a local sweep does (``prewarm``;
  ``supervisor.NodeWarmStarts``), bound to the run's CPUs;
* relays the driver's ``stop`` and ``kill`` words to the attempt they name;
* beats: ``beat.json`` every second says it lives, and what runs where;
* drains on Slurm's warning of the time limit (``drain/JOB``, or SIGUSR1 or
  SIGTERM to itself): starts nothing more, marks each attempt ``drained``
  (handed back: it goes on from its last reported step in another allocation)
  and stops it with the grace period, through the same path as ``gts stop``;
* ends when drained, when the driver closed the pool, or after ``idle_exit``
  seconds with nothing to run: its node is let go.

A SIGKILL of the agent ends its runs too (their lifeline, as locally); their
leases then expire, and the driver hands their runs to another node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from ...gpu.capacity import Capacity
from ...gpu.devices import Slot
from ...gpu.placement import Need
from ...records.paths import atomic_write_json, open_regular, read_json
from ...sweep.options import SchedulerOptions
from ..supervisor import NodeWarmStarts
from .poolfiles import AGENT_BEAT, PoolFiles, token_of
from .task import Events, supervise

logger = logging.getLogger("gpu_task_scheduler")
TICK = 0.05  # seconds between two turns of the agent's loop (its runs' ends wake it at once)
# Seconds between two looks at the shared files when nothing wakes the agent: the queue, the driver's
# words, the warning of the time limit. On NFS or Lustre each look costs the metadata server a
# listing or a stat, from every node: a run's end wakes the agent for the next run at once instead.
LOOK = 0.25
START_WAIT = 10.0  # seconds the loop waits for a run's process before it places the next one
READY_WAIT = 8.0  # seconds the first Python run waits for the node's warm process (then it starts cold)
PEAKS_KEPT = 100  # the latest GPU memory peaks an agent's beat tells the pool's later agents


class _Running:
    def __init__(self, token: str, name: str, entry: str, slot: int, need: Need) -> None:
        self.token, self.name, self.entry, self.slot, self.need = token, name, entry, slot, need
        self.signalled, self.killed = threading.Event(), threading.Event()
        self.started = threading.Event()
        self.ending = threading.Event()  # its processes are gone: the loop releases its slot
        self.released = threading.Event()  # ... and has measured its peak
        self.peak: int | None = None
        self.pid = 0
        self.taken = False  # counted by the capacity (once its pid is known)
        self.since = time.monotonic()
        self.thread: threading.Thread | None = None
        self.share: tuple[int, ...] = ()  # its CPUs


class Agent:
    def __init__(self, files: PoolFiles, settings: dict[str, Any], options: SchedulerOptions) -> None:
        self.files, self.settings = files, settings
        self.job = os.environ.get("SLURM_JOB_ID", "0")
        self.node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        restarts = os.environ.get("SLURM_RESTART_COUNT") or "0"
        self.id = f"{self.job}.{restarts}.{self.node}.{uuid.uuid4().hex[:6]}"
        self.options = _node_options(options, settings)
        self.capacity = Capacity(self.options)
        # The GPU memory peaks runs were seen to use, here and by the pool's other agents (their
        # beats): a new allocation packs by what earlier ones learned, not from one run per GPU.
        self.peaks: list[int] = []
        self.capacity.learned_before(_peaks_seen(files))
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
        self.cpus = CpuShares(cpus, most=self._most_runs(), per_run=settings.get("cpus_per_run"))
        # Python runs fork from a warm process of this node (prewarm, as locally), started at the first.
        self.warm = NodeWarmStarts(self.options.warm_imports, ready_wait=READY_WAIT) if self.options.prewarm else None
        self.draining = threading.Event()
        self._wake = threading.Event()  # a run's thread ended, or a signal came: look now
        self.running: dict[str, _Running] = {}
        self.started = 0
        self._beats = 0
        self._idle_since = time.monotonic()

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        os.makedirs(self.files.claimed(self.id), exist_ok=True)
        next_beat = next_look = 0.0
        drained_sent = False
        try:
            while True:
                now = time.monotonic()
                woken = self._wake.is_set()
                self._wake.clear()
                if now >= next_beat:
                    self._beat()
                    next_beat = now + AGENT_BEAT
                look = now >= next_look
                if look:
                    next_look = now + LOOK
                    if os.path.exists(self.files.drain(self.job)):
                        self.draining.set()
                    self._relay()
                self._reap()
                if self.draining.is_set():
                    if not drained_sent:
                        self._drain()
                        drained_sent = True
                    if not self.running:
                        return 0
                elif look and not self.running and os.path.exists(self.files.closed):
                    return 0
                elif (look or woken) and self._has_room() and self._claim():
                    self._idle_since = now
                elif self.running:
                    self._idle_since = now
                elif now - self._idle_since >= float(self.settings.get("idle_exit", 30.0)):
                    return 0
                self._wake.wait(TICK)
        finally:
            self._beat(final=True)
            self.capacity.close()
            if self.warm is not None:
                self.warm.close()

    def _beat(self, *, final: bool = False) -> None:
        self._beats += 1
        record = {
            "id": self.id,
            "node": self.node,
            "job": self.job,
            "n": self._beats,
            "at": time.time(),
            "pid": os.getpid(),
            "slots": [{"name": slot.name, "gpus": list(slot.gpu_ids)} for slot in self.capacity.slots],
            "running": {
                r.token: {"name": r.name, "slot": self.capacity.slots[r.slot].name} for r in self.running.values()
            },
            "started": self.started,
            "peaks": self.peaks,
            "draining": self.draining.is_set(),
            "over": final,
        }
        with contextlib.suppress(OSError):
            atomic_write_json(self.files.beat(self.id), record, durable=False)

    # --- taking attempts -------------------------------------------------------------------

    def _has_room(self) -> bool:
        """Whether a slot may take one more run (without NVML's word: at most max_runs_per_gpu a GPU
        slot, one a CPU slot), so that a full node does not list the queue at all."""
        return len(self.running) < self._most_runs()

    def _most_runs(self) -> int:
        return sum(self.options.max_runs_per_gpu if slot.gpu_ids else 1 for slot in self.capacity.slots)

    def _claim(self) -> bool:
        """Take what the slots can place now, oldest first; whether anything was taken."""
        try:
            entries = sorted(name for name in os.listdir(self.files.queue) if token_of(name))
        except OSError:
            return False
        took = False
        for entry in entries:
            run = read_json(os.path.join(self.files.queue, entry))
            if not isinstance(run, dict):
                continue  # being written, or withdrawn meanwhile
            need = self.capacity.need(_config_of(run))
            placement = self.capacity.place(str(run.get("name", "")), need)
            if placement.view is None:
                return took  # no room: the oldest waits first (the queue keeps the engine's order)
            claim = os.path.join(self.files.claimed(self.id), entry)
            try:
                os.rename(os.path.join(self.files.queue, entry), claim)
            except OSError:
                continue  # another agent took it, or the driver withdrew it
            self._start(run, entry, placement.view.index, need)
            took = True
        return took

    def _start(self, run: dict[str, Any], entry: str, slot_index: int, need: Need) -> None:
        token = str(run["token"])
        attempt = _Running(token, str(run.get("name", "")), entry, slot_index, need)
        attempt.share = self.cpus.take()
        run = _with_share(run, attempt.share)
        gpus = self.capacity.slots[slot_index].cuda_visible_devices
        events = Events(self.files.events, token, 0)
        batch = {"lease_every": self.settings["lease_every"]}

        def started(pid: int) -> None:
            attempt.pid = pid
            attempt.started.set()

        def ended() -> dict[str, Any]:  # the run's GPU memory peak goes with its end, to the ledger
            attempt.ending.set()
            self._wake.set()
            attempt.released.wait(5.0)
            return {"gpu_peak": attempt.peak} if attempt.peak else {}

        def body() -> None:
            try:
                supervise(
                    run,
                    batch,
                    events,
                    attempt.signalled,
                    killed=attempt.killed,
                    node=self.node,
                    job=self.job,
                    gpus=gpus,
                    slot=self.capacity.slots[slot_index].name,
                    cpus=attempt.share,
                    on_started=started,
                    on_ended=ended,
                    warm=self.warm,
                )
            except Exception as error:  # its end must still be written: the driver waits on it
                events.write("end", {"lost": f"the agent on {self.node} could not run it: {error!r}"})
            finally:
                attempt.started.set()
                self._wake.set()  # its slot is free: the loop takes the next run now

        attempt.thread = threading.Thread(target=body, name=f"gts-run-{token[:8]}", daemon=True)
        self.running[token] = attempt
        attempt.thread.start()
        # The capacity counts the run by its process group, which exists once its process does: the
        # next placement must see it (a start takes milliseconds; the lease comes first, and waits
        # for an earlier attempt's to expire). Meanwhile the driver's words are relayed: a stop or
        # a kill for an attempt that is starting reaches it (it then never starts, or is killed).
        deadline = time.monotonic() + START_WAIT
        while not attempt.started.wait(LOOK) and time.monotonic() < deadline:
            self._relay()
        if attempt.started.is_set() and attempt.pid > 0:
            self.capacity.take(slot_index, attempt.pid, need, attempt.name)
            attempt.taken = True
        self.started += 1

    def _release(self, attempt: _Running) -> None:
        """Its slot is free again: what it was seen to use at most is learned, and told."""
        if attempt.taken and not attempt.released.is_set():
            released = self.capacity.release(attempt.slot, attempt.pid, time.monotonic() - attempt.since)
            if released.peak:
                attempt.peak = released.peak
                self.capacity.learn(released.peak)
                self.peaks = [*self.peaks[-(PEAKS_KEPT - 1) :], released.peak]
        attempt.released.set()

    def _reap(self) -> None:
        for attempt in self.running.values():
            if attempt.ending.is_set():
                self._release(attempt)
        for token, attempt in list(self.running.items()):
            if attempt.thread is None or attempt.thread.is_alive():
                continue
            self._release(attempt)
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.files.claimed(self.id), attempt.entry))
            with contextlib.suppress(OSError):  # the driver's word that it gave the attempt up, now heard
                os.unlink(self.files.event(token, "abandoned"))
            self.cpus.give_back(attempt.share)
            del self.running[token]
        if self.running:
            self.capacity.measure()  # NVML: what the runs use (their peaks teach the next placements)

    # --- the driver's words, and the end of the allocation ------------------------------------

    def _relay(self) -> None:
        if not self.running:
            return
        try:
            listed = set(os.listdir(self.files.events))
        except OSError:
            return
        for token, attempt in self.running.items():
            if f"{token}.kill" in listed:
                attempt.killed.set()
                attempt.signalled.set()
            elif f"{token}.stop" in listed:
                attempt.signalled.set()

    def _drain(self) -> None:
        """The allocation ends soon: each attempt is marked handed back, then stopped with the grace
        period (a run saves at its checkpoints: it goes on from its last reported step)."""
        for token, attempt in self.running.items():
            with contextlib.suppress(OSError):
                atomic_write_json(self.files.event(token, "drained"), {"node": self.node, "job": self.job})
            attempt.signalled.set()
        self._beat()


class NoGPUs(Exception):
    """A GPU sweep's agent on a node where Slurm gave the job no GPU."""


def _node_options(options: SchedulerOptions, settings: dict[str, Any]) -> SchedulerOptions:
    """The sweep's options with this node's slots: the GPUs Slurm gave the job here, in groups of
    ``gpus_per_run`` (never others NVML sees: they may be other jobs'); without GPUs,
    ``slots_per_node`` of them. A GPU sweep with no GPU here never runs on CPU slots (NoGPUs). The
    GPUs are the allocation's own, so no reservations are shared with other sweeps."""
    per_run = max(1, int(settings.get("gpus_per_run") or 1))
    if settings.get("gpus_per_node"):
        visible = slurm_gpus(os.environ)
        if not visible:
            raise NoGPUs(
                "Slurm gave this job no GPU here (CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS and SLURM_JOB_GPUS "
                "are empty); the sweep uses GPUs, and does not run on CPU slots instead"
            )
        slots = [
            Slot(f"gpu{','.join(visible[first : first + per_run])}", tuple(visible[first : first + per_run]))
            for first in range(0, len(visible) - per_run + 1, per_run)
        ]
    else:
        count = settings.get("slots_per_node") or min(8, os.cpu_count() or 1)
        slots = [Slot(f"cpu{index}", ()) for index in range(int(count))]
    return options._replace(slots=tuple(slots), share_gpu_reservations=False)


def slurm_gpus(environ: Mapping[str, str]) -> list[str]:
    """The GPUs Slurm gave this step (its CUDA_VISIBLE_DEVICES), else the step's or the job's ids.

    >>> slurm_gpus({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_JOB_GPUS": "0,1,2,3"})
    ['2', '3']
    >>> slurm_gpus({"SLURM_JOB_GPUS": "0,1"}), slurm_gpus({})
    (['0', '1'], [])

    What names no GPU is no id: Slurm's ``NoDevFiles`` (a GRES without device files), CUDA's
    ``-1`` (hide every device), a word. The next variable is read instead.

    >>> slurm_gpus({"CUDA_VISIBLE_DEVICES": "NoDevFiles", "SLURM_JOB_GPUS": "1"})
    ['1']
    >>> slurm_gpus({"CUDA_VISIBLE_DEVICES": "-1"})
    []
    >>> slurm_gpus({"CUDA_VISIBLE_DEVICES": "GPU-5c2b1e04,MIG-a1b2"})
    ['GPU-5c2b1e04', 'MIG-a1b2']
    """
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        ids = [gpu.strip() for gpu in environ.get(name, "").split(",") if gpu.strip()]
        if ids and all(gpu.isdigit() or gpu.startswith(("GPU-", "MIG-")) for gpu in ids):
            return ids
    return []


class CpuShares:
    """The node's CPUs (those this agent may use: what Slurm bound its step to) shared out among its
    runs, each its own: ``per_run`` of them (``cpus_per_run``), else an even share for the most runs
    the node takes at once. The thread that starts a run is bound to its share for the moment of
    the start (``supervisor.start_run``): the run inherits it, the agent's threads do not. The run
    gets ``OMP_NUM_THREADS`` and the like to match (unless the job sets them): 8 runs' DataLoader
    workers do not all land on the same cores.

    >>> shares = CpuShares(range(8), most=4, per_run=None)
    >>> shares.take(), shares.take()
    ((0, 1), (2, 3))
    >>> shares.give_back((0, 1)); shares.take()
    (0, 1)
    >>> CpuShares(range(2), most=4, per_run=None).shares  # fewer CPUs than runs: one each, shared
    [(0,), (1,)]
    """

    def __init__(self, cpus: Iterable[int], *, most: int, per_run: int | None) -> None:
        cpus = sorted(cpus)
        size = per_run or max(1, len(cpus) // max(1, most))
        self.shares = [tuple(cpus[first : first + size]) for first in range(0, len(cpus) - size + 1, size)] or [
            tuple(cpus)
        ]
        self._used = dict.fromkeys(self.shares, 0)

    def take(self) -> tuple[int, ...]:
        """The least used share (a free one while there is one)."""
        share = min(self.shares, key=lambda share: self._used[share])
        self._used[share] += 1
        return share

    def give_back(self, share: tuple[int, ...]) -> None:
        if self._used.get(share):
            self._used[share] -= 1


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _with_share(run: dict[str, Any], share: tuple[int, ...]) -> dict[str, Any]:
    """The run with its CPUs' count as its thread pools' sizes, where neither it nor the job says."""
    env = dict(run.get("env") or {})
    for name in THREAD_VARIABLES:
        if name not in env and name not in os.environ:
            env[name] = str(len(share))
    return {**run, "env": env}


def _peaks_seen(files: PoolFiles) -> list[int]:
    """The GPU memory peaks the pool's agents (this allocation's and earlier ones') have told."""
    peaks: list[int] = []
    try:
        agents = os.listdir(files.agents)
    except OSError:
        return peaks
    for agent in agents:
        beat = read_json(files.beat(agent))
        told = beat.get("peaks") if isinstance(beat, dict) else None
        if isinstance(told, list):
            peaks += [peak for peak in told if isinstance(peak, int) and not isinstance(peak, bool) and peak > 0]
    return peaks


def _config_of(run: dict[str, Any]) -> dict[str, Any]:
    """The run's config (what a declared memory need reads), or nothing when it cannot be read."""
    config = read_json(str(run.get("config_file", "")))
    return config if isinstance(config, dict) else {}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    files = PoolFiles(args[0])  # the result root
    settings = read_json(files.settings)
    try:  # regular-only, no link followed: a FIFO there would hang the agent (and its node) for good
        with os.fdopen(open_regular(files.options), "rb") as handle:
            options = pickle.load(handle)
    except (OSError, pickle.UnpicklingError, EOFError) as error:
        print(f"gpu_task_scheduler: this node cannot read the pool's options ({error})", file=sys.stderr)
        return 2
    if not isinstance(settings, dict):
        print(f"gpu_task_scheduler: this node cannot read {files.settings}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        agent = Agent(files, settings, options)
    except NoGPUs as error:
        print(f"gpu_task_scheduler: {socket.gethostname()}: {error}", file=sys.stderr)
        return 2

    def drain(*_: object) -> None:
        agent.draining.set()
        agent._wake.set()

    for signum in (signal.SIGUSR1, signal.SIGTERM):  # the time limit's warning, scancel: drain
        signal.signal(signum, drain)
    return agent.run()


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
