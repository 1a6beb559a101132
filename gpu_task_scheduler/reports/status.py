"""Status tables and plots of a result root."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import ConfigError, GTSError, did_you_mean, install_hint
from ..gpu.devices import format_memory
from ..records.checkpoints import DISK_META
from ..records.metrics import describe, latest, shown_first
from ..records.paths import RunPaths, log_name_problem, name_problem
from ..records.status import NOTHING_LEFT, QUEUED, RunStatus
from ..results import duration_text, escape_controls, open_ledger
from .disk import checkpoint_disk, checkpoint_line
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


logger = logging.getLogger("gpu_task_scheduler")

STALE = "stale"


# `gts status` lists every run of a root of up to TABLE_ALL runs; of a larger one, the runs that did
# not succeed, up to TABLE_OTHERS (`--json` streams every run, `gts results` has every result).
TABLE_ALL = 1000
TABLE_OTHERS = 200


def status(root: str, *, runs: str = "all") -> dict[str, Any]:
    """Counts (by SQLite, never by reading every run here) and the entries of the runs ``runs`` asks
    for: ``"all"``, ``"table"`` (what ``gts status`` lists, see TABLE_ALL) or ``"watch"`` (the running
    runs and the latest five failures). Read-only.

    Runs recorded as running while no scheduler holds the root (it was
    killed) are shown as ``stale``, with no growing duration: nothing runs them."""
    ledger = open_ledger(root)
    try:
        report, recorded, entries = _head(root, ledger)
        if runs == "watch":
            texts = list(entries(where="status = 'running'"))
            texts += reversed(list(entries(where="status IN ('failed', 'timed_out')", limit=5, last=True)))
        elif runs == "table" and recorded > TABLE_ALL:
            texts = list(entries(where="status != 'succeeded'", limit=TABLE_OTHERS))
        else:
            texts = list(entries())
        report["runs"] = [json.loads(text) for text in texts]
        report["listed"] = {"runs": len(texts), "of": recorded}
        for run in report["runs"]:
            _add_latest(root, run)
        copies = _copies(ledger) if runs != "watch" else {}
        for run in report["runs"]:
            if run["name"] in copies:
                run["copied"] = copies[run["name"]]
    finally:
        ledger.close()
    reported = [run["metrics"] for run in report["runs"] if isinstance(run.get("metrics"), dict)]
    if reported:  # the metrics the config declares and the losses first (a short view shows three)
        from ..results import declared_modes

        declared = sorted(declared_modes(root))
        for run in report["runs"]:
            if isinstance(run.get("metrics"), dict):
                run["metrics"] = {name: run["metrics"][name] for name in shown_first(run["metrics"], declared)}
    return report


def _copies(ledger: Any) -> dict[str, str]:
    """Population-based training: how many others each member that copied any copied, and the
    latest (``3, last lr-0.37, at 16 (lr x0.5)``; ``gts results --lineage`` gives all), by name."""
    from ..records.lineage import copies_text, lineages

    return {
        name: f"{len(lineage.exploits)}, last {copies_text(lineage.exploits[-1:])}"
        for name, lineage in lineages(ledger.trial_events()).items()
        if lineage.exploits
    }


def _add_latest(root: str, run: dict[str, Any]) -> bool:
    """A running run's latest reported metrics, read from the end of its own file (the ledger has
    them only from its end), as ``run["metrics"]``; whether it has any."""
    if run.get("status") != "running" or name_problem(run["name"]) is not None:
        return False
    found = latest(RunPaths.recorded(root, run["name"]).metrics)
    if found is None:
        return False
    step, values = found
    run["metrics"] = {name: {"last": value, "step": step} for name, value in values.items()}
    return True


def write_status_json(root: str, write: Callable[[str], object]) -> None:
    """The report of :func:`status` with every run, as JSON written a run at a time (each run's
    entry is written by SQLite): a root of 300,000 runs never sits in memory."""
    ledger = open_ledger(root)
    try:
        report, _, entries = _head(root, ledger)
        copies = _copies(ledger)
        write(json.dumps(report, indent=1)[:-2] + ',\n "runs": [')
        for index, text in enumerate(entries()):
            if '"running"' in text or copies:  # its latest metrics, whom it copied, as status() gives them
                run = json.loads(text)
                if run["name"] in copies:
                    run["copied"] = copies[run["name"]]
                if _add_latest(root, run) or "copied" in run:
                    text = json.dumps(run)
            write(("\n  " if index == 0 else ",\n  ") + text)
        write("\n ]\n}\n")
    finally:
        ledger.close()


def _head(root: str, ledger: Any) -> tuple[dict[str, Any], int, Callable[..., Iterator[str]]]:
    """The report without its runs, how many runs are recorded, and the runs' entries (JSON text,
    ``Ledger.status_entries`` bound to this root)."""
    from ..records.ledger.lock import scheduler_state

    tally, mean = ledger.tally()
    total_text = ledger.get_meta("sweep_runs")
    log_file = ledger.get_meta("log_file") or None
    waiting = ledger.get_meta("waiting") or None
    ledger.warn_problems(json_fields=False)  # status shows no result or parameters
    from ..backends.live import left_on_cluster

    running, holder = scheduler_state(root)
    left = left_on_cluster(root) if running is False else None
    on_slurm = left.total if left is not None else 0
    counts = {status.value: 0 for status in RunStatus}
    counts[QUEUED] = 0  # recorded running, waiting in a cluster's queue for a machine
    counts[STALE] = 0
    stages: dict[str, dict[str, int]] = {}
    for stage, state, count in tally:
        if state in (RunStatus.RUNNING.value, QUEUED) and running is False:
            state = RunStatus.RUNNING.value if on_slurm else STALE  # detached: queued or running, unknown here
        counts[state] = counts.get(state, 0) + count
        if stage is not None:  # a sweep with stages: the counts of each too, in the sweep's order
            stages.setdefault(stage, {}).setdefault(state, 0)
            stages[stage][state] += count
    if left is not None and left.queued:
        # Detached: what the cluster says waits for a machine is queued, the rest running. (The ledger
        # cannot say: a run placed after the driver left is recorded as it was when queued.)
        queued = min(left.queued, counts[RunStatus.RUNNING.value])
        counts[RunStatus.RUNNING.value] -= queued
        counts[QUEUED] += queued
    recorded = sum(count for _, _, count in tally)
    if total_text:
        try:
            counts["pending"] = max(0, int(total_text) - recorded)
        except ValueError:  # changed by hand: the pending count is unknown, the rest is read
            logger.warning(
                "the ledger of %s records the sweep's size as %r, not a number; pending unknown", root, total_text[:40]
            )
    scheduler = {
        "running": running,
        "holder": None if running is False else holder,  # nothing holds the root: no holder
        "waiting": waiting if running else None,
    }
    if on_slurm:  # gts run --detach: no scheduler, and its runs queued or running on Slurm
        scheduler["on_slurm"] = on_slurm
    report: dict[str, Any] = {"root": os.path.abspath(root), "scheduler": scheduler, "counts": counts}
    from ..backends.live import shown

    report.update(shown(root, running=bool(running)))  # a Slurm pool's allocations, say
    if nothing := ledger.left_nothing():  # a result written elsewhere goes unnoticed: said
        report["left_nothing"] = nothing
    notes = ledger.notes()
    if notes:  # what the scheduler saw of runs that the user should know (a resume that ignored its checkpoint)
        report["notes"] = notes
    if stages:
        report["stages"] = stages
    report["mean_success_seconds"] = mean
    disk = checkpoint_disk(ledger.get_meta(DISK_META))
    if disk is not None:  # population-based training's checkpoints and snapshots (engine/pauses.py)
        report["checkpoints"] = disk
    seconds, joules = ledger.cost()
    report["gpu_seconds"], report["energy"] = seconds, joules  # over every attempt (gpu/usage.py)
    # Where no GPU was measured (CPU slots): the time the runs held their slots, over every attempt.
    report["slot_seconds"] = ledger.held_seconds(time.time() if running else 0.0) if not seconds else None
    if log_file is not None and log_name_problem(log_file) is not None:
        log_file = None  # changed by hand into a path out of the run folders: no log path is shown
    base = root if root == "/" else root.rstrip("/")
    entries = functools.partial(
        ledger.status_entries,
        root=base,
        log_file=log_file,
        stale=running is False and not on_slurm,
        followed=running is not False,
        now=time.time(),
    )
    return report, recorded, entries


def running_is_stale(root: str) -> bool:
    """Whether the runs this root records as running are stale: no scheduler holds the root, and
    no detached sweep's tasks run them on Slurm. The web view asks the same as ``gts status``."""
    from ..records.ledger.lock import scheduler_state

    return scheduler_state(root)[0] is False and not detached_on_slurm(root)


