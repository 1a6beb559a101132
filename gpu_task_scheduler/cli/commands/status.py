"""``gts status ROOT``: the runs of a result root, what runs now, and ``--watch``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ...errors import GTSError
from ..shared import EXIT_FAILED, EXIT_OK, formatter


def _gpu_memory_by_group(monitor: Any) -> dict[int, int] | None:
    """Bytes of GPU memory each process group holds now (None without NVML)."""
    if monitor is None:
        return None
    used: dict[int, int] = {}
    try:
        for state in monitor.all():
            for process in state.processes:
                try:
                    group = os.getpgid(process.pid)
                except OSError:
                    continue
                used[group] = used.get(group, 0) + (process.used_memory or 0)
    except Exception:  # an NVMLError: show no memory this time
        return None
    return used


def _watch(root: str) -> int:
    import time

    from ...gpu.devices import open_monitor
    from ...reports.status import status, watch_view

    terminal = sys.stdout.isatty()
    monitor, _ = open_monitor()  # once: NVML takes a while to start
    try:
        while True:
            report = status(root, runs="watch")
            frame = watch_view(report, _gpu_memory_by_group(monitor), escape=terminal)
            sys.stdout.write(("\x1b[H\x1b[2J" if terminal else "") + frame + "\n" + ("" if terminal else "\n"))
            sys.stdout.flush()
            if not report["scheduler"]["running"]:
                return _watch_end(report)
            time.sleep(1.0)  # the refresh period
    finally:
        if monitor is not None:
            monitor.close()


def _watch_end(report: dict[str, Any]) -> int:
    """How ``--watch`` ends once no scheduler runs the root: 0 when the sweep ended with every run
    decided, else 1 and what it left (a scheduler killed with -9 leaves its runs stale)."""
    counts = report["counts"]
    left = {what: counts.get(what, 0) for what in ("stale", "pending", "running")}
    if not any(left.values()):
        return EXIT_OK
    words = ", ".join(f"{count} {what}" for what, count in left.items() if count)
    print(
        f"gts status: the sweep is no longer running (no scheduler holds {report['root']}; it was stopped or "
        f"killed) and left runs undone: {words}. Start it again to finish them",
        file=sys.stderr,
    )
    return EXIT_FAILED


def run(args: argparse.Namespace) -> int:
    from ...reports.status import format_status, status, terminal_width, write_status_json

    if args.watch:
        return _watch(args.root)
    if args.json:
        write_status_json(args.root, sys.stdout.write)
        return EXIT_OK
    report = status(args.root, runs="all" if args.all else "table")
    if args.all:
        _add_pending(report)
    width = terminal_width(sys.stdout)
    print(format_status(report, escape=sys.stdout.isatty(), width=width, verbose=args.verbose))
    return EXIT_OK


def _add_pending(report: dict[str, Any]) -> None:
    """``gts status --all``: the runs of the recorded sweep not recorded yet, as ``pending`` rows
    (the engine's own plan, read-only; a search's next runs are not known until it asks)."""
    from ...engine.api import plan
    from ...results import open_ledger
    from ...sweep.expand import Sweep

    ledger = open_ledger(report["root"])
    try:
        recorded = ledger.get_meta("sweep_config")
    finally:
        ledger.close()
    if not report["counts"].get("pending") or not recorded:
        return
    try:
        config = json.loads(recorded)
        config["scheduler_config"]["result_root_folder"] = report["root"]
        config["scheduler_config"]["scheduler_log_file_path"] = None
        sweep = Sweep(config)
    except (ValueError, KeyError, TypeError, RecursionError, GTSError) as error:
        print(
            f"gts status: the pending runs cannot be listed: the recorded config is unusable ({error})", file=sys.stderr
        )
        return
    if sweep.search is not None:
        print("gts status: a search's pending runs are not known until it asks for them", file=sys.stderr)
        return
    known = {run["name"] for run in report["runs"]}
    for spec, decision in plan(sweep):
        if spec.name not in known and decision.action == "run":  # not one a start would skip
            known.add(spec.name)
            report["runs"].append({"name": spec.name, "status": "pending", "duration": None})


def add(sub: Any) -> None:
    s = sub.add_parser(
        "status",
        help="the state of every run of a result root",
        formatter_class=formatter,
        epilog="examples:\n  gts status results/\n  gts status results/ --json | jq .counts",
    )
    s.add_argument("root", help="the result root (result_root_folder), or the sweep's config file")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--all", action="store_true", help="list every run, the pending ones too (not only those recorded)")
    s.add_argument("-v", "--verbose", action="store_true", help="causes in full, the table as wide as it needs")
    s.add_argument(
        "--watch",
        action="store_true",
        help="a view redrawn every second (counts, ETA, each slot's run with its time and GPU memory, "
        "why runs wait) until the sweep ends",
    )
    s.set_defaults(handler=run)
