"""What runs next, and when a run pauses: the decisions of the methods that pause runs at rungs and
resume the best later (promotion-based ASHA, Hyperband), pure and table-tested.

Stopping a run at a rung judges it against the runs that reached the rung before it, so what a
stopping rule keeps depends on the order the grid is written in (``stopping.py``; a grid of
learning rates listed ascending may stop none). A *pausing* method judges no run before enough
others are seen: every run pauses when it reaches a rung, and when a slot frees the method picks
what runs next, the best paused run that the rung's top ``1/reduction_factor`` holds (resumed from
its checkpoint up to the next rung), or else a new configuration.

* :class:`PromotionAsha` is the paper's ASHA (Li et al., MLSys 2020, Algorithm 2): rungs at
  ``min_step * reduction_factor**k`` below ``max_step``; ``next()`` promotes, from the highest
  rung down, a run in the top ``floor(n / reduction_factor)`` of the ``n`` values recorded at its
  rung that was not promoted from there before.
* :class:`AsyncHyperband` runs brackets of it (asynchronous Hyperband, Li et al., MLSys 2020;
  Ray Tune's ASHAScheduler with ``brackets``): bracket ``s`` starts its runs at rung ``s``, so
  some configurations are first judged late, where curves that cross early have crossed; new
  configurations go to the brackets in turn.

* :class:`Hyperband` (Li et al., JMLR 2018; Ray Tune's HyperBandScheduler) runs brackets of
  *synchronous* successive halving: a rung of a bracket promotes its best only once every run
  expected there has reported.

Measured on the early-stopping benchmark's curves (``bench/pausing_sim.py``: 36 configurations x
27 steps, 4 slots, reduction factor 3), as shares of the grid's steps and the best final loss
kept over the true best, in three orders (ascending, descending, the worst of three shuffles):

===================  ==========================  ==========================
method               rungs from step 1           rungs from step 3
===================  ==========================  ==========================
stopping ASHA        71 %, 20 %, 17 %; 1.194     72 %, 36 %, 28 %; 1.000
promotion ASHA       52 %, 13 %, 13 %; 1.038     60 %, 30 %, 28 %; 1.000
Hyperband            27 % in every order; 1.000  48 % in every order; 1.038
===================  ==========================  ==========================

(The engine running these methods over processes measured the same: ``bench/early_stop_bench.py``.)

Asynchronous promotion bounds what it promotes by what its rung has seen, not by the grid: every
new configuration of a grid listed from its worst up is the best yet and is promoted as it
arrives (the first, ascending, share of each cell above). ASHA assumes configurations come at random, so the
engine gives it a grid's configurations in a drawn order (``engine/pauses.Pauses.drawn``).
Hyperband's synchronous brackets judge no run before all it is judged against are seen, so the
grid's order changes nothing but which configuration lands in which bracket.

With several objectives (``early_stop: {..., objectives: {loss: min, latency: min}}``), a value at
a rung is each objective's, and a rung's "best" are the first of :class:`Ranking`'s order: by
non-dominated front, then crowding distance, then the first objective (MO-ASHA's selection,
Schmucker et al., 2021); ``bench/pausing_sim.py --objectives`` measures it.

Given the same events in the same order, a method decides the same: the engine rebuilds one at
each start by replaying what its ledger recorded (which run began in which bracket, each value
at a rung, each promotion, each end, and when the sweep had no more new configurations:
``engine/pauses.py``), then goes on. Nothing here reads a clock, a file or a random number.

A grid ends, where the paper's stream of configurations does not: once the sweep has no more new
ones (:meth:`close`), promotion ASHA promotes at least the best run of a rung that no running run
can still reach, so that a grid smaller than ``reduction_factor ** rungs`` still trains its best to
``max_step``; Hyperband's brackets take no more runs, so that their rungs fill.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .base import CONTINUE, PAUSE, Next, Ranking, Value
from .stopping import asha_rungs


def _rung_at(
    rungs: tuple[float, ...], values: Sequence[Mapping[str, Value]], run: str, step: float, max_step: float
) -> float | None:
    """The highest of ``rungs`` at or below ``step`` if ``run`` has no value there yet (a run that
    reports sparsely is recorded at the highest rung it passed); None at or past ``max_step``."""
    if step >= max_step:
        return None
    for index in range(len(rungs) - 1, -1, -1):
        if rungs[index] <= step:
            return None if run in values[index] else rungs[index]
    return None


class _Bracket:
    """One successive-halving ladder: the values recorded at each of its rungs, and promotions."""

    def __init__(self, rungs: tuple[float, ...], factor: float, ranking: Ranking) -> None:
        self.rungs, self.factor, self.ranking = rungs, factor, ranking
        self.values: list[dict[str, Value]] = [{} for _ in rungs]  # rung index -> run -> value there
        # rung index -> (standing, run), best first: one metric's kept sorted as values come (a
        # promotion looks at the top of a rung at every decision; sorting it each time made a grid's
        # decisions cost its size squared); several objectives' ranked again at each value (a new
        # point moves others between fronts), the standing a run's place
        self.ranked: list[list[tuple[float, str]]] = [[] for _ in rungs]
        self.places: list[dict[str, int]] = [{} for _ in rungs]  # several objectives: rung -> run -> place
        self.promoted: list[set[str]] = [set() for _ in rungs]  # rung index -> runs promoted from it

    def record(self, index: int, run: str, value: Value) -> None:
        """``run``'s value at rung ``index`` (once: the methods record a rung a run has no value at)."""
        self.values[index][run] = value
        if self.ranking.several:
            order = self.ranking.order(self.values[index])
            self.ranked[index] = [(place, name) for place, name in enumerate(order)]
            self.places[index] = {name: place for place, name in enumerate(order)}
        else:
            bisect.insort(self.ranked[index], (self.ranking.signed(value), run))

    def standing(self, index: int, run: str) -> float:
        """Where ``run`` stands at rung ``index``, lower better: its signed value, or its place in the
        rung's ranking by several objectives (two brackets' rungs at one step compare by place:
        each one's best first)."""
        if not self.ranking.several:
            return self.ranking.signed(self.values[index][run])
        return self.places[index][run]

    def keep(self, index: int, complete: bool = False) -> int:
        """How many of rung ``index``'s best go on: ``floor(n / factor)``; ``complete`` (no run can
        still record a value there), at least the best one, so that a grid smaller than
        ``factor**rungs`` still trains its best to ``max_step``."""
        count = len(self.values[index])
        return math.floor(count / self.factor) or (1 if complete and count else 0)

    def promotable(self, index: int, complete: bool = False) -> list[str]:
        """The runs at rung ``index`` in its top :meth:`keep` not yet promoted from it, best first."""
        return [run for _, run in self.ranked[index][: self.keep(index, complete)] if run not in self.promoted[index]]


