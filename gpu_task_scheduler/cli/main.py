"""The ``gts`` command (also ``python -m gpu_task_scheduler``).

Thin: parses arguments, calls the library, maps errors to exit codes
(0 fine, 1 runs failed or the sweep could not run, 2 bad usage or config,
130 interrupted) and configures logging, which the library never does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from .. import __version__
from ..engine.logs import plain_console_logging
from ..errors import ConfigError, GTSError, NoGpuError, SchedulerBusyError, TaskClassError
from ..sweep.files import load_config
from .clean import add_clean_command
from .export import add_export_command

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits 2 too; keep its message, add the hint
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n(see {self.prog} --help)\n")


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32, width=_columns() - 2)


def _columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size`` gives it (argparse's own default).
    argparse makes a formatter for each option it adds, and its default width imports shutil
    (and with it zlib, bz2 and lzma): 2 ms of every start of ``gts``."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):  # no stdout (None), closed, or not a terminal
        return 80


def _gpu_option(values: list[str]) -> Any:
    """``--gpus`` as the ``gpu`` config value: ``all``, or one slot per id.

    As in simple-gpu-scheduler, ids separated by commas or spaces are one slot
    each (``0,1,2`` and ``0 1 2`` are three slots); ``+`` joins GPUs into one
    slot for runs that need several (``0+1 2+3``: two slots of two GPUs).

    >>> _gpu_option(["0,1,2"]), _gpu_option(["0+1", "2+3"]), _gpu_option(["cpu", "cpu"])
    (['0', '1', '2'], [['0', '1'], ['2', '3']], ['cpu', 'cpu'])
    """
    if values == ["all"]:
        return "all"
    slots: list[Any] = []
    for value in values:
        for item in value.split(","):
            if not item:
                raise ConfigError(f"--gpus {value!r} has an empty id; write ids like 0,1 or 0 1 (0+1 for a group)")
            slots.append(item.split("+") if "+" in item else item)
    return slots


def _config_among_gpus(args: argparse.Namespace) -> None:
    """``gts run --gpus 0 1 sweep.yaml``: ``--gpus`` took the config file too; give it back."""
    from ..sweep.files import SUFFIXES

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


def _root_of(given: str) -> str:
    """A result root named on the command line, or the config file of the sweep (``gts status
    sweep.yaml``): its ``result_root_folder``, relative to here as ``gts run`` reads it."""
    from ..sweep.files import SUFFIXES

    if os.path.splitext(given)[1].lower() not in SUFFIXES or not os.path.isfile(given):
        return given
    config = load_config(given)
    scheduler = config.get("scheduler_config")
    if not isinstance(scheduler, dict):
        raise ConfigError(f"{given} is a config file without a scheduler_config to find its result root in")
    root = scheduler.get("result_root_folder", "results/")
    if not isinstance(root, (str, os.PathLike)):
        raise ConfigError(f"{given}: scheduler_config['result_root_folder'] must be a path; got {root!r}")
    return os.fspath(root)


@contextlib.contextmanager
def _gpus_all_said_here(gpus: list[str] | None) -> Iterator[None]:
    """``--gpus all`` on a machine without GPUs: the way out in the command line's words."""
    try:
        yield
    except NoGpuError as error:
        if gpus != ["all"]:
            raise
        raise GTSError(
            f"--gpus all, but no GPU is available ({error.reason}): use --gpus cpu for CPU slots "
            "(--gpus cpu cpu: two runs at a time), or name GPU ids (--gpus 0 1)"
        ) from None


# --- gts run ---------------------------------------------------------------------------


def _run_config(args: argparse.Namespace) -> dict[str, Any]:
    from ..sweep.overrides import apply_overrides

    config, args.override_notes = apply_overrides(dict(load_config(args.config)), args.overrides)
    if not isinstance(config.get("scheduler_config", {}), dict):
        return config  # validation reports it
    scheduler = dict(config.get("scheduler_config") or {})
    if args.gpus:
        scheduler["gpu"] = _gpu_option(args.gpus)
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
        scheduler["scheduler_log_file_path"] = _log_in_root(scheduler.get("result_root_folder", "results/"))
    config["scheduler_config"] = scheduler
    return config


def _log_in_root(root: Any) -> Any:
    """Where a sweep run from the command line logs when its config names no place: in its result
    root, so that two sweeps started from one folder keep their logs apart (the Python API keeps
    the original's ``scheduler.log`` in the current folder). A root that is not a path is left to
    the config's validation."""
    if not isinstance(root, (str, os.PathLike)):
        return None
    return os.path.join(os.path.abspath(root), "scheduler.log")


def _run_sweep(sweep: Any, make_task: Any, *, plain: bool, detach: bool = False) -> int:
    """Run it with the status line on a terminal (plain log lines otherwise); its exit code."""
    from ..backends.choose import launcher_for
    from ..engine.api import run_sweep
    from ..engine.hooks import HookList

    status = None
    if not plain:  # the status line's module (and the reports it uses) is imported only for it: 3 ms
        from .progress import live_status, wanted

        status = live_status(len(sweep), wanted(sys.stderr))
    if status is None:
        plain_console_logging()
    console = None if status is None else status.log_handler()
    with launcher_for(sweep.options, make_task, detach=detach) as launcher:
        hooks = HookList([] if status is None else [status])
        summary = run_sweep(sweep, launcher, hooks=hooks, console=console, detach=detach)
    return summary.exit_code


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

    from ..engine.api import plan

    counts: dict[str, int] = {}
    size = len(sweep)
    listed_all = size <= DRY_LISTED
    last: collections.deque[str] = collections.deque(maxlen=DRY_ENDS)
    decided = 0
    for spec, decision in itertools.islice(plan(sweep), DRY_DECIDED):
        decided += 1
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
        from ..tuning.space import describe

        print(summary.replace("runs:", "runs asked so far:") if decided else "no run asked yet")
        print(f"{sweep.search.describe()}; space: {describe(sweep.space)}")
        left = sweep.search.n_runs - sweep.asked
        if left <= 0:
            from ..tuning.search import spent_message

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
    _say_who_runs(sweep.options.result_root_folder)
    return EXIT_OK


def _say_what_decides(sweep: Any) -> None:
    """What a real start says of the methods that decide which runs go on (population-based
    training's population and interval, promotion ASHA's drawn order) and of a budget it can
    never spend: a dry run says it too."""
    from ..tuning.pbt import PbtRule
    from ..tuning.stopping import Pausing

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


def _say_order_matters(sweep: Any) -> None:
    """ASHA judges a run at a rung against the runs that reached it before: the first to reach
    a rung always goes on. Over a grid the order it is written in decides what is stopped."""
    from ..tuning.stopping import Asha

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
    from ..records.ledger import scheduler_state

    if not os.path.isdir(root):
        return
    running, holder = scheduler_state(root)
    if running:
        print(
            f"a scheduler is running on {root} now ({holder}): the decisions above are as of this moment, and "
            "a start is refused until it ends (gts status ROOT follows it; gts stop ROOT stops it)"
        )


