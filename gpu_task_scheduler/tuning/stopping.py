"""When a run stops early: the rules, as pure decisions over recorded values.

A config names one rule per sweep (or per stage) with its ``early_stop`` key::

    early_stop: {method: asha, metric: loss, mode: min, min_step: 1, max_step: 27, reduction_factor: 3}
    early_stop: {method: median, metric: loss, mode: min, min_step: 5, min_runs: 3}
    early_stop: {method: asha, promotion: true, ...}     # pauses runs at rungs (trials.py)
    early_stop: {method: hyperband, ...}                 # the same keys as asha (trials.py)
    early_stop: {method: asha, objectives: {loss: min, latency: max}, ...}  # several (any method but median)

* :class:`Asha`: asynchronous successive halving, the stopping variant (Li et al.,
  MLSys 2020). Its rungs are the steps ``min_step * reduction_factor**k`` below
  ``max_step``. The first time a run reports a step at or past a rung it has no
  value at, its value there is recorded, and it goes on only if that value is
  within the best ``1/reduction_factor`` of the values the other runs recorded
  at that rung so far (the ``1/reduction_factor`` quantile, linearly
  interpolated). The first run at a rung always goes on: nobody waits for a
  rung to fill.
* :class:`Median`: the median stopping rule (Golovin et al., "Google Vizier",
  KDD 2017). At a step ``t >= min_step``, a run stops when its best value so
  far is worse than the median of the other runs' running averages at ``t``
  (the mean of what each reported up to ``t``), counting only the runs that
  reached ``t``, once at least ``min_runs`` of them did.

A run at or past ``max_step`` is never stopped. Nothing here reads a file or
the clock: the engine (``engine/stopper.py``) feeds the values and keeps the
state that makes decisions survive a restart; the tests feed tables.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from ..errors import ConfigError, unknown_key_message
from ..finite import finite_number
from ..recordclass import Record
from ..reporting import PAUSE_WAIT
from .pareto import standing_of

METHODS = ("asha", "median", "hyperband")
_KEYS = {
    "asha": ("method", "metric", "mode", "objectives", "min_step", "max_step", "reduction_factor", "promotion"),
    "median": ("method", "metric", "mode", "min_step", "max_step", "min_runs"),
    "hyperband": ("method", "metric", "mode", "objectives", "min_step", "max_step", "reduction_factor"),
}


class Verdict(Record):
    """A rule's word on a run at ``step``: go on, or stop (``stop``; ``pause``: for now, a pausing
    method may resume it), and why (``cause``)."""

    stop: bool
    step: float
    value: float
    cause: str = ""
    rung: float | None = None  # ASHA: the rung at which the value was recorded
    pause: bool = False


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile of ``values``, linearly interpolated between the closest ranks.

    >>> quantile([4.0, 1.0, 3.0, 2.0], 1 / 3)
    2.0
    >>> quantile([1.0, 2.0], 0.5)
    1.5
    """
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def _g(value: float) -> str:
    return f"{value:.4g}"


class Rule(Record):
    metric: str
    mode: str  # "min" or "max"
    min_step: float
    max_step: float | None
    # Several objectives (ASHA's and the pausing methods'; Schmucker et al. 2021): (metric, mode)
    # each, the first also ``metric`` and ``mode``; () for the one (metric, mode).
    objectives: tuple[tuple[str, str], ...] = ()

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metrics a report must hold for a value at a rung: the objectives', or the metric."""
        return tuple(name for name, _ in self.objectives) or (self.metric,)

    def value_in(self, metrics: Mapping[str, float]) -> float | list[float] | None:
        """A report's value for the rule: the metric's, each objective's (all of them, or None)."""
        if not self.objectives:
            return metrics.get(self.metric)
        if all(name in metrics for name, _ in self.objectives):
            return [metrics[name] for name, _ in self.objectives]
        return None

    def judged_by(self) -> str:
        """``min loss`` or ``min loss and min latency (by Pareto rank)``."""
        if not self.objectives:
            return f"{self.mode} {self.metric}"
        return " and ".join(f"{mode} {name}" for name, mode in self.objectives) + " (by Pareto rank)"

    def worse(self, value: float, than: float) -> bool:
        return value > than if self.mode == "min" else value < than

    def best(self, values: Sequence[float]) -> float:
        return min(values) if self.mode == "min" else max(values)

    def describe(self) -> str:
        raise NotImplementedError


