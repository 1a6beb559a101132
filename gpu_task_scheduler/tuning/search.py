"""What runs next when a sweep searches instead of walking a grid: ``search:`` in a config.

    search: {sampler: tpe, n_runs: 40, seed: 0, metric: loss, mode: min}
    test_config:
      - {lr: {loguniform: [1.0e-5, 1.0e-1]}, layers: {int: [2, 8]}, optimizer: [adam, sgd]}

A :class:`Searcher` asks its sampler for a run's values when the engine has a
slot for it, and tells it how the run ended when the run settles. It keeps
every trial it asked in the result root's ``.gts/`` before the run starts, so a
restarted scheduler (also after a kill -9) continues the same search: trials
whose runs never finished run again with the same values, finished ones are
told once, and the number of trials never exceeds ``n_runs``.

* ``random``: our own sampler (no dependency); trial ``i`` of seed ``s`` draws its
  values from ``random.Random(f"{s}/{i}")``, so a search is the same on every
  machine and after every restart. Trials are kept in ``.gts/search.jsonl``.
* ``tpe``, ``cmaes``, ``qmc``: Optuna's samplers through its ask/tell interface
  (the ``search`` extra), TPE with ``constant_liar`` so that runs asked at the same
  time do not collide. The study is kept in ``.gts/optuna.journal`` (Optuna's
  journal file storage), which ``optuna-dashboard`` opens.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import warnings
from collections.abc import Mapping
from typing import Any, NoReturn

from ..errors import ConfigError, DamagedRecordError, install_hint, unknown_key_message
from ..finite import finite_number
from ..recordclass import Record
from ..records.jsonlines import read_records
from ..records.paths import name_problem, open_regular, write_all
from .space import Choice, Distribution, Int, LogUniform, Uniform, active, inside

logger = logging.getLogger("gpu_task_scheduler")

SAMPLERS = ("random", "tpe", "nsga2", "cmaes", "qmc")
_KEYS = ("sampler", "n_runs", "seed", "metric", "mode", "objectives", "constraints")
# Always there for a constraint, whatever a run returns: its measured peak GPU memory (bytes on one
# GPU) and its duration (seconds).
BUILTIN_VALUES = ("gpu_peak", "duration")
MAX_RUNS = 1_000_000
EXTRA_HINT = install_hint("search")


class Search(Record):
    sampler: str
    n_runs: int
    seed: int
    metric: str  # the first objective
    mode: str  # "min" or "max"
    objectives: tuple[tuple[str, str], ...] = ()  # (metric, mode) each; () or one: metric and mode alone
    constraints: tuple[str, ...] = ()  # "gpu_peak <= 20GiB": each must hold for a run to be feasible

    @property
    def goals(self) -> tuple[tuple[str, str], ...]:
        """Every objective, (metric, mode): one for a search of one metric."""
        return self.objectives or ((self.metric, self.mode),)

    def describe(self) -> str:
        goals = ", ".join(f"{'minimizing' if mode == 'min' else 'maximizing'} {metric}" for metric, mode in self.goals)
        kept = f"; feasible when {' and '.join(self.constraints)}" if self.constraints else ""
        search = f"{self.sampler} search of {self.n_runs} runs ({goals}, seed {self.seed}){kept}"
        return search + "; values are chosen as runs finish"

    def as_config(self) -> dict[str, Any]:
        """The search as a config's ``search`` section (JSON's types)."""
        written: dict[str, Any] = {"sampler": self.sampler, "n_runs": self.n_runs, "seed": self.seed}
        if len(self.goals) > 1:
            written["objectives"] = dict(self.goals)
        else:
            written.update(metric=self.metric, mode=self.mode)
        if self.constraints:
            written["constraints"] = list(self.constraints)
        return written


class Constraint(Record):
    """``key <= bound`` (or <, >=, >): ``key`` a result, a reported metric, gpu_peak or duration."""

    key: str
    op: str
    bound: float

    def violation(self, value: float) -> float:
        """How far ``value`` is from meeting it: <= 0 when met (Optuna's convention)."""
        return value - self.bound if self.op in ("<=", "<") else self.bound - value

    def holds(self, value: float) -> bool:
        return {"<=": value <= self.bound, "<": value < self.bound, ">=": value >= self.bound, ">": value > self.bound}[
            self.op
        ]


def parse_constraint(text: Any, where: str = "search.constraints") -> Constraint:
    """``"gpu_peak <= 20GiB"``, ``"params <= 1e6"``, ``"accuracy >= 0.9"``: a bound is a number, or
    a memory size with its unit.

    >>> parse_constraint("gpu_peak <= 20GiB")
    Constraint(key='gpu_peak', op='<=', bound=21474836480.0)
    """
    import re

    match = re.fullmatch(r"\s*([^<>=\s]+)\s*(<=|>=|<|>)\s*(\S+)\s*", text) if isinstance(text, str) else None
    if match is None:
        raise ConfigError(
            f"{where}: {text!r} is no constraint; write KEY <= BOUND (or <, >=, >), e.g. 'gpu_peak <= 20GiB' "
            "or 'params <= 1e6'"
        )
    key, op, bound_text = match.groups()
    try:
        bound = float(bound_text)
    except ValueError:
        from ..gpu.devices import parse_memory

        try:
            bound = float(parse_memory(bound_text, where))
        except ConfigError:
            raise ConfigError(f"{where}: {text!r}: {bound_text!r} is neither a number nor a memory size") from None
    if not math.isfinite(bound):
        raise ConfigError(f"{where}: {text!r}: the bound must be a finite number")
    return Constraint(key, op, bound)


def parse_search(raw: Any) -> Search | None:
    if raw is None:
        return None
    example = "e.g. {sampler: tpe, n_runs: 40, metric: loss, mode: min}"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"search must be a dict, {example}; got {raw!r}")
    for key in raw:
        if key not in _KEYS:
            raise ConfigError(unknown_key_message("search", key, _KEYS))
    sampler = raw.get("sampler", "random")
    if sampler not in SAMPLERS:
        raise ConfigError(f"search: sampler must be one of {', '.join(SAMPLERS)}; got {sampler!r}")
    n_runs = raw.get("n_runs")
    if not isinstance(n_runs, int) or isinstance(n_runs, bool) or not 1 <= n_runs <= MAX_RUNS:
        raise ConfigError(f"search: n_runs must be a whole number from 1 to {MAX_RUNS:,} (the budget); got {n_runs!r}")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise ConfigError(f"search: seed must be a whole number from 0 to 2**32 - 1; got {seed!r}")
    objectives: tuple[tuple[str, str], ...] = ()
    metric: Any
    mode: Any
    if "objectives" in raw:
        if "metric" in raw or "mode" in raw:
            raise ConfigError("search: give objectives, or metric and mode for one objective, not both")
        goals = raw["objectives"]
        if not isinstance(goals, Mapping) or not goals:
            raise ConfigError(
                "search: objectives must be a dict of metric -> min or max, e.g. {loss: min, latency_ms: min}; "
                f"got {goals!r}"
            )
        for name, way in goals.items():
            if not isinstance(name, str) or not name or way not in ("min", "max"):
                raise ConfigError(f"search: objectives: {name!r}: {way!r} (each metric is min or max)")
        objectives = tuple((str(name), str(way)) for name, way in goals.items())
        metric, mode = objectives[0]
        if len(objectives) == 1:
            objectives = ()
    else:
        metric, mode = raw.get("metric"), raw.get("mode")
        if not isinstance(metric, str) or not metric:
            raise ConfigError(
                f"search: metric must name the value to optimize: a key of what main() returns (or of "
                f"result.json), or a reported metric; got {metric!r} (or give objectives: {{loss: min, ...}})"
            )
        if mode not in ("min", "max"):
            raise ConfigError(f"search: mode must be min (lower is better) or max (higher is better); got {mode!r}")
    constraints = raw.get("constraints", [])
    if not isinstance(constraints, (list, tuple)) or not all(isinstance(c, str) for c in constraints):
        raise ConfigError(
            f"search: constraints must be a list of strings, e.g. ['gpu_peak <= 20GiB']; got {constraints!r}"
        )
    for index, text in enumerate(constraints):
        parse_constraint(text, f"search.constraints[{index}]")
    if objectives and sampler == "cmaes":
        raise ConfigError("search: cmaes optimizes one objective; for several, use tpe, nsga2, qmc or random")
    if sampler != "random":
        check_optuna(sampler)
    return Search(sampler, n_runs, seed, metric, mode, objectives, tuple(constraints))


