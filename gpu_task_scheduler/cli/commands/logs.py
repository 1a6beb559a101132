"""``gts logs ROOT RUN``: a run's log (``-f`` follows it), or the tails of the failed runs."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ...errors import ConfigError
from ..shared import EXIT_OK, formatter


def run(args: argparse.Namespace) -> int:
    from ...reports.runlogs import failed_tails, show_log

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


def add(sub: Any) -> None:
    lg = sub.add_parser(
        "logs",
        help="a run's log (by folder name, unique prefix or index), or the failed runs' last lines",
        formatter_class=formatter,
        epilog="examples:\n  gts logs results/ lr-0.1,\n  gts logs results/ 7 -f\n  gts logs results/ lr-0.0 -n 50\n"
        "  gts logs results/ --failed",
    )
    lg.add_argument("root", help="the result root, or the sweep's config file")
    lg.add_argument("run", nargs="?", help="the run: its folder name, a unique prefix of it, or its index")
    lg.add_argument("-f", "--follow", action="store_true", help="then print what it adds until the run ends")
    lg.add_argument("-n", "--lines", type=int, metavar="N", help="only the last N lines (--failed: 20)")
    lg.add_argument("--failed", action="store_true", help="the last lines of every failed run's log")
    lg.set_defaults(handler=run)
