"""The driver's side of the Ray backend: the cluster's slots, and one Ray task per attempt.

* **Connecting.** ``ray_address`` names a running cluster (``"auto"``, or
  ``HOST:PORT`` of its head); without it a Ray instance of our own is started
  on this machine, with no dashboard and no usage statistics, and stopped
  when the sweep ends (``ray.shutdown()``: only what we started; never ``ray
  stop``, which would stop every Ray process of the machine). If the program
  had already connected to Ray, that connection is used and left open.
* **Slots.** ``"gpu": "all"`` gives one slot per GPU of the cluster, as
  Ray's resources count them (``max_runs_per_gpu: k`` gives k slots per GPU,
  each asking for 1/k of one); a list of slots keeps its names and sizes (a
  CPU slot asks for no GPU, a slot of two GPUs for two), and Ray chooses which
  GPUs, on which machine. The engine starts a run when a slot is free, so Ray
  has the resources for it at once.
* **An attempt** is prepared here exactly as locally (``prepare.py``: the run
  folder, the task object, the start files), then handed to a Ray task
  (``remote.supervise``) that asks for the slot's GPUs and
  ``ray_cpus_per_run`` CPUs (default 0: Ray's default of one CPU per task
  would cap how many runs a machine with few cores runs at once). Ray workers
  are reused between runs (``max_calls=0``: otherwise Ray starts a fresh
  worker for every GPU task, over a second each); each run still gets a
  fresh process. The task reports where the run started (the engine records
  the machine, ``gts status`` shows it) and how it ended.
* **Failures.** When a machine goes away, the tasks on it fail with Ray's
  error. Ray says so before that machine's processes are surely gone (or
  the machine is only cut off and they run on), so the attempt is given up
  and its lease waited for (``records/lease.py``): the run runs again only
  once its old attempt is known to be over (released, or its lease expired:
  a supervisor cut off from the driver stops its run before that). Then the
  attempt is recorded as interrupted ("its machine went away") and the run
  runs again elsewhere, up to ``node_failure_retries`` times; a run whose
  process had recorded its success in its folder meanwhile is not run
  again: the outcome file decides, as locally. Ray itself retries nothing
  (``max_retries=0``), so the ledger knows every attempt.
* **Stopping.** The engine's stop and kill go through a small actor of the
  driver's (``remote.Control``) to each run's supervisor, which signals the
  run's process group (SIGTERM, the grace period, SIGKILL) as locally; a task
  that has not started yet is cancelled. When the driver ends, Ray ends its
  tasks and actor, and each run's lifeline ends the run's processes.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any

from ...engine.launcher import Abilities, Attempt, BaseLauncher, Ended, LaunchError, OnPlaced
from ...errors import GTSError, install_hint
from ...gpu.devices import Slot
from ...gpu_task import GPUTask
from ...proctree import descendants
from ...records.lease import LeaseTerms, wait_over
from ...records.paths import META, atomic_write
from ...sweep.options import SchedulerOptions
from ..local.keeper import KEEPER_ENV, Keeper
from ..local.keeper import available as keeper_available
from ..local.prepare import TaskFactory, class_factory, log_launch_failure, prepare_attempt
from ..supervisor import remote_run
from . import remote

logger = logging.getLogger("gpu_task_scheduler")

PROBE_TIMEOUT = 120.0  # seconds every machine gets to answer the shared-filesystem check
NO_ANSWER = 30.0  # seconds beyond the grace period a killed run's task gets to report before it is given up


def import_ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise GTSError(f"backend: ray needs Ray: {install_hint('ray')}") from error
    return ray


class RayLauncher(BaseLauncher):
    """Runs each attempt as a Ray task; a context manager (it disconnects, or stops the Ray
    instance it started, when the ``with`` block ends)."""

    abilities = Abilities(cluster_slots=True)  # its slots are the cluster's GPUs

    def __init__(self, task: type[GPUTask] | TaskFactory, options: SchedulerOptions) -> None:
        self._make_task = class_factory(task) if isinstance(task, type) else task
        self._o = options
        self._ray: Any = None
        self._connected = False  # we called ray.init() (started an instance, or joined a cluster): shut down at the end
        self._keeper: Keeper | None = None  # ends the processes of an instance of our own (see _start_local)
        self._kept: set[int | None] = set()  # the pids it was told
        self._control: Any = None
        self._supervise: Any = None
        self._runtime_env: dict[str, Any] = {}
        self._gpus: dict[str, float] = {}  # slot name -> GPUs its runs' tasks ask for
        self._ids = itertools.count(1)
        # Said before the scheduler log is open (slots() comes first): logged by open().
        self._notes: list[str] = []

    # --- the connection -----------------------------------------------------------

    def __enter__(self) -> RayLauncher:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.shutdown()

    def connect(self) -> None:
        if self._ray is not None:
            return
        ray = import_ray()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # and for the processes our instance starts
        if not ray.is_initialized():
            started = time.monotonic()
            if self._o.ray_address is not None:
                try:
                    ray.init(address=self._o.ray_address, log_to_driver=False)
                except (ConnectionError, ValueError, RuntimeError) as error:
                    raise GTSError(f"cannot connect to the Ray cluster at {self._o.ray_address!r}: {error}") from error
                self._connected = True
                self._notes.append(f"connected to the Ray cluster at {self._o.ray_address}")
            else:
                # address="local": a new instance of our own, also when a cluster runs on this machine (without
                # it, ray.init() joins that cluster, and refuses num_gpus there).
                self._start_local(ray)
                self._connected = True
                took = time.monotonic() - started
                self._notes.append(f"started a Ray instance on this machine in {took:.1f}s")
        self._ray = ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # On the driver's machine: it lives as long as the driver does, and a run's supervisor takes
        # its end for the driver's (losing another machine must not stop the runs elsewhere).
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._control = ray.remote(num_cpus=0)(remote.Control).options(scheduling_strategy=here).remote()
        # max_calls=0: the worker runs the next runs too (Ray's default for GPU tasks is a new worker each).
        self._supervise = ray.remote(max_calls=0)(remote.supervise)
        # Ray starts its workers at niceness 15, and a run's process would inherit it: on a busy
        # machine the runs then wait behind everything else (on 2 cores, seconds per run). Our
        # workers start at 0, as Ray's own job supervisor does; the program's env_vars are kept.
        job_env = (ray.get_runtime_context().runtime_env or {}).get("env_vars") or {}
        self._runtime_env = {"env_vars": {**job_env, "RAY_worker_niceness": "0"}}

    def _start_local(self, ray: Any) -> None:
        """Start a Ray instance of our own, whose processes end with this one however it ends.
        Ray's own processes die with a driver killed by SIGKILL, but its dashboard and runtime-env
        agents were seen to live on for good (they try to flush their logs to a GCS that is gone).
        So every process of the instance carries a keeper's mark in its environment (set for
        ray.init() only), and the keeper (backends/local/keeper.py) kills what carries it once
        this process is gone, or once the instance is shut down."""
        if keeper_available():
            # Ray names its session folder .../session_<date>_<time>_<µs>_<the driver's pid>.
            self._keeper = Keeper(holding=f"_{os.getpid()}/logs/")
            self._keeper.ensure()
            os.environ[KEEPER_ENV] = self._keeper.marker
        try:
            ray.init(address="local", num_gpus=self._o.ray_local_gpus, include_dashboard=False, log_to_driver=False)
        finally:
            os.environ.pop(KEEPER_ENV, None)
        self._keep_instance()

    def _keep_instance(self) -> None:
        """Tell the keeper the instance's processes as they are now (Ray's rewrite their titles over
        their environment, where the keeper's mark was): once after the start, and at each run's."""
        if self._keeper is not None:
            new = set(descendants(os.getpid())) - self._kept - {self._keeper.pid}
            self._keeper.keep(new)  # each once: a long sweep's keeper is not told the same pids again
            self._kept |= new

    def shutdown(self) -> None:
        """Disconnect; stop the Ray instance we started (only it)."""
        ray, self._ray = self._ray, None
        if ray is None:
            return
        if self._connected:  # our instance stops with it; a cluster we joined only loses this driver
            ray.shutdown()
            if self._keeper is not None:  # and what of it ray.shutdown() left
                self._keeper.close()
                self._keeper = None
        elif self._control is not None:  # the program's own connection: leave it, take our actor away
            ray.kill(self._control)
        self._control = self._supervise = None

    # --- the slots ------------------------------------------------------------------

    def slot_gpus(self, slot: Slot) -> float:
        return self._gpus.get(slot.name, 0.0)

    def slots(self, options: SchedulerOptions) -> list[Slot]:
        self.connect()
        ray = self._ray
        nodes = [node for node in ray.nodes() if node.get("Alive")]
        per_node = [float(node.get("Resources", {}).get("GPU", 0)) for node in nodes]
        total = sum(per_node)
        slots: list[Slot] = []
        if options.slots is None:
            share = options.max_runs_per_gpu
            if int(total) < 1:
                raise GTSError(
                    f"the Ray cluster has no GPUs ({len(nodes)} machine(s)); give CPU slots ('gpu': ['cpu', "
                    "'cpu']) or, for a Ray instance of our own, ray_local_gpus"
                )
            for index in range(int(total) * share):
                name = f"gpu{index}" if share == 1 else f"gpu{index // share}.{index % share}"
                slots.append(Slot(name, ()))
                self._gpus[name] = 1.0 / share
        else:
            for slot in options.slots:
                slots.append(Slot(slot.name, ()))
                self._gpus[slot.name] = float(len(slot.gpu_ids))
            largest = max(self._gpus.values())
            if largest > max(per_node, default=0.0):
                raise GTSError(
                    f"a slot asks for {largest:g} GPU(s), and no machine of the Ray cluster has that many "
                    f"(GPUs per machine: {', '.join(f'{g:g}' for g in per_node) or 'none'})"
                )
            if any(slot.gpu_ids for slot in options.slots):
                self._notes.append("backend ray: each slot asks Ray for that many GPUs; Ray chooses which, and where")
        cpus = sum(float(node.get("Resources", {}).get("CPU", 0)) for node in nodes)
        self._notes.append(
            f"Ray cluster: {len(nodes)} machine(s), {total:g} GPU(s), {cpus:g} CPU(s); {len(slots)} slot(s)"
        )
        if options.gpu_memory is not None:
            self._notes.append(
                "backend ray: gpu_memory is not used (this machine cannot see the cluster's GPU memory); "
                "max_runs_per_gpu sets how many runs share a GPU"
            )
        return slots

    # --- the sweep --------------------------------------------------------------------

    def open(self, lock_fd: int) -> None:
        """Check that every machine sees the result root (it is locked and exists now)."""
        self.connect()
        for note in self._notes:
            logger.info("%s", note)
        self._notes.clear()
        check_shared_root(self._ray, os.path.abspath(self._o.result_root_folder))

    def close(self) -> None:
        """Nothing to release between sweeps; :meth:`shutdown` disconnects."""

    def start(self, attempt: Attempt, on_exit: Callable[[], None], on_placed: OnPlaced | None = None) -> RayHandle:
        self._keep_instance()  # its agents and workers started since
        paths = attempt.paths
        try:
            launch = prepare_attempt(attempt, self._make_task)
        except (LaunchError, OSError) as error:
            log_launch_failure(paths, error)
            raise
        run = {
            **remote_run(attempt, launch, self._o.grace_period),
            "lease_every": self._o.lease_interval,
            # Forked from the Ray worker's warm process (remote.py), as locally, unless prewarm: false.
            "warm_imports": list(self._o.warm_imports) if self._o.prewarm else None,
        }
        task = self._supervise.options(
            num_gpus=self._gpus.get(attempt.slot.name, 0.0),
            num_cpus=self._o.ray_cpus_per_run,
            max_retries=0,
            num_returns="streaming",
            name=f"gts {attempt.spec.name}"[:200],
            runtime_env=self._runtime_env,
        )
        generator = task.remote(run, self._control)
        return RayHandle(
            self._ray,
            generator,
            self._control,
            attempt.token,
            pid=-next(self._ids),  # no process here; unique, so that the engine can tell runs apart
            reports_outcome=not launch.direct,
            grace_period=self._o.grace_period,
            on_exit=on_exit,
            on_placed=on_placed,
            lease=os.path.abspath(paths.lease),
            terms=LeaseTerms(self._o.lease_interval, self._o.grace_period),
        )


def check_shared_root(ray: Any, root: str) -> None:
    """Each live machine reads a file the scheduler wrote under the root and writes one the
    scheduler reads back: result folders must be on a filesystem all of them see."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    meta = os.path.join(root, META)
    nonce = uuid.uuid4().hex
    os.makedirs(meta, exist_ok=True)
    atomic_write(os.path.join(meta, "probe"), nonce.encode())
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    answers = {node["NodeID"]: uuid.uuid4().hex for node in nodes}
    check = ray.remote(remote.probe)
    refs = {
        node_id: check.options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
        ).remote(root, nonce, answer)
        for node_id, answer in answers.items()
    }
    try:
        ready, waiting = ray.wait(list(refs.values()), num_returns=len(refs), timeout=PROBE_TIMEOUT)
        if waiting:
            late = [node_id[:8] for node_id, ref in refs.items() if ref in waiting]
            raise GTSError(
                f"machine(s) {', '.join(late)} of the Ray cluster did not answer within {PROBE_TIMEOUT:g}s "
                "whether they see the result root"
            )
        problems = [problem for problem in ray.get(ready) if problem]
        for node_id, answer in answers.items():
            written = os.path.join(meta, f"probe-{answer}")
            try:
                with open(written, encoding="utf-8") as handle:
                    if handle.read() != answer:
                        problems.append(f"what node {node_id[:8]} wrote under {root} is not what the scheduler reads")
            except OSError:
                if not problems:
                    problems.append(f"node {node_id[:8]} wrote under {root}, and the scheduler does not see it there")
    finally:
        for name in ["probe"] + [f"probe-{answer}" for answer in answers.values()]:
            try:
                os.unlink(os.path.join(meta, name))
            except OSError:
                pass
    if problems:
        raise GTSError(
            "the result root must be on a filesystem every machine of the Ray cluster sees, at the same "
            "path (NFS, a cluster filesystem):\n  " + "\n  ".join(problems)
        )