def detached_on_slurm(root: str) -> int:
    """How many runs of this root a detached sweep left queued or running on a cluster (asked
    through the backends' seam, ``backends/live.py``): they are running, not stale."""
    from ..backends.live import left_on_cluster

    return left_on_cluster(root).total


def pool_lines(pool: dict[str, Any], width: int = 80) -> list[str]:
    """A Slurm pool as ``gts status`` shows it: its allocations, their nodes, slots and runs."""
    allocations = [a for a in pool.get("allocations") or [] if isinstance(a, dict)]
    if pool.get("over"):
        return [f"  pool: over; {pool.get('submissions', 0)} allocation(s) submitted by its last start"]
    lines = [f"  pool: {len(allocations)} allocation(s) up, {pool.get('submissions', 0)} submitted by this start"]
    for allocation in allocations:
        lines.append(f"    job {allocation.get('job')} {allocation.get('state')} on {allocation.get('nodes') or '-'}")
        for agent in allocation.get("agents") or []:
            slots, running = agent.get("slots") or [], agent.get("running") or []
            draining = " draining" if agent.get("draining") else ""
            text = f"      {agent.get('node')}: {len(running)}/{len(slots)} busy{draining}: " + " ".join(running)
            lines.append(text if len(text) <= width else text[: width - 1] + "…")
    return lines


