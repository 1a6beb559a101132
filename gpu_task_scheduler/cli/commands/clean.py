"""``gts clean ROOT``: remove the checkpoints that attempts which started afresh set aside.

An attempt that starts again from step 0 (a retry of a run whose resume step was lost, a forced
rerun) finds its checkpoint folder empty: the one before is set aside as
``<run>/.gts/logs/attempt-N-checkpoint``. The scheduler keeps the newest
``backends.local.prepare.KEEP_SET_ASIDE`` of them per run; this removes those too (``--keep N``:
all but the newest N). It holds the root's lock while it works, so no sweep runs there meanwhile,
and it follows no link (records/checkpoints.py).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..shared import formatter


def run(args: argparse.Namespace) -> int:
    from ...errors import ConfigError
    from ...records import checkpoints
    from ...records.ledger.lock import SweepLock
    from ...records.paths import RootPaths, RunPaths, name_problem
    from ...results import open_ledger

    if args.keep < 0:
        raise ConfigError(f"--keep must be 0 or more; got {args.keep}")
    open_ledger(args.root).close()  # a result root, or a clear error
    removed, runs = 0, 0
    with SweepLock(RootPaths(args.root)):
        for name in sorted(os.listdir(args.root)):
            paths = RunPaths(os.path.join(args.root, name), None)
            if name_problem(name) is not None or not paths.exists():
                continue
            try:
                gone = checkpoints.clean_set_aside(paths, args.keep)
            except OSError as error:
                print(f"{name}: left as it is ({error})")
                continue
            removed += len(gone)
            runs += bool(gone)
    print(f"removed {removed} checkpoint(s) set aside by fresh attempts, of {runs} run(s)")
    return 0


def add(sub: Any) -> None:
    clean = sub.add_parser(
        "clean",
        help="remove the checkpoints that attempts which started afresh set aside",
        formatter_class=formatter,
        epilog="examples:\n  gts clean results/\n  gts clean results/ --keep 1",
    )
    clean.add_argument("root", help="the result root")
    clean.add_argument("--keep", type=int, default=0, metavar="N", help="keep each run's newest N (default 0)")
    clean.set_defaults(handler=run)
