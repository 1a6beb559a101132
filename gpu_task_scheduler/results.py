"""Collecting a result root into rows: one per run, from the ledger and the run folders.

A run's result is what its ``main()`` returned (recorded by the run's
process); if it returned nothing, the run's own ``result.json`` in its folder
is read instead, if there is one. A dict result contributes one column per
key (``result.loss``); any other value is the ``result`` column.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import time
from collections.abc import Sequence
from typing import Any

from .errors import ConfigError, GTSError, closest, did_you_mean, install_hint
from .layout import RESULT_FILE
from .records.ledger import Ledger
from .records.ledger.record import RunRecord
from .records.metrics import run_points
from .records.paths import RootPaths, RunPaths, UnsafePathError, read_json
from .records.provenance import short
from .records.status import RunStatus
from .textcells import latex_text, markdown_text
from .tuning.pareto import dominates as dominates  # a run dominates another: the Pareto front's test
from .tuning.pareto import fronts

MAX_RESULT_FILE = 1 << 30  # a result file larger than this is not read into a table


def open_ledger(root: str) -> Ledger:
    ledger = Ledger.read_only(RootPaths(root))
    if ledger is None:
        if not os.path.lexists(root):
            raise ConfigError(f"{root!r} does not exist{_near(root)}")
        raise ConfigError(f"{root!r} is not a result root of gpu_task_scheduler (no .gts/ledger.sqlite3 in it)")
    return ledger


def _near(path: str) -> str:
    """``; did you mean 'results/demo'?`` for a path whose first missing folder is a misspelling of
    one beside it, else ``.``"""
    parts = os.path.normpath(path).split(os.sep)
    for index, part in enumerate(parts):
        head = os.sep.join(parts[:index]) or ("/" if path.startswith("/") else ".")
        if os.path.lexists(os.path.join(head, part)) or not part:
            continue
        try:
            names = [name for name in os.listdir(head) if os.path.isdir(os.path.join(head, name))]
        except OSError:
            return "."
        guess = closest(part, names)
        if guess is None:
            return "."
        return f"; did you mean {os.sep.join([*parts[:index], guess, *parts[index + 1 :]])!r}?"
    return "."


def records(root: str, stage: str | None = None) -> list[RunRecord]:
    """The recorded runs, in the sweep's order; ``stage``: only that stage's (a sweep with stages)."""
    ledger = open_ledger(root)
    try:
        if stage is None:
            return ledger.records()
        _check_stage(ledger, root, stage)
        return list(ledger.iter_records("stage = ?", (stage,)))
    finally:
        ledger.close()


def _check_stage(ledger: Ledger, root: str, stage: str) -> None:
    stages = ledger.stages()
    if stage not in stages:
        guess = closest(stage, stages)
        raise ConfigError(
            f"{root!r} records no run of the stage {stage!r}"
            + (f"; did you mean {guess!r}?" if guess else "")
            + (f" Its stages: {', '.join(stages)}." if stages else "; its sweep has no stages")
        )


def run_folder(root: str, record: RunRecord) -> RunPaths:
    """A recorded run's folder (see :meth:`RunPaths.recorded`: raises UnsafePathError for a
    name that is not one folder under the root)."""
    return RunPaths.recorded(root, record.name)


def run_result(root: str, record: RunRecord) -> Any:
    """What ``main()`` returned, else the run's own ``result.json`` (never through a symbolic
    link, never outside the root)."""
    value = record.result_value
    if value is None:
        try:
            paths = run_folder(root, record)
        except UnsafePathError:
            return None
        if paths.unsafe() is None:
            value = read_json(
                paths.result if record.result_file else os.path.join(paths.work_dir, RESULT_FILE), limit=MAX_RESULT_FILE
            )
    return value


def duration(record: RunRecord) -> float | None:
    """The wall time the run held a slot, over all its attempts (a resumed or retried run's too)."""
    if record.started_at is None:
        return None
    return record.held_seconds(time.time())


def duration_text(seconds: float | None, last: float | None = None) -> str | None:
    """A duration as ``gts status`` and ``gts results`` show it; a run's is over all its attempts, and
    ``last``, its last attempt's, is shown beside it where it is less (a resumed or retried run)."""
    if seconds is None:
        return None
    return f"{seconds:.1f}s" + (f" (last {last:.1f}s)" if last is not None and seconds - last >= 0.05 else "")


def rows(root: str, *, stage: str | None = None) -> list[dict[str, Any]]:
    """One dict per run: ``name``, its ``stage`` (a sweep with stages), the swept parameters,
    ``status``, ``duration``, then the result. ``stage``: only that stage's runs."""
    return [row_of(root, record) for record in records(root, stage)]


def row_of(root: str, record: RunRecord) -> dict[str, Any]:
    """One recorded run as :func:`rows` gives it."""
    row: dict[str, Any] = {"name": record.name}
    if record.stage is not None:
        row["stage"] = record.stage
    row.update(record.params_value)
    row["status"] = record.status.value
    row["duration"] = duration(record)
    result = run_result(root, record)
    if isinstance(result, dict):
        row.update(flatten(result, "result."))
    elif result is not None:
        row["result"] = result
    for name, summary in record.metrics_value.items():  # what it reported last as it trained
        if isinstance(summary, dict):
            row[f"metrics.{name}"] = summary.get("last")
    commit = short(record.provenance_value)
    if commit is not None:  # the code it ran (all of what made it: gts status --json, RunRecord.provenance_value)
        row["commit"] = commit
    if isinstance(record.gpu_seconds, (int, float)):  # what it cost, over all its attempts (gpu/usage.py)
        row["gpu_hours"] = record.gpu_seconds / 3600
    elif (held := duration(record)) is not None:  # no GPU measured (CPU slots): the time it held its slots
        row["slot_hours"] = held / 3600
    if isinstance(record.energy, (int, float)):
        row["energy_kwh"] = record.energy / 3.6e6
    return row


MAX_NESTING = 20  # deeper dicts in a result stay one JSON cell


def flatten(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested result as columns: ``{"nested": {"acc": 0.9}}`` gives ``nested.acc``. Where two
    paths give one name (``{"a.b": 1, "a": {"b": 2}}``), the one with fewer levels wins, as the
    ledger's ranking reads it.

    >>> flatten({"loss": 1, "val": {"acc": 0.9, "f1": {"macro": 0.5}}, "empty": {}}, "result.")
    {'result.loss': 1, 'result.val.acc': 0.9, 'result.val.f1.macro': 0.5, 'result.empty': {}}
    """
    flat: dict[str, Any] = {}
    depth: dict[str, int] = {}

    def walk(mapping: dict[str, Any], head: str, level: int) -> None:
        for key, item in mapping.items():
            name = f"{head}{key}"
            if isinstance(item, dict) and item and level < MAX_NESTING:
                walk(item, name + ".", level + 1)
            elif depth.get(name, level + 1) > level:
                flat[name], depth[name] = item, level

    walk(value, prefix, 0)
    return flat


# Columns every row has that the ledger cannot rank: sorted from the rows themselves.
ROW_COLUMNS = ("name", "stage", "status", "duration")


def top_rows(
    root: str, key: str, count: int, *, descending: bool = False, stage: str | None = None, succeeded: bool = False
) -> list[dict[str, Any]]:
    """``sort_rows(rows(root), key)[:count]``, without building every row: SQLite ranks the runs
    whose result the ledger holds, and only those ``count`` and the runs whose result is kept in
    their folders (read one by one, as ``rows`` reads them) become rows. A root of 300,000 runs:
    about a second, in bounded memory."""
    if key in ROW_COLUMNS:
        table = [row for row in rows(root, stage=stage) if not succeeded or row["status"] == "succeeded"]
        return sort_rows(table, key, descending=descending)[:count]
    ledger = open_ledger(root)
    try:
        if stage is not None:
            _check_stage(ledger, root, stage)
        names = set(ledger.ranked(key, count, descending=descending, stage=stage, succeeded=succeeded))
        where = "(result IS NULL OR NOT json_valid(result) OR (params IS NOT NULL AND NOT json_valid(params)))"
        params: tuple[str, ...] = ()
        if stage is not None:
            where, params = where + " AND stage = ?", (stage,)
        if succeeded:
            where += " AND status = 'succeeded'"
        marks = ",".join("?" * len(names))
        candidates = list(ledger.iter_records(f"({where}) OR name IN ({marks})", (*params, *names)))
    finally:
        ledger.close()
    # In the sweep's order, as rows() gives them, so that sort_rows breaks ties as it would there.
    return sort_rows([row_of(root, record) for record in candidates], key, descending=descending)[:count]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def metric(row: dict[str, Any], key: str) -> float | None:
    """``key`` of a row as a number: a result (``loss`` finds ``result.loss``) or a parameter."""
    for name in (f"result.{key}", key) if not key.startswith("result.") else (key,):
        if name in row:
            return _number(row[name])
    if key == "result":
        return _number(row.get("result"))
    return None


# The key holds no comparison and no space, so that no part of the text is tried twice: a lazy
# ``(.+?)\s*`` took 5 s over 20,000 spaces.
_CONDITION = re.compile(r"\s*([^<>=\s]+)\s*(<=|>=|<|>)\s*([^\s<>=]+)\s*")
_COMPARE = {
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
}


def gpu_hours_to(root: str, condition: str, *, stage: str | None = None) -> dict[str, Any]:
    """How many GPU-hours the sweep had spent when a run first reached ``condition`` (``"loss<=0.2"``):
    the first run, by the time it ended, whose KEY (a result, a parameter, else the last value it
    reported as ``metrics.KEY``) meets it. Runs that ended by then count whole; a run running then
    counts the part of its GPU-seconds its last attempt had run by then (prorated by time).

    Returns ``condition``, ``reached`` (False: no run met it yet), ``run``, ``at`` (a Unix time),
    ``gpu_hours`` (spent by then; every GPU-hour recorded when not reached), ``total_gpu_hours``,
    ``unit`` (``GPU-hours``; ``slot-hours`` where no GPU was measured: the wall time the runs' attempts
    held their slots, CPU slots' cost, and what those two numbers then count),
    ``runs_ended`` (runs that had ended by then), and ``best`` (the best value any run has, not reached)."""
    match = _CONDITION.fullmatch(condition)
    if match is None:
        raise ConfigError(f"{condition[:80]!r} is no condition; write KEY<=VALUE (or <, >=, >), e.g. 'loss<=0.2'")
    key, op, text = match.groups()
    try:
        target = float(text)
    except ValueError:
        raise ConfigError(f"{condition!r}: {text!r} is not a number") from None
    if not math.isfinite(target):  # nan compares false with everything: "never reached", said as a fact
        raise ConfigError(f"{condition!r}: the value must be a finite number; got {text!r}")
    every = records(root, stage)
    reached: list[tuple[float, str]] = []
    values: list[float] = []
    for record in every:
        if record.ended_at is None or record.status is RunStatus.RUNNING:
            continue
        row = row_of(root, record)
        value = metric(row, key)
        if value is None:
            value = _number(row.get(f"metrics.{key}"))
        if value is None:
            continue
        values.append(value)
        if _COMPARE[op](value, target):
            reached.append((record.ended_at, record.name))
    if not values:
        problem = key_problem(root, key, stage=stage)
        if problem is not None:
            raise ConfigError(problem)
    now = time.time()
    # No GPU measured (CPU slots): what the runs cost is the time they held their slots, over all
    # their attempts, and the answer says so (``unit``) instead of "after 0 GPU-hours".
    measured = any(isinstance(r.gpu_seconds, (int, float)) and r.gpu_seconds > 0 for r in every)
    unit = "GPU-hours" if measured else "slot-hours"
    if measured:
        total = sum(r.gpu_seconds for r in every if isinstance(r.gpu_seconds, (int, float)))
    else:
        total = sum(r.held_seconds(now) or 0.0 for r in every)
    found: dict[str, Any] = {"condition": f"{key} {op} {text}", "unit": unit, "total_gpu_hours": total / 3600}
    if not reached:
        best = (min if op in ("<", "<=") else max)(values) if values else None
        return {**found, "reached": False, "gpu_hours": total / 3600, "best": best}
    at, name = min(reached)
    spent, ended = 0.0, 0
    for record in every:
        start, end = record.started_at, record.ended_at
        if not measured:  # each attempt's time on its slot up to the moment: none of it after
            spans = [(s, e) for _, s, e in record.spans_value]
            if start is not None and record.status is RunStatus.RUNNING:
                spans.append((start, now))
            elif start is not None and end is not None and not spans:  # recorded before spans were
                spans.append((start, end))
            spent += sum(max(0.0, min(e, at) - s) for s, e in spans)
            ended += int(start is not None and end is not None and end <= at and start < at)
            continue
        seconds = record.gpu_seconds if isinstance(record.gpu_seconds, (int, float)) else 0.0
        if start is None or start >= at:
            continue
        if end is not None and end <= at:
            spent, ended = spent + seconds, ended + 1
        else:
            last = (end if end is not None else now) - start
            spent += seconds * min(1.0, (at - start) / last) if last > 0 else 0.0
    return {**found, "reached": True, "run": name, "at": at, "gpu_hours": spent / 3600, "runs_ended": ended}


def sort_rows(table: Sequence[dict[str, Any]], key: str, *, descending: bool = False) -> list[dict[str, Any]]:
    """The rows by ``key`` (a result or a parameter); rows without a number there come last."""
    with_value = [row for row in table if metric(row, key) is not None]
    without = [row for row in table if metric(row, key) is None]
    return sorted(with_value, key=lambda row: metric(row, key) or 0.0, reverse=descending) + without


def key_problem(root: str, key: str, *, stage: str | None = None) -> str | None:
    """None when some run has a number at ``key``; else why not, in words that help: the key
    matches no column (with the closest one, and the columns there are), or its values are not
    numbers. Reads every row: asked once the cheap way (a ranking) found no number."""
    every = rows(root, stage=stage)
    if any(metric(row, key) is not None for row in every):
        return None
    names = columns(every)
    lookups = (key,) if key.startswith("result.") else (f"result.{key}", key)
    if any(name in names for name in lookups):
        return f"{key!r} is not a number in any run of {root}"
    message = f"no run of {root} has {key!r}"
    if not any(name.startswith(("result", "metrics.")) for name in names):
        message += " (no run has recorded a result yet)"
    short = [name[len("result.") :] for name in names if name.startswith("result.")]
    message += did_you_mean(key, [*names, *short])
    shown = [name for name in names if name not in ROW_COLUMNS]
    if shown:
        message += f" Its columns: {', '.join(shown[:30])}{' ...' if len(shown) > 30 else ''}."
    return message


def declared_mode(root: str, key: str) -> str | None:
    """``"min"`` or ``"max"``: the way the sweep's config says ``key`` is better, where its
    ``early_stop`` or ``search`` (top level or a stage's) declares a ``mode`` for that metric;
    None where none does, or two disagree."""
    modes = declared_modes(root)
    for name, mode in modes.items():
        if key in (name, f"result.{name}", f"metrics.{name}"):
            return mode
    return None


def recorded_config(root: str) -> dict[str, Any] | None:
    """The config the root's sweep was recorded with (the ledger's ``sweep_config``), or None (none
    recorded, or not a JSON object: changed by hand)."""
    ledger = open_ledger(root)
    try:
        recorded = ledger.get_meta("sweep_config")
    finally:
        ledger.close()
    try:
        config = json.loads(recorded) if recorded else None
    except (ValueError, RecursionError):
        return None
    return config if isinstance(config, dict) else None


def declared_modes(root: str) -> dict[str, str]:
    """Each metric the recorded config's ``early_stop``, ``search`` or ``pbt`` declares a ``mode``
    for (top level and stages; ``objectives`` too): ``{"loss": "min"}``; a metric two declare
    differently is left out."""
    config = recorded_config(root)
    if config is None:
        return {}
    sections = [config, *(stage for stage in config.get("stages") or [] if isinstance(stage, dict))]
    found: dict[str, set[str]] = {}
    for section in sections:
        for part in ("early_stop", "search", "pbt"):
            declared = section.get(part)
            goals = declared.get("objectives") if isinstance(declared, dict) else None
            if isinstance(goals, dict):  # a search of several objectives
                for name, mode in goals.items():
                    if mode in ("min", "max"):
                        found.setdefault(str(name), set()).add(mode)
            if isinstance(declared, dict) and declared.get("mode") in ("min", "max"):
                name = declared.get("metric")
                if isinstance(name, str):
                    found.setdefault(name, set()).add(declared["mode"])
    return {name: modes.pop() for name, modes in found.items() if len(modes) == 1}


def declared_search(root: str) -> dict[str, Any] | None:
    """The ``search`` section of the config the root's sweep was recorded with, or None."""
    config = recorded_config(root)
    if config is None:
        return None
    search = config.get("search")
    return search if isinstance(search, dict) else None


def builtin_values(record: RunRecord) -> dict[str, float]:
    """What a search's constraint may bound whatever a run returns: its peak GPU memory (bytes; 0
    where none was measured) and its duration (seconds)."""
    found = {"gpu_peak": float(record.gpu_memory_peak or 0)}
    length = duration(record)
    if length is not None:
        found["duration"] = length
    return found


def declared_objectives(root: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The objectives ``(metric, mode)`` and the constraints the root's search declares ([] and []: none)."""
    search = declared_search(root) or {}
    goals = search.get("objectives")
    if isinstance(goals, dict):
        objectives = [(str(k), v) for k, v in goals.items() if v in ("min", "max")]
    elif isinstance(search.get("metric"), str) and search.get("mode") in ("min", "max"):
        objectives = [(search["metric"], search["mode"])]
    else:
        objectives = []
    constraints = [c for c in search.get("constraints") or [] if isinstance(c, str)]
    return objectives, constraints


def several_objectives(root: str) -> list[str]:
    """The objectives of a root whose search has several ([] for one or none)."""
    objectives, _ = declared_objectives(root)
    return [metric for metric, _ in objectives] if len(objectives) > 1 else []


def scored(root: str, *, stage: str | None = None) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """The root's objectives, and each succeeded run's row with ``objectives`` (their values, as the
    sampler was told them: a result, else the last reported value) and ``feasible`` (every constraint
    holds; gpu_peak and duration are the run's own). Runs without a value for every objective are left out."""
    from .tuning.search import objective, parse_search, violations

    objectives, constraints = declared_objectives(root)
    if not objectives:
        raise ConfigError(
            f"{root!r} declares no objectives: --pareto needs a search with them, e.g. search: "
            "{objectives: {loss: min, latency_ms: min}}"
        )
    search = parse_search(
        {"sampler": "random", "n_runs": 1, "objectives": dict(objectives), "constraints": constraints}
    )
    assert search is not None
    found = []
    for record in records(root, stage):
        if record.status is not RunStatus.SUCCEEDED:
            continue
        result = run_result(root, record)
        values = [objective(result, record.metrics_value, metric) for metric, _ in objectives]
        if any(value is None for value in values):
            continue
        broken, missing = violations(search, result, record.metrics_value, builtin_values(record))
        row = row_of(root, record)
        row["objectives"] = values
        row["feasible"] = not missing and all(v <= 0 for v in broken)
        found.append(row)
    return objectives, found


def front(points: Sequence[Sequence[float]]) -> list[int]:
    """The indices of the non-dominated points (all objectives minimized), in order of the first
    objective; a point equal to another on the front is on it too."""
    return sorted(fronts(points)[0], key=lambda i: tuple(points[i])) if points else []


def pareto(root: str, *, stage: str | None = None) -> list[dict[str, Any]]:
    """The feasible runs no other feasible run dominates in the root's search objectives (its
    ``results.rows()`` rows, with ``objectives`` and ``feasible``), by the first objective."""
    objectives, rows = scored(root, stage=stage)
    feasible = [row for row in rows if row["feasible"]]
    signs = [1.0 if mode == "min" else -1.0 for _, mode in objectives]
    points = [[sign * value for sign, value in zip(signs, row["objectives"], strict=True)] for row in feasible]
    return [feasible[index] for index in front(points)]


def best(root: str, key: str, *, maximize: bool = False, stage: str | None = None) -> dict[str, Any] | None:
    """The succeeded run with the lowest ``key`` (the highest with ``maximize``), or None (ranked by
    SQLite: see :func:`top_rows`)."""
    ranked = top_rows(root, key, 1, descending=maximize, stage=stage, succeeded=True)
    return ranked[0] if ranked and metric(ranked[0], key) is not None else None


# Student's t distribution's 0.975 quantile by degrees of freedom: 1 to 30, then 40, 60, 120 and
# infinity (the normal's); between them, interpolated in 1/df (within 0.001 of the exact value).
_T975: tuple[float, ...] = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179)
_T975 += (2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052)
_T975 += (2.048, 2.045, 2.042)
_T975_BEYOND = ((30, 2.042), (40, 2.021), (60, 2.000), (120, 1.980), (math.inf, 1.960))


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom: a 95 % confidence
    interval of a mean of ``df + 1`` values is the mean +- t975(df) * std / sqrt(df + 1).

    >>> t975(2), t975(30), round(t975(50), 3), t975(10**9) > 1.959
    (4.303, 2.042, 2.008, True)
    """
    if df <= len(_T975):
        return _T975[df - 1]
    for (low, at_low), (high, at_high) in zip(_T975_BEYOND, _T975_BEYOND[1:], strict=False):
        if df <= high:
            share = (1 / low - 1 / df) / (1 / low - (0 if high == math.inf else 1 / high))
            return at_low + (at_high - at_low) * share
    return 1.960


def aggregate(root: str, over: str, *, stage: str | None = None) -> list[dict[str, Any]]:
    """One row per group of succeeded runs that differ only in ``over`` (e.g. the seed): their
    other parameters, ``runs`` (how many), and for every numeric result its mean, sample
    standard deviation and the half-width of its mean's 95 % confidence interval (Student's t;
    both None for one run), and count, as ``result.loss.mean`` and so on.
    Runs of different stages are never averaged together. The groups and the numbers are read
    by SQLite (``Ledger.grouped_numbers``): 100,000 runs in about a second; the page and the report
    average with this function too."""
    ledger = open_ledger(root)
    try:
        if stage is not None:
            _check_stage(ledger, root, stage)
        grouped = ledger.grouped_numbers(over, stage=stage)
        read = [(ledger.get(name), True) for name in grouped.others]
        read += [(ledger.get(name), False) for name in grouped.unparsed]
    finally:
        ledger.close()
    if not grouped.found:
        known = sorted({key for record in records(root, stage) for key in record.params_value})
        raise ConfigError(
            f"no run of {root!r} has the parameter {over!r} to average over{did_you_mean(over, known)}"
            + (f" Parameters: {', '.join(known)}." if known else "")
        )
    groups: dict[str, dict[str, Any]] = {}
    keys: dict[tuple[Any, Any], str] = {}

    def group(stage_name: Any, rest: Any) -> dict[str, Any]:
        """The group of a run of ``stage_name`` whose parameters less ``over`` are ``rest`` (JSON text
        or a dict): one per distinct set of values, whatever their keys' order."""
        cached = keys.get((stage_name, rest)) if isinstance(rest, str) else None
        if cached is None:
            values = json.loads(rest) if isinstance(rest, str) else rest
            values = values if isinstance(values, dict) else {}
            if stage_name is not None:
                values = {"stage": stage_name, **values}
            cached = json.dumps(values, sort_keys=True)
            if isinstance(rest, str):
                keys[(stage_name, rest)] = cached
            groups.setdefault(cached, {"params": values, "runs": 0, "first": math.inf, "numbers": {}})
        return groups[cached]

    for stage_name, rest, count, first in grouped.groups:
        found = group(stage_name, rest)
        found["runs"] += count
        found["first"] = min(found["first"], first if isinstance(first, (int, float)) else math.inf)
    columns: dict[Any, str] = {}
    for stage_name, rest, name, value in grouped.numbers:  # numbers by SQLite's JSON: finite, no bools
        key = (stage_name, rest)
        numbers = (groups[keys[key]] if key in keys else group(stage_name, rest))["numbers"]
        column = columns.get(name)
        if column is None:
            column = columns[name] = "result" if name is None else f"result.{name}"
        numbers.setdefault(column, []).append(float(value))
    for record, counted in read:
        if record is None:
            continue
        found = group(record.stage, {k: v for k, v in record.params_value.items() if k != over})
        if not counted:
            found["runs"] += 1
            found["first"] = min(found["first"], record.run_index if record.run_index is not None else math.inf)
        result = run_result(root, record)
        items = result.items() if isinstance(result, dict) else [("", result)]
        for name, value in items:
            number = _number(value)
            if number is not None:
                found["numbers"].setdefault(f"result.{name}" if name else "result", []).append(number)
    table = []
    for found in sorted(groups.values(), key=lambda g: g["first"]):
        row: dict[str, Any] = dict(found["params"])
        row["runs"] = found["runs"]
        for name, numbers in found["numbers"].items():
            count = len(numbers)
            mean = math.fsum(numbers) / count
            std = math.sqrt(math.fsum((x - mean) ** 2 for x in numbers) / (count - 1)) if count > 1 else None
            row[f"{name}.mean"] = mean
            row[f"{name}.std"] = std
            row[f"{name}.ci95"] = None if std is None else t975(count - 1) * std / math.sqrt(count)
            row[f"{name}.count"] = count
        table.append(row)
    return table


def columns(table: Sequence[dict[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for row in table:
        names.update(dict.fromkeys(row))
    return list(names)


def to_dataframe(root: str) -> Any:
    """The rows as a pandas DataFrame (``pip install gts-sweep[results]``)."""
    try:
        import pandas
    except ImportError as error:
        raise GTSError(f"to_dataframe() needs pandas: {install_hint('results')}") from error
    table = rows(root)
    return pandas.DataFrame(table, columns=columns(table))


def curve_rows(root: str, *, stage: str | None = None) -> list[dict[str, Any]]:
    """One dict per reported step of every run: ``name``, its ``stage``, the swept parameters,
    ``status``, ``step``, then each metric reported at that step (across its attempts: see
    ``records.metrics.stitch``; what its metrics files hold, read as the scheduler reads them)."""
    table = []
    for record in records(root, stage):
        try:
            paths = run_folder(root, record)
        except UnsafePathError:
            continue
        if paths.unsafe(records_only=True) is not None:
            continue
        points = run_points(paths)
        head: dict[str, Any] = {"name": record.name}
        if record.stage is not None:
            head["stage"] = record.stage
        head.update(record.params_value)
        head["status"] = record.status.value
        for step, values in points:
            table.append({**head, "step": step, **values})
    return table


def curves(root: str, *, stage: str | None = None) -> Any:
    """What the runs reported as they trained, as a pandas DataFrame: one row per run and step
    (``curve_rows``; ``pip install gts-sweep[results]``)."""
    try:
        import pandas
    except ImportError as error:
        raise GTSError(f"curves() needs pandas: {install_hint('results')}") from error
    table = curve_rows(root, stage=stage)
    return pandas.DataFrame(table, columns=columns(table))


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    r"""Control characters made visible, so that a value cannot drive the terminal.

    >>> escape_controls("a\x1b[2Jb\n")
    'a\\x1b[2Jb\\n'
    """
    return _CONTROL.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), text)


def format_table(table: Sequence[dict[str, Any]], names: list[str] | None = None, *, escape: bool = False) -> str:
    """The rows as aligned text; ``escape``: control characters shown as ``\x1b`` (for a terminal)."""
    names = names or columns(table)
    show = escape_controls if escape else (lambda text: text)
    names = list(names)
    cells = [[show(_cell(row.get(name))) for name in names] for row in table]
    header = [show(name) for name in names]
    widths = [max([len(name)] + [len(row[i]) for row in cells]) for i, name in enumerate(header)]
    lines = ["  ".join(name.ljust(width) for name, width in zip(header, widths, strict=False)).rstrip()]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)).rstrip() for row in cells]
    return "\n".join(lines)