class RayHandle:
    """One attempt running as a Ray task; its process is on the machine Ray chose."""

    def __init__(
        self,
        ray: Any,
        generator: Any,
        control: Any,
        token: str,
        *,
        pid: int,
        reports_outcome: bool,
        grace_period: float,
        on_exit: Callable[[], None],
        on_placed: OnPlaced | None,
        lease: str,
        terms: LeaseTerms,
    ) -> None:
        self.pid = pid
        self._lease, self._terms = lease, terms
        self.reports_outcome = reports_outcome
        self.node: str | None = None
        self._ray, self._generator, self._control, self._token = ray, generator, control, token
        self._grace_period = grace_period
        self._on_placed = on_placed
        self._ended: Ended | None = None
        self._give_up_at: float | None = None
        name = f"gts-ray-{token[:8]}"
        self._follower = threading.Thread(target=self._follow, args=(on_exit,), name=name, daemon=True)
        self._follower.start()

    def _follow(self, on_exit: Callable[[], None]) -> None:
        try:
            self._ended = self._receive()
        except Exception as error:  # whatever went wrong, the engine hears of an end: once the attempt is over
            lost = self._lost_words(error)
            self._ended = Ended(returncode=-9, lost=f"{lost}; given up, {self._fence()}")
        finally:
            on_exit()

    def _fence(self) -> str:
        """Give the attempt up, and wait until it is surely over (its lease): only then may the
        engine run it again. In words, how that was known."""
        try:  # from now on its supervisor hears it is not wanted: it cannot start its run any more
            self._ray.get(self._control.abandon.remote(self._token), timeout=NO_ANSWER)
        except Exception:
            pass  # our own actor, on this machine: gone only with the driver; the lease still decides
        self._control.request.remote(self._token, remote.KILL)  # a supervisor that still listens stops now
        return wait_over(self._lease, self._token, self._terms)

    def _receive(self) -> Ended:
        exceptions = self._ray.exceptions
        try:
            first = self._next()
            if "lost" in first:
                return Ended(returncode=-9, lost=first["lost"])
            self.node = first["node"]
            if self._on_placed is not None:
                self._on_placed(first["node"], first["pid"])
            last = self._next()
        except exceptions.TaskCancelledError:  # killed before it started (or as it did: its lease says)
            wait_over(self._lease, self._token, self._terms)
            return Ended(returncode=-9)
        fenced = last.get("fenced")
        return Ended(
            returncode=last["returncode"],
            strays=tuple(last["strays"]),
            unstoppable=tuple(last["unstoppable"]),
            lost=None if fenced is None else f"its machine {self.node} was cut off from the scheduler: {fenced}",
        )

    def _next(self) -> dict[str, Any]:
        """The task's next report. Waits in steps, so that a killed run whose machine no longer
        answers (the cluster's head died, say) is given up instead of waited for forever."""
        while True:
            ready, _ = self._ray.wait([self._generator], timeout=1.0)
            if ready:
                return self._ray.get(next(self._generator))
            if self._give_up_at is not None and time.monotonic() > self._give_up_at:
                raise TimeoutError(f"no answer from the Ray cluster {NO_ANSWER:g}s after the run was killed")

    def _lost_words(self, error: BaseException) -> str:
        where = f"its machine {self.node}" if self.node else "the machine Ray chose for it"
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"{where} went away or stopped answering ({type(error).__name__}: {first[:300]})"

    def stop(self) -> None:
        self._control.request.remote(self._token, remote.STOP)

    def kill(self) -> None:
        self._control.request.remote(self._token, remote.KILL)
        if self.node is None:  # not started yet: it never will
            try:
                self._ray.cancel(self._generator, force=True)
            except Exception:
                pass
        if self._give_up_at is None:
            self._give_up_at = time.monotonic() + self._grace_period + NO_ANSWER

    def has_exited(self) -> bool:
        return self._ended is not None

    def reap(self) -> Ended:
        self._follower.join()
        assert self._ended is not None
        return self._ended