CAUSE_SHOWN = 60  # characters of a cause in the table (--verbose, --json: all of it)
# Columns given up, in this order, when the table is wider than the terminal.
DROPPED_FIRST = ("log", "started", "gpu h", "gpu peak", "attempts", "exit")


def terminal_width(stream: Any) -> int | None:
    """The width to fit a table to on a terminal: ``COLUMNS`` when set, else the terminal's. None
    for a pipe or a file (a script reads every column whole) and for a terminal that reports
    width 0 (some CI consoles)."""
    import shutil

    if not stream.isatty():
        return None
    columns = os.environ.get("COLUMNS", "")
    if columns.isascii() and columns.isdigit() and int(columns) > 0:
        return int(columns)
    width = shutil.get_terminal_size(fallback=(0, 0)).columns
    return width if width > 0 else None


def _shorten(text: Any, most: int) -> Any:
    if not isinstance(text, str) or len(text) <= most:
        return text
    return text[: max(1, most - 1)] + "…"


def _fit(table: list[dict[str, Any]], names: list[str], width: int | None, *, escape: bool) -> str:
    """The table within ``width`` characters: the cause column narrowed first (to 20), then the
    columns of DROPPED_FIRST given up, then every line cut."""
    from ..results import format_table

    text = format_table(table, names, escape=escape)
    if width is None:
        return text
    names = list(names)

    def widest(text: str) -> int:
        return max(len(line) for line in text.splitlines())

    for drop in (None, *DROPPED_FIRST):
        if drop in names:
            names.remove(drop)
        if widest(text := format_table(table, names, escape=escape)) <= width:
            return text
        if "cause" in names:
            over = widest(text) - width
            causes = [len(str(row.get("cause") or "")) for row in table]
            room = max(20, max(causes, default=0) - over)
            short = [{**row, "cause": _shorten(row.get("cause"), room)} for row in table]
            if widest(text := format_table(short, names, escape=escape)) <= width:
                return text
    return "\n".join(line[: width - 1] + "…" if len(line) > width else line for line in text.splitlines())


