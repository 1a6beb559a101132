"""``gts plot``: a sweep's timeline, its runs' curves (coloured by a parameter, or averaged over
one), a metric against a parameter, and two objectives' Pareto front, drawn with matplotlib (the
``plot`` extra). Read-only, through the ledger and the run folders."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from typing import Any

from ..errors import ConfigError, GTSError, did_you_mean, install_hint
from ..records.status import RunStatus
from ..results import open_ledger
from .drawing import plain_text

_COLORS = {
    "succeeded": "tab:green",
    "failed": "tab:red",
    "timed_out": "tab:orange",
    "interrupted": "tab:gray",
    "pruned": "tab:purple",
    "paused": "tab:olive",
    "running": "tab:blue",
}


def _save(figure: Any, output: str) -> None:
    try:
        figure.savefig(output)
    except OSError as error:
        raise GTSError(f"cannot write the plot to {output!r}: {error.strerror or error}") from None
    except ValueError as error:  # an unknown image format
        raise GTSError(f"cannot write the plot to {output!r}: {error}") from None


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError as error:
        raise GTSError(f"plots need matplotlib: {install_hint('plot')}") from error
    return pyplot


@plain_text
def plot_timeline(root: str, output: str) -> str:
    """Each run as a bar on its slot's row, over time; failures marked with a cross."""
    ledger = open_ledger(root)
    try:
        records = [r for r in ledger.records() if r.started_at is not None]
    finally:
        ledger.close()
    if not records:
        raise GTSError(f"{root!r} has no started runs to plot")
    pyplot = _pyplot()
    now = time.time()
    # Each attempt a bar: a resumed or retried run's earlier attempts are where and when they ran.
    bars = sorted(
        (begin, end, slot, record)
        for record in records
        for slot, begin, end in record.attempt_spans(now, running=record.status is RunStatus.RUNNING)
    )
    start = min(begin for begin, *_ in bars)
    slots = sorted({slot for _, _, slot, _ in bars})
    figure, axes = pyplot.subplots(figsize=(10, 1 + 0.5 * len(slots)))
    lanes: dict[str, list[float]] = {slot: [] for slot in slots}
    for first, last, slot, record in bars:
        begin = first - start
        length = max(last - first, 1e-3)
        # Runs sharing a GPU overlap: stack them in sub-lanes so every bar shows.
        ends = lanes[slot]
        lane = next((i for i, end in enumerate(ends) if end <= begin), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = begin + length
        y = slots.index(slot) + lane * 0.8 / max(1, len(ends))
        color = _COLORS.get(record.status.value, "tab:purple")
        axes.barh(y, length, left=begin, height=0.7 / max(1, len(ends)), color=color, edgecolor="black", linewidth=0.3)
        if record.status in (RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.INTERRUPTED):
            axes.plot(begin + length, y, marker="x", color="black")
    axes.set_yticks(range(len(slots)))
    axes.set_yticklabels(slots)
    axes.set_xlabel("seconds since the first run started")
    axes.set_title(f"runs per slot: {os.path.basename(os.path.abspath(root))}")
    from matplotlib.patches import Patch

    used = sorted({r.status.value for r in records})
    axes.legend(
        handles=[Patch(color=_COLORS.get(s, "tab:purple"), label=s) for s in used],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0,
    )
    figure.tight_layout()
    _save(figure, output)
    pyplot.close(figure)
    return output


def mean_curves(
    runs: dict[str, list[dict[str, Any]]], params_of: dict[str, dict[str, Any]], metric: str, over: str
) -> list[dict[str, Any]]:
    """The runs that differ only in the parameter ``over`` (e.g. the seed), as one curve each
    group: at each step its members reported ``metric`` at, the mean and the 95 % confidence
    interval of the mean (Student's t; none for one member), and how many: ``{"params", "runs",
    "steps", "mean", "low", "high", "n"}``, the groups in the order their first run is given."""
    from ..results import t975

    groups: dict[str, dict[str, Any]] = {}
    for name, run in runs.items():
        params = {key: value for key, value in params_of.get(name, {}).items() if key != over}
        if run and "stage" in run[0]:
            params = {"stage": run[0]["stage"], **params}
        group = groups.setdefault(json.dumps(params, sort_keys=True, default=str), {"params": params, "runs": []})
        group["runs"].append({row["step"]: row[metric] for row in run})
    table = []
    for group in groups.values():
        steps = sorted({step for curve in group["runs"] for step in curve})
        means, lows, highs, counts = [], [], [], []
        for step in steps:
            values = [curve[step] for curve in group["runs"] if step in curve]
            mean = statistics.fmean(values)
            half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
            means.append(mean)
            lows.append(mean - half)
            highs.append(mean + half)
            counts.append(len(values))
        table.append(
            {
                "params": group["params"],
                "runs": len(group["runs"]),
                "steps": steps,
                "mean": means,
                "low": lows,
                "high": highs,
                "n": counts,
            }
        )
    return table


@plain_text
def plot_curves(root: str, metric: str, by: str | None, output: str, *, over: str | None = None) -> str:
    """What the runs reported of ``metric`` against the step, one line per run, coloured by the
    parameter ``by`` (a colour scale for numbers); a run that did not succeed ends in a cross; a
    population-based training member's curve is ringed where it went on from another's weights.
    ``over``: the runs that differ only in that parameter as one mean curve with its 95 % band."""
    from ..results import curve_rows

    points = [row for row in curve_rows(root) if isinstance(row.get(metric), (int, float))]
    if not points:
        from ..results import records

        reported = sorted({name for record in records(root) for name in record.metrics_value})
        raise ConfigError(
            f"no run reported {metric!r} as it trained{did_you_mean(metric, reported)} Reported: "
            f"{', '.join(reported) or 'nothing'}"
        )
    if by is not None and not any(by in row for row in points):
        known = sorted({k for row in points for k in row} - {"name", "stage", "status", "step", metric})
        raise ConfigError(
            f"the runs have no parameter {by!r}{did_you_mean(by, known)} They have: {', '.join(known) or 'none'}"
        )
    if over is not None and not any(over in row for row in points):
        known = sorted({k for row in points for k in row} - {"name", "stage", "status", "step", metric})
        raise ConfigError(
            f"the runs have no parameter {over!r} to average over{did_you_mean(over, known)} They have: "
            f"{', '.join(known) or 'none'}"
        )
    pyplot = _pyplot()
    runs: dict[str, list[dict[str, Any]]] = {}
    for row in points:
        runs.setdefault(row["name"], []).append(row)
    if over is not None:
        return _plot_mean_curves(root, runs, metric, by, over, output, pyplot)
    colour_by: dict[str, Any] = {name: run[0].get(by) if by else None for name, run in runs.items()}
    values = sorted({json.dumps(value, default=str) for value in colour_by.values()}) if by else []
    numeric = bool(by) and all(
        isinstance(value, (int, float)) and not isinstance(value, bool) for value in colour_by.values()
    )
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    colormap = pyplot.get_cmap("viridis" if numeric else "tab10")
    copied = _copied_steps(root)  # population-based training: where a curve went on from another's weights
    if numeric:
        low, high = min(colour_by.values()), max(colour_by.values())
        log = low > 0 and high / low > 50
    scale = numeric and len(values) > LEGEND_MOST  # a search's many values: a colour bar, not a legend
    labelled: set[str] = set()
    for name, run in runs.items():
        value = colour_by[name]
        if numeric:
            position = (
                0.5
                if high == low
                else ((math.log(value / low) / math.log(high / low)) if log else (value - low) / (high - low))
            )
            color = colormap(position)
        else:
            color = colormap(values.index(json.dumps(value, default=str)) % 10) if by else None
        label = f"{by}={value}" if by and str(value) not in labelled and not scale else None
        labelled.add(str(value))
        steps = [row["step"] for row in run]
        axes.plot(steps, [row[metric] for row in run], color=color, linewidth=1.2, label=label)
        if run[-1]["status"] != "succeeded":  # cut short (pruned, failed, ...): where it stopped
            axes.plot(steps[-1:], [run[-1][metric]], marker="x", color=color or "black", markersize=8)
        rings = [next((row for row in run if row["step"] > at), None) for at in copied.get(name, ())]
        if any(rings):  # the first point after each copy, ringed
            shown = [row for row in rings if row is not None]
            axes.plot([r["step"] for r in shown], [r[metric] for r in shown], "o", mfc="none", color=color or "black")
    axes.set_xlabel("step")
    axes.set_ylabel(metric)
    if scale:
        from matplotlib.colors import LogNorm, Normalize
        from matplotlib.ticker import FuncFormatter, NullFormatter

        shade = pyplot.cm.ScalarMappable(norm=(LogNorm if log else Normalize)(low, high), cmap=colormap)
        bar = figure.colorbar(shade, ax=axes)
        bar.set_label(by)
        if log:  # its ticks as plain numbers (0.001): the figure draws no formulas (drawing.plain_text)
            bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            bar.ax.yaxis.set_minor_formatter(NullFormatter())
    elif by and len(labelled) <= 12:  # each value once, in order (numbers by size)
        handles, labels = axes.get_legend_handles_labels()
        key = {f"{by}={value}": value for value in colour_by.values()}
        ordered = sorted(zip(labels, handles, strict=True), key=lambda pair: _order(key.get(pair[0])))
        axes.legend([h for _, h in ordered], [label for label, _ in ordered], fontsize="small")
    figure.tight_layout()
    _save(figure, output)
    pyplot.close(figure)
    return output


LEGEND_MOST = 8  # a numeric --by with more values than this gets a colour bar instead of a legend


def _order(value: Any) -> tuple[int, Any]:
    """A legend's order: numbers by size, then anything else by its text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, json.dumps(value, default=str))


def _copied_steps(root: str) -> dict[str, list[float]]:
    """Each population-based training member's steps at which it went on from another's weights."""
    from ..records.lineage import lineages
    from ..results import open_ledger

    ledger = open_ledger(root)
    try:
        return {name: [s.step for s in lineage.exploits] for name, lineage in lineages(ledger.trial_events()).items()}
    finally:
        ledger.close()


def group_label(params: dict[str, Any], groups: list[dict[str, Any]], by: str | None) -> str:
    """A group's label: ``by`` first, then every other parameter that differs between the groups
    (by ``lr`` alone, two groups of lr 0.3 that differ in their width were both ``lr=0.3``).

    >>> groups = [{"params": {"lr": 0.3, "width": 64}}, {"params": {"lr": 0.3, "width": 128}}]
    >>> [group_label(g["params"], groups, "lr") for g in groups]
    ['lr=0.3, width=64', 'lr=0.3, width=128']
    """
    differ = [
        key
        for key in dict.fromkeys(k for g in groups for k in g["params"])
        if key != by and len({json.dumps(g["params"].get(key), sort_keys=True, default=str) for g in groups}) > 1
    ]
    keys = ([by] if by else []) + differ
    if not by and not differ:
        keys = list(params)
    return ", ".join(f"{key}={params.get(key)}" for key in keys) or "all runs"


def _plot_mean_curves(
    root: str, runs: dict[str, list[dict[str, Any]]], metric: str, by: str | None, over: str, output: str, pyplot: Any
) -> str:
    """``plot_curves(..., over=...)``: one mean line per group, its 95 % band shaded, labelled by
    ``by`` (or the group's parameters) and its number of runs."""
    from ..results import records

    params_of = {record.name: record.params_value for record in records(root)}
    groups = mean_curves(runs, params_of, metric, over)
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    colormap = pyplot.get_cmap("tab10")
    for number, group in enumerate(groups):
        color = colormap(number % 10)
        label = group_label(group["params"], groups, by)
        axes.plot(group["steps"], group["mean"], color=color, linewidth=1.5, label=f"{label} (n={group['runs']})")
        axes.fill_between(group["steps"], group["low"], group["high"], color=color, alpha=0.2, linewidth=0)
    axes.set_xlabel("step")
    axes.set_ylabel(f"{metric}, mean over {over} (95 % band)")
    if len(groups) <= 12:
        axes.legend(fontsize="small", title=None)
    figure.tight_layout()
    _save(figure, output)
    pyplot.close(figure)
    return output


def metric_lines(root: str, metric: str, by: str) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    """What :func:`plot_metric` draws: the column it plots (``result.<metric>``, else the last
    reported ``metrics.<metric>``) and the succeeded runs that have it and ``by``, one group per
    setting of the *other swept parameters* (those that vary), labelled ``k=v,...``."""
    from ..results import records, row_of

    every = records(root)
    swept = sorted({key for record in every for key in record.params_value})
    table = [row_of(root, record) for record in every if record.status is RunStatus.SUCCEEDED]
    choices = (metric,) if metric.startswith(("result.", "metrics.")) else (f"result.{metric}", f"metrics.{metric}")
    key = next((name for name in choices if any(row.get(name) is not None for row in table)), choices[0])
    points = [row for row in table if row.get(key) is not None and row.get(by) is not None]
    if not points:
        if table and not any(by in row for row in table):
            raise ConfigError(
                f"no run has the parameter {by!r}{did_you_mean(by, swept)} Parameters: {', '.join(swept) or 'none'}"
            )
        known = sorted({k for row in table for k in row if k.startswith(("result.", "metrics."))})
        if table and not any(key in row for row in table):
            short = sorted({name.split(".", 1)[1] for name in known})
            raise ConfigError(
                f"no succeeded run has the result {metric!r}{did_you_mean(metric, [*short, *known])} Results: "
                f"{', '.join(short) or 'none'}"
            )
        raise GTSError(f"no succeeded run has both {by!r} and {key!r}; results have: {', '.join(known) or 'none'}")
    # One line per setting of the other parameters; those that never change say nothing. Results,
    # reported metrics, status and duration are no parameters.
    varying = [
        k for k in swept if k != by and len({json.dumps(row.get(k), sort_keys=True, default=str) for row in points}) > 1
    ]
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in points:
        label = ",".join(f"{k}={row.get(k)}" for k in varying) or metric
        groups.setdefault(label, []).append(row)
    return key, groups


@plain_text
def plot_metric(root: str, metric: str, by: str, output: str) -> str:
    """The result (or last reported value) ``metric`` of the succeeded runs against parameter
    ``by``, one line per setting of the other swept parameters."""
    key, groups = metric_lines(root, metric, by)
    points = [row for group in groups.values() for row in group]
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    numeric = all(isinstance(row[by], (int, float)) and not isinstance(row[by], bool) for row in points)
    categories = sorted({str(row[by]) for row in points})
    for label, group in sorted(groups.items()):
        group = sorted(group, key=lambda row: row[by] if numeric else str(row[by]))
        xs = [row[by] if numeric else categories.index(str(row[by])) for row in group]
        axes.plot(xs, [row[key] for row in group], marker="o", label=label)
    if not numeric:
        axes.set_xticks(range(len(categories)))
        axes.set_xticklabels(categories)
    elif all(row[by] > 0 for row in points) and max(row[by] for row in points) / min(row[by] for row in points) > 50:
        axes.set_xscale("log")
    axes.set_xlabel(by)
    axes.set_ylabel(metric)
    if len(groups) > 1:
        axes.legend(fontsize="small")
    figure.tight_layout()
    _save(figure, output)
    pyplot.close(figure)
    return output


@plain_text
def plot_pareto(root: str, first: str, second: str, output: str) -> str:
    """``gts plot --pareto F1 F2``: every succeeded run by two of its search's objectives (feasible
    runs as dots, infeasible ones as crosses) and the Pareto front of the feasible ones as a line."""
    from ..results import front, scored

    objectives, rows = scored(root)
    names = [metric for metric, _ in objectives]
    for name in (first, second):
        if name not in names:
            raise ConfigError(
                f"{name!r} is not an objective of {root!r}{did_you_mean(name, names)} Objectives: {', '.join(names)}."
            )
    i, j = names.index(first), names.index(second)
    signs = [1.0 if mode == "min" else -1.0 for _, mode in objectives]
    feasible = [row for row in rows if row["feasible"]]
    points = [[sign * value for sign, value in zip(signs, row["objectives"], strict=True)] for row in feasible]
    best = [feasible[k] for k in front(points)]
    best.sort(key=lambda row: row["objectives"][i])
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=(7, 5))
    axes.scatter([r["objectives"][i] for r in feasible], [r["objectives"][j] for r in feasible], s=16, label="feasible")
    infeasible = [row for row in rows if not row["feasible"]]
    if infeasible:
        axes.scatter(
            [r["objectives"][i] for r in infeasible],
            [r["objectives"][j] for r in infeasible],
            marker="x",
            s=16,
            color="grey",
            label="infeasible",
        )
    axes.plot(
        [r["objectives"][i] for r in best],
        [r["objectives"][j] for r in best],
        marker="o",
        color="C3",
        label=f"Pareto front ({len(best)} runs)" + (" of all objectives" if len(names) > 2 else ""),
    )
    axes.set_xlabel(f"{first} ({objectives[i][1]})")
    axes.set_ylabel(f"{second} ({objectives[j][1]})")
    axes.legend(fontsize="small")
    figure.tight_layout()
    _save(figure, output)
    pyplot.close(figure)
    return output
