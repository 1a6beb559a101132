"""Which swept parameters mattered for a metric: Optuna's importance evaluators on the ledger's rows.

The succeeded runs' parameters and values are read from the ledger by SQLite
in one scan (``Ledger.params_and_values``), made into an in-memory Optuna
study (one finished trial per run), and ranked by one of Optuna's evaluators:

``ped-anova`` (the default): PED-ANOVA (Watanabe et al., IJCAI 2023) asks which
    parameters decide whether a run lands among the best ``quantile`` of runs
    (by default 10 %): the divergence between where the best runs lie and where
    all runs lie, per parameter. That is the question a sweep asks (what must I
    get right to do well), it needs no model fit, and it is fast: 10,000 runs
    of 20 parameters in about 4 s on 2 cores (``bench/importance_bench.py``).
    It needs to know which way is better (``mode``).
``fanova``: fANOVA (Hutter et al., ICML 2014) fits a random forest to all runs
    and splits the metric's variance between the parameters: importance over
    the whole space, good runs and bad alike. It needs scikit-learn, and it is
    slow: about 26 s for 1,000 runs of 20 parameters on 2 cores.

The parameters' kinds are inferred from the values the runs have, for grids
and searches alike: numbers (at least two distinct, all finite) are a range,
on a log scale when they are all positive and span 100x or more; anything
else, and a key some runs lack (one block of a grid has it, another not:
those runs count as ``(absent)``), is a category. A parameter every run has
at one value cannot matter here and is listed as constant.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError, GTSError, install_hint
from ..finite import finite_number
from ..records.status import RunStatus
from .drawing import plain_text

EVALUATORS = ("ped-anova", "fanova")
ABSENT = "(absent)"  # the category of a run that lacks a parameter other runs have
MIN_RUNS = 4
NOT_HYPERPARAMETERS = frozenset(("seed",))  # keys left out of the ranking (said in its table)


def _paused_words(root: str) -> str:
    """Why a pausing method's root has few runs to rank: its paused runs are left out (their values
    are of the rung they stopped at, earlier steps than the finished runs': not comparable)."""
    from ..results import open_ledger

    try:
        ledger = open_ledger(root)
    except GTSError:
        return ""
    try:
        paused = ledger.counts().get(RunStatus.PAUSED, 0)
    finally:
        ledger.close()
    if not paused:
        return ""
    return (
        f" ({paused} paused run(s) are left out: their values are of the rung each paused at, earlier steps than "
        "the finished runs', and ranking them together would rank how far a run trained)"
    )


def read_rows(root: str, metric: str, *, stage: str | None = None) -> list[tuple[dict[str, Any], float]]:
    """The succeeded runs' parameters and finite values of ``metric``, from the ledger."""
    from ..results import key_problem, open_ledger

    ledger = open_ledger(root)
    try:
        found = ledger.params_and_values(metric, stage=stage)
    finally:
        ledger.close()
    rows = []
    for params, value in found:
        if not math.isfinite(value):
            continue
        decoded = json.loads(params) if params else {}
        rows.append((decoded if isinstance(decoded, dict) else {}, value))
    if not rows:
        problem = key_problem(root, metric, stage=stage)
        raise ConfigError(problem or f"no succeeded run of {root!r} has a number for {metric!r}")
    return rows


def _choice(value: Any) -> Any:
    """A value as an Optuna category: None, a bool, a number or a string (anything else as JSON; an
    int past float's range, which Optuna cannot compare, as its digits in ``1.2345e+400`` form)."""
    if isinstance(value, int) and not isinstance(value, bool) and not _finite(value):
        digits = str(abs(value))
        return f"{'-' if value < 0 else ''}{digits[0]}.{digits[1:5]}e+{len(digits) - 1}"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True)


def _finite(value: Any) -> bool:
    """A number a float can hold (an int of 400 digits is none: it is a category here)."""
    return finite_number(value)