# What each of Optuna's samplers needs besides Optuna (all in the search extra).
_NEEDS = {"tpe": (), "nsga2": (), "cmaes": ("cmaes",), "qmc": ("scipy",)}


def check_optuna(sampler: str = "tpe") -> None:
    for module in ("optuna", *_NEEDS.get(sampler, ())):
        try:
            __import__(module)
        except ImportError:
            raise ConfigError(
                f"the {sampler} sampler needs {module}, which is not installed: {EXTRA_HINT} "
                "(or use sampler: random, which needs nothing)"
            ) from None


class Trial(Record):
    number: int
    values: dict[str, Any]
    name: str | None = None  # its run's folder name, once known
    done: bool = False  # the sampler was told how it ended (as :meth:`Searcher.trials` found it)


def objective(result: Any, metrics: Mapping[str, Any], metric: str) -> float | None:
    """The value a finished run is told as: ``metric`` in what ``main()`` returned (or its
    result.json), else the last value of the reported metric of that name; None when neither is a
    finite number."""
    value = result.get(metric) if isinstance(result, Mapping) else None
    if value is None:
        reported = metrics.get(metric)
        value = reported.get("last") if isinstance(reported, Mapping) else None
    if not finite_number(value):
        return None
    return float(value)


def reported(
    result: Any, metrics: Mapping[str, Any], key: str, builtins: Mapping[str, float] | None = None
) -> float | None:
    """A constraint's value: ``key`` as :func:`objective` reads it, else a builtin (gpu_peak, duration)."""
    value = objective(result, metrics, key)
    if value is None and builtins is not None and key in builtins:
        value = builtins[key]
    return value


