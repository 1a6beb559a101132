"""Run a sweep from a config file: ``gts run CONFIG [KEY=VALUE ...]``, its dry run and ``--serve``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ...errors import ConfigError, TaskClassError
from ...sweep.files import load_config
from ..shared import EXIT_OK, formatter, gpu_option, gpus_all_said_here, log_in_root, run_with_status


def _config_among_gpus(args: argparse.Namespace) -> None:
    """``gts run --gpus 0 1 sweep.yaml``: ``--gpus`` took the config file too; give it back."""
    from ...sweep.files import SUFFIXES

    gpus = args.gpus or []
    while gpus and "=" in gpus[-1]:  # `--gpus 0 1 sweep.yaml lr=0.1`: overrides (no GPU id has "=")
        args.overrides.insert(0, gpus.pop())
    if args.config is not None:
        if "=" in args.config:  # `gts run --gpus 0 -- lr=0.1`? the config is among the gpus then
            args.overrides.insert(0, args.config)
            args.config = None
        else:
            return
    files = [value for value in gpus if os.path.splitext(value)[1].lower() in SUFFIXES]
    if len(files) == 1 and gpus[-1] == files[0]:
        args.config = gpus.pop()
    if args.config is None:
        raise ConfigError("gts run needs a config file: gts run CONFIG [--gpus ...] (or --gpus ... -- CONFIG)")


def _run_config(args: argparse.Namespace) -> dict[str, Any]:
    from ...sweep.overrides import apply_overrides

    config, args.override_notes = apply_overrides(dict(load_config(args.config)), args.overrides)
    if not isinstance(config.get("scheduler_config", {}), dict):
        return config  # validation reports it
    scheduler = dict(config.get("scheduler_config") or {})
    if args.gpus:
        scheduler["gpu"] = gpu_option(args.gpus)
    for flag, key in (
        ("force_rerun", "force_rerun"),
        ("max_retries", "max_retries"),
        ("timeout", "timeout"),
        ("grace_period", "grace_period"),
        ("backend", "backend"),
        ("address", "ray_address"),
    ):
        value = getattr(args, flag)
        if value is not None and value is not False:
            scheduler[key] = value
    if args.partition is not None:
        slurm = scheduler.get("slurm")
        scheduler["slurm"] = {**(slurm if isinstance(slurm, dict) else {}), "partition": args.partition}
        if args.backend is None:
            scheduler["backend"] = "slurm"  # only Slurm takes a partition
    if args.accept_changes or args.keep:
        scheduler["on_config_change"] = "rerun" if args.accept_changes else "keep"
    if args.address is not None and args.backend is None:
        scheduler["backend"] = "ray"  # only Ray takes an address
    if "scheduler_log_file_path" not in scheduler:
        scheduler["scheduler_log_file_path"] = log_in_root(scheduler.get("result_root_folder", "results/"))
    config["scheduler_config"] = scheduler
    return config


# A dry run lists every run of a sweep of up to DRY_LISTED runs; of a larger one, the first and the
# last DRY_ENDS, with the counts of all. It decides at most DRY_DECIDED runs, so that its time and
# memory stay bounded however large the grid (each decision costs the name registry a few bytes).
DRY_LISTED = 1000
DRY_ENDS = 20
DRY_DECIDED = 1_000_000


def _dry_run(sweep: Any) -> int:
    """What a real start would do with each run: the engine's own decision, read-only, streamed."""
    import collections
    import itertools

    from ...engine.api import plan

    counts: dict[str, int] = {}
    size = len(sweep)
    listed_all = size <= DRY_LISTED
    last: collections.deque[str] = collections.deque(maxlen=DRY_ENDS)
    decided = 0
    to_run: list[Any] = []  # the first ones: how they start (warm or cold) is said below
    for spec, decision in itertools.islice(plan(sweep), DRY_DECIDED):
        decided += 1
        if decision.action == "run" and len(to_run) < DRY_ENDS * 10:
            to_run.append(spec)
        kind = decision.label.split(" ")[0]
        counts[kind] = counts.get(kind, 0) + 1
        waits = ""
        if spec.after and decision.action == "run":  # a run of a later stage starts after these succeed
            waits = f"  (after {spec.after[0]})" if len(spec.after) == 1 else f"  (after {len(spec.after)} runs)"
        line = f"{spec.index:>6}  {decision.label:<28}  {spec.work_dir}{waits}"
        if listed_all or decided <= DRY_ENDS:
            print(line)
        else:
            last.append(line)
    if not listed_all:
        hidden = decided - DRY_ENDS - len(last)
        if hidden > 0:
            print(f"   ... {hidden:,} more runs (the counts below include them)")
        for line in last:
            print(line)
    summary = f"{decided} runs: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    if sweep.search is not None:  # its runs are chosen as earlier ones end: only those asked are known
        from ...tuning.space import describe

        print(summary.replace("runs:", "runs asked so far:") if decided else "no run asked yet")
        print(f"{sweep.search.describe()}; space: {describe(sweep.space)}")
        left = sweep.search.n_runs - sweep.asked
        if left <= 0:
            from ...tuning.search import spent_message

            print(spent_message(sweep.search.n_runs))
        else:
            print(f"a start asks for up to {left} more run(s)")
        _say_who_runs(sweep.options.result_root_folder)
        return EXIT_OK
    if decided < size:
        summary += f"; and {size - decided:,} more runs not decided here (a dry run decides at most {DRY_DECIDED:,})"
    print(summary)
    _say_order_matters(sweep)
    _say_what_decides(sweep)
    _say_what_slurm_gets(sweep, counts.get("run", 0))
    _say_how_runs_start(sweep, to_run)
    _say_who_runs(sweep.options.result_root_folder)
    return EXIT_OK