def _numeric(values: Sequence[Any]) -> bool:
    return all(_finite(v) for v in values) and len(set(values)) > 1


def _log_scale(values: Sequence[float]) -> bool:
    """Whether distinct positive numbers spanning 100x or more lie on a log scale: their median is
    nearer (by ratio) the geometric mean of the ends than the arithmetic one, as a log grid's
    (0.001, 0.01, 0.1) or a log-uniform sample's is and a uniform sample's is not. Worked out in
    logarithms: the product of two tiny numbers is 0 in floats, the sum of two huge ones inf.

    >>> _log_scale([0.001, 0.01, 0.1]), _log_scale([0.0003, 0.02, 0.05, 0.07, 0.1]), _log_scale([1, 2, 3])
    (True, False, False)
    >>> _log_scale([5e-324, 1e-320, 1e-310]), _log_scale([1.0, 1e300, 1.7e308])
    (True, False)
    """
    low, high = values[0], values[-1]
    if low <= 0 or math.log(high) - math.log(low) < math.log(100):
        return False
    middle = len(values) // 2
    if len(values) % 2:
        log_middle = math.log(values[middle])
    else:
        log_middle = (math.log(values[middle - 1]) + math.log(values[middle])) / 2
    geometric = (math.log(low) + math.log(high)) / 2
    return abs(log_middle - geometric) < abs(log_middle - math.log(low / 2 + high / 2))


# A numeric key some runs lack (a conditional ``when:`` key) is a category, with ``(absent)``; past
# this many distinct values its values are binned into this many ranges of equal counts: one
# category a value made Optuna's work grow with the square of the runs (4,000 runs took 55 s).
MAX_CHOICES = 16