class PromotionAsha:
    """Asynchronous successive halving that pauses runs at rungs and promotes the best."""

    def __init__(
        self,
        *,
        min_step: float,
        max_step: float,
        reduction_factor: float = 3.0,
        mode: str = "min",
        brackets: int = 1,
        objectives: Sequence[tuple[str, str]] = (),
    ) -> None:
        """``objectives``: several (metric, mode), ranked by Pareto front (``mode`` is then unused)."""
        self.ranking = Ranking([way for _, way in objectives] or [mode])
        self.max_step, self.factor, self.mode = max_step, reduction_factor, mode
        rungs = asha_rungs(min_step, max_step, reduction_factor)
        # Bracket s starts at rung s (Hyperband); one bracket is ASHA. No bracket starts at max_step.
        self._brackets = [
            _Bracket(rungs[s:], reduction_factor, self.ranking) for s in range(min(brackets, len(rungs) + 1))
        ]
        self._bracket_of: dict[str, int] = {}
        self._paused: dict[str, int] = {}  # run -> the rung index (in its bracket) it waits at
        self._new = 0  # configurations begun: the next one goes to bracket _new % len(brackets)
        self._members: list[list[str]] = [[] for _ in self._brackets]  # bracket -> its runs
        self._ended: set[str] = set()
        # No more new configurations: a rung no running run can still reach promotes at least its best.
        self._closed = False

    # --- what the engine tells it -------------------------------------------------------

    def began(self, run: str, bracket: int, config: Mapping[str, Any] | None = None) -> None:
        """``run`` is a new configuration, started in ``bracket`` (as :meth:`next` said); ValueError
        for a bracket there is not (a damaged record replayed)."""
        if not isinstance(bracket, int) or not 0 <= bracket < len(self._brackets):
            raise ValueError(f"bracket {bracket!r} is not one of the {len(self._brackets)} bracket(s)")
        self._bracket_of[run] = bracket
        self._members[bracket].append(run)
        self._new += 1

    def rung_reached(self, run: str, step: float) -> float | None:
        """The rung a report at ``step`` records a value at (the highest at or below it that the run
        has no value at yet); None: no rung to record."""
        bracket = self._brackets[self._bracket_of.get(run, 0)]
        return _rung_at(bracket.rungs, bracket.values, run, step, self.max_step)

    def report(self, run: str, rung: float, value: Value, step: float | None = None, *, late: bool = False) -> str:
        """``run`` reached ``rung`` with ``value`` there (recorded before anything acts on it). It
        goes on (:data:`CONTINUE`) when it is promotable from there at once and no paused run is
        owed a promotion from a higher rung; otherwise it pauses (:data:`PAUSE`) and waits for
        :meth:`next` to promote it, which may never happen."""
        number = self._bracket_of.get(run, 0)
        bracket = self._brackets[number]
        index = bracket.rungs.index(rung)
        bracket.record(index, run, self.ranking.checked(value))
        owed = self._owed()
        if run in bracket.promotable(index, self._complete(number, index, {})) and not (owed and owed[0][0] < -rung):
            bracket.promoted[index].add(run)
            return CONTINUE
        self._paused[run] = index
        return PAUSE

    def resumed(self, run: str) -> None:
        """``run`` was promoted by :meth:`next` and runs again (replayed at a restart as recorded)."""
        index = self._paused.pop(run)
        self._brackets[self._bracket_of.get(run, 0)].promoted[index].add(run)

    def ended(self, run: str) -> None:
        """``run`` ended (it reached ``max_step``, failed, or was stopped): it waits for nothing."""
        self._paused.pop(run, None)
        self._ended.add(run)

    # --- what it decides -------------------------------------------------------------------

    def next(self, *, more_new: bool) -> Next:
        """What a free slot runs: the best promotable paused run at the highest rung step (of every
        bracket), or else a new configuration (``more_new``: the sweep has one), or nothing (and,
        with no more new configurations, :meth:`close`)."""
        if not more_new:
            self.close()
        owed = self._owed()
        if owed:
            _, _, run, number, index = owed[0]
            return Next("resume", run, self._brackets[number].rungs[index], number)
        if more_new:
            return Next("new", bracket=self._new % len(self._brackets))
        return Next("none")

    def close(self) -> bool:
        """No more new configurations: from now on a rung that no running run can still reach
        promotes at least its best run (the paper's ASHA assumes an endless stream; a grid ends, and
        its best must reach ``max_step``). Whether this changed anything."""
        changed, self._closed = not self._closed, True
        return changed

    def _complete(self, number: int, index: int, known: dict[tuple[int, int], bool]) -> bool:
        """Whether no run can still record a value at rung ``index`` of bracket ``number``: the sweep
        has no more new configurations, and every run of the bracket that is running (neither paused
        nor ended) has a value there (``known``: answers of this decision, kept)."""
        if not self._closed:
            return False
        if (number, index) not in known:
            values = self._brackets[number].values[index]
            known[number, index] = all(
                run in values or run in self._paused or run in self._ended for run in self._members[number]
            )
        return known[number, index]

    @property
    def paused(self) -> Mapping[str, float]:
        """Each paused run and the rung step it waits at."""
        return {run: self._brackets[self._bracket_of.get(run, 0)].rungs[i] for run, i in self._paused.items()}

    def _owed(self) -> list[tuple[float, float, str, int, int]]:
        """The paused runs a promotion is owed to, first the one :meth:`next` resumes: the highest
        rung step first, then the best value (several objectives: the best place at its rung), then
        the name (so that the order is the same at every replay): ``(-step, standing, run, bracket,
        rung index)``."""
        owed = []
        known: dict[tuple[int, int], bool] = {}
        for number, bracket in enumerate(self._brackets):  # the top of each rung, not every paused run
            for index, step in enumerate(bracket.rungs):
                complete = len(bracket.values[index]) < self.factor and self._complete(number, index, known)
                for run in bracket.promotable(index, complete):
                    if self._paused.get(run) == index and self._bracket_of.get(run, 0) == number:
                        owed.append((-step, bracket.standing(index, run), run, number, index))
        return sorted(owed)