def format_status(
    report: dict[str, Any], *, escape: bool = False, width: int | None = None, verbose: bool = False
) -> str:
    """``gts status``: counts, stages, one row per listed run. ``width``: fit the table to it (see
    :func:`_fit`); a cause is cut at CAUSE_SHOWN characters unless ``verbose``."""
    counts = report["counts"]
    head = ", ".join(f"{count} {name}" for name, count in counts.items() if count)
    running = report["scheduler"]["running"]
    where = {
        True: f"a scheduler is running ({report['scheduler']['holder']})",
        False: "no scheduler is running"
        + (
            f"; {report['scheduler']['on_slurm']} run(s) queued or running on Slurm (detached: gts run on this "
            "root again follows them)"
            if report["scheduler"].get("on_slurm")
            else ""
        ),
        None: f"whether a scheduler runs cannot be told from here ({report['scheduler']['holder']})",
    }[running]
    lines = [f"{report['root']}: {head or 'no runs recorded'}; {where}"]
    for stage, stage_counts in report.get("stages", {}).items():
        lines.append(f"  stage {stage}: " + ", ".join(f"{count} {name}" for name, count in stage_counts.items()))
    if report.get("gpu_seconds"):
        energy = f", {report['energy'] / 3.6e6:.4g} kWh" if report.get("energy") else ""
        lines.append(f"  spent: {report['gpu_seconds'] / 3600:.4g} GPU-hours{energy}")
    elif report.get("slot_seconds"):
        lines.append(f"  spent: {report['slot_seconds'] / 3600:.4g} slot-hours (no GPU measured)")
    if isinstance(report.get("pool"), dict):
        lines += pool_lines(report["pool"])
    if report.get("checkpoints"):
        lines.append(checkpoint_line(report["checkpoints"]))
    if report.get("left_nothing"):
        lines.append(f"  {report['left_nothing']} succeeded but left no result and reported no metric ({NOTHING_LEFT})")
    for name, note in report.get("notes", {}).items():
        lines.append(f"  note: {note}" if name in note else f"  note on {name}: {note}")
    if counts.get(STALE):
        lines.append(
            f"{counts[STALE]} run(s) recorded as running are stale: their scheduler is gone and nothing "
            "runs them; the next start runs them again"
        )
    table = [
        {**run, "duration": duration_text(run["duration"], run.get("last_duration"))}
        | {"in queue": duration_text(run.get("queued_for"))}
        for run in report["runs"]
    ]
    if table:
        for row in table:
            if not verbose:
                row["cause"] = _shorten(row.get("cause"), CAUSE_SHOWN)
            peak = row.get("gpu_memory_peak")
            row["gpu peak"] = None if peak is None else format_memory(peak)
            seconds = row.get("gpu_seconds")
            row["gpu h"] = None if seconds is None else f"{seconds / 3600:.3g}"
            row["metrics"] = describe(row["metrics"]) if isinstance(row.get("metrics"), dict) else None
        names = ["name", "status", "slot", "started", "duration", "exit", "attempts", "gpu peak", "cause", "log"]
        if any(row["gpu h"] is not None for row in table):  # what each run cost (gpu/usage.py)
            names.insert(names.index("gpu peak") + 1, "gpu h")
        if any(row["metrics"] for row in table):  # runs that report as they train: their latest values
            names.insert(names.index("attempts") + 1, "metrics")
        if any(row.get("copied") for row in table):  # population-based training: whom each copied
            names.insert(names.index("cause"), "copied")
            if not verbose:
                for row in table:
                    row["copied"] = _shorten(row.get("copied"), CAUSE_SHOWN)
        if any(run.get("node") for run in report["runs"]):  # the Ray backend: which machine
            names.insert(names.index("slot") + 1, "node")
        if any(row["in queue"] for row in table):  # a cluster's queue: how long each has waited, apart
            names.insert(names.index("duration"), "in queue")
        lines.append(_fit(table, names, None if verbose else width, escape=escape))
    listed = report.get("listed", {})
    if listed.get("of", 0) > listed.get("runs", 0):
        lines.append(
            f"({listed['runs']} of {listed['of']} recorded runs listed: those that did not succeed, up to "
            f"{TABLE_OTHERS}; gts status ROOT --json lists every run, gts results ROOT every result)"
        )
    return "\n".join(lines)