def violations(
    search: Search, result: Any, metrics: Mapping[str, Any], builtins: Mapping[str, float]
) -> tuple[list[float], list[str]]:
    """Each constraint's violation (<= 0: it holds; a strict bound met exactly counts as a tiny
    violation), and the constraints whose value the run does not have (counted as violated)."""
    found, missing = [], []
    for text in search.constraints:
        constraint = parse_constraint(text)
        value = reported(result, metrics, constraint.key, builtins)
        if value is None:
            missing.append(constraint.key)
            found.append(1.0)
            continue
        violation = constraint.violation(value)
        if violation <= 0 and not constraint.holds(value):
            violation = 1e-12
        found.append(violation)
    return found, missing


CONSTRAINTS_ATTR = "gts_constraints"  # a trial's constraint values, as Optuna's constraints_func reads them


class Searcher:
    """Asks a sampler for trials and tells it how they ended; keeps the trials under ``meta``."""

    def __init__(self, search: Search, space: Mapping[str, Distribution], meta: str) -> None:
        self.search, self.space, self.meta = search, dict(space), meta

    def trials(self) -> list[Trial]:
        """Every trial asked so far (in any start), by number; and which are done: see :meth:`done`."""
        raise NotImplementedError

    def done(self, number: int) -> bool:
        """Whether the sampler was told how trial ``number`` ended."""
        raise NotImplementedError

    def ask(self) -> Trial:
        raise NotImplementedError

    def name(self, number: int, name: str) -> None:
        """Record the folder name given to trial ``number``'s run (before it starts)."""
        raise NotImplementedError

    def tell(
        self,
        number: int,
        value: float | list[float] | None,
        *,
        pruned: bool = False,
        constraints: list[float] | None = None,
    ) -> None:
        """How trial ``number`` ended: its value (a list: one per objective), or failed (None), or stopped
        early (``pruned``); ``constraints``: each constraint's violation (<= 0: met)."""
        raise NotImplementedError

    def check(self, trial: Trial) -> None:
        for key, distribution in self.space.items():
            if not active(distribution, trial.values):  # a conditional key whose condition is false
                if key in trial.values:
                    raise ConfigError(
                        f"the search's record of trial {trial.number} holds {key}={trial.values[key]!r}, which this "
                        "config's space samples only when its when holds (the space changed?): use another result root"
                    )
                continue
            if key not in trial.values or not inside(distribution, trial.values[key]):
                raise ConfigError(
                    f"the search's record of trial {trial.number} holds {key}={trial.values.get(key)!r}, which "
                    "is not in the space of this config (the space changed?): use another result root"
                )