class AsyncHyperband(PromotionAsha):
    """Brackets of promotion ASHA, bracket ``s`` starting at rung ``s`` (as many brackets as
    rungs, and one that runs each of its configurations to ``max_step``)."""

    def __init__(
        self,
        *,
        min_step: float,
        max_step: float,
        reduction_factor: float = 3.0,
        mode: str = "min",
        objectives: Sequence[tuple[str, str]] = (),
    ) -> None:
        rungs = asha_rungs(min_step, max_step, reduction_factor)
        super().__init__(
            min_step=min_step,
            max_step=max_step,
            reduction_factor=reduction_factor,
            mode=mode,
            brackets=len(rungs) + 1,
            objectives=objectives,
        )


class _Ladder:
    """One bracket of synchronous successive halving: its runs, and at each rung the values seen
    and the runs promoted once every run expected there had reported."""

    def __init__(self, rungs: tuple[float, ...], size: int) -> None:
        self.rungs, self.size = rungs, size  # rungs: where it judges (its start first); size: runs it takes
        self.runs: list[str] = []
        self.values: list[dict[str, Value]] = [{} for _ in rungs]
        self.promoted: list[list[str] | None] = [None for _ in rungs]  # decided once the rung is full
        self.gone: set[str] = set()  # runs that ended before reaching a rung (failed, stopped)
        self.closed = False  # takes no more runs (full, or the sweep has no more configurations)

    def expected(self, index: int) -> list[str]:
        """The runs that report at rung ``index``: all of its runs at its first, then those promoted."""
        before = self.runs if index == 0 else (self.promoted[index - 1] or [])
        return [run for run in before if run not in self.gone]

    def full(self, index: int) -> bool:
        """Whether every run expected at rung ``index`` reported there (none is expected at a rung
        above one not judged yet: it is not full, however empty)."""
        if index > 0 and self.promoted[index - 1] is None:
            return False
        return self.closed and all(run in self.values[index] for run in self.expected(index))


