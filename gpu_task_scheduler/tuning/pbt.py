"""Population-based training's decisions (Jaderberg et al., 2017), pure and table-tested: when a
member of the population copies a better one (exploit) and how its values change (explore).

A config asks for it with its ``pbt`` key::

    pbt: {metric: loss, mode: min, interval: 4, quantile: 0.25, max_step: 40,
          perturb: {lr: [0.8, 1.2]}, resample: {dropout: {uniform: [0.0, 0.5]}}}

The grid's runs (or a search's) are the population. Each time a member has trained ``interval``
steps since it was last judged, its latest value is ranked against every member's latest value
(Ray Tune's PopulationBasedTraining does the same, asynchronously):

* in the bottom ``quantile`` (at least one member, at most half of the population, once two
  members have reported), it *exploits*: it is to go on from a copy of the checkpoint of a member
  of the top ``quantile`` (the donor), at the donor's step, with the donor's values *explored*:
  each value listed in ``perturb`` multiplied by one of its factors, each listed in ``resample``
  drawn again from its distribution with probability ``resample_probability`` (default 1/4;
  otherwise kept, or perturbed if it is listed in ``perturb`` too);
* otherwise it goes on as it is.

A member at or past ``max_step`` is never judged. Every random choice (the donor, the factor, a
resample) is drawn from a generator seeded by the ``seed``, the member and the step, so that the
same events give the same decisions, also in a scheduler started again after a kill -9 (the engine
replays what its ledger recorded). Nothing here reads a clock or a file.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from ..errors import ConfigError, unknown_key_message
from ..recordclass import Record, field
from .space import Distribution, parse_distribution
from .stopping import metric_and_mode

KEYS = (
    "metric",
    "mode",
    "interval",
    "quantile",
    "perturb",
    "resample",
    "resample_probability",
    "max_step",
    "keep",
    "seed",
)
EXAMPLE = "e.g. {metric: loss, mode: min, interval: 4, max_step: 40, perturb: {lr: [0.8, 1.2]}}"


class PbtConfig(Record):
    metric: str
    mode: str  # "min" or "max"
    interval: float
    max_step: float
    quantile: float = 0.25
    perturb: dict[str, tuple[float, ...]] = field(default_factory=dict)
    resample: dict[str, Distribution] = field(default_factory=dict)
    resample_probability: float = 0.25
    keep: int = 0  # old checkpoints of the best member kept (the engine's)
    seed: int = 0


class Exploit(Record):
    """``member`` is to go on from ``donor``'s checkpoint at ``step`` (the donor's last reported
    step), with ``values`` (the donor's, explored); ``changed``: what each explored key became and how."""

    member: str
    donor: str
    step: float
    values: dict[str, Any]
    changed: dict[str, str] = field(default_factory=dict)


class Member(Record, frozen=False):
    values: dict[str, Any]
    last_step: float | None = None  # the step it reported last
    last_value: float | None = None  # its value there
    judged_at: float = 0.0  # the step it was last judged at (or went on from, after an exploit)


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_pbt(raw: Any, where: str = "pbt") -> PbtConfig | None:
    """The ``pbt`` config (None for none); ConfigError, with what to write, otherwise."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a dict, {EXAMPLE}; got {raw!r}")
    for key in raw:
        if key not in KEYS:
            raise ConfigError(unknown_key_message(where, key, KEYS))
    metric, mode = metric_and_mode(raw, where)
    interval = raw.get("interval")
    if not _number(interval) or interval <= 0:
        raise ConfigError(
            f"{where}: interval must be a number of steps above 0 (how often a member is judged); got {interval!r}"
        )
    max_step = raw.get("max_step")
    if not _number(max_step) or max_step <= interval:
        raise ConfigError(
            f"{where}: max_step must be a number above interval ({interval!r}): the step at which "
            f"a member is done; got {max_step!r}"
        )
    quantile = raw.get("quantile", 0.25)
    if not _number(quantile) or not 0 < quantile <= 0.5:
        raise ConfigError(
            f"{where}: quantile must be a fraction above 0 and at most 0.5 (the bottom share that "
            f"copies the top share); got {quantile!r}"
        )
    perturb = _factors(raw.get("perturb", {}), f"{where}.perturb")
    resample = raw.get("resample", {})
    if not isinstance(resample, Mapping):
        raise ConfigError(
            f"{where}.resample must be a dict of key: distribution, e.g. {{dropout: {{uniform: [0, "
            f"0.5]}}}}; got {resample!r}"
        )
    distributions = {str(key): parse_distribution(value, f"{where}.resample.{key}") for key, value in resample.items()}
    if not perturb and not distributions:
        raise ConfigError(
            f"{where}: give perturb or resample (the values a member that copies another changes), {EXAMPLE}"
        )
    probability = raw.get("resample_probability", 0.25)
    if not _number(probability) or not 0 <= probability <= 1:
        raise ConfigError(f"{where}: resample_probability must be a number from 0 to 1; got {probability!r}")
    keep = raw.get("keep", 0)
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
        raise ConfigError(f"{where}: keep must be a whole number of old checkpoints to keep, 0 or more; got {keep!r}")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"{where}: seed must be a whole number; got {seed!r}")
    return PbtConfig(
        metric=metric,
        mode=mode,
        interval=interval,
        max_step=max_step,
        quantile=quantile,
        perturb=perturb,
        resample=distributions,
        resample_probability=probability,
        keep=keep,
        seed=seed,
    )


def _factors(raw: Any, where: str) -> dict[str, tuple[float, ...]]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a dict of key: [factors], e.g. {{lr: [0.8, 1.2]}}; got {raw!r}")
    factors: dict[str, tuple[float, ...]] = {}
    for key, value in raw.items():
        if (
            not isinstance(value, (list, tuple))
            or not value
            or not all(_number(factor) and factor > 0 for factor in value)
        ):
            raise ConfigError(f"{where}.{key} must be a list of factors above 0, e.g. [0.8, 1.2]; got {value!r}")
        factors[str(key)] = tuple(float(factor) for factor in value)
    return factors


class Pbt:
    """A population's state and the decisions on it (see the module's text)."""

    def __init__(self, config: PbtConfig) -> None:
        self.config = config
        self.members: dict[str, Member] = {}

    def began(self, member: str, values: Mapping[str, Any]) -> None:
        """``member`` joined the population with ``values`` (its config's explored keys)."""
        self.members[member] = Member(dict(values))

    def report(self, member: str, step: float, value: float) -> Exploit | None:
        """``member`` reported ``value`` at ``step``: the exploit it is to make now, or None (it goes on)."""
        state = self.members[member]
        if state.last_step is not None and step <= state.last_step:
            return None  # a step it reported already (a resumed attempt's first lines)
        state.last_step, state.last_value = step, value
        c = self.config
        if step >= c.max_step or step - state.judged_at < c.interval:
            return None
        state.judged_at = step
        bottom, top = self._quantiles()
        if member not in bottom or not top:
            return None
        rng = random.Random(f"{c.seed}/{member}/{step!r}")
        donor = top[rng.randrange(len(top))]
        values, changed = self._explore(self.members[donor].values, rng)
        return Exploit(member, donor, self.members[donor].last_step or 0.0, values, changed)

    def exploited(self, exploit: Exploit) -> None:
        """``exploit`` was made: the member goes on from the donor's step with its new values."""
        state = self.members[exploit.member]
        state.values = dict(exploit.values)
        state.last_step = exploit.step
        state.judged_at = exploit.step
        donor = self.members[exploit.donor]
        state.last_value = donor.last_value

    def _quantiles(self) -> tuple[list[str], list[str]]:
        """The bottom and the top ``quantile`` of the members that reported, by their latest value
        (best first within each; ties by name)."""
        reported = [(name, m.last_value) for name, m in self.members.items() if m.last_value is not None]
        if len(reported) < 2:
            return [], []
        sign = 1 if self.config.mode == "min" else -1
        ranked = [name for name, _ in sorted(reported, key=lambda item: (sign * item[1], item[0]))]
        size = min(max(1, math.ceil(len(ranked) * self.config.quantile)), len(ranked) // 2)
        return ranked[-size:], ranked[:size]

    def _explore(self, values: Mapping[str, Any], rng: random.Random) -> tuple[dict[str, Any], dict[str, str]]:
        c = self.config
        explored, changed = dict(values), {}
        for key in sorted(set(c.perturb) | set(c.resample)):
            if key not in explored:
                continue
            if key in c.resample and rng.random() < c.resample_probability:
                explored[key] = c.resample[key].sample(rng)
                changed[key] = "resampled"
            elif key in c.perturb and _number(explored[key]):
                factor = c.perturb[key][rng.randrange(len(c.perturb[key]))]
                explored[key] = _scaled(explored[key], factor)
                changed[key] = f"x{factor:g}"
        return explored, changed


def _scaled(value: float, factor: float) -> float:
    """``value * factor``, an int kept an int (rounded, at least 1 away from 0 when it was)."""
    if isinstance(value, int):
        scaled = round(value * factor)
        return scaled if scaled != 0 or value == 0 else (1 if value > 0 else -1)
    return value * factor


def perturbed_keys(config: PbtConfig) -> Sequence[str]:
    """The keys a member's values may change in, sorted."""
    return sorted(set(config.perturb) | set(config.resample))
