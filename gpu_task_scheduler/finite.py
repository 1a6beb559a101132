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