# At most this many rungs: 3**40 steps is past any training run, and every run carries its rungs in
# its environment (GTS_RUNGS), which the system caps (about 6,900 rungs overflowed it).
MAX_RUNGS = 40


@lru_cache(maxsize=64)
def asha_rungs(min_step: float, max_step: float, factor: float) -> tuple[float, ...]:
    """ASHA's rung steps, ``min_step * factor**k`` below ``max_step``; ValueError, saying why, when
    they do not grow (a factor a hair above 1, a step so small that multiplying it changes nothing)
    or would be more than MAX_RUNGS. Computed once for a rule: a report asks for them.

    >>> asha_rungs(1, 27, 3)
    (1.0, 3.0, 9.0)
    >>> asha_rungs(1, 27, 1.0000000000000002)
    Traceback (most recent call last):
    ValueError: gives more than 40 rungs between min_step 1 and max_step 27 (at most 40)
    """
    rungs: list[float] = []
    step = float(min_step)
    while step < max_step:
        if len(rungs) == MAX_RUNGS:
            raise ValueError(
                f"gives more than {MAX_RUNGS} rungs between min_step {min_step:g} and max_step {max_step:g} "
                f"(at most {MAX_RUNGS})"
            )
        rungs.append(step)
        grown = step * factor
        if not grown > step:  # 5e-324 * 1.5 is 5e-324 again
            raise ValueError(f"does not grow the rungs: {step:g} x {factor!r} is {grown:g}")
        step = grown
    return tuple(rungs)


class Asha(Rule):
    reduction_factor: float = 3.0

    def judge_several(
        self, rung: float, step: float, values: Sequence[float], others: Sequence[Sequence[float]]
    ) -> Verdict:
        """MO-ASHA's verdict for the objectives' ``values`` first recorded at ``rung``, given the other
        runs' values there: all of them are sorted into non-dominated fronts, ties within a front
        broken by crowding distance (the more isolated first), and the run goes on while it is among
        the best ``ceil(n / reduction_factor)`` of the ``n`` runs with values at the rung (fewer
        runs than that strictly ahead of it: ties do not count against it)."""
        if not others:
            return Verdict(False, step, values[0], rung=rung)
        signs = [1.0 if mode == "min" else -1.0 for _, mode in self.objectives]
        points = [[sign * v for sign, v in zip(signs, vector, strict=True)] for vector in [*others, values]]
        # The runs strictly ahead of it: a tie (two ends of a front) does not count against it.
        rank, ahead = standing_of(len(points) - 1, points)
        kept = max(1, math.ceil(len(points) / self.reduction_factor))
        if ahead < kept:
            return Verdict(False, step, values[0], rung=rung)
        shown = ", ".join(f"{name} {_g(v)}" for (name, _), v in zip(self.objectives, values, strict=True))
        cause = (
            f"{shown}: Pareto rank {rank}, {ahead} of the {len(points)} runs at the rung ahead of it, "
            f"the best {kept} go on"
        )
        return Verdict(True, step, values[0], cause, rung=rung)

    @property
    def rungs(self) -> list[float]:
        """The rung steps, lowest first (``max_step`` is no rung: a run there is never stopped)."""
        assert self.max_step is not None
        return list(asha_rungs(self.min_step, self.max_step, self.reduction_factor))

    def rung_for(self, step: float, recorded: Mapping[float, Any]) -> float | None:
        """The rung a report at ``step`` records a value at: the highest one at or below ``step``,
        if the run has no value there yet (``recorded``: its rungs so far). None: no rung to record."""
        assert self.max_step is not None
        if step >= self.max_step:
            return None
        for rung in reversed(self.rungs):
            if rung <= step:
                return None if rung in recorded else rung
        return None

    def judge(self, rung: float, step: float, value: float, others: Sequence[float]) -> Verdict:
        """The verdict for a value first recorded at ``rung`` (reported at ``step``), given the
        values other runs recorded at that rung before it."""
        if not others:
            return Verdict(False, step, value, rung=rung)
        best_share = 1 / self.reduction_factor
        cutoff = quantile(others, best_share if self.mode == "min" else 1 - best_share)
        if self.worse(value, cutoff):
            cause = f"{self.metric} {_g(value)}, rung cutoff {_g(cutoff)}"
            return Verdict(True, step, value, cause, rung=rung)
        return Verdict(False, step, value, rung=rung)

    def describe(self) -> str:
        rungs = ", ".join(f"{r:g}" for r in self.rungs)
        return (
            f"ASHA on {self.judged_by()}: rungs at steps {rungs}, the best 1/{self.reduction_factor:g} "
            f"go on, none stopped at step {self.max_step:g} or later"
        )


