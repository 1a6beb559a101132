"""``gts report ROOT -o sweep.html``: the web view of a result root as one self-contained file.

The page of ``gts serve`` with its answers written into it (the overview, every run up to
REPORT_RUNS, what they reported up to REPORT_CURVES runs, the timeline) and its script, style and
Plotly inline: it opens from a file, with no server and no network, to be mailed or attached to
a paper's supplement. Logs stay out (they can be large and private); the page says so.

The data is JSON inside a ``<script type="application/json">`` element, with ``<`` written as
``\\u003c``, so no value (a run named ``</script><script>...``) can end the element early; the
page reads it with ``JSON.parse`` and writes every value as text, as it does when served.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import time
from typing import Any

from ..errors import GTSError
from ..records.metrics import CURVE_POINTS, run_curve
from ..records.paths import RunPaths, UnsafePathError, atomic_write
from . import data
from .server import _finite, plotly_js

REPORT_RUNS = 10_000  # runs in the table (the sweep's first; the counts cover every run)
REPORT_CURVES = 500  # runs whose reported metrics are kept (for their curves)
REPORT_POINTS = 200_000  # points of all those curves together: each run's curve is thinned to its share
REPORT_GROUP_KEYS = 8  # parameters (and metrics) the report works out "mean over" curves for


def _static(name: str) -> str:
    return importlib.resources.files(__package__).joinpath("static").joinpath(name).read_text(encoding="utf-8")


def _inline_script(text: str) -> str:
    """JavaScript safe inside a ``<script>`` element (no ``</script`` can end it)."""
    return text.replace("</", "<\\/")


def report_data(root: str) -> dict[str, Any]:
    """What the page asks the server for, answered once."""
    page = data.runs_page(root, limit=0)
    runs: list[dict[str, Any]] = []
    while len(runs) < min(page["total"], REPORT_RUNS):
        chunk = data.runs_page(root, offset=len(runs), limit=data.PAGE_MOST)["runs"]
        if not chunk:
            break
        runs.extend(chunk[: REPORT_RUNS - len(runs)])
    curves: dict[str, Any] = {}
    most = max(50, min(CURVE_POINTS, REPORT_POINTS // max(1, min(len(runs), REPORT_CURVES))))
    for run in runs[:REPORT_CURVES]:
        try:
            paths = RunPaths.recorded(root, run["name"])
        except UnsafePathError:
            continue
        if paths.unsafe(records_only=True) is not None:
            continue
        points = run_curve(paths, most=most)
        if points:
            curves[run["name"]] = {"steps": [step for step, _ in points], "values": [values for _, values in points]}
    return {
        "made": time.strftime("%Y-%m-%d %H:%M:%S"),
        "root": os.path.abspath(root),
        "overview": data.overview(root),
        "total": page["total"],
        "runs": runs,
        "curves": curves,
        "lineages": data.lineages(root),
        "groups": _groups(root, curves),
        "timeline": data.timeline(root),
        "importance": _importance(root),
        "pareto": data.pareto_view(root),
        "provenance": data.provenances(root, [run["name"] for run in runs]),
    }


def _importance(root: str) -> dict[str, Any] | None:
    """The importance of the metric the config declares (the page's default), or None (none declared)."""
    declared = data.declared_modes(root)
    if not declared:
        return None
    metric, mode = next(iter(declared.items()))
    return data.importance(root, metric, mode)


def _groups(root: str, curves: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The page's "mean over" curves, worked out here as the server works them out (``data.groups_of``):
    ``{parameter: {metric: groups}}`` for up to REPORT_GROUP_KEYS parameters and metrics each, while
    their points stay within REPORT_POINTS (the rest: the page shows the runs' own curves)."""
    params = {name: data.record_params(root, name) for name in curves}
    keys = sorted({key for values in params.values() for key in values})[:REPORT_GROUP_KEYS]
    metrics = sorted({m for curve in curves.values() for values in curve["values"] for m in values})
    groups: dict[str, dict[str, Any]] = {}
    left = REPORT_POINTS
    for over in keys:
        for metric in metrics[:REPORT_GROUP_KEYS]:
            runs = []
            for name, curve in curves.items():
                kept = [
                    (step, v[metric]) for step, v in zip(curve["steps"], curve["values"], strict=True) if metric in v
                ]
                if kept:
                    runs.append(
                        {
                            "name": name,
                            "params": params[name],
                            "steps": [s for s, _ in kept],
                            "values": [v for _, v in kept],
                        }
                    )
            found = data.groups_of(runs, over)
            cost = sum(len(group["steps"]) * 4 for group in found)
            if cost > left:
                return groups
            left -= cost
            groups.setdefault(over, {})[metric] = found
    return groups


def write_report(root: str, output: str) -> str:
    """Write the report of ``root`` to ``output`` (a GTSError when it cannot be written)."""
    html = report_html(root)
    try:
        atomic_write(os.path.abspath(output), html.encode("utf-8"), durable=False)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(output, 0o666 & ~umask)  # a file to share, as any file written here would be
    except OSError as error:
        raise GTSError(f"cannot write the report {output}: {error.strerror or error}") from error
    return output


def report_html(root: str) -> str:
    """The report of ``root`` as the text of one HTML file."""
    payload = json.dumps(_finite(report_data(root)), default=str, allow_nan=False, separators=(",", ":"))
    payload = payload.replace("<", "\\u003c")
    html = _static("index.html")
    style = _static("app.css")
    script = _static("app.js")
    plotly = plotly_js()
    head = "<style>" + style.replace("</", "<\\/") + "</style>"
    scripts = f'<script type="application/json" id="gts-report">{payload}</script>'
    if plotly is not None:
        scripts += f"<script>{_inline_script(plotly.decode('utf-8'))}</script>"
    scripts += f"<script>{_inline_script(script)}</script>"
    html = html.replace('<link rel="stylesheet" href="/static/app.css">', head)
    html = html.replace('<script src="/static/plotly.min.js" defer></script>', "")
    html = html.replace('<script src="/static/app.js" defer></script>', "")
    return html.replace("</body>", scripts + "\n</body>")
