"""A search's runs: what the sampler asked, as runs of the sweep, and how each ended, told back.

The sampler itself (random, or Optuna's) and its records are ``tuning/search.py``'s; this module
is where its trials become :class:`RunSpec` s (named as any run of the sweep is) and where the
engine's word that a run settled reaches it. A search thus depends on nothing of the sweep's, and
the sweep on the search only through here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import did_you_mean
from ..layout import META
from ..tuning.search import BUILTIN_VALUES, objective, open_searcher, spent_message, violations
from ..tuning.space import complete
from .naming import NameRegistry
from .spec import NOT_READY, Foreign, RunSpec

if TYPE_CHECKING:
    from ..tuning.search import Search, Searcher, Trial
    from ..tuning.space import Distribution
    from .options import SchedulerOptions

logger = logging.getLogger("gpu_task_scheduler")


class Sweep(Protocol):
    """What a search's runs need of their sweep (sweep/expand.py's ``Sweep``, which calls this
    module): written out here, so that this module depends on nothing of the one that uses it."""

    options: SchedulerOptions
    search: Search | None
    searcher: Searcher | None
    space: dict[str, Distribution]
    selected: frozenset[str] | None
    parallel: int
    live: bool
    trial_of: dict[str, int]
    twins: dict[str, list[int]]
    asked: int
    in_flight: int
    waiting: set[str]
    lookup: Callable[[str], Any]

    def trial_run(self, trial: Trial, registry: NameRegistry, foreign: Foreign | None) -> RunSpec: ...

    def followers(self, run: RunSpec, registry: NameRegistry, foreign: Foreign | None) -> Iterator[RunSpec]: ...


def search_runs(sweep: Sweep, foreign: Foreign | None) -> Iterator[RunSpec]:
    """The runs a search asked so far (after a restart: those not yet told first) and, once the
    engine runs the sweep (``sweep.live``), new ones: at most ``sweep.parallel`` unsettled at a
    time, and ``n_runs`` trials in all, over every start. A trial that asks for values an earlier
    trial has (a small discrete space) runs nothing: it is told what its twin is told."""
    search = sweep.search
    assert search is not None
    meta = os.path.join(sweep.options.result_root_folder, META)  # the root's records (records/paths.py)
    if not sweep.live and not os.path.isdir(meta):
        return  # nothing asked yet, and only the engine asks
    searcher = sweep.searcher = open_searcher(search, sweep.space, meta, read_only=not sweep.live)
    registry = NameRegistry()
    sweep.trial_of.clear()
    sweep.twins.clear()
    unfinished: list[RunSpec] = []
    followers: list[RunSpec] = []
    sweep.asked = 0
    for trial in searcher.trials():
        if not complete(sweep.space, trial.values):
            # Asked by a scheduler killed before the sampler had given all its values: no run ever
            # had them. Told failed (the sampler learns nothing from it) and not counted.
            if sweep.live and not trial.done:
                searcher.tell(trial.number, None)
            continue
        sweep.asked += 1
        searcher.check(trial)
        spec = sweep.trial_run(trial, registry, foreign)
        if trial.name is None and sweep.live:
            searcher.name(trial.number, spec.name)
        later = [] if spec.duplicate else list(sweep.followers(spec, registry, foreign))
        if sweep.selected is not None:  # `gts retry`: those runs again, whatever they were told
            if spec.name in sweep.selected and not spec.duplicate:
                unfinished.append(spec)
            later = [run for run in later if run.name in sweep.selected]
        elif not sweep.live:
            if not spec.duplicate:
                unfinished.append(spec)
        elif not trial.done:
            if spec.duplicate:
                _twin(sweep, spec.name, trial.number)
            else:
                unfinished.append(spec)
        followers.extend(later)  # the runs of later stages: each start decides them (skip or run)
    if sweep.live and sweep.selected is None and sweep.asked >= search.n_runs:
        logger.warning("%s", spent_message(search.n_runs, len(unfinished)))
    for spec in unfinished:
        sweep.in_flight += sweep.live
        yield spec
    yield from followers
    if not sweep.live or sweep.selected is not None:
        return
    while sweep.asked < search.n_runs:
        if sweep.in_flight >= sweep.parallel:
            yield NOT_READY  # the next values are asked when a slot is free, knowing more
            continue
        trial = searcher.ask()
        sweep.asked += 1
        searcher.check(trial)
        spec = sweep.trial_run(trial, registry, foreign)
        searcher.name(trial.number, spec.name)
        if spec.duplicate:
            _twin(sweep, spec.name, trial.number)
            continue
        sweep.in_flight += 1
        yield spec
        yield from sweep.followers(spec, registry, foreign)


def _twin(sweep: Sweep, name: str, number: int) -> None:
    """Trial ``number`` asked for the values of the run ``name``: told now if that run ended
    before this start, else with it."""
    record = sweep.lookup(name)
    first = sweep.trial_of[name]
    if record is not None and str(record.status) not in ("running", "interrupted") and sweep.searcher is not None:
        if sweep.searcher.done(first):
            _tell(sweep, number, str(record.status), record)
            return
    sweep.twins.setdefault(name, []).append(number)


def settled(sweep: Sweep, spec: RunSpec, status: str, record: Any) -> None:
    """Tell the sampler how ``spec`` ended (``status``: a RunStatus value; ``record``: its ledger
    record), and the trials that asked for the same values. A run interrupted by a stop is told
    nothing: it runs again at the next start. A run a pausing method paused and never promoted is
    told (``status`` paused) the value it reported at the highest rung it reached (BOHB-like), when
    the start ends with it paused; the search samples on while it waits (``Sweep.paused``)."""
    number = sweep.trial_of.get(spec.name)
    if sweep.searcher is None or number is None or sweep.search is None:
        return
    if spec.name in sweep.waiting:  # paused before: no longer counted in flight
        sweep.waiting.discard(spec.name)
    else:
        sweep.in_flight -= 1
    if status == "interrupted":
        return
    for trial in (number, *sweep.twins.pop(spec.name, ())):
        _tell(sweep, trial, status, record)


def _tell(sweep: Sweep, number: int, status: str, record: Any) -> None:
    assert sweep.searcher is not None and sweep.search is not None
    search = sweep.search
    value: float | list[float] | None = None
    constraints = None
    if status in ("succeeded", "paused"):  # paused: the value it reported at the rung it paused at
        from ..results import run_result  # what main() returned, else the run's own result.json

        result = run_result(sweep.options.result_root_folder, record) if record is not None else None
        metrics = record.metrics_value if record is not None else {}
        given = [*(result if isinstance(result, Mapping) else ()), *metrics]
        values = [objective(result, metrics, metric) for metric, _ in search.goals]
        lacking = [metric for (metric, _), found in zip(search.goals, values, strict=True) if found is None]
        for metric in lacking:
            logger.warning(
                "%s %s but gave no number for %r (neither in what it returned nor as a reported metric)%s "
                "The search is told it failed",
                record.name if record is not None else f"trial {number}",
                status,
                metric,
                did_you_mean(metric, [str(key) for key in given]),
            )
        if not lacking:
            value = values[0] if len(values) == 1 else [v for v in values if v is not None]
        if search.constraints:
            from ..results import builtin_values

            builtins = builtin_values(record) if record is not None else {"gpu_peak": 0.0}
            constraints, missing = violations(search, result, metrics, builtins)
            for key in missing:
                logger.warning(
                    "%s gave no number for %r, which a constraint bounds%s: it counts as infeasible",
                    record.name if record is not None else f"trial {number}",
                    key,
                    did_you_mean(key, [*map(str, given), *BUILTIN_VALUES]),
                )
    sweep.searcher.tell(number, value, pruned=status == "pruned", constraints=constraints)
