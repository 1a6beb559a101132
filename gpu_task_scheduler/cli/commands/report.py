"""``gts report ROOT``: a self-contained HTML report of a result root."""

from __future__ import annotations

import argparse
from typing import Any

from ..shared import EXIT_OK, formatter


def run(args: argparse.Namespace) -> int:
    from ...web.report import write_report

    print(write_report(args.root, args.output))
    return EXIT_OK


def add(sub: Any) -> None:
    rp = sub.add_parser(
        "report",
        help="the web view of a result root as one self-contained HTML file (no server, no network)",
        formatter_class=formatter,
        epilog="examples:\n  gts report results/ -o sweep.html",
    )
    rp.add_argument("root", help="the result root, or the sweep's config file")
    rp.add_argument("-o", "--output", required=True, help="the HTML file to write")
    rp.set_defaults(handler=run)
