"""``gts importance ROOT``: how much each parameter matters to a result."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..shared import EXIT_OK, formatter


def run(args: argparse.Namespace) -> int:
    from ...reports.importance import format_importance, importance

    mode = "max" if args.max else ("min" if args.min else None)
    found = importance(
        args.root, args.metric, mode=mode, evaluator=args.evaluator, quantile=args.quantile, stage=args.stage
    )
    print(json.dumps(found, indent=1) if args.format == "json" else format_importance(found))
    return EXIT_OK


def add(sub: Any) -> None:
    im = sub.add_parser(
        "importance",
        help="rank the swept parameters by how much they mattered for a metric (PED-ANOVA or fANOVA)",
        formatter_class=formatter,
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
    im.set_defaults(handler=run)