def _bins(present: Sequence[float]) -> tuple[list[float], list[str]]:
    """The lower edges and the labels of :data:`MAX_CHOICES` ranges of equal counts of ``present``."""
    distinct = sorted(set(present))
    edges = [distinct[len(distinct) * k // MAX_CHOICES] for k in range(MAX_CHOICES)]
    edges = sorted(set(edges))
    uppers = [*edges[1:], None]
    labels = [
        f"{low:.4g} to {upper:.4g}" if upper is not None else f"{low:.4g} up"
        for low, upper in zip(edges, uppers, strict=True)
    ]
    return edges, labels


def declared_scales(root: str) -> dict[str, bool]:
    """Whether each key of the root's search space is on a log scale, as its config declares it
    (``loguniform``, ``{int: ..., log: true}``: True; ``uniform``, ``int``: False); empty for a
    grid, whose scale is guessed from its values (:func:`_log_scale`)."""
    from ..results import recorded_config
    from ..tuning.space import Int, LogUniform, Uniform, parse_distribution

    try:
        config = recorded_config(root) or {}
    except GTSError:  # no result root there (rows given by the caller): every scale is guessed
        return {}
    if not isinstance(config.get("search"), dict):
        return {}
    found: dict[str, bool] = {}
    blocks = config.get("test_config")
    for block in blocks if isinstance(blocks, list) else ():
        for key, value in block.items() if isinstance(block, dict) else ():
            try:
                distribution = parse_distribution(value, str(key), conditional=True)
            except (ConfigError, TypeError, ValueError):
                continue
            if isinstance(distribution, LogUniform):
                found[str(key)] = True
            elif isinstance(distribution, (Uniform, Int)):
                found[str(key)] = bool(getattr(distribution, "log", False))
    return found


def spaces(
    rows: Sequence[tuple[Mapping[str, Any], float]],
    metric: str,
    bins: dict[str, tuple[list[float], list[str]]] | None = None,
    scales: Mapping[str, bool] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Each parameter's Optuna distribution, inferred from the runs' values; and the constant ones.
    ``bins``: filled with the ranges of the numeric keys binned (:data:`MAX_CHOICES`). ``scales``:
    the keys whose scale a search declares (:func:`declared_scales`), log or not: a guess for the
    others."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    bins = {} if bins is None else bins

    names = sorted({name for params, _ in rows for name in params if name != metric})
    found: dict[str, Any] = {}
    constant = []
    for name in names:
        present = [params[name] for params, _ in rows if name in params]
        absent = len(present) < len(rows)
        if not absent and _numeric(present):
            low, high = min(present), max(present)
            declared = (scales or {}).get(name)
            log = _log_scale(sorted(set(present))) if declared is None else declared and low > 0
            if all(isinstance(v, int) for v in present):
                found[name] = IntDistribution(int(low), int(high), log=log)
            else:
                found[name] = FloatDistribution(float(low), float(high), log=log)
            continue
        if absent and len(set(present)) > MAX_CHOICES and all(_finite(v) for v in present):
            bins[name] = _bins(present)
            found[name] = CategoricalDistribution([*bins[name][1], ABSENT])
            continue
        choices = {json.dumps(_choice(v), sort_keys=True): _choice(v) for v in present}
        if absent:
            choices[json.dumps(ABSENT)] = ABSENT
        if len(choices) < 2:
            constant.append(name)
            continue
        found[name] = CategoricalDistribution([choices[key] for key in sorted(choices)])
    return found, constant


def _value_of(
    params: Mapping[str, Any], name: str, distribution: Any, bins: Mapping[str, tuple[list[float], list[str]]]
) -> Any:
    from optuna.distributions import CategoricalDistribution

    if name not in params:
        return ABSENT
    value = params[name]
    if name in bins:
        edges, labels = bins[name]
        return labels[max(0, bisect.bisect_right(edges, value) - 1)]
    if isinstance(distribution, CategoricalDistribution):
        return _choice(value)
    return value


def importance(
    root: str,
    metric: str,
    *,
    mode: str | None = None,
    evaluator: str = "ped-anova",
    quantile: float = 0.1,
    stage: str | None = None,
    seed: int = 0,
    rows: Sequence[tuple[dict[str, Any], float]] | None = None,
    scales: Mapping[str, bool] | None = None,
) -> dict[str, Any]:
    """The parameters of ``root``'s succeeded runs ranked by their importance for ``metric``.

    ``mode`` ("min" or "max"; default: what the config's early_stop or search declares) says which
    way is better (PED-ANOVA needs it). Returns ``metric``, ``mode``, ``evaluator``, ``runs`` (how
    many were used), ``parameters`` (``[{"name", "importance", "kind"}]``, most important first,
    importances adding up to 1) and ``constant`` (parameters at one value in every run). ``rows``:
    :func:`read_rows`'s, when the caller has read them already."""
    if evaluator not in EVALUATORS:
        raise ConfigError(f"unknown evaluator {evaluator!r}; choose {' or '.join(EVALUATORS)}")
    if not 0 < quantile < 1:
        raise ConfigError(f"the quantile of the best runs must be in (0, 1); got {quantile!r}")
    from ..results import declared_mode

    mode = mode or declared_mode(root, metric)
    if mode not in ("min", "max"):
        raise ConfigError(
            f"which way is {metric!r} better? Say --min or --max (the config's early_stop or search declares "
            "no mode for it)"
        )
    rows = read_rows(root, metric, stage=stage) if rows is None else rows
    if len(rows) < MIN_RUNS:
        raise ConfigError(
            f"{len(rows)} succeeded run(s) have a number for {metric!r}; importance needs {MIN_RUNS}"
            + _paused_words(root)
        )
    try:
        import optuna
    except ImportError:
        raise ConfigError(f"importance uses Optuna's evaluators: {install_hint('importance')}") from None
    bins: dict[str, tuple[list[float], list[str]]] = {}
    # A seed is no hyperparameter: what it "explains" is noise, and a sweep over seeds would rank it.
    left_out = sorted({key for params, _ in rows for key in params if key in NOT_HYPERPARAMETERS})
    rows = [({k: v for k, v in params.items() if k not in NOT_HYPERPARAMETERS}, value) for params, value in rows]
    found, constant = spaces(rows, metric, bins, declared_scales(root) if scales is None else scales)
    result: dict[str, Any] = {
        "metric": metric,
        "mode": mode,
        "evaluator": evaluator,
        "runs": len(rows),
        "parameters": [],
        "constant": constant,
        "left_out": left_out,
    }
    if not found:
        return result
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize" if mode == "min" else "maximize")
    study.add_trials(
        [
            optuna.trial.create_trial(
                params={name: _value_of(params, name, dist, bins) for name, dist in found.items()},
                distributions=found,
                value=value,
            )
            for params, value in rows
        ]
    )
    if evaluator == "fanova":
        import importlib.util

        if importlib.util.find_spec("sklearn") is None:  # Optuna's fANOVA fits scikit-learn's random forest
            raise ConfigError(
                f"the fanova evaluator needs scikit-learn: {install_hint('importance')}; ped-anova needs nothing more"
            )
        chosen: Any = optuna.importance.FanovaImportanceEvaluator(seed=seed)
    else:
        # At least two runs make up the best quantile (PED-ANOVA compares where they lie with where all do).
        chosen = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=max(quantile, 2 / len(rows)))
    scores = optuna.importance.get_param_importances(study, evaluator=chosen, normalize=True)
    result["parameters"] = [
        {"name": name, "importance": float(score), "kind": _kind(found[name])} for name, score in scores.items()
    ]
    return result


def _kind(distribution: Any) -> str:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(distribution, CategoricalDistribution):
        return "category"
    scale = "log " if distribution.log else ""
    return scale + ("integer" if isinstance(distribution, IntDistribution) else "range")


def format_importance(found: Mapping[str, Any]) -> str:
    """``gts importance``'s table: each parameter, its importance as a number and a bar."""
    lines = [
        f"{found['metric']} ({found['mode']}, {found['runs']} runs): importance by "
        f"{'PED-ANOVA' if found['evaluator'] == 'ped-anova' else 'fANOVA'}"
    ]
    width = max([len(p["name"]) for p in found["parameters"]] + [9])
    for parameter in found["parameters"]:
        bar = "#" * round(40 * parameter["importance"])
        lines.append(f"  {parameter['name']:<{width}}  {parameter['importance']:6.3f}  {bar}  ({parameter['kind']})")
    if not found["parameters"]:
        lines.append("  no parameter takes two values in these runs")
    if found["constant"]:
        lines.append(f"  constant in every run: {', '.join(found['constant'])}")
    if found.get("left_out"):
        lines.append(f"  left out: {', '.join(found['left_out'])} (a seed is not a hyperparameter)")
    return "\n".join(lines)


def top_points(
    root: str,
    metric: str,
    names: Sequence[str],
    *,
    stage: str | None = None,
    most: int = 5000,
    rows: Sequence[tuple[dict[str, Any], float]] | None = None,
) -> dict[str, Any]:
    """What contour and slice plots of ``names`` draw: each succeeded run's values of them and its
    value of ``metric`` (at most ``most`` runs: the first in the sweep's order)."""
    rows = (read_rows(root, metric, stage=stage) if rows is None else rows)[:most]
    return {
        "metric": metric,
        "names": list(names),
        "points": [[[_choice(params.get(name, ABSENT)) for name in names], value] for params, value in rows],
    }


def chosen_params(
    root: str,
    metric: str,
    params: Sequence[str] | None,
    mode: str | None,
    rows: Sequence[tuple[dict[str, Any], float]],
) -> list[str]:
    """The two parameters a contour draws: ``params`` (checked), else the two most important."""
    if params:
        if len(set(params)) != 2:
            raise ConfigError("a contour needs two different parameters")
        known = sorted({name for row, _ in rows for name in row})
        for name in params:
            if name not in known:
                from ..errors import did_you_mean

                raise ConfigError(
                    f"no run has the parameter {name!r}{did_you_mean(name, known)} Parameters: {', '.join(known)}."
                )
        return list(params)
    ranked = [p["name"] for p in importance(root, metric, mode=mode, rows=rows)["parameters"]]
    if len(ranked) < 2:
        raise ConfigError(f"a contour needs two parameters that take several values; the runs have {len(ranked)}")
    return ranked[:2]


def _axis(values: Sequence[Any], log: bool | None = None) -> tuple[list[float], list[str] | None, bool]:
    """Positions on an axis: numbers as they are (``log``: as a search declares its scale; None:
    guessed, spanning 100x, all positive), anything else as the index of its category (with the
    categories' labels)."""
    if all(_finite(v) for v in values):
        distinct = sorted(set(values))
        if log is not None:
            return [float(v) for v in values], None, log and bool(distinct) and distinct[0] > 0
        return [float(v) for v in values], None, len(distinct) > 1 and _log_scale(distinct)
    labels = sorted({str(v) for v in values})
    return [float(labels.index(str(v))) for v in values], labels, False


@plain_text
def plot_contour(
    root: str, metric: str, output: str, *, params: Sequence[str] | None = None, mode: str | None = None
) -> str:
    """``gts plot --contour``: the metric over two parameters (the two most important unless named),
    interpolated between the runs (each run a dot), and a slice along each: the metric against it."""
    from .plots import _pyplot, _save

    rows = read_rows(root, metric)  # once, for the ranking and the points
    names = chosen_params(root, metric, params, mode, rows)
    points = top_points(root, metric, names, rows=rows)["points"]
    scales = declared_scales(root)
    xs, x_labels, x_log = _axis([values[0] for values, _ in points], scales.get(names[0]))
    ys, y_labels, y_log = _axis([values[1] for values, _ in points], scales.get(names[1]))
    zs = [value for _, value in points]
    pyplot = _pyplot()
    figure, (contour, left, right) = pyplot.subplots(1, 3, figsize=(15, 4.5))
    tx = [math.log10(x) for x in xs] if x_log else xs
    ty = [math.log10(y) for y in ys] if y_log else ys
    if len(set(zip(tx, ty, strict=True))) >= 3 and len(set(tx)) > 1 and len(set(ty)) > 1:
        try:
            filled = contour.tricontourf(tx, ty, zs, levels=14, cmap="viridis")
            figure.colorbar(filled, ax=contour, label=metric)
        except (ValueError, RuntimeError):  # points on one line: no triangles to fill
            pass
    contour.scatter(tx, ty, c=zs, cmap="viridis", edgecolors="white", linewidths=0.5, s=18)
    for axes, labels, log, name, setter in (
        (contour, x_labels, x_log, names[0], "x"),
        (contour, y_labels, y_log, names[1], "y"),
    ):
        getattr(axes, f"set_{setter}label")(f"log10 {name}" if log else name)
        if labels is not None:
            getattr(axes, f"set_{setter}ticks")(range(len(labels)))
            getattr(axes, f"set_{setter}ticklabels")(labels)
    contour.set_title(f"{metric} over {names[0]} and {names[1]}")
    for axes, positions, labels, log, name in (
        (left, xs, x_labels, x_log, names[0]),
        (right, ys, y_labels, y_log, names[1]),
    ):
        axes.scatter(positions, zs, s=14, alpha=0.7)
        axes.set_xlabel(name)
        axes.set_ylabel(metric)
        if log:
            axes.set_xscale("log")
        if labels is not None:
            axes.set_xticks(range(len(labels)))
            axes.set_xticklabels(labels)
        axes.set_title(f"{metric} against {name}")
    figure.tight_layout()
    _save(figure, output)
    pyplot.close(figure)
    return output
