"""After a restore, the run's own hyperparameters win over those the checkpoint brought back.

A framework's checkpoint holds the optimizer's state and the LR scheduler's, and with them copies
of the very values population-based training changes: each param group's ``lr``, ``weight_decay``,
``momentum``, ``betas``, ..., and each scheduler's ``base_lrs``. A member that copied a donor's
checkpoint, restored as it is, trains at the donor's rate whatever its own config says. So a
callback takes what the script built before the restore (``capture``, from the fresh optimizers
and schedulers) and, once the framework restored the checkpoint, puts those values back
(``reapply``), keeping the schedule's position:

* a group's other hyperparameters (``weight_decay``, ``momentum``, ``betas``, ...) take the fresh
  values;
* its rate keeps the schedule's factor at the restored step: ``lr = fresh base x (restored lr /
  restored base)``, the base being the scheduler's ``base_lrs`` (else the group's ``initial_lr``,
  else, with no scheduler, its ``lr``); every scheduler of it (those a ``SequentialLR`` or
  ``ChainedScheduler`` holds too) takes the fresh base, so its next steps compute the rate from
  the member's value. Exact for the multiplicative schedules (``LambdaLR``, hence the Hugging Face
  warm-up and cosine schedules, ``StepLR``, ``ExponentialLR``, ``CosineAnnealingLR`` to a floor
  of 0); a schedule with an additive floor (``eta_min``) goes on from the scaled rate.

A scheduler that keeps no base rate (``ReduceLROnPlateau``: its reductions are in the rate itself)
is given one (:func:`remember_bases`, ``_gts_base_lrs``), which its ``state_dict()`` then saves
with the checkpoint: a restore brings back the base of the run that saved it, so the factor is
known. Where a restored checkpoint holds none (saved before it had one), the restored rate is the
schedule's position and stays: before, the config's rate was put back on every resume, and a
``ReduceLROnPlateau`` lost its reductions at each pause, promotion and preemption.

Nothing changes when the restored values are the fresh ones (a run resumed from its own
checkpoint). Every change is said in the run's log, by :func:`describe`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from ..recordclass import Record, field

RATE_KEYS = ("lr", "initial_lr")  # the rate is kept at its schedule's position, not copied
BASE_ATTRIBUTE = "_gts_base_lrs"  # the base rates of a scheduler that keeps none, saved in its state_dict()


class Fresh(Record):
    """What the script built, before a restore: each optimizer's param groups' hyperparameters, and
    each scheduler's ``base_lrs`` with the optimizer it drives (its index in the optimizers)."""

    groups: list[list[dict[str, Any]]]
    schedulers: list[tuple[int, list[float]]]
    # Each scheduler's own settings (those a script sets from its config: eta_min, gamma, ...), by
    # its place among the schedulers given and those they hold (chained()).
    settings: list[dict[str, Any]] = field(default_factory=list)


# A scheduler's settings a script sets (its config's), which a restore brings back as the saved
# run's: put back as a param group's values are. Its position (last_epoch, _step_count, the
# rates it computed) stays as restored.
SETTINGS = ("eta_min", "gamma", "step_size", "T_max", "T_0", "T_mult", "factor", "patience", "threshold", "cooldown")


class Change(Record):
    name: str  # "lr", "weight_decay", ...
    restored: Any
    fresh: Any
    scheduled: bool = False  # a base rate under a schedule, whose position stays as restored


def hyperparameters(group: dict[str, Any]) -> dict[str, Any]:
    """A param group's values that a script sets: numbers, and tuples of numbers (``betas``);
    not its parameters, nor flags (``foreach``, ``amsgrad``: booleans)."""
    found = {}
    for name, value in group.items():
        if name == "params":
            continue
        if _number(value) or (isinstance(value, tuple) and value and all(_number(v) for v in value)):
            found[name] = value
    return found


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def chained(scheduler: Any) -> list[Any]:
    """A scheduler and those it holds (``SequentialLR``, ``ChainedScheduler``), each once."""
    found: list[Any] = []
    todo = [scheduler]
    while todo:
        one = todo.pop(0)
        if any(one is seen for seen in found):
            continue
        found.append(one)
        todo.extend(getattr(one, "_schedulers", None) or [])
    return found


def remember_bases(schedulers: Iterable[Any]) -> None:
    """Give each scheduler that keeps no base rate (``ReduceLROnPlateau``) its optimizer's rates as
    they are now (as built, before any step), where it has none yet: saved with its state from
    then on, they tell a later restore what the rate was a factor of."""
    for scheduler in (one for given in schedulers for one in chained(given)):
        optimizer = getattr(scheduler, "optimizer", None)
        if _bases(scheduler) is None and optimizer is not None:
            setattr(scheduler, BASE_ATTRIBUTE, [float(group["lr"]) for group in optimizer.param_groups])


def _bases(scheduler: Any) -> list[float] | None:
    base = getattr(scheduler, "base_lrs", None)
    held = getattr(scheduler, "_schedulers", None)
    if base is None and held:  # a SequentialLR or ChainedScheduler: its schedulers' bases
        return _bases(held[0])
    return base if base is not None else getattr(scheduler, BASE_ATTRIBUTE, None)


