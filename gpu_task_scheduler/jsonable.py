"""JSON-compatible forms of config values and results (a leaf module: the run's process uses it too)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any


def to_jsonable(value: Any) -> Any:
    """A JSON-compatible, deterministic form of a config value."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        number = int(value)
        # Python refuses to print integers of more than 4300 digits in decimal.
        return number if number.bit_length() < 14000 else f"int:{number:#x}"
    if isinstance(value, numbers.Real):
        real = float(value)
        return real if math.isfinite(real) else repr(real)
    if isinstance(value, Mapping):
        items = sorted(((str(k), to_jsonable(v)) for k, v in value.items()), key=lambda item: item[0])
        return dict(items)
    if isinstance(value, (list, tuple, range)):
        return [to_jsonable(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((to_jsonable(item) for item in value), key=repr)
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return to_jsonable(value.tolist())
    return repr(value)
