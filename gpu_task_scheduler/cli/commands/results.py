"""``gts results ROOT``: the results table, averaged, ranked, for a paper, by lineage or Pareto front."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ...errors import ConfigError
from ..shared import EXIT_FAILED, EXIT_OK, formatter


def _best_maximizes(args: argparse.Namespace) -> bool:
    """Which way ``--best KEY`` goes: ``--min``/``--max`` (``--desc``: ``--max``), else the
    ``mode`` the sweep's config declares for that metric; never a guess."""
    from ...results import declared_mode

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


def _declared_best(root: str) -> str:
    """``--best`` with no KEY: the one metric the config declares a mode for (early_stop, search, pbt)."""
    from ...results import declared_modes

    declared = sorted(declared_modes(root))
    if len(declared) == 1:
        return declared[0]
    if not declared:
        raise ConfigError(
            "give --best KEY: the sweep's config declares no metric (an early_stop's, a search's or pbt's metric "
            "and mode say which one is best)"
        )
    raise ConfigError(f"give --best KEY: the sweep's config declares several metrics ({', '.join(declared)})")


def _with_checkpoint(root: str, row: dict[str, Any]) -> dict[str, Any]:
    """The best run's row with its folder and the checkpoint it left (``<run>/.gts/checkpoint/...``;
    None where it left none)."""
    from ...integrations.common import checkpoint_left
    from ...records.paths import RunPaths, UnsafePathError

    try:
        paths = RunPaths.recorded(root, row["name"])
    except (UnsafePathError, KeyError, TypeError):
        return row
    left = checkpoint_left(paths.checkpoint)
    return {**row, "folder": os.path.abspath(paths.work_dir), "checkpoint": left and os.path.abspath(left)}


def run(args: argparse.Namespace) -> int:
    from ...results import aggregate, best, format_csv, format_table, key_problem, metric, rows, sort_rows, top_rows

    if args.best == "":  # --best alone: the metric the config declares
        args.best = _declared_best(args.root)

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
        from ...results import several_objectives

        several = several_objectives(args.root)
        if several:
            raise ConfigError(
                f"{args.root!r} is a search of several objectives ({', '.join(several)}): no one run is best; "
                "gts results ROOT --pareto lists the runs no other run beats in all of them"
            )
    if args.pareto:
        from ...results import pareto

        if args.best or args.sort or args.average_over or args.top is not None:
            raise ConfigError("--pareto lists the front; it goes with --stage and --format only")
        table = pareto(args.root, stage=args.stage)
    elif args.best:
        found = best(args.root, args.best, maximize=_best_maximizes(args), stage=args.stage)
        table = [] if found is None else [_with_checkpoint(args.root, found)]
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
        from ...results import duration_text

        shown = [{**row, "duration": duration_text(row["duration"])} if "duration" in row else row for row in table]
        print(format_table(shown, escape=sys.stdout.isatty()) if table else "no runs recorded")
    if schedule is not None:
        print(f"\nthe schedule {table[0]['name']} trained with (population-based training):\n{schedule}")
    return EXIT_OK


def _print_gpu_hours_to(args: argparse.Namespace) -> int:
    """``--gpu-hours-to 'loss<=0.2'``: the GPU-hours the sweep had spent when a run first reached it."""
    from ...results import gpu_hours_to

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
    from ...records.lineage import copies_text, lineages, schedule_text
    from ...results import open_ledger

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
    from ...results import declared_modes, format_paper, paper_columns

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
    from ...errors import closest
    from ...results import columns

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


def add(sub: Any) -> None:
    r = sub.add_parser(
        "results",
        help="one row per run: parameters, state, duration, result",
        formatter_class=formatter,
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
        nargs="?",
        const="",
        help="the one succeeded run with the best KEY: --min or --max says which way (else the mode the "
        "config's early_stop, search or pbt declares for it); KEY left out: the metric the config declares. "
        "With the run's folder and the checkpoint it left",
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
    r.set_defaults(handler=run)
