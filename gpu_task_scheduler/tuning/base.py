"""What every method that pauses runs at rungs shares (tuning/trials.py's promotion ASHA and Hyperband,
tuning/pbt.py's population-based training): the words of a decision (:data:`CONTINUE`,
:data:`PAUSE`), a value at a rung (:data:`Value`), how values rank (:class:`Ranking`) and what a
free slot runs (:class:`Next`). Each method depends on this module, and this module on none of
them; tuning/methods.py builds the method a config names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from ..recordclass import Record
from .pareto import dominates, pareto_order

CONTINUE, PAUSE = "continue", "pause"

# A run's value at a rung: its metric's, or (several objectives) each objective's, in their order.
Value: TypeAlias = "float | tuple[float, ...]"


class Ranking:
    """How the values at a rung rank, best first: one metric's, the lower (``min``) or the higher
    first; several objectives' by non-dominated front, then crowding distance (the more isolated
    first), as MO-ASHA (Schmucker et al., 2021) and NSGA-II select, then by the first objective
    (``pareto.pareto_order``). The run's name breaks what ties remain, so that a replay decides
    the same."""

    def __init__(self, modes: Sequence[str]) -> None:
        if not modes or any(mode not in ("min", "max") for mode in modes):
            raise ValueError(f"mode must be 'min' or 'max'; got {', '.join(map(repr, modes)) or 'none'}")
        self.signs = tuple(1.0 if mode == "min" else -1.0 for mode in modes)

    @property
    def several(self) -> bool:
        return len(self.signs) > 1

    def checked(self, value: Any) -> Value:
        """``value`` as this ranking records it; ValueError for a value of the wrong shape (a
        replayed event of another rule)."""
        if not self.several:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            raise ValueError(f"a value of one metric is a number; got {value!r}")
        if isinstance(value, (list, tuple)) and len(value) == len(self.signs):
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
                return tuple(float(v) for v in value)
        count = len(self.signs)
        raise ValueError(f"a value of {count} objectives is a list of {count} numbers; got {value!r}")

    def signed(self, value: Value) -> float:
        """One metric's value, lower better."""
        assert isinstance(value, float)
        return self.signs[0] * value

    def worse(self, value: Value, than: Value) -> bool:
        """Whether ``value`` is worse than ``than``: one metric's, strictly; several objectives',
        dominated by it (as good in every one and better in one)."""
        if not self.several:
            return self.signed(value) > self.signed(than)
        signed = [[sign * v for sign, v in zip(self.signs, _vector(point), strict=True)] for point in (than, value)]
        return dominates(signed[0], signed[1])

    def order(self, values: Mapping[str, Value]) -> list[str]:
        """The runs of ``values``, best first."""
        names = sorted(values)
        if not self.several:
            return sorted(names, key=lambda run: (self.signed(values[run]), run))
        points = [[sign * v for sign, v in zip(self.signs, _vector(values[run]), strict=True)] for run in names]
        return [names[i] for i in pareto_order(points)]


class Next(Record):
    """What a free slot runs: ``"resume"`` run ``run`` from ``step`` (its checkpoint) up to the next
    rung, a ``"new"`` configuration (in ``bracket``), or ``"none"`` (wait for a running run)."""

    kind: str
    run: str | None = None
    step: float | None = None
    bracket: int = 0


def _vector(value: Value) -> tuple[float, ...]:
    assert isinstance(value, tuple)
    return value
