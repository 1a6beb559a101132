"""Search spaces: the values a sampler may choose for a key (``search:`` in a config).

In a config with ``search``, a ``test_config`` value is a distribution::

    lr: {loguniform: [1.0e-5, 1.0e-1]}
    dropout: {uniform: [0.0, 0.5]}
    layers: {int: [2, 8]}                 # also {int: [16, 512], log: true} or {..., step: 16}
    optimizer: {choice: [adam, sgd]}      # a plain list means the same
    momentum: {uniform: [0.0, 0.99], when: {optimizer: sgd}}

A key with ``when`` is conditional: it is sampled only for runs whose other keys have those
values (a list: any of them), and the other runs do not have it at all (not in their config,
folder name or command). Each is checked here, before anything runs (a ``when`` on a key the
space lacks, a value that key never takes, a cycle); sampling is ``tuning/search.py``'s.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from ..finite import finite_number
from ..recordclass import Record

KINDS = ("uniform", "loguniform", "int", "choice")
# A conditional key's condition: (other key, the values it must have), all of them.
Condition = tuple[tuple[str, tuple[Any, ...]], ...]


class Uniform(Record):
    low: float
    high: float
    when: Condition = ()

    def sample(self, rng: random.Random) -> float:
        return rng.uniform(self.low, self.high)

    def representative(self) -> Any:
        return self.low


class LogUniform(Record):
    low: float
    high: float
    when: Condition = ()

    def sample(self, rng: random.Random) -> float:
        return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))

    def representative(self) -> Any:
        return self.low


class Int(Record):
    low: int
    high: int
    step: int = 1
    log: bool = False
    when: Condition = ()

    def sample(self, rng: random.Random) -> int:
        if self.log:
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high + 1)))
            return min(self.high, int(value))
        return self.low + self.step * rng.randrange((self.high - self.low) // self.step + 1)

    def representative(self) -> Any:
        return self.low


class Choice(Record):
    values: tuple[Any, ...]
    when: Condition = ()

    def sample(self, rng: random.Random) -> Any:
        return self.values[rng.randrange(len(self.values))]

    def representative(self) -> Any:
        return self.values[0]


Distribution = Uniform | LogUniform | Int | Choice


def _number(value: Any) -> bool:
    return finite_number(value)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_distribution(value: Any) -> bool:
    """Whether a test_config value is written as a distribution (a dict naming one of KINDS)."""
    return isinstance(value, Mapping) and any(kind in value for kind in KINDS)


def parse_distribution(value: Any, where: str, *, conditional: bool = False) -> Distribution:
    """The distribution a test_config value asks for (a list is a choice); ConfigError naming ``where``.
    ``conditional``: it may say ``when`` (a search's space; checked against the space by parse_space)."""
    if conditional and isinstance(value, Mapping) and "when" in value:
        found = parse_distribution({k: v for k, v in value.items() if k != "when"}, where)
        return found._replace(when=_condition(value["when"], where))
    if isinstance(value, (list, tuple)):
        if not value:
            raise ConfigError(f"{where} is an empty list: a choice needs at least one value")
        return _choice(value, where)
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{where} must be a distribution, e.g. {{uniform: [0, 1]}}, {{loguniform: [1e-5, 1e-1]}}, "
            f"{{int: [2, 8]}}, {{choice: [a, b]}}, or a list of values; got {value!r}"
        )
    kinds = [kind for kind in KINDS if kind in value]
    if len(kinds) != 1:
        raise ConfigError(f"{where} must name one of {', '.join(KINDS)}; got {value!r}")
    kind = kinds[0]
    allowed = {"int": {"int", "step", "log"}}.get(kind, {kind})
    extra = sorted(str(key) for key in value if key not in allowed)
    if extra:
        also = " (when: only in a search's space)" if "when" in extra else ""
        raise ConfigError(f"{where}: {kind} takes {', '.join(sorted(allowed))}; unknown: {', '.join(extra)}{also}")
    bounds = value[kind]
    if kind == "choice":
        if not isinstance(bounds, (list, tuple)) or not bounds:
            raise ConfigError(f"{where}: choice needs a non-empty list of values; got {bounds!r}")
        return _choice(bounds, where)
    if not isinstance(bounds, (list, tuple)) or len(bounds) != 2:
        raise ConfigError(f"{where}: {kind} needs [low, high]; got {bounds!r}")
    low, high = bounds
    if kind == "int":
        if not (_whole(low) and _whole(high)) or low > high:
            raise ConfigError(f"{where}: int needs whole numbers low <= high; got {bounds!r}")
        if max(abs(low), abs(high)) > MAX_INT:
            # Optuna keeps a value as a float: beyond 2**53 it would come back as another number.
            raise ConfigError(f"{where}: int bounds must be within +-2**53; got {bounds!r}")
        step, log = value.get("step", 1), value.get("log", False)
        if not _whole(step) or step < 1:
            raise ConfigError(f"{where}: step must be a whole number of at least 1; got {step!r}")
        if not isinstance(log, bool):
            raise ConfigError(f"{where}: log must be true or false; got {log!r}")
        if log and (low < 1 or step != 1):
            raise ConfigError(f"{where}: a log int needs low >= 1 and no step; got {value!r}")
        if (high - low) % step:
            raise ConfigError(f"{where}: high - low ({high - low}) is not a multiple of step {step}")
        return Int(low, high, step, log)
    if not (_number(low) and _number(high)) or not low < high:
        raise ConfigError(f"{where}: {kind} needs numbers low < high; got {bounds!r}")
    if not math.isfinite(float(high) - float(low)):  # a draw would be infinite
        raise ConfigError(f"{where}: {kind}'s width high - low overflows a float; got {bounds!r}")
    if kind == "loguniform":
        if low <= 0:
            raise ConfigError(f"{where}: loguniform needs low > 0 (a log scale); got {bounds!r}")
        return LogUniform(float(low), float(high))
    return Uniform(float(low), float(high))


