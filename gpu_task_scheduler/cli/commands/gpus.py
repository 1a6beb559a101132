"""``gts gpus``: the machine's GPUs as the scheduler sees them."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..shared import EXIT_FAILED, EXIT_OK, formatter


def run(args: argparse.Namespace) -> int:
    from ...reports.gpus import format_gpus, machine_gpus

    report = machine_gpus()
    print(json.dumps(report, indent=1) if args.json else format_gpus(report))
    return EXIT_FAILED if report["problem"] else EXIT_OK


def add(sub: Any) -> None:
    gp = sub.add_parser(
        "gpus",
        help="this machine's GPUs: memory, utilisation, sweeps' runs and reservations, other processes",
        formatter_class=formatter,
        epilog="examples:\n  gts gpus\n  gts gpus --json | jq '.gpus[].memory_free'",
    )
    gp.add_argument("--json", action="store_true", help="machine-readable output")
    gp.set_defaults(handler=run)