def capture(optimizers: Sequence[Any], schedulers: Iterable[Any]) -> Fresh:
    """The fresh values of ``optimizers`` and of the ``schedulers`` driving them (torch objects)."""
    schedulers = list(schedulers)
    remember_bases(schedulers)
    groups = [[hyperparameters(group) for group in optimizer.param_groups] for optimizer in optimizers]
    driven = []
    for scheduler in schedulers:
        index = next((i for i, o in enumerate(optimizers) if o is getattr(scheduler, "optimizer", None)), None)
        base = _bases(scheduler)
        if index is not None and base is not None:
            driven.append((index, [float(b) for b in base]))
    settings = [_settings(one) for given in schedulers for one in chained(given)]
    return Fresh(groups=groups, schedulers=driven, settings=settings)


def _settings(scheduler: Any) -> dict[str, Any]:
    return {name: value for name in SETTINGS if _number(value := getattr(scheduler, name, None))}


def reapply(fresh: Fresh, optimizers: Sequence[Any], schedulers: Sequence[Any]) -> list[Change]:
    """Put ``fresh`` back into the restored ``optimizers`` and ``schedulers`` (the same objects, in the
    same order, as captured); the changes made, each once."""
    if len(fresh.groups) != len(optimizers) or any(
        len(groups) != len(o.param_groups) for groups, o in zip(fresh.groups, optimizers, strict=True)
    ):
        raise ValueError("the optimizers restored are not those the script built: their param groups differ")
    changes: list[Change] = []
    bases = dict(fresh.schedulers)
    for index, optimizer in enumerate(optimizers):
        driving = [s for s in schedulers if getattr(s, "optimizer", None) is optimizer]
        for place, (was, group) in enumerate(zip(fresh.groups[index], optimizer.param_groups, strict=True)):
            for name, value in was.items():
                if name not in RATE_KEYS and name in group and not _same(group[name], value):
                    changes.append(Change(name=name, restored=group[name], fresh=value))
                    group[name] = value
            base = bases.get(index)
            _rate(group, was, base[place] if base and place < len(base) else None, place, driving, changes)
    if fresh.settings:
        held = [one for given in schedulers for one in chained(given)]
        if len(held) == len(fresh.settings):
            for one, was in zip(held, fresh.settings, strict=True):
                for name, value in was.items():
                    if getattr(one, name, value) != value:
                        changes.append(Change(name=name, restored=getattr(one, name), fresh=value))
                        setattr(one, name, value)
    unique: list[Change] = []
    for change in changes:
        if change not in unique:
            unique.append(change)
    return unique


def _rate(
    group: dict[str, Any],
    was: dict[str, Any],
    fresh_base: float | None,
    place: int,
    schedulers: list[Any],
    changes: list[Change],
) -> None:
    """One group's rate: the fresh base at the restored schedule's position."""
    if "lr" not in group or "lr" not in was:
        return
    restored_base = _base(group, schedulers, place)
    new_base = fresh_base if fresh_base is not None else was.get("initial_lr", was["lr"])
    if restored_base is None or restored_base == new_base:
        return
    scheduled = bool(schedulers) or "initial_lr" in group
    factor = group["lr"] / restored_base if restored_base else 1.0
    rate = new_base * factor if restored_base else was["lr"]
    changes.append(Change(name="lr", restored=restored_base, fresh=new_base, scheduled=scheduled))
    group["lr"] = rate
    if "initial_lr" in group:
        group["initial_lr"] = new_base
    for scheduler in schedulers:
        for one in chained(scheduler):
            base = _bases(one)
            if base is not None and place < len(base):
                base[place] = new_base
            last = getattr(one, "_last_lr", None)
            if isinstance(last, list) and place < len(last):
                last[place] = rate


def _same(restored: Any, fresh: Any) -> bool:
    """Equal values, a restored list equal to a fresh tuple too (``betas`` come back from a saved
    state as a list)."""
    if isinstance(restored, list) and isinstance(fresh, tuple):
        restored = tuple(restored)
    return bool(restored == fresh)


def _base(group: dict[str, Any], schedulers: list[Any], place: int) -> float | None:
    """The base the restored rate is a factor of; None where a scheduler keeps none and the
    checkpoint brought none back: the restored rate is then the schedule's position."""
    for scheduler in schedulers:
        base = _bases(scheduler)
        if base is None:
            return None
        if place < len(base):
            return float(base[place])
    return float(group.get("initial_lr", group["lr"]))


def describe(changes: Sequence[Change], framework: str) -> str:
    """The log's line for what :func:`reapply` did (``lr 0.001 (restored) -> 0.0005 (this run's
    config)``), or that nothing differed."""
    if not changes:
        return f"the values {framework} restored are this run's own"
    said = []
    for change in changes:
        name = f"base {change.name}" if change.scheduled else change.name
        said.append(f"{name} {_shown(change.restored)} (restored) -> {_shown(change.fresh)} (this run's config)")
    tail = "; the schedule goes on from the restored step" if any(c.scheduled for c in changes) else ""
    return f"{framework} restored another run's values; this run's own are put back: {', '.join(said)}{tail}"


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_shown(v) for v in value) + ")"
    return f"{value:g}" if isinstance(value, float) and math.isfinite(value) else str(value)


KEPT = "reapply=False: the values {framework} restored stay (those of the checkpoint's run)"
