"""``gts grid PATTERN -p NAME V1 V2 ...``: print a command line per point of a grid (or a sample of it)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ...errors import ConfigError
from ..shared import EXIT_OK, formatter


def run(args: argparse.Namespace) -> int:
    from ...sweep.grid import commands

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


def add(sub: Any) -> None:
    g = sub.add_parser(
        "grid",
        help="print the commands of a parameter grid",
        formatter_class=formatter,
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
    g.set_defaults(handler=run)
