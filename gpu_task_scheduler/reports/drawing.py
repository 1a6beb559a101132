"""What every plot of gts draws with."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def plain_text(plot: Callable[..., str]) -> Callable[..., str]:
    """``plot`` with matplotlib's mathtext off while it draws: a ``$`` in a run's name, a key or a
    value is text, not the start of a formula (``lr$1`` once made every plot mode die with
    ParseFatalException). Only while it draws: a user's own figures keep their formulas."""

    @functools.wraps(plot)
    def drawn(*args: Any, **kwargs: Any) -> str:
        try:
            import matplotlib
        except ImportError:  # _pyplot says what to install
            return plot(*args, **kwargs)
        with matplotlib.rc_context({"text.parse_math": False}):
            return plot(*args, **kwargs)

    return drawn