def _recorded_name(name: object, number: int, where: str) -> str:
    """The run name a search's records give trial ``number``, checked as a new name is: a name
    there is as hostile as anything else under the root (``../outside`` would run outside it)."""
    problem = name_problem(name)
    if problem is not None:
        raise DamagedRecordError(
            f"{where} names the run of trial {number} {name!r}, which no sweep makes ({problem}): restore the "
            "file from a backup, or use another result root; nothing was run"
        )
    assert isinstance(name, str)
    return name


def open_searcher(search: Search, space: Mapping[str, Distribution], meta: str, *, read_only: bool = False) -> Searcher:
    """The searcher of a result root; ``read_only``: to list its trials only (``--dry-run``,
    ``ConfigManager``), writing nothing."""
    if search.sampler == "random":
        return RandomSearcher(search, space, meta, read_only=read_only)
    return OptunaSearcher(search, space, meta, read_only=read_only)


# --- random, our own -------------------------------------------------------------


class RandomSearcher(Searcher):
    def __init__(
        self, search: Search, space: Mapping[str, Distribution], meta: str, *, read_only: bool = False
    ) -> None:
        super().__init__(search, space, meta)
        self.path = os.path.join(meta, "search.jsonl")
        self._trials: dict[int, Trial] = {}
        self._done: set[int] = set()
        for record in read_records(self.path, repair=not read_only, what="the search's trials"):
            self._load(record)

    def _load(self, record: dict[str, Any]) -> None:
        number = record.get("number")
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            self._damaged(record, "no trial number")
        if "values" in record:
            if not isinstance(record["values"], dict):
                self._damaged(record, "values that are not a mapping")
            self._trials[number] = Trial(number, record["values"], self._trials.get(number, Trial(0, {})).name)
        if "name" in record:
            if number not in self._trials:
                self._damaged(record, "a name for a trial never asked")
            name = _recorded_name(record["name"], number, self.path)
            self._trials[number] = Trial(number, self._trials[number].values, name)
        if record.get("told"):
            self._done.add(number)

    def _damaged(self, record: dict[str, Any], what: str) -> NoReturn:
        raise DamagedRecordError(
            f"{self.path} holds a record with {what} ({json.dumps(record)[:80]}), which the scheduler never "
            "writes: restore the file from a backup, or use another result root; nothing was run"
        )

    def _append(self, record: dict[str, Any]) -> None:
        fd = open_regular(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            write_all(fd, (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
            os.fsync(fd)  # asked before its run starts: a restart must know of it
        finally:
            os.close(fd)

    def trials(self) -> list[Trial]:
        return [self._trials[number]._replace(done=number in self._done) for number in sorted(self._trials)]

    def done(self, number: int) -> bool:
        return number in self._done

    def ask(self) -> Trial:
        number = max(self._trials, default=-1) + 1
        rng = random.Random(f"{self.search.seed}/{number}")
        values: dict[str, Any] = {}
        for key, distribution in self.space.items():  # parents first (space.py): a when sees their values
            if active(distribution, values):
                values[key] = distribution.sample(rng)
        self._append({"number": number, "values": values})
        self._trials[number] = Trial(number, values)
        return self._trials[number]

    def name(self, number: int, name: str) -> None:
        self._append({"number": number, "name": name})
        self._trials[number] = Trial(number, self._trials[number].values, name)

    def tell(
        self,
        number: int,
        value: float | list[float] | None,
        *,
        pruned: bool = False,
        constraints: list[float] | None = None,
    ) -> None:
        if number in self._done:
            return
        told: dict[str, Any] = {"number": number, "told": True, "value": value, "pruned": pruned}
        if constraints is not None:
            told["constraints"] = constraints
        self._append(told)
        self._done.add(number)


# --- Optuna's samplers --------------------------------------------------------------


def _optuna_distribution(distribution: Distribution) -> Any:
    import optuna

    d = optuna.distributions
    if isinstance(distribution, Uniform):
        return d.FloatDistribution(distribution.low, distribution.high)
    if isinstance(distribution, LogUniform):
        return d.FloatDistribution(distribution.low, distribution.high, log=True)
    if isinstance(distribution, Int):
        return d.IntDistribution(distribution.low, distribution.high, log=distribution.log, step=distribution.step)
    assert isinstance(distribution, Choice)
    return d.CategoricalDistribution(distribution.values)


class _FlockLock:
    """The journal's lock, as an ``flock``: Optuna's default (a symbolic link) outlives a scheduler
    killed while it writes, and the next start then waits for it (30 s) before it breaks it; the
    kernel drops an ``flock`` with its holder. (The root's own lock already keeps a second
    scheduler out: this one only orders the writes of the one scheduler.)"""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        import fcntl

        self._fd = open_regular(self._path, os.O_RDWR | os.O_CREAT)  # never through a link, never a FIFO
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def _suggest(trial: Any, key: str, distribution: Distribution) -> Any:
    """Optuna's suggestion of ``key`` in a trial asked define-by-run (a space with conditional keys)."""
    if isinstance(distribution, Choice):
        return trial.suggest_categorical(key, list(distribution.values))
    if isinstance(distribution, Int):
        return trial.suggest_int(key, distribution.low, distribution.high, step=distribution.step, log=distribution.log)
    return trial.suggest_float(key, distribution.low, distribution.high, log=isinstance(distribution, LogUniform))


class OptunaSearcher(Searcher):
    NAME_ATTR = "gts_run"

    def __init__(
        self, search: Search, space: Mapping[str, Distribution], meta: str, *, read_only: bool = False
    ) -> None:
        super().__init__(search, space, meta)
        check_optuna(search.sampler)
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        for key, distribution in self.space.items():
            if isinstance(distribution, Choice) and not all(
                value is None or isinstance(value, (bool, int, float, str)) for value in distribution.values
            ):
                raise ConfigError(
                    f"test_config[0][{key!r}]: Optuna's samplers choose among None, booleans, numbers and "
                    "strings only; name the choices (e.g. 'small', 'large') and map them in the task"
                )
        self._distributions = {key: _optuna_distribution(d) for key, d in self.space.items()}
        self._conditional = any(d.when for d in self.space.values())
        self.path = os.path.join(meta, "optuna.journal")
        self._states = optuna.trial.TrialState
        self._live: dict[int, Any] = {}  # trials asked in this start: their names are set through them
        self._study: Any = None
        if read_only and not os.path.lexists(self.path):
            return  # nothing asked yet
        # Optuna opens the journal by its path, following a link and blocking on a FIFO: it is
        # checked first (and a line a crash cut short dropped before anything is appended to it).
        read_records(self.path, repair=not read_only, what="the search's study (Optuna's journal)")
        lock = _FlockLock(self.path + ".lock")  # Optuna only calls acquire() and release()
        if not read_only:
            lock.acquire()  # refuses a link or a FIFO there now, not at the first trial
            lock.release()
        storage = JournalStorage(JournalFileBackend(self.path, lock_obj=lock))  # type: ignore[arg-type]
        samplers = optuna.samplers
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # qmc: asked for

        limits = len(search.constraints)

        def feasibility(trial: Any) -> list[float]:  # what tell() recorded on the trial (>0: violated)
            found = trial.user_attrs.get(CONSTRAINTS_ATTR)
            return list(found) if isinstance(found, list) and len(found) == limits else [0.0] * limits

        limited = feasibility if limits else None

        def make_sampler(seed: int) -> Any:
            seed %= 2**32
            return {
                "tpe": lambda: samplers.TPESampler(seed=seed, constant_liar=True, constraints_func=limited),
                # A generation of a fifth of the budget (Optuna's default of 50 assumes thousands of
                # trials: a 60-run search would end in its first, random, generation).
                "nsga2": lambda: samplers.NSGAIISampler(
                    seed=seed, constraints_func=limited, population_size=max(4, min(50, search.n_runs // 5))
                ),
                "cmaes": lambda: samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False),
                "qmc": lambda: samplers.QMCSampler(seed=seed),
            }[search.sampler]()

        sampler = make_sampler(search.seed)
        if read_only:
            self._study = optuna.load_study(study_name="gts", storage=storage, sampler=sampler)
            return
        self._study = optuna.create_study(
            storage=storage,
            study_name="gts",
            sampler=sampler,
            directions=["minimize" if mode == "min" else "maximize" for _, mode in search.goals],
            load_if_exists=True,
        )
        if len(self._study.directions) != len(search.goals):
            raise ConfigError(
                f"the search in {meta} optimizes {len(self._study.directions)} objective(s) and this config "
                f"{len(search.goals)}: a search's objectives cannot change; use another result root"
            )
        asked = len(self._study.get_trials(deepcopy=False))
        if asked:  # a restart: the sampler's own random draws must not repeat those of the first start
            self._study.sampler = make_sampler(search.seed + 1_000_003 * asked)

    def trials(self) -> list[Trial]:
        if self._study is None:
            return []
        return [
            Trial(t.number, dict(t.params), self._name(t), t.state.is_finished())
            for t in self._study.get_trials(deepcopy=False)
        ]

    def _name(self, trial: Any) -> str | None:
        name = trial.user_attrs.get(self.NAME_ATTR)
        return None if name is None else _recorded_name(name, trial.number, self.path)

    def done(self, number: int) -> bool:
        return self._study.get_trials(deepcopy=False)[number].state.is_finished()

    def ask(self) -> Trial:
        if not self._conditional:
            trial = self._study.ask(self._distributions)
        else:  # define-by-run: a conditional key is suggested only when its when holds
            trial = self._study.ask()
            for key, distribution in self.space.items():
                if active(distribution, trial.params):
                    _suggest(trial, key, distribution)
        self._live[trial.number] = trial
        return Trial(trial.number, dict(trial.params))

    def name(self, number: int, name: str) -> None:
        self._handle(number, forget=True).set_user_attr(self.NAME_ATTR, name)

    def _handle(self, number: int, *, forget: bool = False) -> Any:
        """Trial ``number`` to set attributes on: the one asked in this start, else one built from storage."""
        trial = self._live.pop(number, None) if forget else self._live.get(number)
        if trial is None:  # asked by an earlier start (maybe one that was killed)
            import optuna

            frozen = self._study.get_trials(deepcopy=False)[number]
            # Optuna has no public handle on a trial asked by another process but this one, built
            # from its storage id (and the name is also found again without it: see trial_run).
            trial = optuna.trial.Trial(self._study, frozen._trial_id)
        return trial

    def tell(
        self,
        number: int,
        value: float | list[float] | None,
        *,
        pruned: bool = False,
        constraints: list[float] | None = None,
    ) -> None:
        if self.done(number):
            return
        if constraints is not None:  # read by the sampler's constraints_func when told
            self._handle(number).set_user_attr(CONSTRAINTS_ATTR, constraints)
        if pruned:
            self._study.tell(number, state=self._states.PRUNED)
        elif value is None:
            self._study.tell(number, state=self._states.FAIL)
        else:
            self._study.tell(number, value)


# --- the engine's side: the runs of a search, and how they ended -----------------------


def spent_message(n_runs: int, unfinished: int = 0) -> str:
    """What a start of a search that asked all its runs says: how to sample more."""
    rest = f"; {unfinished} run(s) it asked but did not finish run now" if unfinished else ""
    return (
        f"the search's budget is spent: it has asked all n_runs={n_runs} runs, and samples no more{rest}. To "
        f"sample more, raise n_runs in the config's search, or give e.g. search.n_runs={2 * n_runs} on gts run's "
        "command line"
    )
