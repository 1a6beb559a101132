"""What ``gts serve`` shows, read from a result root the way ``gts status`` reads it: read-only,
consistent while a sweep writes the ledger, and bounded in time and memory for a root of any size
(counts and pages come from SQLite; only the runs shown become Python objects).

Every function takes the root and plain values from the request, never a path: a run is found
by its name in the ledger (:meth:`RunPaths.recorded` refuses a name that is not one folder under
the root), and a log or metrics file is read through the records' own safe readers (no link, no
FIFO, a bounded tail).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import ConfigError
from ..records.ledger.record import RunRecord
from ..records.metrics import run_curve
from ..records.paths import RunPaths, UnsafePathError, open_regular, read_json
from ..records.status import QUEUED, RunStatus
from ..reporting import TIME_KEY
from ..reports.status import STALE, eta, pool_lines, running_is_stale, shown_status, status
from ..results import declared_modes, open_ledger, row_of

PAGE_MOST = 500  # runs one page may ask for
LOG_BYTES = 64 << 10  # the tail of a log the page shows (it follows it while the run runs)
CURVES_MOST = 50  # runs whose curves one request may ask for
PARCOORDS_MOST = 5000  # finished runs in the parallel-coordinates plot (the best, by the metric)
TIMELINE_MOST = 2000  # runs on the slots' timeline (the latest started)


class NotFound(Exception):
    """What the request names does not exist (an unknown run, a run without that file): 404."""


def overview(root: str) -> dict[str, Any]:
    """Counts by state, the scheduler, the stages, the ETA and the running runs (with their
    latest metrics), as ``gts status --watch`` sees them."""
    report = status(root, runs="watch")
    running = [run for run in report["runs"] if run["status"] in ("running", STALE)]
    failures = [run for run in report["runs"] if run["status"] in ("failed", "timed_out")]
    return {
        "root": report["root"],
        "scheduler": report["scheduler"],
        "counts": report["counts"],
        "stages": report.get("stages", {}),
        "eta": eta(report),
        "mean_success_seconds": report["mean_success_seconds"],
        "gpu_seconds": report["gpu_seconds"],  # what every attempt cost (gpu/usage.py), as gts status says
        "energy": report["energy"],
        "slot_seconds": report.get("slot_seconds"),  # no GPU measured (CPU slots): the slots' time instead
        "running": running,
        "failures": failures,
        "notes": report.get("notes", {}),  # what the scheduler saw of runs that the user should know
        # A Slurm pool's allocations, nodes, slots and runs, as gts status shows them.
        "pool": [line.strip() for line in pool_lines(report["pool"], width=200)] if "pool" in report else [],
        # What the charts open on: the metrics the config's early_stop, search or pbt judges by;
        # where none is declared, the first metric of the runs' report lines (as written: the
        # ledger keeps metrics sorted by name, which put acc before loss).
        "declared": [{"metric": name, "mode": mode} for name, mode in declared_modes(root).items()],
        "first_reported": first_reported(root),
    }


def first_reported(root: str, *, most: int = 20) -> str | None:
    """The first metric named in the first report line of the first run (of the first ``most``, by
    the sweep's order) that reported one: its first line's first key after ``step``."""
    ledger = open_ledger(root)
    try:
        names = [record.name for record in ledger.page(key="index", limit=most)[1]]
    finally:
        ledger.close()
    for name in names:
        try:
            paths = RunPaths.recorded(root, name)
            fd = open_regular(paths.metrics)
        except OSError:
            continue
        try:
            head = os.read(fd, 4096)
        except OSError:
            continue
        finally:
            os.close(fd)
        try:
            line = json.loads(head.split(b"\n", 1)[0])
        except ValueError:
            continue
        if isinstance(line, dict):
            for key, value in line.items():
                if key not in ("step", TIME_KEY) and isinstance(value, (int, float)) and not isinstance(value, bool):
                    return str(key)
    return None


def _entry(root: str, record: RunRecord, stale: bool, modes: dict[str, str] | None = None) -> dict[str, Any]:
    """One run as the table shows it: ``results.rows()``'s row (parameters, status, duration,
    the result's columns, the last reported metrics), the best value of each reported metric
    whose ``mode`` the config declares (``metrics.loss.min`` for a loss to minimise), and where
    and how often it ran."""
    row = row_of(root, record)
    for name, summary in record.metrics_value.items():
        mode = (modes or {}).get(name)
        if mode is not None and isinstance(summary, dict):
            row[f"metrics.{name}.{mode}"] = summary.get(mode)
    row["status"] = shown_status(record, stale)
    row.update(
        index=record.run_index,
        attempts=record.attempts,
        slot=record.slot,
        node=record.node or None,
        started=record.started_at,
        cause=record.cause,
        gpu_peak=record.gpu_memory_peak,
    )
    return row


def runs_page(
    root: str,
    *,
    sort: str | None = None,
    descending: bool = False,
    statuses: list[str] | None = None,
    text: str = "",
    offset: int = 0,
    limit: int = 50,
) -> dict[str, Any]:
    """A page of the runs, sorted by a column or any number a run has (``loss``, ``lr``,
    ``metrics.acc``) and filtered by state and by a part of the name: ``{"total", "offset",
    "runs"}``. Sorted, filtered and paged by SQLite."""
    if limit < 0 or limit > PAGE_MOST or offset < 0:
        raise ConfigError(f"a page holds 0 to {PAGE_MOST} runs from an offset of 0 or more")
    states = list(statuses or [])
    known = {state.value for state in RunStatus} | {STALE, QUEUED}
    unknown = [state for state in states if state not in known]
    if unknown:
        raise ConfigError(f"unknown state {unknown[0]!r}; states: {', '.join(sorted(known))}")
    stale = running_is_stale(root)
    if STALE in states:  # stale runs are recorded as running
        states = [state for state in states if state != STALE] + (["running"] if stale else [])
    if QUEUED in states:  # so are queued ones (and those running: the page tells them apart)
        states = [state for state in states if state != QUEUED] + ([] if stale else ["running"])
    ledger = open_ledger(root)
    try:
        total, records = ledger.page(
            key=sort, descending=descending, statuses=states, text=text, offset=offset, limit=limit
        )
    finally:
        ledger.close()
    modes = declared_modes(root)
    entries = [_entry(root, record, stale, modes) for record in records]
    view = pareto_view(root) if entries else {"objectives": []}
    if view["objectives"]:  # a search of several objectives: which runs are on its front
        on_front = {run["name"] for run in view["runs"] if run["rank"] == 0}
        for entry in entries:
            entry["pareto"] = "front" if entry["name"] in on_front else ""
    return {"total": total, "offset": offset, "runs": entries}


def _record(root: str, name: str) -> tuple[RunRecord, str | None]:
    ledger = open_ledger(root)
    try:
        record = ledger.get(name)
        log_file = ledger.get_meta("log_file") or None
    finally:
        ledger.close()
    if record is None:
        raise NotFound(f"no run named {name!r} is recorded in {root}")
    return record, log_file


def _paths(root: str, name: str, log_file: str | None = None) -> RunPaths:
    try:
        return RunPaths.recorded(root, name, log_file)
    except UnsafePathError as error:
        raise NotFound(str(error)) from None


def run_detail(root: str, name: str) -> dict[str, Any]:
    """One run: its row, its resolved config (its folder's ``.gts/config.json``) and its result."""
    record, _ = _record(root, name)
    paths = _paths(root, name)
    return {
        "run": _entry(root, record, stale=False),
        "config": read_json(paths.config) if paths.unsafe(records_only=True) is None else None,
        "metrics": record.metrics_value,
        "provenance": record.provenance_value,
    }


def provenances(root: str, names: list[str]) -> dict[str, Any]:
    """What made each named run (records/provenance.py), where it was recorded: for a report's run view."""
    ledger = open_ledger(root)
    try:
        every = ledger.provenances()
    finally:
        ledger.close()
    return {name: every[name] for name in names if name in every}


def run_log(root: str, name: str, *, most: int = LOG_BYTES) -> dict[str, Any]:
    """The last ``most`` bytes of a recorded run's log (its current attempt), as text."""
    record, log_file = _record(root, name)
    paths = _paths(root, name, log_file)
    if paths.log is None or paths.unsafe() is not None:
        raise NotFound(f"{name} has no log to show")
    text = paths.tail(lines=1 << 30, max_bytes=most)
    return {"name": name, "status": record.status.value, "log": text}


def curves(root: str, metric: str, names: list[str], over: str | None = None) -> dict[str, Any]:
    """What each named run reported of ``metric``, step by step (across its attempts), with its
    parameters and state: ``{"runs": [{"name", "status", "params", "steps", "values"}]}``, and a
    population-based training member's ``lineage`` (:func:`lineages`: where its curve jumps);
    ``over``: also ``"groups"``, the runs that differ only in that parameter as one mean curve
    with its 95 % band (``reports.plots.mean_curves``, as ``gts plot --over`` draws them)."""
    if len(names) > CURVES_MOST:
        raise ConfigError(f"at most {CURVES_MOST} runs' curves at once")
    found = []
    lineage = lineages(root)
    for name in names:
        record, _ = _record(root, name)
        paths = _paths(root, name)
        if paths.unsafe(records_only=True) is not None:
            continue
        points = [(step, values[metric]) for step, values in run_curve(paths) if metric in values]
        steps = [step for step, _ in points]
        values = [value for _, value in points]
        found.append(
            {
                "name": name,
                "status": record.status.value,
                "params": record.params_value,
                "steps": steps,
                "values": values,
                **({"lineage": lineage[name]} if name in lineage else {}),
            }
        )
    if over:
        return {"metric": metric, "runs": found, "over": over, "groups": groups_of(found, over)}
    return {"metric": metric, "runs": found}


def lineages(root: str) -> dict[str, list[dict[str, Any]]]:
    """Population-based training: each member's own segments, ``[{"step", "values", "donor"}]`` (its
    start, then each copy it made: where its curve jumps to another member's weights), by name."""
    from ..records.lineage import lineages as read

    ledger = open_ledger(root)
    try:
        found = read(ledger.trial_events())
    finally:
        ledger.close()
    return {
        name: [{"step": s.step, "values": s.values, "donor": s.donor} for s in lineage.own]
        for name, lineage in found.items()
    }


def record_params(root: str, name: str) -> dict[str, Any]:
    """The swept parameters of the run ``name``."""
    return _record(root, name)[0].params_value


def groups_of(runs: list[dict[str, Any]], over: str) -> list[dict[str, Any]]:
    """:func:`curves`' runs as ``mean_curves`` groups over the parameter ``over``."""
    from ..reports.plots import mean_curves

    points = {
        run["name"]: [{"step": step, "value": value} for step, value in zip(run["steps"], run["values"], strict=True)]
        for run in runs
    }
    return mean_curves(points, {run["name"]: run["params"] for run in runs}, "value", over)


def importance(root: str, metric: str, mode: str) -> dict[str, Any]:
    """The parameters ranked by their importance for ``metric`` (reports/importance.py, as ``gts
    importance`` ranks them), and the succeeded runs' values of the two most important with their
    ``metric`` (at most PARCOORDS_MOST) for a contour and slices; or ``{"problem"}``: why not (too
    few runs, no such metric, Optuna not installed), in words the page shows."""
    from ..reports.importance import importance as rank
    from ..reports.importance import read_rows, top_points

    try:
        rows = read_rows(root, metric)  # once, for the ranking and the points
        found = rank(root, metric, mode=mode, rows=rows)
        names = [parameter["name"] for parameter in found["parameters"][:2]]
        found["names"] = names
        found["points"] = (
            top_points(root, metric, names, most=PARCOORDS_MOST, rows=rows)["points"] if len(names) == 2 else []
        )
    except ConfigError as error:
        return {"metric": metric, "mode": mode, "problem": str(error)}
    return found


_PARETO_CACHE: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}


def _ledger_state(root: str) -> tuple[int, ...]:
    """What changes when the root's ledger does: its files' sizes and modification times."""
    from ..records.paths import RootPaths

    state: list[int] = []
    for path in (RootPaths(root).ledger, RootPaths(root).ledger + "-wal"):
        try:
            info = os.stat(path)
        except OSError:
            state += [-1, -1]
        else:
            state += [info.st_size, info.st_mtime_ns]
    return tuple(state)


def pareto_view(root: str) -> dict[str, Any]:
    """A search of several objectives: ``{"objectives": [[metric, mode], ...], "runs": [{"name",
    "values", "feasible", "rank"}]}`` (rank: the feasible run's non-dominated front among the
    feasible runs, 0 the front ``gts results --pareto`` lists; infeasible runs have none);
    ``{"objectives": []}`` for any other root. Worked out again only when the ledger changed (the
    page asks every second)."""
    from ..results import scored, several_objectives
    from ..tuning.pareto import fronts

    state = _ledger_state(root)
    cached = _PARETO_CACHE.get(root)
    if cached is not None and cached[0] == state:
        return cached[1]
    view: dict[str, Any] = {"objectives": [], "runs": []}
    if several_objectives(root):
        objectives, rows = scored(root)
        rows = rows[:PARCOORDS_MOST]
        signs = [1.0 if mode == "min" else -1.0 for _, mode in objectives]
        feasible = [row for row in rows if row["feasible"]]
        points = [[sign * v for sign, v in zip(signs, row["objectives"], strict=True)] for row in feasible]
        rank_of = {feasible[i]["name"]: rank for rank, found in enumerate(fronts(points)) for i in found}
        view = {
            "objectives": [list(goal) for goal in objectives],
            "runs": [
                {
                    "name": r["name"],
                    "values": r["objectives"],
                    "feasible": r["feasible"],
                    "rank": rank_of[r["name"]] if r["feasible"] else None,
                }
                for r in rows
            ],
        }
    _PARETO_CACHE[root] = (state, view)
    return view


def parcoords(root: str, metric: str, *, descending: bool = False) -> dict[str, Any]:
    """The finished runs' parameters and ``metric`` (a result or reported metric, as ``gts
    results`` reads it), the best PARCOORDS_MOST of them: ``{"params", "runs": [{"name",
    "params", "value"}], "total"}``."""
    from ..results import metric as number

    ledger = open_ledger(root)
    try:
        total, records = ledger.page(key=metric, descending=descending, statuses=["succeeded"], limit=PARCOORDS_MOST)
    finally:
        ledger.close()
    runs = []
    params: dict[str, None] = {}
    for record in records:
        row = row_of(root, record)
        value = number(row, metric)
        if value is None:
            continue
        values = record.params_value
        params.update(dict.fromkeys(values))
        runs.append({"name": record.name, "params": values, "value": value})
    return {"metric": metric, "params": list(params), "runs": runs, "total": total}


def timeline(root: str, *, most: int = TIMELINE_MOST) -> dict[str, Any]:
    """Which run ran on which slot (and machine) when: the ``most`` latest started runs, each with
    its start and end (now, for a running one), in seconds since the first of them started; gaps
    in a slot's row are idle time. ``{"runs": [{"name", "slot", "node", "status", "start",
    "end"}], "total"}``."""
    import time

    stale = running_is_stale(root)
    ledger = open_ledger(root)
    try:
        total, records = ledger.page(key="started", descending=True, limit=most)
    finally:
        ledger.close()
    started = [record for record in records if isinstance(record.started_at, (int, float))]
    if not started:
        return {"runs": [], "total": 0}
    now = time.time()
    # Each attempt a bar: a resumed or retried run's earlier attempts are where and when they ran.
    spans = {
        record.name: record.attempt_spans(now, running=record.status is RunStatus.RUNNING and not stale)
        for record in started
    }
    origin = min(start for found in spans.values() for _, start, _ in found)
    runs = []
    for record in reversed(started):
        for slot, start, end in spans[record.name]:
            runs.append(
                {
                    "name": record.name,
                    "slot": slot,
                    "node": record.node or None,
                    "status": shown_status(record, stale),
                    "start": start - origin,
                    "end": end - origin,
                }
            )
    return {"runs": runs, "total": total}


def gpus() -> dict[str, Any]:
    """This machine's GPUs as ``gts gpus --json`` sees them (memory, utilisation, processes,
    sweeps' reservations); ``"problem"`` says why there are none."""
    from ..reports.gpus import machine_gpus

    return machine_gpus()