class Pausing(Rule):
    """A method that pauses runs at rungs and resumes the best (``trials.py``): ``asha`` with
    ``promotion: true``, or ``hyperband``. Its rungs are ASHA's; which of them a run is judged at
    depends on its bracket (Hyperband's start later)."""

    reduction_factor: float = 3.0
    method: str = "asha"  # "asha" (promotion) or "hyperband"

    @property
    def rungs(self) -> list[float]:
        assert self.max_step is not None
        return list(asha_rungs(self.min_step, self.max_step, self.reduction_factor))

    def crossed(self, last: float, step: float) -> bool:
        """Whether a report at ``step``, after one at ``last``, passes a step the run waits at."""
        return any(last < level <= step for level in self.rungs)

    def waits(self) -> dict[str, Any]:
        """Where a run's report() waits for the scheduler's word (its ``GTS_RUNGS``, with the metric),
        and how long at most (reporting.PAUSE_WAIT)."""
        return {"steps": self.rungs, "wait": PAUSE_WAIT}

    def describe(self) -> str:
        rungs = ", ".join(f"{r:g}" for r in self.rungs)
        if self.method == "hyperband":
            what = "Hyperband's brackets of successive halving"
        else:
            what = "promotion ASHA"
        return (
            f"{what} on {self.judged_by()}: runs pause at rungs (steps {rungs}) and the best "
            f"1/{self.reduction_factor:g} of each rung resume, up to step {self.max_step:g}"
        )


class Curve:
    """One run's values of the metric, by step, with running sums: the running average up to any
    step costs a binary search. Kept as arrays of doubles (16 bytes a point), as the median rule
    needs every run's whole curve."""

    __slots__ = ("steps", "sums", "best")

    def __init__(self) -> None:
        self.steps = array("d")
        self.sums = array("d")
        self.best: float | None = None

    def add(self, step: float, value: float, rule: Rule) -> None:
        if self.steps and step < self.steps[-1]:
            return  # the metrics reader already skips a step that goes back
        self.steps.append(step)
        self.sums.append((self.sums[-1] if self.sums else 0.0) + value)
        self.best = value if self.best is None or rule.worse(self.best, value) else self.best

    @property
    def last_step(self) -> float | None:
        return self.steps[-1] if self.steps else None

    def mean_up_to(self, step: float) -> float | None:
        count = bisect_right(self.steps, step)
        return self.sums[count - 1] / count if count else None


class Median(Rule):
    min_runs: int = 3

    def judge(self, step: float, value: float, best: float, others: Sequence[Curve]) -> Verdict:
        """The verdict for a run whose best value so far is ``best``, reporting ``value`` at ``step``;
        ``others``: the other runs' curves."""
        if step < self.min_step or (self.max_step is not None and step >= self.max_step):
            return Verdict(False, step, value)
        averages = [
            mean
            for curve in others
            if curve.last_step is not None and curve.last_step >= step
            for mean in (curve.mean_up_to(step),)
            if mean is not None
        ]
        if len(averages) < self.min_runs:
            return Verdict(False, step, value)
        median = quantile(averages, 0.5)
        if self.worse(best, median):
            cause = f"best {self.metric} {_g(best)}, median of {len(averages)} runs {_g(median)}"
            return Verdict(True, step, value, cause)
        return Verdict(False, step, value)

    def describe(self) -> str:
        until = "" if self.max_step is None else f", none stopped at step {self.max_step:g} or later"
        return (
            f"the median rule on {self.mode} {self.metric}: from step {self.min_step:g}, once {self.min_runs} "
            f"other runs got there{until}"
        )


def _number(value: Any) -> bool:
    return finite_number(value)


