"""The ``gts`` command (also ``python -m gpu_task_scheduler``).

Thin: parses arguments, calls the library, maps errors to exit codes
(0 fine, 1 runs failed or the sweep could not run, 2 bad usage or config,
130 interrupted) and configures logging, which the library never does.
Each subcommand is a module of cli/commands/ (its arguments, what it runs and prints),
imported only when it is the one run (or for ``gts --help``); what they share is in cli/shared.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..errors import ConfigError, GTSError, TaskClassError
from ..version import __version__
from .commands import COMMANDS, add_command
from .shared import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, Parser, formatter, root_of

# --- the parser ---------------------------------------------------------------------------


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The gts parser. With ``command``, one of its subcommands, only that one gets its arguments:
    main() builds only the one it runs (all of them cost 8 ms of every start: argparse looks up
    gettext translations and the terminal's size for each argument); ``gts --help`` and a
    mistyped command build all."""
    parser = Parser(
        prog="gts",
        formatter_class=formatter,
        description="gpu_task_scheduler: hyperparameter sweeps over your GPUs.",
        epilog="examples:\n  gts run sweep.yaml --gpus 0 1\n  gts status results/\n"
        "  gts grid 'python train.py --lr {lr}' -p lr 0.1 0.01 | gts queue --gpus 0 1",
    )
    parser.add_argument("--version", action="version", version=f"gts {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:
        if command is None or command == name:
            add_command(name, sub)
    return parser


def _take_late_overrides(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> None:
    """``gts run s.yaml --dry-run lr=0.5``: argparse takes the positional overrides in one group,
    before the first option; overrides after an option come back unrecognised. As in Hydra, they
    are accepted anywhere after the subcommand, in the order given. Anything else is still an
    error, worded as argparse words it."""
    is_run = getattr(args, "command", None) == "run"
    late = [item for item in extra if is_run and "=" in item and not item.startswith("-")]
    if len(late) != len(extra):
        parser.error(f"unrecognized arguments: {' '.join(item for item in extra if item not in late)}")
    args.overrides.extend(late)


def _ensure_standard_streams() -> None:
    """``gts run 2>&-``: a closed stdout or stderr becomes /dev/null, so that no
    write to it (a log line, the summary) can end the sweep in a traceback."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
            setattr(sys, name, open(fd, "w", closefd=False))
        else:
            if getattr(sys, name) is None:
                setattr(sys, name, open(fd, "w", closefd=False))


def main(argv: Sequence[str] | None = None) -> int:
    _ensure_standard_streams()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args, extra = parser.parse_known_args(argv)
    if extra:
        _take_late_overrides(parser, args, extra)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        if getattr(args, "root", None) is not None:
            args.root = root_of(args.root)
        return args.handler(args)
    except (ConfigError, TaskClassError) as error:
        print(f"gts {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except GTSError as error:
        print(f"gts {args.command}: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `gts grid ... | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except OSError as error:  # a file or folder named on the command line that cannot be used
        print(f"gts {args.command}: {error}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