MAX_INT = 2**53


def _condition(raw: Any, where: str) -> Condition:
    """``when: {optimizer: sgd}`` or ``{optimizer: [sgd, momentum_sgd], layers: 2}``, as a Condition."""
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(f"{where}: when must be a dict of key -> value (or list of values); got {raw!r}")
    found = []
    for key, allowed in raw.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{where}: when's keys must be keys of the space; got {key!r}")
        values = tuple(allowed) if isinstance(allowed, (list, tuple)) else (allowed,)
        if not values:
            raise ConfigError(f"{where}: when {key}: an empty list (no value would ever make it sampled)")
        found.append((key, values))
    return tuple(found)


def active(distribution: Distribution, values: Mapping[str, Any]) -> bool:
    """Whether a key with this distribution is sampled, given the other keys' ``values`` so far."""
    return all(
        key in values and any(values[key] == v and type(values[key]) is type(v) for v in allowed)
        for key, allowed in distribution.when
    )


def complete(space: Mapping[str, Distribution], values: Mapping[str, Any]) -> bool:
    """Whether ``values`` has every key its own values make active (a trial a sampler finished)."""
    return all(key in values for key, distribution in space.items() if active(distribution, values))


def _choice(values: Sequence[Any], where: str) -> Choice:
    """A choice among ``values``; a NaN or an infinity among them (or inside one) is refused: a
    NaN equals nothing, not even itself, so the choice a run recorded could never be found again."""
    pending = list(values)
    while pending:
        value = pending.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}: a choice must not hold {value!r} (not a finite number); got {list(values)!r}")
        if isinstance(value, Mapping):
            pending.extend(value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
    return Choice(tuple(values))


def parse_space(block: Any, where: str = "test_config[0]") -> dict[str, Distribution]:
    """A search's one test_config block: key -> distribution."""
    if not isinstance(block, Mapping) or not block:
        raise ConfigError(f"{where} must be a dict of key -> distribution (or list of values); got {block!r}")
    space = {}
    for key, value in block.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{where}: keys must be non-empty strings; got {key!r}")
        space[key] = parse_distribution(value, f"{where}[{key!r}]", conditional=True)
    return _ordered(space, where)


def _ordered(space: dict[str, Distribution], where: str) -> dict[str, Distribution]:
    """The space with each conditional key after the keys its ``when`` names (the order a sampler
    draws them in), its conditions checked: keys of the space, values they can take, no cycle."""
    from ..errors import did_you_mean

    for key, distribution in space.items():
        for parent, allowed in distribution.when:
            if parent not in space:
                raise ConfigError(
                    f"{where}[{key!r}]: when names {parent!r}, which is not a key of the space"
                    f"{did_you_mean(parent, [k for k in space if k != key])} Keys: {', '.join(space)}."
                )
            if parent == key:
                raise ConfigError(f"{where}[{key!r}]: when names the key itself")
            for value in allowed:
                if not inside(space[parent], value):
                    raise ConfigError(
                        f"{where}[{key!r}]: when {parent}: {value!r}, which {parent} never takes "
                        f"({describe({parent: space[parent]._replace(when=())})})"
                    )
    # A depth-first order kept on a stack of its own, not Python's: a when chain of 3,000 keys is
    # a config, not a RecursionError.
    ordered: dict[str, Distribution] = {}
    for start in space:
        if start in ordered:
            continue
        visiting: list[str] = [start]
        parents = [iter([parent for parent, _ in space[start].when])]
        while parents:
            step: str | None = next(parents[-1], None)
            if step is None:
                parents.pop()
                key = visiting.pop()
                ordered[key] = space[key]
            elif step in visiting:
                cycle = visiting[visiting.index(step) :] + [step]
                raise ConfigError(f"{where}: the when conditions form a cycle: {' -> '.join(cycle)}")
            elif step not in ordered:
                visiting.append(step)
                parents.append(iter([grand for grand, _ in space[step].when]))
    return ordered


def inside(distribution: Distribution, value: Any) -> bool:
    """Whether ``value`` is one ``distribution`` can give (a sampler's answer is checked)."""
    if isinstance(distribution, Choice):
        return any(value == choice and type(value) is type(choice) for choice in distribution.values)
    if isinstance(distribution, Int):
        return _whole(value) and distribution.low <= value <= distribution.high
    return _number(value) and distribution.low <= value <= distribution.high


def describe(space: Mapping[str, Distribution]) -> str:
    """``lr loguniform [1e-05, 0.1], layers int [2, 8]`` for ``--dry-run``."""
    parts = []
    for key, d in space.items():
        if isinstance(d, Choice):
            parts.append(f"{key} one of {list(d.values)}")
        elif isinstance(d, Int):
            extra = " log" if d.log else (f" step {d.step}" if d.step != 1 else "")
            parts.append(f"{key} int [{d.low}, {d.high}]{extra}")
        else:
            parts.append(f"{key} {'loguniform' if isinstance(d, LogUniform) else 'uniform'} [{d.low:g}, {d.high:g}]")
        if d.when:
            parts[-1] += " when " + " and ".join(
                f"{parent}={'|'.join(map(str, allowed))}" for parent, allowed in d.when
            )
    return ", ".join(parts)


def values_text(values: Sequence[Any]) -> str:
    return ", ".join(map(str, values))