# --- paper-ready tables ------------------------------------------------------------------

_HIDDEN = (".std", ".ci95", ".count")  # shown in their mean's cell, or not at all


class PaperColumn:
    """One column of a paper table: its header, the key of its number, and that of its spread."""

    __slots__ = ("header", "key", "spread", "mode")

    def __init__(self, header: str, key: str, spread: str | None, mode: str | None) -> None:
        self.header, self.key, self.spread, self.mode = header, key, spread, mode


SPREADS = {"std": "std", "ci95": "95% CI"}  # what the ± of a paper table's averaged cell is, and its words


def paper_columns(table: Sequence[dict[str, Any]], modes: dict[str, str], spread: str = "std") -> list[PaperColumn]:
    """The columns of :func:`format_paper`: an averaged result's mean and its spread (``std``, or
    ``ci95``: the half-width of the 95 % confidence interval of the mean) in one column named by
    the result (``loss`` for ``result.loss.mean``); ``modes``: the way each metric is better."""
    names = columns(table)
    means = {name[: -len(".mean")] for name in names if name.endswith(".mean")}
    shown: list[PaperColumn] = []
    for name in names:
        base = name[: -len(".mean")] if name.endswith(".mean") else name
        if name.endswith(_HIDDEN) and name.rsplit(".", 1)[0] in means:
            continue
        header = base[len("result.") :] if base.startswith("result.") else base
        spread_key = f"{base}.{spread}" if name.endswith(".mean") else None
        mode = modes.get(header.removeprefix("metrics.")) if base.startswith(("result.", "metrics.")) else None
        shown.append(PaperColumn(header, name, spread_key, mode))
    return shown


