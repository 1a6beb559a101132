"""What every config value, every reported value and every record read back counts as a number."""

from __future__ import annotations

import math
from typing import Any, TypeGuard


def finite_number(value: Any) -> TypeGuard[float]:
    """An int or a float (not a bool) that a float can hold and that is not nan or inf.

    Values come from YAML, JSON and the ledger, where an int may have 400 digits:
    ``math.isfinite`` raises OverflowError on it, and arithmetic with floats would too, so it is no
    finite number here (a config gets a message naming the key, not a traceback).

    >>> finite_number(0.5), finite_number(3), finite_number(True), finite_number(float("nan"))
    (True, True, False, False)
    >>> finite_number(10**400), finite_number("1")
    (False, False)
    """
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


MAX_STEP = 2**53  # the largest step: every whole number up to it is exact in a float, and fits the trackers' int64


def step_problem(value: Any) -> str | None:
    """Why ``value`` is no step (None: it is one). A step is a number from 0 to :data:`MAX_STEP`
    (an epoch may be fractional): what a float holds exactly, and what TensorBoard, MLflow and W&B
    store. Steps are refused where they enter (``report()``, the metrics file's reader, the
    TensorBoard feed), so nothing past them meets a step it cannot store.

    >>> step_problem(3), step_problem(0.5), step_problem(2**53)
    (None, None, None)
    >>> step_problem(-1), step_problem(1e300), step_problem(float("nan")), step_problem(True)
    ('it is below 0', 'it is above 2**53', 'it is not a finite number', 'it is not a finite number')
    """
    if not finite_number(value):
        return "it is not a finite number"
    if value < 0:
        return "it is below 0"
    if value > MAX_STEP:
        return "it is above 2**53"
    return None


def ascii_int(text: str, *, most: int = 18) -> int | None:
    """The whole number ``text`` spells in ASCII digits (at most ``most`` of them), or None: the one
    rule for a number read back from a name or a file the product did not write alone (a folder
    name, a queue entry, a count in a file, Slurm's answers). ``str.isdigit`` is no such rule: it is
    true of ``'²'`` and ``'٣'``, and ``int('²')`` raises.

    >>> ascii_int("12"), ascii_int("²"), ascii_int("٣"), ascii_int(""), ascii_int("-1"), ascii_int("1" * 19)
    (12, None, None, None, None, None)
    """
    if 0 < len(text) <= most and text.isascii() and text.isdigit():
        return int(text)
    return None
