"""``gts queue``: run the command lines read from stdin, one per run, over the slots."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ...engine.logs import plain_console_logging
from ..shared import EXIT_INTERRUPTED, formatter, gpu_option, gpus_all_said_here


def run(args: argparse.Namespace) -> int:
    from ...backends.local.launcher import LocalLauncher
    from ...backends.local.tasks import ShellLineTask
    from ...engine.api import run_sweep
    from ...sweep.stream import StreamSweep

    plain_console_logging()
    config = {
        "scheduler_config": {
            "gpu": gpu_option(args.gpus),
            "result_root_folder": args.log_dir,
            "force_rerun": not args.resume,
            "scheduler_log_file_path": os.path.join(args.log_dir, "scheduler.log"),
            **({"timeout": args.timeout} if args.timeout else {}),
            **({"grace_period": args.grace_period} if args.grace_period is not None else {}),
        }
    }
    sweep = StreamSweep(config, sys.stdin)
    launcher = LocalLauncher(ShellLineTask, grace_period=sweep.options.grace_period)
    with gpus_all_said_here(args.gpus):
        summary = run_sweep(sweep, launcher, keep_succeeded=False)
    return EXIT_INTERRUPTED if summary.interrupted_by else summary.exit_code


def add(sub: Any) -> None:
    q = sub.add_parser(
        "queue",
        help="run shell commands read from stdin on the GPUs",
        formatter_class=formatter,
        description="Run one shell command per line of stdin, each on a free slot, with "
        "CUDA_VISIBLE_DEVICES set (compatible with simple-gpu-scheduler).",
        epilog="examples:\n  gts queue --gpus 0 1 2 < commands.txt\n"
        "  gts grid 'python train.py --lr {lr}' -p lr 1e-3 1e-4 | gts queue --gpus 0+1 2+3",
    )
    q.add_argument(
        "--gpus",
        nargs="+",
        required=True,
        metavar="ID",
        help="slots: 0 1 2 or 0,1,2 (one GPU each), 0+1 2+3 (groups of GPUs), cpu, or all",
    )
    q.add_argument("--log-dir", default="gts-queue", help="where each command's output goes (default: gts-queue)")
    q.add_argument("--timeout", type=float, metavar="SECONDS", help="stop a command after this long")
    q.add_argument(
        "--resume",
        action="store_true",
        help="skip commands that succeeded before in this log dir (a job is its command, wherever its line is)",
    )
    q.add_argument(
        "--grace-period",
        type=float,
        metavar="SECONDS",
        help="seconds between SIGTERM and SIGKILL when a command is stopped (default 10)",
    )
    q.set_defaults(handler=run)
