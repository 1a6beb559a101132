"""``gts serve ROOT ...``: the live web view of result roots."""

from __future__ import annotations

import argparse
from typing import Any

from ..shared import EXIT_OK, formatter, root_of


def run(args: argparse.Namespace) -> int:
    from ...web.server import serve

    roots = [root_of(root) for root in args.roots]
    try:
        serve(roots, host=args.host, port=args.port, token=args.token, no_token=args.no_token)
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def add(sub: Any) -> None:
    sv = sub.add_parser(
        "serve",
        help="a live web view of result roots: progress, sortable runs, logs, curves, parallel coordinates",
        formatter_class=formatter,
        description="Serve a read-only web view of one or more result roots (or sweeps' config files), "
        "updated every second while their sweeps run. Charts need 'pip install gts-sweep[web]' (from a clone: "
        "pip install -e '.[web]').",
        epilog="examples:\n  gts serve results/\n  gts serve results/a results/b --port 8300\n"
        "  gts serve results/ --host 0.0.0.0    # other machines: prints a URL with a token",
    )
    sv.add_argument("roots", nargs="+", metavar="ROOT", help="result roots, or the sweeps' config files")
    sv.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine)")
    sv.add_argument("--port", type=int, default=8642, help="the port (default 8642; 0: any free one)")
    sv.add_argument(
        "--token", help="the token a browser must give, 16 characters or more (default: one is made and printed)"
    )
    sv.add_argument(
        "--no-token",
        action="store_true",
        help="ask for no token (a loopback --host only: then every user of this machine can read the view)",
    )
    sv.set_defaults(handler=run)