def shown_status(record: Any, stale: bool) -> str:
    """A run's status as shown: one recorded running is ``stale`` when nothing runs its root, and
    ``queued`` while its attempt waits for a cluster's machine (its node '' until placed)."""
    if record.status is RunStatus.RUNNING:
        if stale:
            return STALE
        if record.node == "":
            return QUEUED
    return str(record.status.value)


def eta(report: dict[str, Any]) -> float | None:
    """Seconds until the sweep ends, guessed from the runs that succeeded (None before any did)."""
    mean = report.get("mean_success_seconds")
    running = [run for run in report["runs"] if run["status"] == "running"]
    left = report["counts"].get("pending", 0) + report["counts"].get(QUEUED, 0) + len(running)
    if not mean or not left:
        return None if not mean else 0.0
    started = sum(min(mean, run["duration"] or 0.0) for run in running)
    return max(0.0, (mean * left - started) / max(1, len(running)))


def watch_view(report: dict[str, Any], memory: dict[int, int] | None, *, escape: bool = False) -> str:
    """One screen of ``gts status --watch``: counts and ETA, each running run on its slot with its
    elapsed time and GPU memory (``memory``: bytes by process group, which a run's pid leads;
    None without NVML), why runs wait, the
    latest failures."""
    clean = escape_controls if escape else (lambda text: text)
    counts = report["counts"]
    head = ", ".join(f"{count} {name}" for name, count in counts.items() if count) or "no runs recorded"
    left = eta(report)
    lines = [f"{clean(report['root'])}: {head}" + ("" if left is None else f" | ETA {clock_text(left)}")]
    running = sorted((run for run in report["runs"] if run["status"] == "running"), key=lambda run: run["slot"] or "")
    for run in running:
        if run.get("node"):  # the Ray backend: its pid is on that machine, its GPUs out of this one's sight
            used = f"  on {clean(run['node'])}"
        else:
            used = "" if memory is None else f"  {format_memory(memory.get(run['pid'] or -1, 0))} GPU memory"
        reported = f"  {describe(run['metrics'])}" if isinstance(run.get("metrics"), dict) else ""
        lines.append(
            f"  {clean(run['slot'] or '?'):<8} {clean(run['name'])}  {clock_text(run['duration'] or 0)}{used}"
            + clean(reported)
        )
    if counts.get(QUEUED):
        lines.append(f"  {counts[QUEUED]} queued for a machine of the cluster")
    if report["scheduler"].get("waiting"):
        lines.append(f"  waiting: {clean(report['scheduler']['waiting'])}")
    failed = [run for run in report["runs"] if run["status"] in ("failed", "timed_out")]
    for run in failed[-5:]:
        lines.append(f"  {run['status']}: {clean(run['name'])} ({clean(run['cause'] or run['exit'] or '')})")
    if not report["scheduler"]["running"]:
        lines.append("no scheduler is running on this root")
    return "\n".join(lines)


def clock_text(seconds: float) -> str:
    """``h:mm:ss`` (also the status line's, cli/progress.py)."""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


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
        label = f"{by}={value}" if by and str(value) not in labelled else None
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
    if by and len(labelled) <= 12:
        axes.legend(fontsize="small", title=None)
    figure.tight_layout()
    _save(figure, output)
    pyplot.close(figure)
    return output


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
