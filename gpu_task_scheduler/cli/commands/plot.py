"""``gts plot ROOT``: plot a result (or a reported metric) against a parameter, or the runs' curves."""

from __future__ import annotations

import argparse
from typing import Any

from ...errors import ConfigError
from ..shared import EXIT_OK, formatter


def run(args: argparse.Namespace) -> int:
    from ...reports.plots import plot_curves, plot_metric, plot_timeline

    if [bool(args.timeline), bool(args.metric), bool(args.curves), bool(args.contour), bool(args.pareto)].count(
        True
    ) != 1:
        raise ConfigError(
            "give one of --timeline, --metric NAME --by PARAMETER, --curves NAME [--by PARAMETER], --contour NAME, "
            "--pareto F1 F2"
        )
    if args.pareto:
        from ...reports.plots import plot_pareto

        print(plot_pareto(args.root, args.pareto[0], args.pareto[1], args.output))
        return EXIT_OK
    if args.contour:
        from ...reports.importance import plot_contour

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


def add(sub: Any) -> None:
    p = sub.add_parser(
        "plot",
        help="plot a timeline of the runs, a metric against a parameter, or the runs' reported curves",
        formatter_class=formatter,
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
    p.set_defaults(handler=run)
