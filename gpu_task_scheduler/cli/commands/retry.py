"""``gts retry ROOT``: run the recorded sweep's failed, interrupted, pruned or named runs again."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ...errors import ConfigError, SchedulerBusyError, TaskClassError
from ..shared import EXIT_FAILED, EXIT_OK, EXIT_USAGE, formatter, gpu_option, log_in_root, run_with_status


def _warn_code_changed(records: Any) -> None:
    """``gts retry``: say when the code (its commit, or its uncommitted changes) is not what the runs
    it reruns were made with, so that their new results are not taken for the old code's."""
    from ...records.provenance import code_changed, collected

    now = collected(os.getcwd())
    changed = [(r.name, how) for r in records if (how := code_changed(r.provenance_value, now)) is not None]
    if changed:
        name, how = changed[0]
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        print(
            f"warning: the code changed since {name}{more} was run: {how}; it runs again with the code of now",
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    from ...backends.local.tasks import import_task, resolve_task
    from ...records.ledger.lock import scheduler_state
    from ...records.status import RunStatus
    from ...reports.runlogs import find_run
    from ...results import open_ledger
    from ...sweep.expand import Sweep

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
    if recorded_scheduler.get("scheduler_log_file_path") == log_in_root(
        recorded_scheduler.get("result_root_folder", "results/")
    ):  # the log gts run put in the root follows the root (moved since?)
        recorded_scheduler["scheduler_log_file_path"] = log_in_root(args.root)
    recorded_scheduler["result_root_folder"] = os.path.abspath(args.root)
    if args.gpus:
        config["scheduler_config"]["gpu"] = gpu_option(args.gpus)
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
    code = run_with_status(sweep, make_task, plain=args.plain)
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


def add(sub: Any) -> None:
    rt = sub.add_parser(
        "retry",
        help="run failed, interrupted or pruned runs of a result root again, without the config file",
        formatter_class=formatter,
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
    rt.set_defaults(handler=run)
