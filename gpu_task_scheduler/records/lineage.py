"""Population-based training's lineages, read from the ledger's ``trial_events``: which member each
member copied at which step, and the schedule of values the weights it ended with were trained with.

A member's *schedule* is the values its weights were trained with, from step 0: when it copies a
donor's snapshot of step ``s``, its schedule becomes the donor's schedule as it was at that
snapshot (up to ``s``), then its new values from ``s``. So the best member's schedule can be run
again as one fixed run (``gts results ROOT --best score --max --schedule``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from ..recordclass import Record, field
from .ledger.trials import TrialEvent


class Segment(Record):
    """From ``step`` on, the values ``values``; ``donor``: the member whose snapshot of ``step`` it
    went on from (None: its own start), ``changed``: how each explored value changed then, ``was``:
    the donor's values at that snapshot (what ``changed`` changed; empty where not recorded)."""

    step: float
    values: dict[str, Any]
    donor: str | None = None
    changed: dict[str, str] = field(default_factory=dict)
    was: dict[str, Any] = field(default_factory=dict)

    def change_text(self) -> str:
        """How each explored value became this segment's: ``lr 0.001 x0.5 = 0.0005``."""
        said = []
        for key, how in sorted(self.changed.items()):
            before = f" {_value(self.was[key])}" if key in self.was and how.startswith("x") else ""
            after = f" = {_value(self.values[key])}" if key in self.values else ""
            said.append(f"{key}{before} {how}{after}")
        return ", ".join(said)


def _value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value) if isinstance(value, str) else str(value)


class Lineage(Record, frozen=False):
    start: Segment  # its values at its start
    exploits: list[Segment] = field(default_factory=list)  # its own copies, in order
    schedule: list[Segment] = field(default_factory=list)  # its weights' values from step 0

    @property
    def own(self) -> list[Segment]:
        """Its own values: at its start, then each copy's, in order."""
        return [self.start, *self.exploits]


def lineages(events: Iterable[TrialEvent]) -> dict[str, Lineage]:
    """Each member's lineage (empty without population-based training)."""
    found: dict[str, Lineage] = {}
    snapshots: dict[tuple[str, float], list[Segment]] = {}  # (member, step) -> its schedule then
    decided: dict[str, Segment] = {}  # exploits decided, not yet made
    for event in events:
        name = event.name
        if name is None:
            continue
        if event.kind == "began" and event.detail is not None and name not in found:
            values = event.detail.get("values")
            start = Segment(0.0, dict(values) if isinstance(values, dict) else {})
            found[name] = Lineage(start, schedule=[start])
        elif name not in found:
            continue
        elif event.kind == "rung" and event.decision in ("snapshot", "snapshot+yield") and event.step is not None:
            snapshots[name, event.step] = list(found[name].schedule)
        elif event.kind == "rung" and event.decision == "exploit" and event.detail is not None:
            detail = event.detail
            step, values = detail.get("step"), detail.get("values")
            if isinstance(step, (int, float)) and isinstance(values, dict):
                changed = detail.get("changed")
                donor = detail.get("donor")
                decided[name] = Segment(
                    float(step),
                    values,
                    donor if isinstance(donor, str) else None,
                    changed if isinstance(changed, dict) else {},
                )
        elif event.kind == "resumed" and name in decided:
            segment = decided.pop(name)
            lineage = found[name]
            snapshot = snapshots.get((segment.donor or "", segment.step))
            if snapshot:  # the donor's values at that snapshot: what the exploit changed
                segment = segment._replace(was=dict(snapshot[-1].values))
            lineage.exploits.append(segment)
            before = snapshot if snapshot is not None else lineage.schedule
            lineage.schedule = [s for s in before if s.step < segment.step] + [segment]
    return found


def copies_text(copies: Iterable[Segment]) -> str:
    """``lr-1.0, at 4 (lr 1 x0.5 = 0.5); lr-0.37, at 16 (lr 0.37 x2 = 0.74)`` (a lineage's
    exploits: whom it copied, at which step, and the values it went on with), or ``""``."""
    texts: list[list[Any]] = []  # [text, times]: a member sent back to a step it had copied at copies it again
    for s in copies:
        changed = s.change_text()
        text = f"{s.donor} at {s.step:g}" + (f" ({changed})" if changed else "")
        if texts and texts[-1][0] == text:
            texts[-1][1] += 1
        else:
            texts.append([text, 1])
    return "; ".join(text if times == 1 else f"{text} {_times(times)}" for text, times in texts)


def _times(count: int) -> str:
    return {2: "twice", 3: "three times"}.get(count, f"{count} times")


def schedule_text(lineage: Lineage, end: float | None = None) -> str:
    """The schedule, one line a segment: ``steps 0-8: lr=1.0``."""
    lines = []
    for index, segment in enumerate(lineage.schedule):
        upto = lineage.schedule[index + 1].step if index + 1 < len(lineage.schedule) else end
        span = f"steps {segment.step:g}-{upto:g}" if upto is not None else f"from step {segment.step:g}"
        values = ", ".join(f"{key}={value!r}" for key, value in sorted(segment.values.items()))
        via = f"  (from {segment.donor})" if segment.donor else ""
        lines.append(f"{span}: {values}{via}")
    return "\n".join(lines)


def copy_faults(
    events: Iterable[TrialEvent],
    *,
    interval: float,
    value_of: Callable[[TrialEvent], Any],
    worse: Callable[[Any, Any], bool],
) -> list[str]:
    """Each exploit in ``events`` that broke population-based training's copy rule (tuning/pbt.py),
    in words: a snapshot its donor did not take since it last copied a member itself (a lineage it
    dropped), or one recorded worse than the copier's own value at that snapshot's interval (its
    latest value, where it has none there). ``value_of``: an event's value (one metric's, or
    several objectives'); ``worse(a, b)``: whether ``a`` is worse than ``b``. An audit of what the
    ledger says happened, for tests, benchmarks and a user who wants to check a sweep."""
    current: dict[str, dict[float, Any]] = {}  # member -> its snapshots of its current lineage
    at: dict[tuple[str, float], Any] = {}  # (member, interval) -> its value there
    latest: dict[str, Any] = {}
    decided: dict[str, tuple[float, Any]] = {}  # exploits decided: the step and value copied
    faults: list[str] = []
    for event in events:
        name = event.name
        if name is None:
            continue
        if event.kind == "resumed" and name in decided:
            went_on, copied = decided.pop(name)
            current[name] = {}
            latest[name] = copied
            at[name, math.floor(went_on / interval) * interval] = copied
            continue
        if event.kind != "rung" or event.step is None or event.rung is None:
            continue
        value = value_of(event)
        at[name, event.rung] = latest[name] = value
        if event.decision in ("snapshot", "snapshot+yield"):
            current.setdefault(name, {})[event.step] = value
        elif event.decision == "exploit" and event.detail is not None:
            donor, step = event.detail.get("donor"), event.detail.get("step")
            if not isinstance(donor, str) or not isinstance(step, (int, float)) or isinstance(step, bool):
                continue
            kept = current.get(donor, {})
            if step not in kept:
                faults.append(f"{name} copied {donor}'s snapshot of step {step:g}, not of its current lineage")
                continue
            own = at.get((name, math.floor(step / interval) * interval), latest.get(name))
            if own is not None and worse(kept[step], own):
                faults.append(
                    f"{name} copied {donor}'s snapshot of step {step:g}, recorded at {kept[step]!r}, "
                    f"worse than its own {own!r}"
                )
            decided[name] = (float(step), kept[step])
    return faults
