"""Population-based training's decisions (Jaderberg et al., 2017), pure and table-tested: when a
member of the population copies a better one (exploit) and how its values change (explore).

A config asks for it with its ``pbt`` key::

    pbt: {metric: loss, mode: min, interval: 4, quantile: 0.25, max_step: 40,
          perturb: {lr: [0.8, 1.2]}, resample: {dropout: {uniform: [0.0, 0.5]}}}

The grid's runs (or a search's) are the population. A member is judged by its first report at or
past each multiple of ``interval``. It is ranked by its value at the latest interval that half the
population has reached, against the other members' values there. (Ray Tune's
PopulationBasedTraining ranks each member's latest value against the others' latest values,
whatever their steps: with a metric that grows as runs train, a member that runs ahead then looks
better than better ones behind it, and is never made to copy them. Measured on
``bench/pbt_bench.py``, where members run at the same pace but start at different moments: that
rule left the worst member uncopied for the whole sweep.) So ranked:

* in the bottom ``quantile`` (at least one member, at most half of those ranked; of the members
  that still train: one that ended ranks, and may be a donor, but copies no one), it *exploits*:
  it is to go on from a copy of a snapshot of a member of the top ``quantile`` (the donor), with
  the donor's values *explored* (which snapshot: the copy rule below):
  each value listed in ``perturb`` multiplied by one of its factors, each listed in ``resample``
  drawn again from its distribution with probability ``resample_probability`` (default 1/4;
  otherwise kept, or perturbed if it is listed in ``perturb`` too);
* in the top ``quantile``, or judged where too few are to rank it (among the first at its
  interval, whatever it is ranked at), a snapshot of its checkpoint is kept (the donors' copies
  are made from these);
* otherwise it goes on as it is.

The copy rule: the weights a member copies are weights its donor earned, never worse than its
own. A donor offers only the snapshots of its *current lineage* (taken since it last copied a
member itself: what it had before belongs to weights it dropped), and of those only its latest
and its best (the two the engine keeps on disk). The copier takes the latest of these that is of
the interval it may go back to or later, and was recorded at a value not worse than its own at
that snapshot's interval (its latest value, if it has none there; several objectives: not
dominated by it). A donor with no such snapshot is no donor, and a member with no donor goes on.
(Before this rule, a member could copy its donor's snapshot from before the donor's own copy, of
a lineage the donor no longer had, or a snapshot taken when the donor had diverged, long after
the value that ranked it: healthy members were handed chance-level weights.)

A member at or past ``max_step`` is never judged. Every random choice (the donor, the factor, a
resample) is drawn from a generator seeded by the ``seed``, the member and the step, so that the
same events give the same decisions, also in a scheduler started again after a kill -9 (the engine
replays what its ledger recorded). Nothing here reads a clock or a file.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from ..errors import ConfigError, unknown_key_message
from ..finite import finite_number
from ..recordclass import Record, field
from .base import CONTINUE, Next, Ranking, Value
from .space import Distribution, parse_distribution
from .stopping import Pausing, judged_by

# PBT's decisions besides CONTINUE (trials.py): EXPLOIT, SNAPSHOT, and the same with a pause for
# the member's turn (a population larger than its slots).
EXPLOIT, SNAPSHOT, YIELD, SNAPSHOT_YIELD = "exploit", "snapshot", "yield", "snapshot+yield"
PAUSING = frozenset((EXPLOIT, YIELD, SNAPSHOT_YIELD))  # the decisions that pause the member
SNAPSHOTS = frozenset((SNAPSHOT, SNAPSHOT_YIELD))  # the decisions that keep a snapshot of its checkpoint
TURNS = frozenset((YIELD, SNAPSHOT_YIELD))  # the decisions that make the member wait for members behind it
# Seconds report() waits at an interval for the scheduler's word (a snapshot of a top member's
# checkpoint is copied then, while the run waits; ASHA's rungs wait 5 s at most).
PBT_WAIT = 120.0

KEYS = (
    "metric",
    "mode",
    "objectives",
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
    # Several objectives (metric, mode), ranked by Pareto front then crowding distance, as MO-PBT
    # (Dushatskiy et al., 2023) and the pausing methods rank; the first is also metric and mode.
    objectives: tuple[tuple[str, str], ...] = ()


class Exploit(Record):
    """``member`` is to go on from ``donor``'s checkpoint at ``step`` (the donor's last reported
    step), with ``values`` (the donor's, explored); ``changed``: what each explored key became and how."""

    member: str
    donor: str
    step: float
    values: dict[str, Any]
    changed: dict[str, str] = field(default_factory=dict)
    value: Value | None = None  # the donor's value at ``step``


class Member(Record, frozen=False):
    values: dict[str, Any]
    last_step: float | None = None  # the step it was last judged at (or went on from, after an exploit)
    last_value: Value | None = None  # its value at its latest judgement
    judged_at: float = 0.0  # the multiple of interval it was last judged at (or the step it went on from)
    # (step, its value there, its values then): its snapshots since it last copied a member (its
    # current lineage), oldest first; ``best``: the best of them (the first of equals)
    snapshots: list[tuple[float, Value, dict[str, Any]]] = field(default_factory=list)
    best: tuple[float, Value, dict[str, Any]] | None = None
    went_back: float | None = None  # the interval its last exploit went back from (to the one before)
    furthest: float = 0.0  # the furthest interval it was judged at


def _number(value: Any) -> TypeGuard[float]:
    return finite_number(value)


def parse_pbt(raw: Any, where: str = "pbt") -> PbtConfig | None:
    """The ``pbt`` config (None for none); ConfigError, with what to write, otherwise."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a dict, {EXAMPLE}; got {raw!r}")
    for key in raw:
        if key not in KEYS:
            raise ConfigError(unknown_key_message(where, key, KEYS))
    metric, mode, objectives = judged_by(raw, where)
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
        objectives=objectives,
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


def _go_on(state: Member, step: float, value: Value) -> str:
    """It goes on as it is: no snapshot of it is kept."""
    del state, step, value
    return CONTINUE


class Pbt:
    """A population's state and the decisions on it (see the module's text): one of the engine's
    trial-scheduling methods (``trials.py``), driven by ``engine/pauses.py`` as promotion ASHA is.

    A member is judged at the first step it reports at or past each multiple of ``interval``
    (below ``max_step``), ranked by its value at the latest interval half the population reached,
    against the others' values there. A judged member in the top ``quantile`` goes on after a
    snapshot of its checkpoint
    (:data:`SNAPSHOT`: the donor copies come from these); one in the bottom ``quantile`` pauses
    (:data:`EXPLOIT`) and :meth:`next` resumes it at once, from a copy of a top member's latest
    snapshot, with that member's values explored; the others go on (:data:`CONTINUE`).

    A population larger than the slots that run it (``population`` members, ``slots`` at once)
    takes turns, as Ray Tune's does: a member that goes on from an interval while members that have
    not begun, or that wait at an earlier step, wait for a slot, pauses instead (:data:`YIELD`, or
    :data:`SNAPSHOT_YIELD` after its snapshot), and :meth:`next` gives slots to the members that
    have not begun first, then to the one that waits at the earliest step. So the population
    trains together, about an interval apart, and each member is ranked against members at about
    its own step. With a slot for every member, a member more than an interval ahead of a member
    that still trains waits so too (:meth:`_ahead`), and its turn comes once none is."""

    def __init__(self, config: PbtConfig, *, population: int = 0, slots: int = 0) -> None:
        self.config = config
        self.ranking = Ranking([way for _, way in config.objectives] or [config.mode])
        self.population, self.slots = population, slots
        self.members: dict[str, Member] = {}
        self._exploits: dict[str, Exploit] = {}  # decided, not yet resumed
        self._turns: dict[str, float] = {}  # members that wait for their turn, and the step they wait at
        self._at: dict[float, dict[str, Value]] = {}  # interval -> member -> its value there
        self._levels: list[float] = []  # the intervals of _at, sorted
        self._ended: set[str] = set()
        self._closed = False  # no more members will begin

    # --- what the engine tells it ------------------------------------------------------------

    def began(self, run: str, bracket: int = 0, config: Mapping[str, Any] | None = None) -> None:
        """``run`` joined the population with ``config`` (of which the keys PBT explores count)."""
        del bracket  # one population
        keys = perturbed_keys(self.config)
        self.members[run] = Member({key: config[key] for key in keys if key in config} if config else {})

    def rung_reached(self, run: str, step: float) -> float | None:
        """The multiple of ``interval`` a report at ``step`` is judged at (the highest at or below it,
        past the one the member was last judged at or went on from); None: not judged there."""
        state = self.members.get(run)
        c = self.config
        if state is None or step >= c.max_step or (state.last_step is not None and step <= state.last_step):
            return None
        boundary = math.floor(step / c.interval) * c.interval
        return boundary if boundary > state.judged_at and boundary > 0 else None

    def report(self, run: str, rung: float, value: Value, step: float | None = None, *, late: bool = False) -> str:
        """``run`` reported ``value`` at ``step`` (several objectives: each one's), judged at ``rung``
        (recorded before anything acts on it): :data:`EXPLOIT` (it pauses; :meth:`exploit_of` says
        from what it resumes), :data:`SNAPSHOT` (a top member: its checkpoint is kept as a donor's)
        or :data:`CONTINUE`. ``late``: told after the run went on past ``step`` (an earlier
        attempt's report, read after a restart): no snapshot of that step can be taken, so a top
        member goes on without one."""
        state = self.members[run]
        value = self.ranking.checked(value)
        step = rung if step is None else step
        state.last_step, state.last_value, state.judged_at = step, value, rung
        decision = self._decide(run, state, rung, step, value)
        if late and decision == SNAPSHOT:
            self._forget_latest(state)
            decision = CONTINUE
        if decision != EXPLOIT and self._others_wait(run, step):
            self._turns[run] = step
            return SNAPSHOT_YIELD if decision == SNAPSHOT else YIELD
        return decision

    def unsaved(self, run: str, decision: str) -> str:
        """The snapshot ``decision`` keeps of ``run`` could not be taken: no member copies it (as a
        late report's, :meth:`report`); the decision it is then (it goes on, or waits its turn)."""
        self._forget_latest(self.members[run])
        return YIELD if decision == SNAPSHOT_YIELD else CONTINUE

    def went_on(self, run: str) -> None:
        """``run`` was to wait for the members behind it, but its ledger says it went on (a sweep
        begun by an earlier version, which held no member of a population with a slot each)."""
        self._turns.pop(run, None)

    def unmade(self, run: str, decision: str) -> None:
        """The exploit decided for ``run`` was never made: its ledger says it went on instead
        (``decision``; a sweep begun by an earlier version, whose rule sent no member of this rank
        to copy). It goes on as it did (or waits its turn, as it did)."""
        self._exploits.pop(run, None)
        state = self.members[run]
        if decision in TURNS and state.last_step is not None:
            self._turns[run] = state.last_step

    def _forget_latest(self, state: Member) -> None:
        dropped = state.snapshots.pop()
        if state.best is dropped:  # the best of those left (rare: only a late or unsaved one goes)
            state.best = None
            for kept in state.snapshots:
                if state.best is None or self.ranking.worse(state.best[1], kept[1]):
                    state.best = kept

    def _keep(self, state: Member, step: float, value: Value) -> str:
        """A snapshot of ``state`` at ``step`` is kept (a donor's)."""
        kept = (step, value, dict(state.values))
        state.snapshots.append(kept)
        if state.best is None or self.ranking.worse(state.best[1], value):
            state.best = kept
        return SNAPSHOT

    def _others_wait(self, run: str, step: float) -> bool:
        """Whether ``run`` at ``step`` is to wait for members behind it: in a crowded population,
        members that wait for a slot; otherwise members that still train more than an interval
        behind it (:meth:`_ahead`)."""
        if not self.population > self.slots > 0:
            return self._ahead(run, step)
        if not self._closed and len(self.members) < self.population:
            return True  # members that have not begun
        return any(at < step for other, at in self._turns.items() if other != run)

    def _ahead(self, run: str, step: float) -> bool:
        """Whether a member that still trains is more than an interval behind ``run`` at ``step``
        (judged last at, or going on from, an interval before the one before ``step``'s). With a
        slot for every member, nothing else keeps them together: a member that copies another
        restarts (a process start, its imports) while the others train on, and one that starts
        late starts behind. Measured on bench/pbt_slots_sim.py (8 members on 8 slots, a restart
        costing 12 steps): the members that never copied ran ahead, judged alone, and the copiers'
        next copies were of snapshots far ahead of them; the median best member fell from 1.60 to
        1.22x the best fixed learning rate, 29 % of sweeps below 1.15x. Held until the others
        catch up: 1.41x, 7 %. (On digits with 8 slots on 2 cores, a restart cost 10 epochs.)"""
        return self._behind(run, step, self._slowest())

    def _behind(self, run: str, step: float, slowest: list[tuple[float, str]]) -> bool:
        """:meth:`_ahead`, given the two slowest members that still train (:meth:`_slowest`)."""
        interval = self.config.interval
        rung = math.floor(step / interval) * interval
        return any(progress < rung - interval for progress, other in slowest if other != run)

    def _slowest(self) -> list[tuple[float, str]]:
        """The two members that still train furthest behind, with their progress (one pass over the
        population, not one per member that waits: next() is asked at every look)."""
        return heapq.nsmallest(2, ((self._progress(name), name) for name in self.members if name not in self._ended))

    def _progress(self, run: str) -> float:
        """The interval ``run`` was last judged at, or the step it goes on from (an exploit's)."""
        exploit = self._exploits.get(run)
        return exploit.step if exploit is not None else self.members[run].judged_at

    def _decide(self, run: str, state: Member, rung: float, step: float, value: Value) -> str:
        if rung not in self._at:
            self._at[rung] = {}
            bisect.insort(self._levels, rung)
        self._at[rung][run] = value
        level = self._level(rung)
        if level is None:  # too few members there yet to rank it: kept as a donor, in case it is a top one
            return self._keep(state, step, value)
        # Among the first judged at its own interval, it is ranked at an earlier one; it is kept as a
        # donor all the same, in case it is a top one at its own, where the next members are ranked
        # once enough are there. (Without it, a member first at an interval, not top at the earlier
        # one, was the top of its own with no snapshot: the members ranked there had no donor. A
        # lightning sweep of four members on two slots whose worst member was judged only at such
        # intervals made no copy at all.)
        go_on = self._keep if len(self._at[rung]) < self._need() else _go_on
        table = self._at[level]
        if run not in table:  # it reached this interval by a copy, not at the one it is ranked at
            return go_on(state, step, value)
        bottom, top = self._quantiles(table)
        if run in top:
            return self._keep(state, step, value)
        # A donor's snapshot may be of the interval it is ranked at (a member that ran ahead and is
        # ranked where the others are may go back there), or the one before the furthest it
        # reached, once: a member that went back so is judged there again, and then copies only a
        # snapshot of that interval or later (going back to a slow or ended donor again and again
        # could loop for ever).
        state.furthest = max(state.furthest, rung)
        if state.went_back == state.furthest:
            since = state.furthest
        else:
            since = min(level, state.furthest - self.config.interval)
        if run not in bottom:
            return go_on(state, step, value)
        offers = {name: self._offer(name, run, since) for name in top}
        donors = [name for name in top if offers[name] is not None]
        if not donors:
            return go_on(state, step, value)
        # Seeded by the step as a float: a report's step may be 8 (its JSON line), its replay 8.0 (SQLite).
        rng = random.Random(f"{self.config.seed}/{run}/{float(step)!r}")
        donor = donors[rng.randrange(len(donors))]
        offered = offers[donor]
        assert offered is not None
        at, there, values = offered
        explored, changed = self._explore(values, rng)
        self._exploits[run] = Exploit(run, donor, at, explored, changed, there)
        return EXPLOIT

    def _offer(self, donor: str, copier: str, since: float) -> tuple[float, Value, dict[str, Any]] | None:
        """The snapshot ``copier`` would copy of ``donor`` (the copy rule, in the module's text), or None."""
        state = self.members[donor]
        offered = [snapshot for snapshot in (state.snapshots[-1:] + [state.best]) if snapshot is not None]
        for step, value, values in sorted(offered, key=lambda snapshot: -snapshot[0]):
            if step < since:
                continue
            interval = math.floor(step / self.config.interval) * self.config.interval
            own = self._at.get(interval, {}).get(copier, self.members[copier].last_value)
            if own is None or not self.ranking.worse(value, own):
                return step, value, values
        return None

    def resumed(self, run: str) -> None:
        """``run``'s exploit was made (it goes on from the donor's snapshot, with its new values), or
        its turn came (it goes on from its own checkpoint)."""
        if self._turns.pop(run, None) is not None:
            return
        exploit = self._exploits.pop(run)
        state = self.members[run]
        state.went_back = state.furthest if exploit.step < state.furthest else None
        state.snapshots, state.best = [], None  # of the weights it dropped: no member copies them now
        state.values = dict(exploit.values)
        state.last_step = state.judged_at = exploit.step
        state.last_value = exploit.value  # ranked as the member it copied until it is judged again
        level = math.floor(exploit.step / self.config.interval) * self.config.interval
        if exploit.value is not None and level > 0:  # and at the donor's interval, where it went on from
            self._at.setdefault(level, {})[run] = exploit.value

    def ended(self, run: str) -> None:
        """``run`` ended: its last value still ranks it, and its snapshot may still be copied."""
        self._exploits.pop(run, None)
        self._turns.pop(run, None)
        self._ended.add(run)

    def close(self) -> bool:
        """No more members will begin (some were done before, or never start): the members that
        wait for their turn no longer wait for new ones. Whether this changed anything."""
        changed, self._closed = not self._closed, True
        return changed

    # --- what it decides -------------------------------------------------------------------------

    def next(self, *, more_new: bool) -> Next:
        """A member that exploits resumes before anything (the first by name); then a member that has
        not begun; then the member that waits for its turn at the earliest step."""
        if self._exploits:
            run = min(self._exploits)
            return Next("resume", run, self._exploits[run].step)
        if more_new and not self._closed and len(self.members) < self.population:
            return Next("new")
        crowded = self.population > self.slots > 0
        slowest = [] if crowded or not self._turns else self._slowest()
        turns = [name for name, at in self._turns.items() if crowded or not self._behind(name, at, slowest)]
        if turns:
            run = min(turns, key=lambda name: (self._turns[name], name))
            return Next("resume", run, self._turns[run])
        return Next("new") if more_new else Next("none")

    @property
    def paused(self) -> Mapping[str, float]:
        """Each member waiting to resume (from a donor, or for its turn), and the step it resumes at."""
        return {**self._turns, **{run: exploit.step for run, exploit in self._exploits.items()}}

    def waits_for_turn(self, run: str) -> bool:
        return run in self._turns

    def exploit_of(self, run: str) -> Exploit | None:
        """What ``run`` resumes from (decided, not yet resumed), if it exploits."""
        return self._exploits.get(run)

    def values_of(self, run: str) -> dict[str, Any] | None:
        """``run``'s current values of the explored keys (its config's, or the last exploit's)."""
        state = self.members.get(run)
        return None if state is None else dict(state.values)

    @property
    def finished(self) -> bool:
        """Every member has ended and no more will begin: no member copies a snapshot any more."""
        return (
            bool(self.members)
            and (self._closed or len(self.members) >= self.population)
            and self._ended.issuperset(self.members)
            and not self._exploits
            and not self._turns
        )

    def needed_snapshots(self, run: str) -> set[float]:
        """The steps of ``run``'s snapshots that must be kept: its latest and its best (what it offers
        as a donor), those an exploit not yet made copies, and the ``keep`` before the latest of the
        best member. Once the population has :attr:`finished`, only the ``keep`` latest of the
        member that ended best: no member copies any other."""
        state = self.members.get(run)
        if state is None:
            return set()
        if self.finished:
            values = {name: m.last_value for name, m in self.members.items() if m.last_value is not None}
            ranked = self.ranking.order(values)
            kept = state.snapshots[-self.config.keep :] if self.config.keep and ranked[:1] == [run] else []
            return {step for step, _, _ in kept}
        needed = {step for step, _, _ in state.snapshots[-1:] + ([state.best] if state.best else [])}
        needed |= {e.step for e in self._exploits.values() if e.donor == run}
        if self.config.keep and run == self.best():
            needed |= {step for step, _, _ in state.snapshots[-1 - self.config.keep : -1]}
        return needed

    def best(self) -> str | None:
        """The member with the best value at its latest judgement (ties by name)."""
        ranked = self._ranked()
        return ranked[0] if ranked else None

    def _ranked(self) -> list[str]:
        members = self.members.items()
        return self.ranking.order(
            {name: m.last_value for name, m in members if m.last_value is not None and name not in self._ended}
        )

    def _need(self) -> int:
        """How many members an interval needs to have been judged at before members are ranked there."""
        return max(2, math.ceil(len(self.members) / 2))

    def _level(self, rung: float) -> float | None:
        """The interval a member judged at ``rung`` is ranked at: the latest, up to ``rung``, that at
        least half the members (and two) have been judged at. Members are ranked by their values at
        one step: a metric that grows as a run trains (an accuracy, a return) would otherwise rank
        a member that runs ahead above better ones that are behind, and never let it copy them."""
        need = self._need()
        # From the highest interval down (the latest is nearly always ready): not a scan of every
        # interval at every report, which grew with the square of the intervals.
        for index in range(bisect.bisect_right(self._levels, rung) - 1, -1, -1):
            if len(self._at[self._levels[index]]) >= need:
                return self._levels[index]
        return None

    def _quantiles(self, values: Mapping[str, Value] | None = None) -> tuple[list[str], list[str]]:
        """The bottom and the top ``quantile`` of ``values`` (by member; else each member's value at
        its latest judgement), best first within each, ties by name (several objectives: ranked
        by Pareto front, then crowding distance: trials.Ranking)."""
        ranked = self._ranked() if values is None else self.ranking.order(values)
        if len(ranked) < 2:  # the first judged is the top of one: its snapshot is the first donor's
            return [], ranked
        size = min(max(1, math.ceil(len(ranked) * self.config.quantile)), len(ranked) // 2)
        # The bottom is of the members that still train: a member that ended still ranks (and may be
        # a donor), but it copies no one, and the worst of those that do were left to train on as they
        # were. (Seen on bench/pbt_bench.py with 8 slots on a loaded machine: 3 members started
        # seconds before the others, ran to the end alone, and then filled the bottom of every
        # interval: the two worst members that trained on never copied after step 12.)
        training = [name for name in ranked[size:] if name not in self._ended]
        return training[-size:], ranked[:size]

    def _explore(self, values: Mapping[str, Any], rng: random.Random) -> tuple[dict[str, Any], dict[str, str]]:
        c = self.config
        explored, changed = dict(values), {}
        for key in sorted(set(c.perturb) | set(c.resample)):
            if key not in explored:
                continue
            if key in c.resample and rng.random() < c.resample_probability:
                explored[key] = c.resample[key].sample(rng)
                changed[key] = "resampled"
            elif key in c.perturb and isinstance(explored[key], (int, float)) and not isinstance(explored[key], bool):
                factor = c.perturb[key][rng.randrange(len(c.perturb[key]))]
                scaled = _scaled(explored[key], factor)
                if scaled is None:  # past float's range: kept
                    changed[key] = f"kept (x{factor:g} is out of range)"
                else:
                    explored[key] = scaled
                    changed[key] = f"x{factor:g}"
        return explored, changed


def _scaled(value: float, factor: float) -> float | None:
    """``value * factor``, an int kept an int (rounded, at least 1 away from 0 when it was); None
    when that is past float's range (an int of 400 digits, a float scaled to inf)."""
    try:
        product = value * factor
    except OverflowError:
        return None
    if not math.isfinite(product):
        return None
    if isinstance(value, int):
        scaled = round(product)
        return scaled if scaled != 0 or value == 0 else (1 if value > 0 else -1)
    return product


class PbtRule(Pausing):
    """The ``pbt`` config as the engine's rule: its runs report ``metric`` and wait at each multiple
    of ``interval`` (``min_step``) below ``max_step`` for the scheduler's word."""

    pbt: PbtConfig | None = None

    @property
    def config(self) -> PbtConfig:
        assert self.pbt is not None
        return self.pbt

    @property
    def rungs(self) -> list[float]:
        """The multiples of ``interval`` below ``max_step`` (what a member may be judged at)."""
        c = self.config
        return [c.interval * k for k in range(1, math.ceil(c.max_step / c.interval)) if c.interval * k < c.max_step]

    def crossed(self, last: float, step: float) -> bool:
        c = self.config
        boundary = math.floor(step / c.interval) * c.interval
        return 0 < boundary < c.max_step and boundary > last

    def waits(self) -> dict[str, Any]:
        return {"every": self.config.interval, "below": self.config.max_step, "wait": PBT_WAIT}

    def describe(self) -> str:
        c = self.config
        changes = ", ".join(
            [f"{key} x{'/'.join(f'{f:g}' for f in factors)}" for key, factors in sorted(c.perturb.items())]
            + [f"{key} drawn again" for key in sorted(c.resample)]
        )
        return (
            f"population-based training on {self.judged_by()}: every {c.interval:g} steps the bottom "
            f"{c.quantile:g} copy the top {c.quantile:g} ({changes}), up to step {c.max_step:g}"
        )


def pbt_rule(config: PbtConfig) -> PbtRule:
    return PbtRule(
        metric=config.metric,
        mode=config.mode,
        min_step=config.interval,
        max_step=config.max_step,
        method="pbt",
        pbt=config,
        objectives=config.objectives,
    )


def perturbed_keys(config: PbtConfig) -> Sequence[str]:
    """The keys a member's values may change in, sorted."""
    return sorted(set(config.perturb) | set(config.resample))