def metric_and_mode(raw: Mapping[str, Any], where: str) -> tuple[str, str]:
    """A rule's ``metric`` (a reported metric's name) and ``mode`` (``min`` or ``max``), checked."""
    metric = raw.get("metric")
    if not isinstance(metric, str) or not metric or metric == "step":
        raise ConfigError(f"{where}: metric must name a reported metric, e.g. loss; got {metric!r}")
    mode = raw.get("mode")
    if mode not in ("min", "max"):
        raise ConfigError(f"{where}: mode must be min (lower is better) or max (higher is better); got {mode!r}")
    return metric, mode


def judged_by(raw: Mapping[str, Any], where: str) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """What a rule judges by: its ``metric`` and ``mode``, or several ``objectives`` (metric -> min
    or max, the first also its metric and mode), checked."""
    if "objectives" not in raw:
        return (*metric_and_mode(raw, where), ())
    if "metric" in raw or "mode" in raw:
        raise ConfigError(f"{where}: give objectives, or metric and mode for one, not both")
    goals = raw["objectives"]
    if not isinstance(goals, Mapping) or len(goals) < 2:
        raise ConfigError(f"{where}: objectives must be a dict of two or more metric -> min or max; got {goals!r}")
    for name, way in goals.items():
        metric_and_mode({"metric": name, "mode": way}, f"{where}: objectives")
    objectives = tuple((str(name), str(way)) for name, way in goals.items())
    return (*objectives[0], objectives)


def parse_early_stop(raw: Any, where: str = "early_stop") -> Asha | Median | Pausing | None:
    """The rule an ``early_stop`` value asks for (None for none); ConfigError with the fix otherwise."""
    if raw is None:
        return None
    example = "e.g. {method: asha, metric: loss, mode: min, min_step: 1, max_step: 27}"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a dict, {example}; got {raw!r}")
    method = raw.get("method")
    if method not in METHODS:
        raise ConfigError(f"{where}: method must be one of {', '.join(METHODS)}; got {method!r}")
    for key in raw:
        if key not in _KEYS[method]:
            raise ConfigError(unknown_key_message(f"{where} (method {method})", key, _KEYS[method]))
    metric, mode, objectives = judged_by(raw, where)
    min_step = raw.get("min_step", 1)
    if not _number(min_step) or min_step <= 0:
        raise ConfigError(f"{where}: min_step must be a number above 0; got {min_step!r}")
    max_step = raw.get("max_step")
    if method in ("asha", "hyperband") and max_step is None:
        raise ConfigError(f"{where}: {method} needs max_step, the step at which a run is complete")
    if max_step is not None and (not _number(max_step) or max_step <= min_step):
        raise ConfigError(f"{where}: max_step must be a number above min_step ({min_step!r}); got {max_step!r}")
    common = {"metric": metric, "mode": mode, "min_step": min_step, "max_step": max_step}
    if method in ("asha", "hyperband"):
        promotion = raw.get("promotion", False)
        if not isinstance(promotion, bool):
            raise ConfigError(
                f"{where}: promotion must be true (runs pause at rungs and the best resume) or false (runs "
                f"below a rung's cutoff stop); got {promotion!r}"
            )
        factor = raw.get("reduction_factor", 3)
        if not _number(factor) or factor <= 1 or factor > 1000:
            raise ConfigError(f"{where}: reduction_factor must be a number above 1 (e.g. 3); got {factor!r}")
        try:
            asha_rungs(min_step, max_step, factor)
        except ValueError as error:
            raise ConfigError(
                f"{where}: min_step {min_step!r} with reduction_factor {factor!r} {error}: raise reduction_factor "
                "(e.g. 3) or min_step"
            ) from None
        if promotion or method == "hyperband":
            return Pausing(**common, reduction_factor=factor, method=method, objectives=objectives)
        return Asha(**common, reduction_factor=factor, objectives=objectives)
    min_runs = raw.get("min_runs", 3)
    if not isinstance(min_runs, int) or isinstance(min_runs, bool) or not 1 <= min_runs <= 1_000_000:
        raise ConfigError(f"{where}: min_runs must be a whole number of at least 1; got {min_runs!r}")
    return Median(**common, min_runs=min_runs)
