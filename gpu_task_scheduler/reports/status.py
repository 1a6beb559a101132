"""Status tables and plots of a result root."""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..gpu.devices import format_memory
from ..records.checkpoints import DISK_META
from ..records.metrics import describe, latest, shown_first
from ..records.paths import RunPaths, log_name_problem, name_problem
from ..records.status import NOTHING_LEFT, QUEUED, RunStatus
from ..results import duration_text, escape_controls, open_ledger
from .disk import checkpoint_disk, checkpoint_line

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