def cmd_run(args: argparse.Namespace) -> int:
    from ..backends.local.tasks import NoTaskError, import_task, resolve_task
    from ..sweep.expand import Sweep

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
    with _gpus_all_said_here(args.gpus):
        if args.dry_run:
            if sweep.options.backend == "local":  # the slots a start would find, checked as it checks them
                from ..gpu.capacity import check_slots

                check_slots(sweep.options)
            for note in args.override_notes:
                print(f"override: {note}")
            return _dry_run(sweep)
        if args.serve is not None:
            if args.detach:
                raise ConfigError("--serve and --detach: a detached sweep has no scheduler to serve it (use gts serve)")
            return _run_served(sweep, make_task, args)
        return _run_sweep(sweep, make_task, plain=args.plain, detach=args.detach)


def _serve_port(args: argparse.Namespace) -> int | None:
    """``--serve``'s port (DEFAULT_PORT, 8642, when none is given; 0: any free one), None without ``--serve``.
    ``--serve lr=0.1``: argparse took the override for the port; it goes back among the overrides."""
    given = args.serve
    if given is None:
        return None
    from ..web.server import DEFAULT_PORT  # here: http.server takes 50 ms to import, before the first run

    if "=" in given:
        args.overrides.append(given)
        return DEFAULT_PORT
    if given and not (given.isascii() and given.isdigit()):
        raise ConfigError(f"--serve takes a port number; got {given!r}")
    return int(given) if given else DEFAULT_PORT


def _run_served(sweep: Any, make_task: Any, args: argparse.Namespace) -> int:
    """``gts run --serve [PORT]``: the sweep, with ``gts serve`` of its root while it runs."""
    from ..web.server import Serving

    with Serving([sweep.options.result_root_folder], port=args.serve) as serving:
        print(f"gts run: watching at {serving.url}", file=sys.stderr, flush=True)
        return _run_sweep(sweep, make_task, plain=args.plain)


# --- gts queue ---------------------------------------------------------------------------


def cmd_queue(args: argparse.Namespace) -> int:
    from ..backends.local.launcher import LocalLauncher
    from ..backends.local.tasks import ShellLineTask
    from ..engine.api import run_sweep
    from ..sweep.stream import StreamSweep

    plain_console_logging()
    config = {
        "scheduler_config": {
            "gpu": _gpu_option(args.gpus),
            "result_root_folder": args.log_dir,
            "force_rerun": not args.resume,
            "scheduler_log_file_path": os.path.join(args.log_dir, "scheduler.log"),
            **({"timeout": args.timeout} if args.timeout else {}),
            **({"grace_period": args.grace_period} if args.grace_period is not None else {}),
        }
    }
    sweep = StreamSweep(config, sys.stdin)
    launcher = LocalLauncher(ShellLineTask, grace_period=sweep.options.grace_period)
    with _gpus_all_said_here(args.gpus):
        summary = run_sweep(sweep, launcher, keep_succeeded=False)
    return EXIT_INTERRUPTED if summary.interrupted_by else summary.exit_code


# --- gts grid -----------------------------------------------------------------------------


def cmd_grid(args: argparse.Namespace) -> int:
    from ..sweep.grid import commands

    parameters = []
    for group in args.parameter or []:
        if len(group) < 2:
            raise ConfigError(f"-p {group[0]} needs at least one value: -p NAME V1 [V2 ...]")
        parameters.append((group[0], group[1:]))
    lines = commands(args.pattern, parameters, mode=args.sampling_mode, n_samples=args.n_samples, seed=args.seed)
    first = next(lines, None)  # report a bad pattern before printing anything
    if first is None:
        return EXIT_OK
    write = sys.stdout.write
    write(first + "\n")
    for line in lines:
        write(line + "\n")
    sys.stdout.flush()
    return EXIT_OK


# --- gts status / results / plot ----------------------------------------------------------


def _gpu_memory_by_group(monitor: Any) -> dict[int, int] | None:
    """Bytes of GPU memory each process group holds now (None without NVML)."""
    if monitor is None:
        return None
    used: dict[int, int] = {}
    try:
        for state in monitor.all():
            for process in state.processes:
                try:
                    group = os.getpgid(process.pid)
                except OSError:
                    continue
                used[group] = used.get(group, 0) + (process.used_memory or 0)
    except Exception:  # an NVMLError: show no memory this time
        return None
    return used


def _watch(root: str) -> int:
    import time

    from ..gpu.devices import open_monitor
    from ..reports.status import status, watch_view

    terminal = sys.stdout.isatty()
    monitor, _ = open_monitor()  # once: NVML takes a while to start
    try:
        while True:
            report = status(root, runs="watch")
            frame = watch_view(report, _gpu_memory_by_group(monitor), escape=terminal)
            sys.stdout.write(("\x1b[H\x1b[2J" if terminal else "") + frame + "\n" + ("" if terminal else "\n"))
            sys.stdout.flush()
            if not report["scheduler"]["running"]:
                return _watch_end(report)
            time.sleep(1.0)  # the refresh period
    finally:
        if monitor is not None:
            monitor.close()


def _watch_end(report: dict[str, Any]) -> int:
    """How ``--watch`` ends once no scheduler runs the root: 0 when the sweep ended with every run
    decided, else 1 and what it left (a scheduler killed with -9 leaves its runs stale)."""
    counts = report["counts"]
    left = {what: counts.get(what, 0) for what in ("stale", "pending", "running")}
    if not any(left.values()):
        return EXIT_OK
    words = ", ".join(f"{count} {what}" for what, count in left.items() if count)
    print(
        f"gts status: the sweep is no longer running (no scheduler holds {report['root']}; it was stopped or "
        f"killed) and left runs undone: {words}. Start it again to finish them",
        file=sys.stderr,
    )
    return EXIT_FAILED


def cmd_status(args: argparse.Namespace) -> int:
    from ..reports.status import format_status, status, terminal_width, write_status_json

    if args.watch:
        return _watch(args.root)
    if args.json:
        write_status_json(args.root, sys.stdout.write)
        return EXIT_OK
    report = status(args.root, runs="all" if args.all else "table")
    if args.all:
        _add_pending(report)
    width = terminal_width(sys.stdout)
    print(format_status(report, escape=sys.stdout.isatty(), width=width, verbose=args.verbose))
    return EXIT_OK


def _add_pending(report: dict[str, Any]) -> None:
    """``gts status --all``: the runs of the recorded sweep not recorded yet, as ``pending`` rows
    (the engine's own plan, read-only; a search's next runs are not known until it asks)."""
    from ..engine.api import plan
    from ..results import open_ledger
    from ..sweep.expand import Sweep

    ledger = open_ledger(report["root"])
    try:
        recorded = ledger.get_meta("sweep_config")
    finally:
        ledger.close()
    if not report["counts"].get("pending") or not recorded:
        return
    try:
        config = json.loads(recorded)
        config["scheduler_config"]["result_root_folder"] = report["root"]
        config["scheduler_config"]["scheduler_log_file_path"] = None
        sweep = Sweep(config)
    except (ValueError, KeyError, TypeError, RecursionError, GTSError) as error:
        print(
            f"gts status: the pending runs cannot be listed: the recorded config is unusable ({error})", file=sys.stderr
        )
        return
    if sweep.search is not None:
        print("gts status: a search's pending runs are not known until it asks for them", file=sys.stderr)
        return
    known = {run["name"] for run in report["runs"]}
    for spec, decision in plan(sweep):
        if spec.name not in known and decision.action == "run":  # not one a start would skip
            known.add(spec.name)
            report["runs"].append({"name": spec.name, "status": "pending", "duration": None})