def _say_how_runs_start(sweep: Any, to_run: list[Any]) -> None:
    """Whether a local sweep's Python command is forked warm (backends/local/zygote.py), or why not,
    for the runs a start would run (``to_run``, their specs), each command as it would be run."""
    command = sweep.command
    if sweep.options.backend != "local" or not isinstance(command, list) or not command:
        return
    if not os.path.basename(str(command[0])).startswith("python"):
        return  # another program: there is nothing to warm
    if not sweep.options.prewarm:
        print("warm starts: off (prewarm: false): every run starts a fresh Python")
        return
    from ...backends.local import importcache, sourceimports
    from ...backends.local.tasks import CommandTask
    from ...backends.local.zygote import script_argv
    from ...sweep.commands import check_template

    parts = check_template(command, sweep.keys(), shell=False)
    cold: dict[str, int] = {}
    imports: list[str] = list(sweep.options.warm_imports)
    read: set[str] = set()
    base = [folder for folder in sys.path[1:] if folder]
    looked = to_run[: DRY_ENDS * 10]
    for spec in looked:
        task = CommandTask(spec.config, spec.work_dir, parts=parts, run_name=spec.name, run_index=spec.index)
        argv, why = script_argv(task.direct_command("")[0], dict(os.environ), os.getcwd())
        if argv is None:
            cold[why] = cold.get(why, 0) + 1
            continue
        source = sourceimports.command_source(argv, os.getcwd(), base)
        if source.key is None or source.key in read:
            continue
        read.add(source.key)
        kept = importcache.installed(importcache.recall(source.key)[0], source.search)  # earlier sweeps' of it
        imports += [name for name in source.imports() + kept if name not in imports]
    for why, count in cold.items():
        print(f"warm starts: {count} of the {len(looked)} run(s) looked at start cold: {why}")
    if looked and sum(cold.values()) == len(looked):
        return
    libraries = sorted(imports, key=lambda name: name.split(".")[0] in sys.stdlib_module_names)  # libraries first
    shown = ", ".join(libraries[:8]) + (f" and {len(libraries) - 8} more" if len(libraries) > 8 else "")
    what = f"{shown} (prewarm's, the scripts' own read from their source, and earlier sweeps'), then" if shown else ""
    print(
        f"warm starts: {'the other runs are' if cold else 'each run is'} forked from a warm process that imports "
        f"{what} what the runs are seen to import; the first run waits for it (prewarm: false: every run cold)"
    )


def _say_what_decides(sweep: Any) -> None:
    """What a real start says of the methods that decide which runs go on (population-based
    training's population and interval, promotion ASHA's drawn order) and of a budget it can
    never spend: a dry run says it too."""
    from ...tuning.pbt import PbtRule
    from ...tuning.stopping import Pausing

    size = len(sweep)
    for stage, rule in sweep.stopping.items():
        where = "early_stop" if stage is None else f"stage {stage!r}'s early_stop"
        if isinstance(rule, PbtRule):
            count = len(sweep.options.slots or ())
            on = f"{count} slot(s)" if count else "the machine's slots"
            turns = "; members take turns" if count and size > count else ""
            print(f"pbt: {rule.describe()}; a population of {size} on {on}{turns}")
        elif isinstance(rule, Pausing):
            drawn = (
                "; it takes the grid's configurations in a drawn order (the same at every start), not as listed"
                if rule.method == "asha" and sweep.search is None
                else ""
            )
            print(f"{where}: {rule.describe()}{drawn}")
    budget = sweep.options.budget
    slots = sweep.options.slots
    if budget is not None and budget.gpu_hours is not None and slots is not None and all(s.is_cpu for s in slots):
        print("budget: gpu_hours counts GPU-hours, and no slot of this sweep has a GPU: it is never spent")


