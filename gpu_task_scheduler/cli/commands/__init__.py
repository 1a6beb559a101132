"""The ``gts`` subcommands, one module each, as pip's commands are: ``add(sub)`` gives the subcommand
its arguments and handler (``run(args)``, its exit code). The order here is ``gts --help``'s."""

from __future__ import annotations

import importlib
from typing import Any

COMMANDS = (
    "run",
    "queue",
    "grid",
    "status",
    "retry",
    "stop",
    "pool",
    "logs",
    "gpus",
    "results",
    "plot",
    "importance",
    "serve",
    "report",
    "clean",
    "export",
)


def add_command(name: str, sub: Any) -> None:
    """Import the subcommand ``name``'s module (only it: each costs a start of ``gts`` its imports) and add it."""
    importlib.import_module(f"{__name__}.{name}").add(sub)