def _warn_code_changed(records: Any) -> None:
    """``gts retry``: say when the code (its commit, or its uncommitted changes) is not what the runs
    it reruns were made with, so that their new results are not taken for the old code's."""
    from ..records.provenance import code_changed, collected

    now = collected(os.getcwd())
    changed = [(r.name, how) for r in records if (how := code_changed(r.provenance_value, now)) is not None]
    if changed:
        name, how = changed[0]
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        print(
            f"warning: the code changed since {name}{more} was run: {how}; it runs again with the code of now",
            file=sys.stderr,
        )


def cmd_retry(args: argparse.Namespace) -> int:
    from ..backends.local.tasks import import_task, resolve_task
    from ..records.ledger import RunStatus, scheduler_state
    from ..reports.runlogs import find_run
    from ..results import open_ledger
    from ..sweep.expand import Sweep

    if not (args.failed or args.interrupted or args.pruned or args.runs):
        raise ConfigError("say which runs: --failed, --interrupted, --pruned, or their names (or prefixes, or indexes)")
    ledger = open_ledger(args.root)
    try:
        records = ledger.records()
        recorded = ledger.get_meta("sweep_config")
        task_files = ledger.get_meta("task_files")
    finally:
        ledger.close()
    if not recorded:
        raise ConfigError(
            f"{args.root} keeps no record of its sweep's config (written by an earlier version, or a config "
            "with values that are not plain JSON): run the sweep again with its config file instead "
            "(failed and interrupted runs run again)"
        )
    wanted_status = {RunStatus.FAILED, RunStatus.TIMED_OUT} if args.failed else set()
    if args.interrupted:
        wanted_status.add(RunStatus.INTERRUPTED)
    if args.pruned:
        wanted_status.add(RunStatus.PRUNED)
    if wanted_status:  # the runs of later stages they blocked wait for them again
        wanted_status.add(RunStatus.BLOCKED)
    chosen = {r.name: r for r in records if r.status in wanted_status}
    for run in args.runs:
        record = find_run(records, run)
        if record.status is RunStatus.SUCCEEDED and not args.force:
            raise ConfigError(f"{record.name} succeeded; add --force to run it again")
        if record.status is RunStatus.RUNNING:
            raise ConfigError(f"{record.name} is recorded as running; stop its sweep first (gts stop)")
        if record.status is RunStatus.PAUSED and not args.force:
            # Refused, not resumed to its end: which paused run earns more steps is its method's
            # decision, recorded and replayed (trial_events); steps given outside it would make the
            # runs' steps and that history disagree, and a retry that went on past the rung would
            # be paused again there at once.
            raise ConfigError(
                f"{record.name} is paused ({record.cause or 'at a rung'}): its early_stop method decides whether "
                "it trains on, and has not promoted it. gts run CONFIG again resumes the paused runs the method "
                "promotes; to train it outside the method, retry it with --force (from step 0: its checkpoint is "
                "set aside), or run its config alone without early_stop"
            )
        chosen[record.name] = record
    if not chosen:
        print("no run to retry", file=sys.stderr)
        return EXIT_OK
    _warn_code_changed(chosen.values())
    try:
        config = json.loads(recorded)
        if not isinstance(config, dict) or not isinstance(config.get("scheduler_config"), dict):
            raise ValueError("not a config")
    except (ValueError, RecursionError):
        raise ConfigError(
            f"the ledger of {args.root} keeps its sweep's config (meta 'sweep_config'), but what it keeps is "
            "not a config (changed by hand?): run the sweep again with its config file instead"
        ) from None
    stages = config.get("stages") or []
    each_stage_has_one = bool(stages) and all("task" in stage or "command" in stage for stage in stages)
    if not args.task and "task" not in config and "command" not in config and not each_stage_has_one:
        raise ConfigError(
            "the sweep's task class has no importable name (defined in __main__?): give --task MODULE:CLASS"
        )
    recorded_scheduler = config["scheduler_config"]
    if recorded_scheduler.get("scheduler_log_file_path") == _log_in_root(
        recorded_scheduler.get("result_root_folder", "results/")
    ):  # the log gts run put in the root follows the root (moved since?)
        recorded_scheduler["scheduler_log_file_path"] = _log_in_root(args.root)
    recorded_scheduler["result_root_folder"] = os.path.abspath(args.root)
    if args.gpus:
        config["scheduler_config"]["gpu"] = _gpu_option(args.gpus)
    if args.force:
        config["scheduler_config"]["force_rerun"] = True
    sweep = Sweep(config)
    sweep.selected = frozenset(chosen)
    # Runs stopped early run again to their end: the early_stop rule leaves them alone this time.
    sweep.rerun_pruned = True
    sweep.unjudged = frozenset(name for name, record in chosen.items() if record.status is RunStatus.PRUNED)
    looked = [] if args.task else _find_recorded_tasks(task_files)
    try:
        make_task = resolve_task(sweep, import_task(args.task) if args.task else None)
    except (ConfigError, TaskClassError) as error:
        if args.task or "task" not in config:
            raise
        where = f" ({'; '.join(looked)})" if looked else " (the ledger records no file for it)"
        raise type(error)(  # the recorded task cannot be imported from here
            f"{error}{where}; run gts retry where the sweep was started, set PYTHONPATH, or name the task with --task"
        ) from None
    in_sweep = {spec.name for spec in sweep.runs()} & set(chosen)
    missing = sorted(set(chosen) - in_sweep)
    if missing:  # a later start with another config replaced the record: these runs are not in it
        print(
            f"gts retry: error: {len(missing)} of the runs to retry are not in the sweep {args.root} recorded last "
            f"(a later start with another config replaced it): {', '.join(missing[:10])}"
            f"{' ...' if len(missing) > 10 else ''}. Run the config they belong to again with gts run CONFIG "
            "(its failed and interrupted runs run again)",
            file=sys.stderr,
        )
        if not in_sweep:
            return EXIT_USAGE
        sweep.selected = frozenset(in_sweep)
    running, holder = scheduler_state(args.root)
    if running:  # said before "running ... again", which would be untrue
        raise SchedulerBusyError(
            f"another scheduler is already running on {args.root!r} ({holder}); wait for it to finish or stop it first"
        )
    shown = ", ".join(sorted(in_sweep)[:10]) + (" ..." if len(in_sweep) > 10 else "")
    fresh = " (--force: from step 0, their checkpoints set aside)" if args.force else ""
    print(f"running {len(in_sweep)} run(s) again: {shown}{fresh}")
    code = _run_sweep(sweep, make_task, plain=args.plain)
    return code if code != EXIT_OK or not missing else EXIT_FAILED