def _say_what_slurm_gets(sweep: Any, runs: int) -> None:
    """Backend slurm: how many jobs a start would submit, and what each asks for."""
    slurm = sweep.options.slurm if sweep.options.backend == "slurm" else None
    if slurm is None or not runs:
        return
    if slurm.pool is not None:
        from ...backends.slurm import commands
        from ...backends.slurm.shape import allocation_args, pool_shape, pool_slots

        shape = pool_shape(sweep.options, lambda: _partition_if_known(commands, slurm.partition))
        at_once = (
            f"up to {pool_slots(sweep.options, shape.runs_per_node)} at once"
            if shape.runs_per_node is not None
            else "as many at once as their nodes have GPUs"
        )
        per_run = f"{shape.cpus_per_run} CPU(s)" if shape.cpus_per_run else "an even share of its node's CPUs"
        print(
            f"slurm pool: {slurm.pool.allocations} allocation job(s) of {slurm.pool.nodes} "
            f"{'whole ' if shape.exclusive else 'shared '}node(s) for the {runs} run(s), {at_once} (one more for "
            f"each that ends while runs wait), each run on {per_run}"
            f"{' and its GPUs' if shape.gpus_per_node != 0 else ''}; "
            f"each: sbatch {' '.join(allocation_args(sweep.options, shape))}"
        )
        return
    from ...backends.slurm.resources import Resources

    arrays = -(-runs // min(slurm.max_queued, 1001))
    print(
        f"slurm: {runs} job array task(s) in at least {arrays} array(s) (up to {slurm.max_queued} queued at once), "
        f"one per run; each: sbatch {' '.join(Resources(sweep.options).sbatch_args())}"
    )


def _partition_if_known(commands: Any, name: str | None) -> Any:
    """What the partition's nodes have, or None where Slurm cannot say (a dry run off the cluster)."""
    from ...errors import GTSError

    try:
        return commands.partition(name)
    except GTSError:
        return None


def _say_order_matters(sweep: Any) -> None:
    """ASHA judges a run at a rung against the runs that reached it before: the first to reach
    a rung always goes on. Over a grid the order it is written in decides what is stopped."""
    from ...tuning.stopping import Asha

    for stage, rule in sweep.stopping.items():
        if isinstance(rule, Asha) and sweep.search is None:
            where = "early_stop" if stage is None else f"stage {stage!r}'s early_stop"
            print(
                f"{where} (asha): the first run to reach a rung always goes on, and each later one is judged only "
                "against those before it, so over a grid the order matters: list the values you expect to do "
                "best first (a grid written in ascending order of, say, the learning rate may stop none)"
            )


def _say_who_runs(root: str) -> None:
    """A dry run beside a running scheduler says so: what it decided is as of now, and a start
    would be refused until that one ends."""
    from ...records.ledger.lock import scheduler_state

    if not os.path.isdir(root):
        return
    running, holder = scheduler_state(root)
    if running:
        print(
            f"a scheduler is running on {root} now ({holder}): the decisions above are as of this moment, and "
            "a start is refused until it ends (gts status ROOT follows it; gts stop ROOT stops it)"
        )


def run(args: argparse.Namespace) -> int:
    from ...backends.local.tasks import NoTaskError, import_task, resolve_task
    from ...sweep.expand import Sweep

    _config_among_gpus(args)
    args.serve = _serve_port(args)
    sweep = Sweep(_run_config(args))
    try:
        make_task = resolve_task(sweep, import_task(args.task) if args.task else None)
    except NoTaskError:
        raise TaskClassError(
            "no task to run: give --task MODULE:CLASS (a GPUTask subclass), or write task: 'package.module:Class' "
            "or command: [...] in the config"
        ) from None
    with gpus_all_said_here(args.gpus):
        if args.dry_run:
            if sweep.options.backend == "local":  # the slots a start would find, checked as it checks them
                from ...gpu.capacity import check_slots

                check_slots(sweep.options)
            for note in args.override_notes:
                print(f"override: {note}")
            return _dry_run(sweep)
        if args.serve is not None:
            if args.detach:
                raise ConfigError("--serve and --detach: a detached sweep has no scheduler to serve it (use gts serve)")
            return _run_served(sweep, make_task, args)
        return run_with_status(sweep, make_task, plain=args.plain, detach=args.detach)


def _serve_port(args: argparse.Namespace) -> int | None:
    """``--serve``'s port (DEFAULT_PORT, 8642, when none is given; 0: any free one), None without ``--serve``.
    ``--serve lr=0.1``: argparse took the override for the port; it goes back among the overrides."""
    given = args.serve
    if given is None:
        return None
    from ...web.server import DEFAULT_PORT  # here: http.server takes 50 ms to import, before the first run

    if "=" in given:
        args.overrides.append(given)
        return DEFAULT_PORT
    if given and not (given.isascii() and given.isdigit()):
        raise ConfigError(f"--serve takes a port number; got {given!r}")
    return int(given) if given else DEFAULT_PORT


def _run_served(sweep: Any, make_task: Any, args: argparse.Namespace) -> int:
    """``gts run --serve [PORT]``: the sweep, with ``gts serve`` of its root while it runs."""
    from ...web.server import Serving

    with Serving([sweep.options.result_root_folder], port=args.serve) as serving:
        print(f"gts run: watching at {serving.url}", file=sys.stderr, flush=True)
        return run_with_status(sweep, make_task, plain=args.plain)


def add(sub: Any) -> None:
    parser = sub.add_parser(
        "run",
        help="run a sweep from a config file",
        formatter_class=formatter,
        description="Run every run of a sweep config (YAML, JSON or .py).",
        epilog="examples:\n  gts run sweep.yaml\n  gts run sweep.yaml --gpus 0 1 --dry-run\n"
        "  gts run sweep.yaml lr=0.1,0.01 layers=2 +seed=1,2,3 scheduler_config.timeout=600\n"
        "  gts run sweep.yaml --task mypkg.tasks:Train --gpus 0,1 2,3\n"
        "  gts run sweep.yaml --address auto --gpus all    # every GPU of the Ray cluster\n\n"
        "The task is the config's `command:` template, its `task: module:Class`, "
        "or --task.",
    )
    parser.add_argument("config", nargs="?", help="the sweep config: .yaml, .yml, .json or .py")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="change the config: lr=0.1,0.01 sweeps lr, layers=2 fixes it, +seed=1,2 adds a key, "
        "scheduler_config.timeout=600 reaches inside",
    )
    parser.add_argument("--task", metavar="MODULE:CLASS", help="the GPUTask subclass to run (overrides the config)")
    parser.add_argument(
        "--gpus", nargs="+", metavar="ID", help="slots: 0 1 or 0,1 (one GPU each), 0+1 2+3 (groups of GPUs), cpu, all"
    )
    parser.add_argument("--force-rerun", action="store_true", help="run every run, also those that succeeded")
    parser.add_argument(
        "--dry-run", action="store_true", help="list the runs and whether they would run; change nothing"
    )
    parser.add_argument("--max-retries", type=int, metavar="N", help="retry a failed run up to N times")
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help="stop a run after this long")
    parser.add_argument(
        "--grace-period",
        type=float,
        metavar="SECONDS",
        help="seconds between SIGTERM and SIGKILL when a run is stopped (default 10)",
    )
    parser.add_argument(
        "--backend",
        choices=["local", "ray", "slurm"],
        help="where runs run: this machine's GPUs (local, the default), a Ray cluster's (ray) or a Slurm "
        "cluster's (slurm: job arrays, submitted from this login node)",
    )
    parser.add_argument(
        "--partition",
        metavar="NAME",
        help="the Slurm partition the runs go to (slurm: {partition}); implies --backend slurm",
    )
    parser.add_argument(
        "--detach",
        action="store_true",
        help="backend slurm: submit the runs that are ready and exit; gts status shows them, and gts run "
        "again follows them (and submits what was not ready)",
    )
    parser.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="the Ray cluster to use ('auto': the one this machine belongs to); implies --backend ray. "
        "Without it, --backend ray starts a Ray instance on this machine for the sweep",
    )
    parser.add_argument("--plain", action="store_true", help="plain log lines even on a terminal")
    parser.add_argument(
        "--serve",
        nargs="?",
        const="",
        metavar="PORT",
        help="serve the web view of the sweep while it runs (gts serve; default port 8642)",
    )
    changed = parser.add_mutually_exclusive_group()
    changed.add_argument(
        "--accept-changes",
        action="store_true",
        help="runs that succeeded with another config run again (on_config_change: rerun)",
    )
    changed.add_argument(
        "--keep",
        action="store_true",
        help="runs that succeeded with another config keep their results (on_config_change: keep)",
    )
    parser.set_defaults(handler=run)