def format_paper(
    table: Sequence[dict[str, Any]],
    modes: dict[str, str],
    kind: str = "markdown",
    *,
    escape: bool = False,
    spread: str = "std",
) -> str:
    """The rows as a table for a paper or a README: ``kind`` ``markdown`` or ``latex`` (a booktabs
    ``tabular``). An averaged result is one cell, ``mean ± std`` (``spread="ci95"``: ± the 95 %
    confidence interval's half-width), and its header says which (``loss (mean ± std)``); numbers
    to 4 significant digits; in each result column whose way is known (``modes``:
    ``{"loss": "min"}``), the best in bold."""
    if spread not in SPREADS:
        raise ConfigError(f"the spread must be one of {', '.join(SPREADS)}; got {spread!r}")
    shown = paper_columns(table, modes, spread)
    best: dict[str, float] = {}
    for column in shown:
        numbers = [v for row in table if (v := _number(row.get(column.key))) is not None]
        if column.mode is not None and numbers:
            best[column.key] = min(numbers) if column.mode == "min" else max(numbers)
    latex = kind == "latex"

    def text(value: str) -> str:
        value = escape_controls(value) if escape else value
        value = " ".join(value.splitlines())  # a row is one line
        return latex_text(value) if latex else markdown_text(value)

    def cell(row: dict[str, Any], column: PaperColumn) -> str:
        value = row.get(column.key)
        number = _number(value)
        if number is None:
            return text(_cell(value))
        shown_value = f"{number:.4g}"
        spread = _number(row.get(column.spread)) if column.spread is not None else None
        if spread is not None:
            shown_value += f" $\\pm$ {spread:.2g}" if latex else f" ± {spread:.2g}"
        if best.get(column.key) == number:
            return f"\\textbf{{{shown_value}}}" if latex else f"**{shown_value}**"
        return shown_value

    pm = "$\\pm$" if latex else "±"
    spread_shown = {  # the columns whose cells show a spread: their header says what it is
        column.key
        for column in shown
        if column.spread is not None and any(_number(row.get(column.spread)) is not None for row in table)
    }
    headers = [
        text(column.header) + (f" (mean {pm} {text(SPREADS[spread])})" if column.key in spread_shown else "")
        for column in shown
    ]
    body = [[cell(row, column) for column in shown] for row in table]
    numeric = [any(_number(row.get(c.key)) is not None for row in table) for c in shown]
    if latex:
        lines = [
            "\\begin{tabular}{" + "".join("r" if n else "l" for n in numeric) + "}",
            "\\toprule",
            " & ".join(headers) + " \\\\",
            "\\midrule",
            *(" & ".join(cells) + " \\\\" for cells in body),
            "\\bottomrule",
            "\\end{tabular}",
        ]
    else:
        lines = [
            "| " + " | ".join(headers) + " |",
            "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
            *("| " + " | ".join(cells) + " |" for cells in body),
        ]
    return "\n".join(lines)


def format_csv(table: Sequence[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns(table), lineterminator="\n")
    writer.writeheader()
    for row in table:
        writer.writerow({key: _cell(value) for key, value in row.items()})
    return buffer.getvalue()