class Hyperband:
    """Hyperband (Li et al., JMLR 2018) as Ray Tune's HyperBandScheduler runs it: brackets of
    synchronous successive halving, filled in turn by new configurations.

    With levels ``min_step * reduction_factor**k`` up to ``max_step`` (``s_max + 1`` of them),
    bracket ``s`` (from ``s_max`` down to 0) takes ``ceil((s_max + 1) / (s + 1) * factor**s)``
    configurations and first judges them at level ``s_max - s``: the most exploratory bracket
    starts every configuration at ``min_step``, the last runs each to ``max_step``. A run that
    reaches one of its bracket's rungs pauses until every run of the bracket expected there has
    reported (the bracket takes no more configurations once it holds its share, or the sweep has
    no more); then the best ``floor(n / factor)`` are promoted, the best first, and the rest stay
    paused for good. No run is judged before all it is judged against are seen, so the order of
    the grid decides nothing. New configurations are spread over a round's brackets in their
    shares (:meth:`_bracket_for_new`), and more than a round holds start the brackets again.
    """

    def __init__(
        self,
        *,
        min_step: float,
        max_step: float,
        reduction_factor: float = 3.0,
        mode: str = "min",
        objectives: Sequence[tuple[str, str]] = (),
    ) -> None:
        """``objectives``: several (metric, mode), ranked by Pareto front (``mode`` is then unused)."""
        self.ranking = Ranking([way for _, way in objectives] or [mode])
        self.max_step, self.factor, self.mode = max_step, reduction_factor, mode
        self._levels = asha_rungs(min_step, max_step, reduction_factor)  # the rungs; max_step is the end
        top = len(self._levels)  # s_max
        self._shapes = [
            (self._levels[top - s :], math.ceil((top + 1) / (s + 1) * reduction_factor**s)) for s in range(top, -1, -1)
        ]
        self._ladders: list[_Ladder] = []
        self._ladder_of: dict[str, int] = {}
        self._paused: dict[str, int] = {}  # run -> the rung index (of its ladder) it waits at

    def began(self, run: str, bracket: int, config: Mapping[str, Any] | None = None) -> None:
        """``run`` began in ``bracket``. ValueError for a bracket the method cannot have given (a
        damaged record replayed: a bracket of 10**12 would otherwise make brackets for ever): at
        most one round past the brackets there are (:meth:`_bracket_for_new`)."""
        if not isinstance(bracket, int) or not 0 <= bracket <= len(self._ladders) + len(self._shapes):
            raise ValueError(f"bracket {bracket!r} is none Hyperband gives with {len(self._ladders)} bracket(s) begun")
        while len(self._ladders) <= bracket:
            rungs, size = self._shapes[len(self._ladders) % len(self._shapes)]
            self._ladders.append(_Ladder(rungs, size))
        ladder = self._ladders[bracket]
        ladder.runs.append(run)
        ladder.closed = ladder.closed or len(ladder.runs) >= ladder.size
        self._ladder_of[run] = bracket

    def rung_reached(self, run: str, step: float) -> float | None:
        ladder = self._ladders[self._ladder_of[run]]
        return _rung_at(ladder.rungs, ladder.values, run, step, self.max_step)

    def report(self, run: str, rung: float, value: Value, step: float | None = None, *, late: bool = False) -> str:
        """``run`` reached ``rung``: it pauses, unless its value completes the rung and puts it
        among the promoted (it goes on at once; the others promoted wait for :meth:`next`)."""
        number = self._ladder_of[run]
        ladder = self._ladders[number]
        index = ladder.rungs.index(rung)
        ladder.values[index][run] = self.ranking.checked(value)
        self._paused[run] = index
        self._judge(ladder, index)
        promoted = ladder.promoted[index]
        if promoted is not None and run in promoted:
            del self._paused[run]
            return CONTINUE
        return PAUSE

    def resumed(self, run: str) -> None:
        del self._paused[run]

    def ended(self, run: str) -> None:
        """``run`` ended: at ``max_step``, or before reaching its next rung (failed, stopped), in which
        case its bracket expects it nowhere any more."""
        self._paused.pop(run, None)
        ladder = self._ladders[self._ladder_of[run]]
        ladder.gone.add(run)
        for index in range(len(ladder.rungs)):
            self._judge(ladder, index)

    def next(self, *, more_new: bool) -> Next:
        """The best promoted run still paused, from the highest rung; else a new configuration for
        the bracket being filled; else nothing (and, with no more configurations, every bracket
        takes no more, so that its rungs can fill)."""
        if not more_new:
            self.close()
        owed = []
        for number, ladder in enumerate(self._ladders):  # the runs promoted, not every paused run
            for index, promoted in enumerate(ladder.promoted):
                for place, run in enumerate(promoted or ()):
                    if self._paused.get(run) == index and self._ladder_of[run] == number:
                        # several objectives: its place among the promoted (best first)
                        standing = place if self.ranking.several else self.ranking.signed(ladder.values[index][run])
                        owed.append((-ladder.rungs[index], standing, run, index))
        if owed:
            _, _, run, index = min(owed)
            number = self._ladder_of[run]
            return Next("resume", run, self._ladders[number].rungs[index], number)
        if more_new:
            return Next("new", bracket=self._bracket_for_new())
        return Next("none")

    def close(self) -> bool:
        """The sweep has no more new configurations: every bracket takes no more, so that its rungs
        can fill. Whether a bracket was still open (the engine records that it closed them)."""
        changed = False
        for ladder in self._ladders:
            if not ladder.closed:
                ladder.closed = changed = True
                for index in range(len(ladder.rungs)):
                    self._judge(ladder, index)
        return changed

    def _bracket_for_new(self) -> int:
        """The bracket a new configuration joins: the brackets of a round share its configurations
        as Hyperband sizes them (27, 12, 6 and 4 of 49 for rungs at 1, 3 and 9 of 27), spread out
        (the one furthest behind its share first), so that a grid smaller than a round reaches
        every bracket; a round whose brackets are all full starts the next."""
        shares = len(self._shapes)
        first = max(0, (len(self._ladders) - 1) // shares * shares)
        sizes = [size for _, size in self._shapes]
        taken = [  # a closed bracket takes no more: as good as full
            (sizes[s] if self._ladders[first + s].closed else len(self._ladders[first + s].runs))
            if first + s < len(self._ladders)
            else 0
            for s in range(shares)
        ]
        if all(t >= size for t, size in zip(taken, sizes, strict=True)):
            return first + shares
        done = sum(taken) + 1
        behind = [size * done / sum(sizes) - t if t < size else -math.inf for t, size in zip(taken, sizes, strict=True)]
        return first + max(range(shares), key=lambda s: (behind[s], -s))

    @property
    def paused(self) -> Mapping[str, float]:
        return {run: self._ladders[self._ladder_of[run]].rungs[i] for run, i in self._paused.items()}

    def _judge(self, ladder: _Ladder, index: int) -> None:
        """Promote the best ``floor(n / factor)`` of a rung once it is full (once)."""
        if ladder.promoted[index] is not None or not ladder.full(index):
            return
        values = ladder.values[index]
        ranked = self.ranking.order({run: value for run, value in values.items() if run not in ladder.gone})
        ladder.promoted[index] = ranked[: math.floor(len(ranked) / self.factor)] or ranked[:1]