def _find_recorded_tasks(recorded: str | None) -> list[str]:
    """Make the task modules the ledger recorded (``{"module": "/abs/file.py"}``) importable when
    they are not from here: their import root goes on ``sys.path``, but only for a file the user
    (or root) owns, in folders no other user may write, so that a result root shared with others
    cannot make ``gts retry`` import code of their choosing. What it looked at, for the error."""
    import importlib.util
    import stat

    try:
        files = json.loads(recorded) if recorded else {}
    except ValueError:
        return ["the ledger's record of the task files is not JSON"]
    looked = []
    for module, path in files.items() if isinstance(files, dict) else ():
        if not isinstance(module, str) or not isinstance(path, str) or not module.replace(".", "").isidentifier():
            continue
        try:
            if importlib.util.find_spec(module) is not None:
                continue  # importable from here
        except (ImportError, ValueError):
            pass
        parts = module.split(".")
        top = os.path.dirname(path) if os.path.basename(path) == "__init__.py" else os.path.splitext(path)[0]
        root = top
        for _ in parts:
            root = os.path.dirname(root)
        expected = os.path.join(root, *parts)
        if not os.path.isabs(path) or top != expected:
            looked.append(f"the ledger records {module} in {path!r}, which is not that module's file")
            continue
        try:
            infos = [os.stat(path), os.stat(root)]
        except OSError as error:
            looked.append(f"looked for {module} in {path}: {(error.strerror or str(error)).lower()}")
            continue
        mine = all(info.st_uid in (os.getuid(), 0) and not info.st_mode & stat.S_IWOTH for info in infos)
        if not mine:
            looked.append(f"{path} is not yours (or others may write there): not imported")
            continue
        sys.path.insert(0, root)
        looked.append(f"found {module} in {path}")
    return looked


def cmd_stop(args: argparse.Namespace) -> int:
    import time

    from ..records.control import request_stop
    from ..records.ledger import scheduler_process

    mode = "now" if args.now else "drain" if args.drain else "stop"
    pid = request_stop(args.root, mode)
    what = {
        "stop": "to stop its runs (SIGTERM, then SIGKILL after the grace period) and exit",
        "drain": "to start no more runs and exit when the running ones have finished",
        "now": "to kill its runs at once and exit",
    }[mode]
    print(f"asked the scheduler of {args.root} (pid {pid}) {what}")
    if args.wait:
        _wait_for_exit(pid)
        while scheduler_process(args.root)[0]:  # the pid gone, its runs may hold the lock a moment longer
            time.sleep(0.1)
        print("it has exited")
    return EXIT_OK


def _wait_for_exit(pid: int) -> None:
    """Until the process ``pid`` has ended (a pidfd where Linux has them)."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfds here, or it is gone already: the caller looks
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def cmd_logs(args: argparse.Namespace) -> int:
    from ..reports.runlogs import failed_tails, show_log

    def write(data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    if args.failed == bool(args.run):
        raise ConfigError("give a run (its folder name, a unique prefix of it, or its index) or --failed")
    if args.lines is not None and args.lines < 0:
        raise ConfigError("-n must be 0 or more")
    if args.failed:
        if not failed_tails(args.root, write, lines=20 if args.lines is None else args.lines):
            print("no run failed", file=sys.stderr)
        return EXIT_OK
    show_log(args.root, args.run, write, lines=args.lines, follow=args.follow)
    return EXIT_OK


def cmd_gpus(args: argparse.Namespace) -> int:
    from ..reports.gpus import format_gpus, machine_gpus

    report = machine_gpus()
    print(json.dumps(report, indent=1) if args.json else format_gpus(report))
    return EXIT_FAILED if report["problem"] else EXIT_OK


def _best_maximizes(args: argparse.Namespace) -> bool:
    """Which way ``--best KEY`` goes: ``--min``/``--max`` (``--desc``: ``--max``), else the
    ``mode`` the sweep's config declares for that metric; never a guess."""
    from ..results import declared_mode

    if args.max or args.min or args.desc:
        if args.min and args.desc:
            raise ConfigError("--min and --desc say opposite things; give one (--desc with --best means --max)")
        return not args.min
    mode = declared_mode(args.root, args.best)
    if mode is None:
        raise ConfigError(
            f"say which way {args.best!r} is better: --best {args.best} --min (e.g. a loss) or --max (e.g. "
            "an accuracy); the sweep's config declares no mode for it (early_stop or search)"
        )
    return mode == "max"


def cmd_results(args: argparse.Namespace) -> int:
    from ..results import aggregate, best, format_csv, format_table, key_problem, metric, rows, sort_rows, top_rows

    if args.best and (args.sort or args.average_over):
        raise ConfigError("--best gives one run; it does not go with --sort or --average-over")
    if (args.min or args.max) and not args.best:
        raise ConfigError("--min and --max say which way --best goes; to order rows, use --sort KEY [--desc]")
    if args.top is not None and args.top < 1:
        raise ConfigError("--top must be 1 or more")
    if args.schedule and not args.best:
        raise ConfigError("--schedule gives the values the best run trained with: give --best KEY too")
    if args.gpu_hours_to:
        return _print_gpu_hours_to(args)
    if args.best:
        from ..results import several_objectives

        several = several_objectives(args.root)
        if several:
            raise ConfigError(
                f"{args.root!r} is a search of several objectives ({', '.join(several)}): no one run is best; "
                "gts results ROOT --pareto lists the runs no other run beats in all of them"
            )
    if args.pareto:
        from ..results import pareto

        if args.best or args.sort or args.average_over or args.top is not None:
            raise ConfigError("--pareto lists the front; it goes with --stage and --format only")
        table = pareto(args.root, stage=args.stage)
    elif args.best:
        found = best(args.root, args.best, maximize=_best_maximizes(args), stage=args.stage)
        table = [] if found is None else [found]
        if found is None:
            problem = key_problem(args.root, args.best, stage=args.stage)
            if problem is not None:
                raise ConfigError(problem)
            print(f"no succeeded run has a number for {args.best!r}", file=sys.stderr)
            return EXIT_FAILED
    else:
        if args.sort and args.top is not None and not args.average_over:  # ranked without reading every row
            table = top_rows(args.root, args.sort, args.top, descending=args.desc, stage=args.stage)
        elif args.average_over:
            table = aggregate(args.root, args.average_over, stage=args.stage)
        else:
            table = rows(args.root, stage=args.stage)
        if args.sort:
            key = args.sort if not args.average_over else _mean_column(args.sort)
            table = sort_rows(table, key, descending=args.desc)
            if table and metric(table[0], key) is None:  # sorted rows with a number come first
                problem = _averaged_key_problem(table, args.sort) if args.average_over else None
                problem = problem or key_problem(args.root, args.sort, stage=args.stage)
                if problem is not None:
                    raise ConfigError(problem)
        if args.top is not None:
            table = table[: args.top]
    schedule = _lineages(args, table)
    if args.format == "json":
        print(json.dumps(table, indent=1))
    elif args.format == "csv":
        sys.stdout.write(format_csv(table))
    elif args.format in ("markdown", "latex"):
        _print_paper(args.root, table, args)
    else:
        from ..reports.status import duration_text

        shown = [{**row, "duration": duration_text(row["duration"])} if "duration" in row else row for row in table]
        print(format_table(shown, escape=sys.stdout.isatty()) if table else "no runs recorded")
    if schedule is not None:
        print(f"\nthe schedule {table[0]['name']} trained with (population-based training):\n{schedule}")
    return EXIT_OK


