"""The ``gts`` command (also ``python -m gpu_task_scheduler``).

This release ships the library; the subcommands below are the planned
command line and say so instead of pretending to work.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from . import __version__

PLANNED = {
    "run": "run a sweep from a YAML/JSON/.py config",
    "queue": "run shell commands read from stdin on the GPUs",
    "grid": "print the commands of a parameter grid",
    "status": "show the state of every run of a result root",
    "results": "collect the runs' results into a table",
    "plot": "plot a timeline or a metric of a result root",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gts",
        description="gpu_task_scheduler: hyperparameter sweeps over your GPUs.",
        epilog="Today the sweep runs from Python: GPUTaskScheduler(config, MyTask).start() (see the README).",
    )
    parser.add_argument("--version", action="version", version=f"gts {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in PLANNED.items():
        commands.add_parser(name, help=f"{help_text} (not available yet)", add_help=True)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args, _ = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    print(f"gts {args.command}: not available yet in gts {__version__}; "
          "run sweeps from Python with GPUTaskScheduler (see the README).", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
