"""``gts stop ROOT``: ask the scheduler of a result root to stop, drain or kill its runs."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..shared import EXIT_OK, formatter


def run(args: argparse.Namespace) -> int:
    import time

    from ...records.control import request_stop
    from ...records.ledger.lock import scheduler_process

    mode = "now" if args.now else "drain" if args.drain else "stop"
    pid = request_stop(args.root, mode)
    what = {
        "stop": "to stop its runs (SIGTERM, then SIGKILL after the grace period) and exit",
        "drain": "to start no more runs and exit when the running ones have finished",
        "now": "to kill its runs at once and exit",
    }[mode]
    print(f"asked the scheduler of {args.root} (pid {pid}) {what}")
    if args.wait:
        _wait_for_exit(pid)
        while scheduler_process(args.root)[0]:  # the pid gone, its runs may hold the lock a moment longer
            time.sleep(0.1)
        print("it has exited")
    return EXIT_OK


def _wait_for_exit(pid: int) -> None:
    """Until the process ``pid`` has ended (a pidfd where Linux has them)."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfds here, or it is gone already: the caller looks
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def add(sub: Any) -> None:
    st = sub.add_parser(
        "stop",
        help="stop the sweep running on a result root (from another shell)",
        formatter_class=formatter,
        epilog="examples:\n  gts stop results/\n  gts stop results/ --drain --wait\n  gts stop results/ --now",
    )
    st.add_argument("root", help="the result root of the running sweep, or its config file")
    how = st.add_mutually_exclusive_group()
    how.add_argument("--drain", action="store_true", help="start no more runs; let the running ones finish")
    how.add_argument("--now", action="store_true", help="kill the running runs at once (no grace period)")
    st.add_argument("--wait", action="store_true", help="return once the scheduler has exited")
    st.set_defaults(handler=run)
