"""The package's errors: one root, a few precise subclasses.

Each subclass also derives from the built-in exception the original
GPUTaskScheduler raised in the same situation (``ValueError`` for a bad
config), so ``except ValueError`` in existing user code keeps working.
"""

from __future__ import annotations

from collections.abc import Iterable


class GTSError(Exception):
    """Root of every error raised by gpu_task_scheduler."""


class ConfigError(GTSError, ValueError):
    """The config (or a value derived from it) is invalid.

    Raised before anything runs or is written to disk.
    """


class TaskClassError(GTSError, TypeError):
    """The task class given to the scheduler is not usable."""


class NoGpuError(GTSError):
    """``"gpu": "all"`` on a machine where no GPU is available; ``reason`` says why."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class SchedulerBusyError(GTSError, RuntimeError):
    """Another scheduler holds the lock on the same result root."""


class LedgerError(GTSError, RuntimeError):
    """The ledger under the result root cannot be read or written."""


class DamagedRecordError(LedgerError):
    """A record under the result root (the ledger, a search's trials) is damaged or was changed by
    hand into something the scheduler would never write: refused, never acted on."""


class RunsFailedError(GTSError, RuntimeError):
    """Raised by :meth:`SweepSummary.raise_for_failures` when runs failed."""

    def __init__(self, message: str, summary: object) -> None:
        super().__init__(message)
        self.summary = summary


def install_hint(extra: str) -> str:
    """How to install an extra, from the package index and from a clone of the repository:
    ``pip install 'gts-sweep[plot]' (from a clone: pip install -e '.[plot]')``."""
    return f"pip install 'gts-sweep[{extra}]' (from a clone of the repository: pip install -e '.[{extra}]')"


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The valid choice closest to a misspelt ``word``, or None."""
    import difflib  # here: only a bad config needs it

    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """The end of a sentence about a misspelt ``word``: ``"; did you mean 'loss'?"`` for the
    closest choice, else ``"."``."""
    guess = closest(word, choices)
    return "." if guess is None else f"; did you mean {guess!r}?"


def unknown_key_message(where: str, key: object, valid: Iterable[str]) -> str:
    """``unknown key 'foo' in scheduler_config; did you mean 'bar'? Valid keys: ...``

    >>> unknown_key_message("the config", "zzz", ["task", "command"])
    "unknown key 'zzz' in the config. Valid keys: command, task."
    """
    valid = sorted(valid)
    message = f"unknown key {key!r} in {where}"
    if not valid:
        return message + f"; {where} has no keys."
    return message + (did_you_mean(key, valid) if isinstance(key, str) else ".") + f" Valid keys: {', '.join(valid)}."