def _print_gpu_hours_to(args: argparse.Namespace) -> int:
    """``--gpu-hours-to 'loss<=0.2'``: the GPU-hours the sweep had spent when a run first reached it."""
    from ..results import gpu_hours_to

    if args.best or args.sort or args.average_over or args.lineage or args.top is not None:
        raise ConfigError("--gpu-hours-to answers one question; it goes with --stage and --format json only")
    found = gpu_hours_to(args.root, args.gpu_hours_to, stage=args.stage)
    unit = found["unit"]
    why = "" if unit == "GPU-hours" else " (no GPU was measured, as on CPU slots: the time the runs held their slots)"
    if args.format == "json":
        print(json.dumps(found, indent=1))
    elif found["reached"]:
        import time

        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(found["at"]))
        print(
            f"{found['condition']}: first reached by {found['run']} (it ended at {when}), after "
            f"{found['gpu_hours']:.4g} {unit} ({found['runs_ended']} run(s) had ended; "
            f"{found['total_gpu_hours']:.4g} {unit} recorded in all){why}"
        )
    else:
        best = "" if found["best"] is None else f" (the best value: {found['best']:.6g})"
        print(
            f"{found['condition']}: no run reached it{best}; {found['gpu_hours']:.4g} {unit} recorded in all{why}",
            file=sys.stderr,
        )
    return EXIT_OK if found["reached"] else EXIT_FAILED


def _lineages(args: argparse.Namespace, table: list[dict[str, Any]]) -> str | None:
    """``--lineage``: each row's ``lineage`` (whom it copied, where); ``--schedule``: the best run's
    schedule of values, as text (None without it)."""
    if not (args.lineage or args.schedule):
        return None
    from ..records.lineage import copies_text, lineages, schedule_text
    from ..results import open_ledger

    ledger = open_ledger(args.root)
    try:
        found = lineages(ledger.trial_events())
    finally:
        ledger.close()
    if not found:
        raise ConfigError(f"{args.root!r} records no population-based training (no pbt in its config): no lineage")
    if args.lineage:
        for row in table:
            if isinstance(row.get("name"), str):
                row["lineage"] = copies_text(found[row["name"]].exploits) if row["name"] in found else ""
    if not args.schedule or not table:
        return None
    if table[0]["name"] not in found:
        raise ConfigError(f"{table[0]['name']} was no member of the population: it has no schedule")
    return schedule_text(found[table[0]["name"]])


