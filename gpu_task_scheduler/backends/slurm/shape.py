"""What one allocation of a Slurm pool holds on each node, and what it asks Slurm for.

A pool's runs share its nodes, so the allocation must hold what they use, or a real cluster
takes the rest away: with ``task/affinity`` or ``task/cgroup`` (most clusters) an allocation
of one CPU confines all of a node's runs, and their DataLoader workers, to one core, and Slurm
keeps placing other jobs on the node's "free" CPUs, memory and GPUs.

* **Whole nodes** (the default, ``pool: {exclusive: true}``): every CPU of each node
  (``--cpus-per-task``: what the partition's nodes have, the fewest, from ``sinfo``), all
  its memory (``--mem=0``) and its GPUs as GRES. Not ``--exclusive``: with Slurm 22.05, once
  a job holding nodes exclusively is shrunk (a pool gives back a node whose agent found
  nothing to run; Slurm removes a failed node from a ``--no-kill`` job), those nodes never
  take an exclusive job again (seen on the test Slurm: both nodes idle, no CPU allocated, the
  next allocation pending "Resources" for good), while a job of all their CPUs starts at once.
  A job that holds every core leaves none for another job all the same.
* **Shared nodes** (``exclusive: false``): the CPUs, memory and GPUs of the slots the
  allocation fills: ``--cpus-per-task`` = runs per node x ``cpus_per_run`` (1 if unsaid),
  ``--mem`` = runs per node x ``mem`` (when said), ``--gres=gpu:G``.

**GPUs.** A GPU sweep (``gpu: all``, or GPU ids) asks for the GPUs it uses:
``gpus_per_node`` when said; else, on whole nodes, the GPUs each node of the partition has
as GRES (``sinfo``, the fewest of its GPU nodes). It never falls back to CPU slots in
silence: a partition without GPU GRES, or shared nodes with no ``gpus_per_node``, is a config
error before anything is submitted. The agents then use only the GPUs Slurm gave the job
(``agent.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from ...errors import ConfigError
from ...recordclass import Record
from ...sweep.options import SchedulerOptions
from ...sweep.slurm import PoolOptions, SlurmOptions
from .commands import Partition
from .resources import Resources


class PoolShape(Record):
    exclusive: bool
    node_cpus: int | None  # whole nodes: the CPUs asked on each (None: the partition's, unknown here)
    gpus_per_node: int | None  # GRES GPUs asked on each node; 0: none; None: the partition's, unknown here
    runs_per_node: int | None  # runs at once on a node (None: as many as its GPUs allow, unknown here)
    cpus_per_run: int | None  # as said (slurm: {cpus_per_run}); None: the node's CPUs shared out evenly


def is_gpu_sweep(options: SchedulerOptions) -> bool:
    """Whether the sweep's runs use GPUs: ``gpu: all`` (slots resolved at the start) or GPU ids."""
    return options.slots is None or any(slot.gpu_ids for slot in options.slots)


def pool_shape(options: SchedulerOptions, partition: Callable[[], Partition | None]) -> PoolShape:
    """The pool's allocation, node by node. ``partition``: what the partition's nodes have (None:
    Slurm's sinfo is not here to say), asked only where the config does not say. Raises
    ConfigError where the sweep would not get what it uses."""
    slurm = options.slurm or SlurmOptions()
    pool = slurm.pool or PoolOptions()
    asked: list[Partition | None] = []

    def nodes() -> Partition | None:
        if not asked:
            asked.append(partition())
        return asked[0]

    where = "scheduler_config['slurm']['pool']"
    per_run = Resources(options).gpus_per_run() or 1
    gpus: int | None = pool.gpus_per_node
    if not gpus and is_gpu_sweep(options):
        if not pool.exclusive:
            raise ConfigError(
                f"{where}: a GPU sweep on shared nodes (exclusive: false) says how many GPUs each node of "
                "an allocation takes (gpus_per_node: N), or runs on CPUs (gpu: ['cpu']): it would run on "
                "CPU slots, or on GPUs Slurm gave other jobs"
            )
        found = nodes()
        gpus = None if found is None else found.gpus
        if gpus == 0:
            which = f"partition {slurm.partition}" if slurm.partition else "the default partition"
            raise ConfigError(
                f"{where}: the sweep uses GPUs (gpu: all) and {which} has none as GRES (sinfo): say "
                "gpus_per_node: N if its nodes have GPUs Slurm does not list, or gpu: ['cpu'] to run on CPUs"
            )
    if gpus and gpus < per_run:
        raise ConfigError(f"{where}: each run takes {per_run} GPU(s) and each node has {gpus}: no run would fit")
    if gpus is None:
        runs: int | None = None
    elif gpus:
        runs = gpus // per_run * options.max_runs_per_gpu
    else:
        runs = pool.slots_per_node or 8
    found = nodes() if pool.exclusive or slurm.cpus_per_run else None
    if found is not None and found.cpus and (slurm.cpus_per_run or 0) > found.cpus:
        raise ConfigError(
            f"scheduler_config['slurm']['cpus_per_run'] is {slurm.cpus_per_run} and the partition's nodes have "
            f"{found.cpus} CPUs (the fewest): no run would fit"
        )
    if found is not None and found.cpus and not pool.exclusive and (runs or 1) * (slurm.cpus_per_run or 1) > found.cpus:
        raise ConfigError(
            f"{where}: {runs} run(s) a node x cpus_per_run {slurm.cpus_per_run} is more CPUs than the partition's "
            f"nodes have ({found.cpus}, the fewest): Slurm would never start the allocation"
        )
    found = found if pool.exclusive else None
    return PoolShape(
        exclusive=pool.exclusive,
        node_cpus=None if found is None else found.cpus or None,
        gpus_per_node=gpus,
        runs_per_node=runs,
        cpus_per_run=slurm.cpus_per_run,
    )


def allocation_args(options: SchedulerOptions, shape: PoolShape) -> list[str]:
    """The sbatch arguments of each allocation (``--dry-run`` shows them)."""
    slurm = options.slurm or SlurmOptions()
    pool, asks = slurm.pool or PoolOptions(), Resources(options)
    where = [arg for arg in asks.placement_args() if not arg.startswith("--mem=")]  # a run's mem: below
    args = [f"--nodes={pool.nodes}", "--ntasks-per-node=1", "--no-kill", *where]
    if shape.exclusive:
        cpus = shape.node_cpus or "<each node's CPUs, from sinfo at the start>"
        args += [f"--cpus-per-task={cpus}", "--mem=0"]
    else:
        runs = shape.runs_per_node or 1
        args.append(f"--cpus-per-task={runs * (shape.cpus_per_run or 1)}")
        if slurm.mem:
            number, unit = (slurm.mem[:-1], slurm.mem[-1]) if slurm.mem[-1].isalpha() else (slurm.mem, "")
            args.append(f"--mem={int(number) * runs}{unit}")
    if shape.gpus_per_node is None:
        args.append("--gres=gpu:<each node's GPUs, from sinfo at the start>")
    elif shape.gpus_per_node:
        args.append(f"--gres=gpu:{shape.gpus_per_node}")
    if pool.time:
        args += [f"--time={pool.time}", f"--signal=B:USR1@{int(asks.signal_lead())}"]
    return args + list(slurm.extra)


def pool_slots(options: SchedulerOptions, runs_per_node: int | None) -> int:
    """Runs a pool runs at once when every allocation runs: ``runs_per_node`` (None, a node's GPUs
    not known here: one a node) on each node of each allocation."""
    pool = (options.slurm or SlurmOptions()).pool or PoolOptions()
    return (runs_per_node or 1) * pool.nodes * pool.allocations
