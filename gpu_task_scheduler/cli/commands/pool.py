"""``gts pool ROOT --allocations K``: grow or shrink the Slurm pool of the sweep running on a root."""

from __future__ import annotations

import argparse
from typing import Any

from ...finite import ascii_int
from ..shared import EXIT_OK, formatter, root_of


def run(args: argparse.Namespace) -> int:
    from ...backends.slurm.poolfiles import PoolFiles
    from ...errors import GTSError
    from ...records.ledger.lock import scheduler_state
    from ...records.paths import atomic_write, read_json

    root = root_of(args.root)
    files = PoolFiles(root)
    running, holder = scheduler_state(root)
    if running is False:
        raise GTSError(f"no scheduler is running on {root}; the next gts run takes the pool's size from the config")
    settings = read_json(files.settings)
    if not isinstance(settings, dict):
        raise GTSError(f"the sweep on {root} runs no Slurm pool (backend slurm with slurm: {{pool: ...}})")
    most = settings.get("max_allocations")
    if isinstance(most, int) and not isinstance(most, bool) and args.allocations > most:
        raise GTSError(
            f"--allocations {args.allocations}: the pool can use 1 to {most} allocation(s) at once "
            "(its partition's nodes over the nodes each allocation takes)"
        )
    atomic_write(files.target, f"{args.allocations}\n".encode())
    print(f"asked the scheduler of {root} ({holder}) to keep {args.allocations} allocation(s) while runs wait")
    return EXIT_OK


def _at_least_one(text: str) -> int:
    number = ascii_int(text)
    if number is None or number < 1:
        raise argparse.ArgumentTypeError(f"an integer >= 1, not {text!r}")
    return number


def add(sub: Any) -> None:
    po = sub.add_parser(
        "pool",
        help="grow or shrink the Slurm pool of the sweep running on a result root",
        formatter_class=formatter,
        epilog="examples:\n  gts pool results/ --allocations 4",
    )
    po.add_argument("root", help="the result root of the running sweep, or its config file")
    po.add_argument(
        "--allocations",
        type=_at_least_one,
        required=True,
        help="allocation jobs to keep queued or running while runs wait (the config's pool.allocations "
        "until then); one that ends is not replaced beyond it",
    )
    po.set_defaults(handler=run)