def _print_paper(root: str, table: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """``--format markdown|latex``: the paper table, and which result columns have no best in bold."""
    from ..results import declared_modes, format_paper, paper_columns

    modes = declared_modes(root)
    for said in args.bold or ():  # --bold loss=min: the way the user names, over the config's
        key, _, way = said.partition("=")
        if not key or way not in ("min", "max"):
            raise ConfigError(f"--bold takes KEY=min or KEY=max (which way KEY is better), e.g. loss=min; got {said!r}")
        modes[key.removeprefix("result.")] = way
    shown = format_paper(table, modes, args.format, escape=sys.stdout.isatty(), spread=args.spread)
    print(shown if table else "no runs recorded")
    unknown = [c.header for c in paper_columns(table, modes) if c.mode is None and c.key.startswith("result")]
    if unknown:
        print(
            f"no best in bold in {', '.join(unknown[:10])}: the config declares no mode for it (an early_stop's, a "
            "search's or pbt's metric and mode say which way it is better; or say it: --bold KEY=min)",
            file=sys.stderr,
        )


def _averaged_key_problem(table: list[dict[str, Any]], key: str) -> str | None:
    """``--sort KEY --average-over P``: KEY must be a result averaged in the groups."""
    from ..errors import closest
    from ..results import columns

    means = [name[: -len(".mean")] for name in columns(table) if name.endswith(".mean")]
    if _mean_column(key)[: -len(".mean")] in means:
        return None
    short = [name[len("result.") :] for name in means if name.startswith("result.")]
    guess = closest(key, [*means, *short])
    return (
        f"no averaged result is named {key!r}"
        + (f"; did you mean {guess!r}?" if guess else "")
        + (f" Averaged: {', '.join(short or means)}." if means else " (no group has a numeric result)")
    )


def _mean_column(key: str) -> str:
    """``--sort loss --average-over seed`` sorts by the mean of the result."""
    name = key if key.startswith("result") else f"result.{key}"
    return f"{name}.mean"


def cmd_plot(args: argparse.Namespace) -> int:
    from ..reports.status import plot_curves, plot_metric, plot_timeline

    if [bool(args.timeline), bool(args.metric), bool(args.curves), bool(args.contour), bool(args.pareto)].count(
        True
    ) != 1:
        raise ConfigError(
            "give one of --timeline, --metric NAME --by PARAMETER, --curves NAME [--by PARAMETER], --contour NAME, "
            "--pareto F1 F2"
        )
    if args.pareto:
        from ..reports.status import plot_pareto

        print(plot_pareto(args.root, args.pareto[0], args.pareto[1], args.output))
        return EXIT_OK
    if args.contour:
        from ..reports.importance import plot_contour

        mode = "max" if args.max else ("min" if args.min else None)
        print(plot_contour(args.root, args.contour, args.output, params=args.params, mode=mode))
        return EXIT_OK
    if args.params or args.min or args.max:
        raise ConfigError("--params, --min and --max go with --contour NAME")
    if args.metric and not args.by:
        raise ConfigError("--metric needs --by PARAMETER (the x axis)")
    if args.over and not args.curves:
        raise ConfigError("--over PARAMETER goes with --curves NAME: each group's mean curve with a 95 % band")
    if args.timeline:
        output = plot_timeline(args.root, args.output)
    elif args.curves:
        output = plot_curves(args.root, args.curves, args.by, args.output, over=args.over)
    else:
        output = plot_metric(args.root, args.metric, args.by, args.output)
    print(output)
    return EXIT_OK


def cmd_importance(args: argparse.Namespace) -> int:
    from ..reports.importance import format_importance, importance

    mode = "max" if args.max else ("min" if args.min else None)
    found = importance(
        args.root, args.metric, mode=mode, evaluator=args.evaluator, quantile=args.quantile, stage=args.stage
    )
    print(json.dumps(found, indent=1) if args.format == "json" else format_importance(found))
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    from ..web.server import serve

    roots = [_root_of(root) for root in args.roots]
    try:
        serve(roots, host=args.host, port=args.port, token=args.token, no_token=args.no_token)
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from ..web.report import write_report

    print(write_report(args.root, args.output))
    return EXIT_OK


# --- the parser ---------------------------------------------------------------------------


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The gts parser. With ``command``, one of its subcommands, only that one gets its arguments:
    main() builds only the one it runs (all of them cost 8 ms of every start: argparse looks up
    gettext translations and the terminal's size for each argument); ``gts --help`` and a
    mistyped command build all."""
    parser = _Parser(
        prog="gts",
        formatter_class=_formatter,
        description="gpu_task_scheduler: hyperparameter sweeps over your GPUs.",
        epilog="examples:\n  gts run sweep.yaml --gpus 0 1\n  gts status results/\n"
        "  gts grid 'python train.py --lr {lr}' -p lr 0.1 0.01 | gts queue --gpus 0 1",
    )
    parser.add_argument("--version", action="version", version=f"gts {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, add in _SUBCOMMANDS.items():
        if command is None or command == name:
            add(sub)
    return parser


def _run_command(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="run a sweep from a config file",
        formatter_class=_formatter,
        description="Run every run of a sweep config (YAML, JSON or .py).",
        epilog="examples:\n  gts run sweep.yaml\n  gts run sweep.yaml --gpus 0 1 --dry-run\n"
        "  gts run sweep.yaml lr=0.1,0.01 layers=2 +seed=1,2,3 scheduler_config.timeout=600\n"
        "  gts run sweep.yaml --task mypkg.tasks:Train --gpus 0,1 2,3\n"
        "  gts run sweep.yaml --address auto --gpus all    # every GPU of the Ray cluster\n\n"
        "The task is the config's `command:` template, its `task: module:Class`, "
        "or --task.",
    )
    run.add_argument("config", nargs="?", help="the sweep config: .yaml, .yml, .json or .py")
    run.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="change the config: lr=0.1,0.01 sweeps lr, layers=2 fixes it, +seed=1,2 adds a key, "
        "scheduler_config.timeout=600 reaches inside",
    )
    run.add_argument("--task", metavar="MODULE:CLASS", help="the GPUTask subclass to run (overrides the config)")
    run.add_argument(
        "--gpus", nargs="+", metavar="ID", help="slots: 0 1 or 0,1 (one GPU each), 0+1 2+3 (groups of GPUs), cpu, all"
    )
    run.add_argument("--force-rerun", action="store_true", help="run every run, also those that succeeded")
    run.add_argument("--dry-run", action="store_true", help="list the runs and whether they would run; change nothing")
    run.add_argument("--max-retries", type=int, metavar="N", help="retry a failed run up to N times")
    run.add_argument("--timeout", type=float, metavar="SECONDS", help="stop a run after this long")
    run.add_argument(
        "--grace-period",
        type=float,
        metavar="SECONDS",
        help="seconds between SIGTERM and SIGKILL when a run is stopped (default 10)",
    )
    run.add_argument(
        "--backend",
        choices=["local", "ray", "slurm"],
        help="where runs run: this machine's GPUs (local, the default), a Ray cluster's (ray) or a Slurm "
        "cluster's (slurm: job arrays, submitted from this login node)",
    )
    run.add_argument(
        "--partition",
        metavar="NAME",
        help="the Slurm partition the runs go to (slurm: {partition}); implies --backend slurm",
    )
    run.add_argument(
        "--detach",
        action="store_true",
        help="backend slurm: submit the runs that are ready and exit; gts status shows them, and gts run "
        "again follows them (and submits what was not ready)",
    )
    run.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="the Ray cluster to use ('auto': the one this machine belongs to); implies --backend ray. "
        "Without it, --backend ray starts a Ray instance on this machine for the sweep",
    )
    run.add_argument("--plain", action="store_true", help="plain log lines even on a terminal")
    run.add_argument(
        "--serve",
        nargs="?",
        const="",
        metavar="PORT",
        help="serve the web view of the sweep while it runs (gts serve; default port 8642)",
    )
    changed = run.add_mutually_exclusive_group()
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
    run.set_defaults(handler=cmd_run)


def _queue_command(sub: Any) -> None:
    q = sub.add_parser(
        "queue",
        help="run shell commands read from stdin on the GPUs",
        formatter_class=_formatter,
        description="Run one shell command per line of stdin, each on a free slot, with "
        "CUDA_VISIBLE_DEVICES set (compatible with simple-gpu-scheduler).",
        epilog="examples:\n  gts queue --gpus 0 1 2 < commands.txt\n"
        "  gts grid 'python train.py --lr {lr}' -p lr 1e-3 1e-4 | gts queue --gpus 0+1 2+3",
    )
    q.add_argument(
        "--gpus",
        nargs="+",
        required=True,
        metavar="ID",
        help="slots: 0 1 2 or 0,1,2 (one GPU each), 0+1 2+3 (groups of GPUs), cpu, or all",
    )
    q.add_argument("--log-dir", default="gts-queue", help="where each command's output goes (default: gts-queue)")
    q.add_argument("--timeout", type=float, metavar="SECONDS", help="stop a command after this long")
    q.add_argument(
        "--resume",
        action="store_true",
        help="skip commands that succeeded before in this log dir (a job is its command, wherever its line is)",
    )
    q.add_argument(
        "--grace-period",
        type=float,
        metavar="SECONDS",
        help="seconds between SIGTERM and SIGKILL when a command is stopped (default 10)",
    )
    q.set_defaults(handler=cmd_queue)


def _grid_command(sub: Any) -> None:
    g = sub.add_parser(
        "grid",
        help="print the commands of a parameter grid",
        formatter_class=_formatter,
        description="Print one command per grid point (compatible with simple_hypersearch); "
        "streamed, so any size works.",
        epilog="examples:\n  gts grid 'python train.py --lr {lr} --bs {bs}' -p lr 0.1 0.01 -p bs 32 64\n"
        "  gts grid 'run {job_index} {x}' -p x 1 2 3 --sampling-mode shuffled_grid --seed 0",
    )
    g.add_argument("pattern", help="command pattern with {NAME} placeholders (and {job_index})")
    g.add_argument(
        "-p",
        "--parameter",
        nargs="+",
        action="append",
        metavar=("NAME", "VALUE"),
        help="a parameter and its values: -p lr 0.1 0.01",
    )
    g.add_argument(
        "--sampling-mode",
        choices=["grid", "shuffled_grid"],
        default="shuffled_grid",
        help="shuffled_grid (the default, as in simple_hypersearch): every point once, in a shuffled "
        "order fixed by the input (--seed for another); grid: in order, the last parameter fastest",
    )
    g.add_argument("--n-samples", type=int, help="print only this many commands")
    g.add_argument("--seed", type=int, help="seed of the shuffled order")
    g.set_defaults(handler=cmd_grid)


def _status_command(sub: Any) -> None:
    s = sub.add_parser(
        "status",
        help="the state of every run of a result root",
        formatter_class=_formatter,
        epilog="examples:\n  gts status results/\n  gts status results/ --json | jq .counts",
    )
    s.add_argument("root", help="the result root (result_root_folder), or the sweep's config file")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--all", action="store_true", help="list every run, the pending ones too (not only those recorded)")
    s.add_argument("-v", "--verbose", action="store_true", help="causes in full, the table as wide as it needs")
    s.add_argument(
        "--watch",
        action="store_true",
        help="a view redrawn every second (counts, ETA, each slot's run with its time and GPU memory, "
        "why runs wait) until the sweep ends",
    )
    s.set_defaults(handler=cmd_status)


def _retry_command(sub: Any) -> None:
    rt = sub.add_parser(
        "retry",
        help="run failed, interrupted or pruned runs of a result root again, without the config file",
        formatter_class=_formatter,
        epilog="examples:\n  gts retry results/ --failed\n  gts retry results/ --interrupted --gpus 0 1\n"
        "  gts retry results/ lr-0.1, 7",
    )
    rt.add_argument("root", help="the result root, or the sweep's config file")
    rt.add_argument("runs", nargs="*", metavar="RUN", help="runs by folder name, unique prefix or index")
    rt.add_argument(
        "--failed", action="store_true", help="every failed or timed-out run (and every run blocked by one: stages)"
    )
    rt.add_argument(
        "--interrupted", action="store_true", help="every interrupted run (and every run blocked by one: stages)"
    )
    rt.add_argument(
        "--pruned",
        action="store_true",
        help="every run the early_stop rule stopped early, run to its end this time (and every run blocked by one)",
    )
    rt.add_argument("--force", action="store_true", help="also runs named that succeeded")
    rt.add_argument("--gpus", nargs="+", metavar="ID", help="slots, as for gts run (default: the sweep's)")
    rt.add_argument("--task", metavar="MODULE:CLASS", help="the GPUTask subclass (when the record names none)")
    rt.add_argument("--plain", action="store_true", help="plain log lines even on a terminal")
    rt.set_defaults(handler=cmd_retry)


def _stop_command(sub: Any) -> None:
    st = sub.add_parser(
        "stop",
        help="stop the sweep running on a result root (from another shell)",
        formatter_class=_formatter,
        epilog="examples:\n  gts stop results/\n  gts stop results/ --drain --wait\n  gts stop results/ --now",
    )
    st.add_argument("root", help="the result root of the running sweep, or its config file")
    how = st.add_mutually_exclusive_group()
    how.add_argument("--drain", action="store_true", help="start no more runs; let the running ones finish")
    how.add_argument("--now", action="store_true", help="kill the running runs at once (no grace period)")
    st.add_argument("--wait", action="store_true", help="return once the scheduler has exited")
    st.set_defaults(handler=cmd_stop)


def _logs_command(sub: Any) -> None:
    lg = sub.add_parser(
        "logs",
        help="a run's log (by folder name, unique prefix or index), or the failed runs' last lines",
        formatter_class=_formatter,
        epilog="examples:\n  gts logs results/ lr-0.1,\n  gts logs results/ 7 -f\n  gts logs results/ lr-0.0 -n 50\n"
        "  gts logs results/ --failed",
    )
    lg.add_argument("root", help="the result root, or the sweep's config file")
    lg.add_argument("run", nargs="?", help="the run: its folder name, a unique prefix of it, or its index")
    lg.add_argument("-f", "--follow", action="store_true", help="then print what it adds until the run ends")
    lg.add_argument("-n", "--lines", type=int, metavar="N", help="only the last N lines (--failed: 20)")
    lg.add_argument("--failed", action="store_true", help="the last lines of every failed run's log")
    lg.set_defaults(handler=cmd_logs)


def _gpus_command(sub: Any) -> None:
    gp = sub.add_parser(
        "gpus",
        help="this machine's GPUs: memory, utilisation, sweeps' runs and reservations, other processes",
        formatter_class=_formatter,
        epilog="examples:\n  gts gpus\n  gts gpus --json | jq '.gpus[].memory_free'",
    )
    gp.add_argument("--json", action="store_true", help="machine-readable output")
    gp.set_defaults(handler=cmd_gpus)


def _results_command(sub: Any) -> None:
    r = sub.add_parser(
        "results",
        help="one row per run: parameters, state, duration, result",
        formatter_class=_formatter,
        epilog="examples:\n  gts results results/\n  gts results results/ --format csv > runs.csv\n"
        "  gts results results/ --sort loss --top 5\n  gts results results/ --best accuracy --max\n"
        "  gts results results/ --average-over seed --sort loss\n"
        "  gts results results/ --stage eval --best loss --min\n"
        "  gts results results/pbt --best score --max --schedule\n"
        "  gts results results/ --gpu-hours-to 'loss<=0.2'",
    )
    r.add_argument("root", help="the result root, or the sweep's config file")
    r.add_argument(
        "--format",
        choices=["table", "csv", "json", "markdown", "latex"],
        default="table",
        help="markdown, latex: a table for a paper (mean ± std with --average-over, the best in bold)",
    )
    r.add_argument(
        "--spread",
        choices=["std", "ci95"],
        default="std",
        help="with --format markdown|latex and --average-over: what the ± is, the standard deviation (std) or "
        "the 95%% confidence interval of the mean (ci95); the header says which",
    )
    r.add_argument(
        "--bold",
        action="append",
        metavar="KEY=min|max",
        help="with --format markdown|latex: bold the best KEY, the lowest (min) or highest (max); repeatable "
        "(else the mode the config declares)",
    )
    r.add_argument("--sort", metavar="KEY", help="order by a result (loss finds result.loss) or a parameter")
    r.add_argument("--desc", action="store_true", help="largest first (with --best: the largest)")
    r.add_argument("--top", type=int, metavar="N", help="only the first N rows")
    r.add_argument(
        "--best",
        metavar="KEY",
        help="the one succeeded run with the best KEY: --min or --max says which way (else the mode the "
        "config's early_stop or search declares for it)",
    )
    way = r.add_mutually_exclusive_group()
    way.add_argument("--min", action="store_true", help="with --best: the lowest KEY is best (a loss)")
    way.add_argument("--max", action="store_true", help="with --best: the highest KEY is best (an accuracy)")
    r.add_argument(
        "--average-over",
        "--group-by-seed",
        dest="average_over",
        metavar="KEY",
        help="mean, std and count of every numeric result over runs that differ only in KEY (e.g. seed)",
    )
    r.add_argument("--stage", metavar="NAME", help="only the runs of this stage (a sweep with stages)")
    r.add_argument(
        "--lineage", action="store_true", help="population-based training: the members each run copied, and where"
    )
    r.add_argument(
        "--schedule",
        action="store_true",
        help="with --best: the values its weights trained with, step by step (population-based training)",
    )
    r.add_argument(
        "--pareto",
        action="store_true",
        help="a search of several objectives: the feasible runs no other feasible run beats in all of them",
    )
    r.add_argument(
        "--gpu-hours-to",
        metavar="CONDITION",
        help="the GPU-hours the sweep had spent when a run first reached CONDITION, e.g. 'loss<=0.2'",
    )
    r.set_defaults(handler=cmd_results)


def _plot_command(sub: Any) -> None:
    p = sub.add_parser(
        "plot",
        help="plot a timeline of the runs, a metric against a parameter, or the runs' reported curves",
        formatter_class=_formatter,
        epilog="examples:\n  gts plot results/ --timeline -o timeline.png\n"
        "  gts plot results/ --metric loss --by lr -o loss.png\n"
        "  gts plot results/ --curves loss --by lr -o curves.png\n"
        "  gts plot results/ --curves loss --by lr --over seed -o seeds.png\n"
        "  gts plot results/ --contour loss -o contour.png\n"
        "  gts plot results/ --pareto val_loss latency_ms -o front.png",
    )
    p.add_argument("root", help="the result root, or the sweep's config file")
    p.add_argument("--timeline", action="store_true", help="runs as bars per slot over time, failures marked")
    p.add_argument("--metric", help="a key of the runs' results")
    p.add_argument("--curves", metavar="NAME", help="a metric the runs reported as they trained, against the step")
    p.add_argument("--by", help="the parameter on the x axis (with --curves: the one that colours the lines)")
    p.add_argument(
        "--over",
        metavar="PARAMETER",
        help="with --curves: the runs that differ only in it (e.g. seed) as one mean curve with a 95 %% band",
    )
    p.add_argument(
        "--contour",
        metavar="NAME",
        help="a result (or reported metric) over its two most important parameters, and a slice along each",
    )
    p.add_argument("--params", nargs=2, metavar="PARAMETER", help="with --contour: these two, not the most important")
    p.add_argument(
        "--pareto",
        nargs=2,
        metavar=("F1", "F2"),
        help="a search of several objectives: the runs by two of them, and the Pareto front",
    )
    way = p.add_mutually_exclusive_group()
    way.add_argument("--min", action="store_true", help="with --contour: lower is better (else as the config says)")
    way.add_argument("--max", action="store_true", help="with --contour: higher is better")
    p.add_argument("-o", "--output", required=True, help="the image file to write (.png, .svg, .pdf)")
    p.set_defaults(handler=cmd_plot)


def _importance_command(sub: Any) -> None:
    im = sub.add_parser(
        "importance",
        help="rank the swept parameters by how much they mattered for a metric (PED-ANOVA or fANOVA)",
        formatter_class=_formatter,
        epilog="examples:\n  gts importance results/ --metric loss\n"
        "  gts importance results/ --metric accuracy --max --evaluator fanova\n"
        "  gts plot results/ --contour loss -o contour.png    # the two most important, drawn",
    )
    im.add_argument("root", help="the result root, or the sweep's config file")
    im.add_argument("--metric", required=True, help="a result (loss finds result.loss), else a reported metric")
    way = im.add_mutually_exclusive_group()
    way.add_argument("--min", action="store_true", help="lower is better (else the mode the config declares)")
    way.add_argument("--max", action="store_true", help="higher is better")
    im.add_argument(
        "--evaluator",
        choices=["ped-anova", "fanova"],
        default="ped-anova",
        help="ped-anova (default): what decides whether a run is among the best --quantile; fanova: the share "
        "of the metric's variance (needs scikit-learn; slow past a few hundred runs)",
    )
    im.add_argument(
        "--quantile", type=float, default=0.1, help="ped-anova: the share of runs counted as the best (default 0.1)"
    )
    im.add_argument("--stage", metavar="NAME", help="only the runs of this stage (a sweep with stages)")
    im.add_argument("--format", choices=["table", "json"], default="table")
    im.set_defaults(handler=cmd_importance)


def _serve_command(sub: Any) -> None:
    sv = sub.add_parser(
        "serve",
        help="a live web view of result roots: progress, sortable runs, logs, curves, parallel coordinates",
        formatter_class=_formatter,
        description="Serve a read-only web view of one or more result roots (or sweeps' config files), "
        "updated every second while their sweeps run. Charts need 'pip install gts-sweep[web]' (from a clone: "
        "pip install -e '.[web]').",
        epilog="examples:\n  gts serve results/\n  gts serve results/a results/b --port 8300\n"
        "  gts serve results/ --host 0.0.0.0    # other machines: prints a URL with a token",
    )
    sv.add_argument("roots", nargs="+", metavar="ROOT", help="result roots, or the sweeps' config files")
    sv.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine)")
    sv.add_argument("--port", type=int, default=8642, help="the port (default 8642; 0: any free one)")
    sv.add_argument(
        "--token", help="the token a browser must give, 16 characters or more (default: one is made and printed)"
    )
    sv.add_argument(
        "--no-token",
        action="store_true",
        help="ask for no token (a loopback --host only: then every user of this machine can read the view)",
    )
    sv.set_defaults(handler=cmd_serve)


def _report_command(sub: Any) -> None:
    rp = sub.add_parser(
        "report",
        help="the web view of a result root as one self-contained HTML file (no server, no network)",
        formatter_class=_formatter,
        epilog="examples:\n  gts report results/ -o sweep.html",
    )
    rp.add_argument("root", help="the result root, or the sweep's config file")
    rp.add_argument("-o", "--output", required=True, help="the HTML file to write")
    rp.set_defaults(handler=cmd_report)


_SUBCOMMANDS: dict[str, Callable[[Any], None]] = {
    "run": _run_command,
    "queue": _queue_command,
    "grid": _grid_command,
    "status": _status_command,
    "retry": _retry_command,
    "stop": _stop_command,
    "logs": _logs_command,
    "gpus": _gpus_command,
    "results": _results_command,
    "plot": _plot_command,
    "importance": _importance_command,
    "serve": _serve_command,
    "report": _report_command,
    "clean": lambda sub: add_clean_command(sub, _formatter),
    "export": lambda sub: add_export_command(sub, _formatter),
}


def _take_late_overrides(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> None:
    """``gts run s.yaml --dry-run lr=0.5``: argparse takes the positional overrides in one group,
    before the first option; overrides after an option come back unrecognised. As in Hydra, they
    are accepted anywhere after the subcommand, in the order given. Anything else is still an
    error, worded as argparse words it."""
    is_run = getattr(args, "command", None) == "run"
    late = [item for item in extra if is_run and "=" in item and not item.startswith("-")]
    if len(late) != len(extra):
        parser.error(f"unrecognized arguments: {' '.join(item for item in extra if item not in late)}")
    args.overrides.extend(late)


def _ensure_standard_streams() -> None:
    """``gts run 2>&-``: a closed stdout or stderr becomes /dev/null, so that no
    write to it (a log line, the summary) can end the sweep in a traceback."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
            setattr(sys, name, open(fd, "w", closefd=False))
        else:
            if getattr(sys, name) is None:
                setattr(sys, name, open(fd, "w", closefd=False))


def main(argv: Sequence[str] | None = None) -> int:
    _ensure_standard_streams()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv and argv[0] in _SUBCOMMANDS else None)
    args, extra = parser.parse_known_args(argv)
    if extra:
        _take_late_overrides(parser, args, extra)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        if getattr(args, "root", None) is not None:
            args.root = _root_of(args.root)
        return args.handler(args)
    except (ConfigError, TaskClassError) as error:
        print(f"gts {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except GTSError as error:
        print(f"gts {args.command}: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `gts grid ... | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except OSError as error:  # a file or folder named on the command line that cannot be used
        print(f"gts {args.command}: {error}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
