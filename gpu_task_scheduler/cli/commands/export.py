"""``gts export ROOT --to tensorboard DIR | mlflow URI | wandb [DIR]``: the sweep in a tracker
(reports/export.py). A second export of the same root adds nothing; after more runs or steps, only
what is new."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..shared import formatter

TARGETS = ("tensorboard", "mlflow", "wandb")


def run(args: argparse.Namespace) -> int:
    from ...errors import ConfigError
    from ...reports import export
    from ...results import open_ledger

    open_ledger(args.root).close()  # a result root, or a clear error
    target, where = args.to[0], args.to[1:]
    if target not in TARGETS:
        raise ConfigError(f"--to {target!r}: give one of {', '.join(TARGETS)}")
    if len(where) > 1 or (target != "wandb" and not where):
        usage = {"tensorboard": "--to tensorboard DIR", "mlflow": "--to mlflow URI", "wandb": "--to wandb [DIR]"}
        raise ConfigError(f"--to {target} takes {usage[target].split(' ', 2)[2]}: {usage[target]}")
    if target == "tensorboard":
        counts = export.to_tensorboard(args.root, where[0])
        print(f"{counts}; see them with: tensorboard --logdir {where[0]}")
    elif target == "mlflow":
        counts = export.to_mlflow(args.root, where[0])
        print(f"{counts}; see them with: mlflow ui --backend-store-uri {where[0]}")
    else:
        folder = where[0] if where else "."
        counts = export.to_wandb(args.root, folder)
        print(f"{counts}; upload them with: wandb sync {folder}/wandb/offline-run-*")
    for words in counts.said():
        print(f"gts export: {words}", file=sys.stderr)
    return 0


def add(sub: Any) -> None:
    command = sub.add_parser(
        "export",
        help="export a sweep to TensorBoard, MLflow or W&B (again: only what is new)",
        formatter_class=formatter,
        epilog=(
            "examples:\n  gts export results/ --to tensorboard tb/\n"
            "  gts export results/ --to mlflow sqlite:///sweep.db\n  gts export results/ --to wandb"
        ),
    )
    command.add_argument("root", help="the result root")
    command.add_argument(
        "--to", nargs="+", required=True, metavar="TARGET", help="tensorboard DIR, mlflow URI or wandb [DIR]"
    )
    command.set_defaults(handler=run)
