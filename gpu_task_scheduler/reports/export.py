"""``gts export ROOT --to tensorboard DIR | mlflow URI | wandb [DIR]``: a sweep in the trackers people
already use, read from the ledger and the runs' metrics files.

Each run becomes one run of the tracker: its parameters, its curve (every step it reported, across
its attempts), its state (``succeeded``, ``pruned``, ``paused``, ``failed``, ...), what made it (the
commit, the host), its final numbers, a population-based training member's lineage (the copies it
made) and, with several objectives, whether it is on the Pareto front.

An export is idempotent by run and step: what each run was exported with is kept (in the folder, for
TensorBoard and W&B; in the runs' own tags, for MLflow), so that a second export of the same root adds
nothing, and one after more runs or more steps adds only what is new.

* **TensorBoard**: ``DIR/<run>/`` holds the run's scalars, and the HParams plugin's summaries
  (``DIR`` the experiment, each run its session), so that TensorBoard's HParams view lists the sweep
  with each run's parameters, state and final metrics. A session is written at a run's first export
  that finds it no longer running; its state (a later one too) is also the text ``gts/status``.
* **MLflow**: one parent run per sweep (tag ``gts.root``), a child per run (``gts.run``), with params,
  the metric history, provenance tags, and the MLflow status (``FINISHED``, ``FAILED``, ``KILLED``).
* **W&B**: offline runs grouped by sweep, under ``DIR/wandb`` for ``wandb sync``. A run exported
  again with new steps is resumed (same id) and given only those.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..finite import step_problem
from ..recordclass import Record, field
from ..records.metrics import Point, run_points, run_times
from ..records.paths import atomic_write_json, read_json
from ..records.provenance import short
from ..records.status import RunStatus

if TYPE_CHECKING:
    from ..records.lineage import Lineage

STATE_FILE = "gts-export.json"  # in an export folder: what each run was exported with


class ExportedRun(Record):
    """One run as every tracker gets it."""

    name: str
    stage: str | None
    params: dict[str, Any]
    status: str
    running: bool  # it may report more, and change state
    curve: list[Point]  # every step it reported, across its attempts
    finals: dict[str, float]  # its result's numbers and its metrics' last values
    tags: dict[str, str]  # what made it, its lineage, its place on the Pareto front, its cost
    moving: tuple[str, ...] = ()  # params population-based training may still change (its explored keys)
    # when it reported each step (seconds since the epoch), where its lines say
    times: dict[float, float] = field(default_factory=dict)

    def time_of(self, step: float) -> float:
        """When the run reported ``step``; now where its line does not say (an older line)."""
        return self.times.get(step) or time.time()

    @property
    def settled(self) -> bool:
        """Whether its params are final: it is not running, nor a member paused that may go on
        with other values."""
        return not self.running and not (self.moving and self.status == RunStatus.PAUSED.value)


def _with_values(params: dict[str, Any], lineage: Lineage | None) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A population-based training member's params: the values it ended with (its last copy's),
    and its starting ones as ``start.KEY``; and its explored keys."""
    if lineage is None:
        return params, ()
    moving = tuple(sorted(lineage.start.values))
    ended = {**params, **lineage.own[-1].values}
    ended.update({f"start.{key}": value for key, value in lineage.start.values.items()})
    return ended, moving


def _with_schedule(curve: list[Point], lineage: Lineage | None) -> list[Point]:
    """Each point with the values the member trained with at that step (``gts/hp/KEY``), so that a
    tracker shows a perturbed value's schedule beside the loss."""
    if lineage is None or not lineage.exploits:
        return curve
    own = lineage.own
    shown = []
    for step, values in curve:
        segment = next((s for s in reversed(own) if s.step < step or s is own[0]), own[0])
        hp = {f"gts/hp/{key}": float(v) for key, v in segment.values.items() if _number(v)}
        shown.append((step, {**values, **hp}))
    return shown


def gather(root: str) -> list[ExportedRun]:
    """Every recorded run of ``root``, in the sweep's order."""
    from ..records.lineage import lineages
    from ..results import flatten, open_ledger, records, run_folder, run_result

    ledger = open_ledger(root)
    try:
        lineage = lineages(ledger.trial_events())
    finally:
        ledger.close()
    front = _front(root)
    found = []
    for record in records(root):
        paths = run_folder(root, record)
        safe = paths.unsafe(records_only=True) is None
        curve = run_points(paths) if safe else []
        result = run_result(root, record)
        columns = flatten(result, "result.") if isinstance(result, dict) else {"result": result}
        finals = {key: float(value) for key, value in columns.items() if _number(value) and math.isfinite(value)}
        for name, summary in record.metrics_value.items():
            if isinstance(summary, dict) and isinstance(summary.get("last"), (int, float)):
                finals[name] = float(summary["last"])
        tags = {"gts.status": record.status.value, "gts.attempts": str(record.attempts or 0)}
        if record.cause:
            tags["gts.cause"] = record.cause[:500]
        commit = short(record.provenance_value)
        if commit is not None:
            tags["gts.commit"] = commit
        if record.stage is not None:
            tags["gts.stage"] = record.stage
        member = lineage.get(record.name)
        if member is not None and member.exploits:
            tags["gts.lineage"] = "; ".join(
                f"step {s.step:g}: copied {s.donor}" + (f", {s.change_text()}" if s.changed else "")
                for s in member.exploits
                if s.donor is not None
            )
        if front is not None:
            tags["gts.pareto"] = "true" if record.name in front else "false"
        params, moving = _with_values(record.params_value, member)
        found.append(
            ExportedRun(
                name=record.name,
                stage=record.stage,
                params=params,
                status=record.status.value,
                running=record.status is RunStatus.RUNNING,
                curve=_with_schedule(curve, member),
                times=run_times(paths) if safe else {},
                finals=finals,
                tags=tags,
                moving=moving,
            )
        )
    return found


def _front(root: str) -> set[str] | None:
    """The runs on the Pareto front of the root's objectives; None without several objectives."""
    from ..results import pareto, several_objectives

    try:
        if not several_objectives(root):
            return None
        return {row["name"] for row in pareto(root)}
    except ConfigError:
        return None


def sweep_name(root: str) -> str:
    return os.path.basename(os.path.abspath(root).rstrip(os.sep)) or "sweep"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _State:
    """What each run was exported with, in an export folder (written whole, by a rename). Read as
    hostile: never a link or a FIFO (read through ``read_json``, which never blocks), every entry's
    shape checked; a damaged record, or a damaged entry of one run, starts that export afresh, said."""

    def __init__(self, folder: str, root: str, counts: Counts) -> None:
        self.path = os.path.join(folder, STATE_FILE)
        self.root = os.path.abspath(root)
        saved: Any = read_json(self.path) if os.path.lexists(self.path) else {"root": self.root, "runs": {}}
        if not isinstance(saved, dict) or not isinstance(saved.get("runs"), dict):
            counts.note(f"{self.path} is not an export's record (damaged, or not a file): the export starts afresh")
            saved = {"root": self.root, "runs": {}}
        if saved.get("root") != self.root:
            raise ConfigError(
                f"{folder} holds the export of another root ({saved.get('root')}): export to another folder"
            )
        self.runs: dict[str, dict[str, Any]] = {}
        damaged = []
        for name, entry in saved["runs"].items():
            if _entry_problem(name, entry) is None:
                self.runs[name] = entry
            else:
                damaged.append(name)
        if damaged:
            counts.note(
                f"{self.path}: the record of {len(damaged)} run(s) is damaged ({', '.join(damaged[:3])}): "
                "they are exported afresh"
            )

    def of(self, name: str) -> dict[str, Any]:
        return self.runs.setdefault(name, {"step": None, "status": None, "session": False})

    def save(self) -> None:
        atomic_write_json(self.path, {"root": self.root, "runs": self.runs})


def _entry_problem(name: str, entry: Any) -> str | None:
    """Why a run's entry of ``gts-export.json`` is damaged (None: it is whole).

    >>> _entry_problem("a,", {"step": 3, "status": "succeeded", "session": True})
    >>> _entry_problem("a,", "x"), _entry_problem("a,", {"step": "3", "status": None, "session": False})
    ('not a mapping', 'a step that is none')
    """
    if not isinstance(entry, dict):
        return "not a mapping"
    if name == "":  # the experiment's own entry (TensorBoard's HParams summary)
        return None if isinstance(entry.get("experiment"), str) else "no experiment"
    if entry.get("step") is not None and step_problem(entry.get("step")) is not None:
        return "a step that is none"
    if not isinstance(entry.get("status"), (str, type(None))) or not isinstance(entry.get("session", False), bool):
        return "a status or session of another kind"
    if "id" in entry and not (isinstance(entry["id"], str) and entry["id"].isascii() and entry["id"].isalnum()):
        return "an id of another kind"
    return None


def new_points(run: ExportedRun, after: float | None) -> list[Point]:
    """The run's points past the step exported last."""
    return [point for point in run.curve if after is None or point[0] > after]


class Counts:
    """What an export added, and what it could not export (each kind said once, with examples)."""

    def __init__(self) -> None:
        self.runs = self.points = self.states = 0
        self.notes: list[str] = []
        self._left: dict[str, list[str]] = {}  # why -> the points left out for it

    def note(self, words: str) -> None:
        self.notes.append(words)

    def leave_out(self, why: str, what: str) -> None:
        """A value the tracker cannot store, left out (``why``: the kind, said once)."""
        self._left.setdefault(why, []).append(what)

    def said(self) -> list[str]:
        """Every note, and each kind of value left out with how many and the first few."""
        left = [
            f"{len(items)} value(s) not exported: {why} ({', '.join(items[:3])}{', ...' if len(items) > 3 else ''})"
            for why, items in self._left.items()
        ]
        return [*self.notes, *left]

    def __str__(self) -> str:
        return f"{self.runs} new run(s), {self.points} new step(s), {self.states} new state(s)"


# --- TensorBoard -----------------------------------------------------------------------------


def to_tensorboard(root: str, folder: str) -> Counts:
    """Export ``root`` into the TensorBoard log folder ``folder``."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
        from tensorboard.plugins.hparams import summary_v2 as hp
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        from tensorboard.util import tensor_util
    except ImportError:
        raise ConfigError("gts export --to tensorboard needs TensorBoard: pip install tensorboard") from None
    runs = gather(root)
    os.makedirs(folder, exist_ok=True)
    counts = Counts()
    state = _State(folder, root, counts)
    statuses = {
        "succeeded": api_pb2.STATUS_SUCCESS,
        "failed": api_pb2.STATUS_FAILURE,
        "running": api_pb2.STATUS_RUNNING,
    }

    def write(where: str, values: list[Any], step: float, at: float | None = None) -> None:
        writer = writers.get(where)
        if writer is None:
            writer = writers[where] = EventFileWriter(where, filename_suffix=".gts")
        wall_time = time.time() if at is None else at
        event = event_pb2.Event(wall_time=wall_time, step=int(step), summary=summary_pb2.Summary(value=values))
        writer.add_event(event)

    def text(tag: str, value: str) -> Any:
        from tensorboard.plugins.text import metadata as text_metadata

        return summary_pb2.Summary.Value(
            tag=tag,
            metadata=text_metadata.create_summary_metadata(display_name=tag, description=""),
            tensor=tensor_util.make_tensor_proto(value.encode()),
        )

    writers: dict[str, Any] = {}
    params = sorted({key for run in runs for key in run.params})
    metrics = sorted({key for run in runs for key in run.finals})
    experiment = json.dumps([params, metrics])
    if state.runs.get("", {}).get("experiment") != experiment:
        config = hp.hparams_config_pb(
            [hp.HParam(key) for key in params] + [hp.HParam("gts/status")], [hp.Metric(key) for key in metrics]
        )
        write(folder, list(config.value), 0)
        state.runs[""] = {"experiment": experiment}
    try:
        for run in runs:
            done = state.of(run.name)
            where = os.path.join(folder, _safe(run.name))
            if done["step"] is None and done["status"] is None:
                counts.runs += 1
            for step, values in new_points(run, done["step"]):
                done["step"] = step
                if not float(step).is_integer():
                    counts.leave_out("TensorBoard's steps are whole numbers", f"{run.name} at step {step:g}")
                    continue
                scalars = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in values.items()]
                write(where, scalars, step, run.time_of(step))
                counts.points += 1
            last = done["step"] if done["step"] is not None else 0
            if run.settled and not done["session"]:
                hparams = {
                    k: (v if _number(v) or isinstance(v, (str, bool)) else json.dumps(v)) for k, v in run.params.items()
                }
                start = hp.hparams_pb({**hparams, "gts/status": run.status}, trial_id=run.name)
                end = plugin_data_pb2.HParamsPluginData(
                    session_end_info=plugin_data_pb2.SessionEndInfo(
                        status=statuses.get(run.status, api_pb2.STATUS_UNKNOWN)
                    )
                )
                end_value = summary_pb2.Summary.Value(
                    tag=metadata.SESSION_END_INFO_TAG, metadata=metadata.create_summary_metadata(end)
                )
                finals = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in run.finals.items()]
                write(where, [*start.value, *finals, end_value], last)
                done["session"] = True
            if done["status"] != run.status:
                write(
                    where,
                    [text("gts/status", run.status), *(text(k, v) for k, v in run.tags.items() if k != "gts.status")],
                    last,
                )
                done["status"] = run.status
                counts.states += 1
    finally:
        for writer in writers.values():
            writer.close()
        state.save()
    return counts


def _safe(name: str) -> str:
    """A run's folder name as a TensorBoard run name: its own (run folder names are safe ones)."""
    return name.replace(os.sep, "_") or "_"


# --- MLflow ----------------------------------------------------------------------------------


def to_mlflow(root: str, uri: str) -> Counts:
    """Export ``root`` to the MLflow tracking store ``uri`` (``sqlite:///sweep.db``, a folder, a server)."""
    try:
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise ConfigError("gts export --to mlflow needs MLflow: pip install mlflow") from None
    runs = gather(root)
    client, counts = MlflowClient(tracking_uri=uri), Counts()
    absolute = os.path.abspath(root)
    root_id = _root_id(absolute)
    name = f"gts: {sweep_name(root)}"
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment is not None else client.create_experiment(name)
    found = _mlflow_runs_of(client, experiment_id, absolute, root_id)
    parent = next((r for r in found if r.data.tags.get("gts.parent") == "true"), None)
    if parent is None:
        tags = {"gts.root": absolute, "gts.root_id": root_id, "gts.parent": "true"}
        parent = client.create_run(experiment_id, run_name=sweep_name(root), tags=tags)
    children = {r.data.tags.get("gts.run"): r for r in found if r.data.tags.get("gts.parent") != "true"}
    finished = {"succeeded": "FINISHED", "failed": "FAILED", "timed_out": "FAILED"}
    for run in runs:
        try:
            child = children.get(run.name)
            if child is None:
                tags = {"gts.root": absolute, "gts.root_id": root_id, "gts.run": run.name}
                child = client.create_run(
                    experiment_id, run_name=run.name, tags={**tags, "mlflow.parentRunId": parent.info.run_id}
                )
                _log_params(client, Param, child.info.run_id, run, settled=False)
                counts.runs += 1
            run_id, tags_now = child.info.run_id, child.data.tags
            if run.moving and run.settled and tags_now.get("gts.values") != "final":
                # MLflow's params never change: a member's explored ones wait until no copy can change them
                _log_params(client, Param, run_id, run, settled=True)
                client.set_tag(run_id, "gts.values", "final")
            after = _exported_step(tags_now.get("gts.exported_step"))
            points = new_points(run, after)
            batch: list[Any] = []
            for step, values in points:
                if not float(step).is_integer():
                    counts.leave_out("MLflow's steps are whole numbers", f"{run.name} at step {step:g}")
                    continue
                stamp = int(run.time_of(step) * 1000)  # MLflow's: milliseconds
                batch.extend(Metric(mlflow_name(k), v, stamp, int(step)) for k, v in values.items())
            for at in range(0, len(batch), 1000):
                client.log_batch(run_id, metrics=batch[at : at + 1000])
            counts.points += len(points)
            new_tags = {k: v for k, v in run.tags.items() if tags_now.get(k) != v}
            names = {k for k in run.params} | {k for _, values in run.curve for k in values}
            for original in sorted(names):  # a name MLflow refuses: the original kept beside it
                mapped = mlflow_name(original)
                if mapped != original and tags_now.get(f"gts.name.{mapped}") != original:
                    new_tags[f"gts.name.{mapped}"] = original[:5000]
            if points:
                new_tags["gts.exported_step"] = repr(points[-1][0])
            if new_tags:
                client.log_batch(run_id, tags=[RunTag(k, v) for k, v in new_tags.items()])
            if tags_now.get("gts.status") != run.status:
                counts.states += 1
                if not run.running:
                    client.set_terminated(run_id, status=finished.get(run.status, "KILLED"))
        except MlflowException as error:  # this run only: the others are exported, and it is tried again next time
            counts.note(f"{run.name}: not exported to MLflow ({str(error).splitlines()[0][:300]})")
    client.set_terminated(parent.info.run_id, status="RUNNING" if any(r.running for r in runs) else "FINISHED")
    return counts


def _log_params(client: Any, param: Any, run_id: str, run: ExportedRun, *, settled: bool) -> None:
    """A run's params (``settled``: its explored ones, now final); a member's explored ones not while
    population-based training may still change them (``gts.values`` says when they are in)."""
    chosen = {k: v for k, v in run.params.items() if (k in run.moving) == settled}
    params = [param(mlflow_name(k), _text(v)[:6000]) for k, v in chosen.items()]
    for at in range(0, len(params), 100):
        client.log_batch(run_id, params=params[at : at + 100])


def _root_id(absolute: str) -> str:
    """A root's id in MLflow's tags: hex digits, which a filter string holds as they are (no quoting
    in MLflow's filter language holds a value with both ``'`` and ``"``)."""
    from ..digest import sha256_hex

    return sha256_hex(absolute)[:32]


def _mlflow_runs_of(client: Any, experiment_id: str, absolute: str, root_id: str) -> list[Any]:
    """The runs an earlier export of the root made: by its id, or, for an export made before roots
    had ids, by its path where a filter can hold it; each checked against the path itself."""
    found = client.search_runs([experiment_id], filter_string=f"tags.`gts.root_id` = '{root_id}'", max_results=50000)
    if not found:
        quote = "'" if "'" not in absolute else '"' if '"' not in absolute else None
        if quote is not None:
            where = f"tags.`gts.root` = {quote}{absolute}{quote}"
            found = client.search_runs([experiment_id], filter_string=where, max_results=50000)
    return [run for run in found if run.data.tags.get("gts.root") == absolute]


_MLFLOW_NAME = re.compile(r"[A-Za-z0-9_.\- /]+")  # what every MLflow store takes (a Windows one: no colon)


def mlflow_name(name: str) -> str:
    """``name`` as MLflow takes it: unchanged if it can, else each other character as ``_`` and a
    digest of the original after it, the same every time (so a second export adds nothing) and
    never another name's.

    >>> mlflow_name("val/loss"), mlflow_name("acc@1"), mlflow_name("../up")
    ('val/loss', 'acc_1-71dfc155', '_._up-8c722b8a')
    """
    if _MLFLOW_NAME.fullmatch(name) and len(name) <= 200 and not _mlflow_path_problem(name):
        return name
    from ..digest import sha256_hex

    # No '/' and no leading '.': nothing a path would change
    shown = re.sub(r"^\.|[^A-Za-z0-9_.\- ]", "_", name)[:190] or "_"
    return f"{shown}-{sha256_hex(name)[:8]}"


def _mlflow_path_problem(name: str) -> bool:
    """MLflow stores a name as a path: one that a path would change (``a//b``, ``./a``, ``..``) is refused."""
    import posixpath

    normal = posixpath.normpath(name)
    return normal != name or normal == "." or normal.startswith(("..", "/"))


def _exported_step(text: Any) -> float | None:
    """The step an earlier export reached, from its tag (None: none, or a tag that is no step)."""
    try:
        step = float(text)
    except (TypeError, ValueError):
        return None
    return step if step_problem(step) is None else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


# --- W&B -------------------------------------------------------------------------------------


def to_wandb(root: str, folder: str) -> Counts:
    """Export ``root`` as offline W&B runs under ``folder`` (``wandb sync folder/wandb/offline-run-*``)."""
    try:
        import wandb
    except ImportError:
        raise ConfigError("gts export --to wandb needs W&B: pip install wandb") from None
    runs = gather(root)
    os.makedirs(folder, exist_ok=True)
    counts = Counts()
    state = _State(folder, root, counts)
    group = sweep_name(root)
    try:
        for run in runs:
            done = state.of(run.name)
            points = new_points(run, done["step"])
            if not points and done["status"] == run.status:
                continue
            fresh = done["step"] is None and done["status"] is None
            if "id" not in done:
                done["id"] = _wandb_id(os.path.abspath(root), run.name)
            live = wandb.init(
                mode="offline",
                dir=folder,
                project=f"gts-{group}",
                group=group,
                name=run.name,
                id=done["id"],
                resume="allow",
                tags=[run.status],
                settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
            )
            try:
                live.config.update(run.params, allow_val_change=True)  # a member's values after a copy too
                live.define_metric("gts_step")
                live.define_metric("*", step_metric="gts_step")
                for step, values in points:  # W&B's own key for a row's time (else: when it is logged)
                    live.log({"gts_step": step, **values, "_timestamp": run.time_of(step)})
                live.summary.update({**run.finals, **run.tags})
            finally:
                live.finish(exit_code=0 if run.status in ("succeeded", "running", "paused") else 1)
            counts.runs += fresh
            counts.points += len(points)
            counts.states += done["status"] != run.status
            if points:
                done["step"] = points[-1][0]
            done["status"] = run.status
            state.save()
    finally:
        state.save()
        wandb.teardown()
    return counts


def _wandb_id(root: str, name: str) -> str:
    """A stable W&B run id for a run of a root (W&B ids: letters and digits)."""
    from ..digest import sha256_hex

    return sha256_hex(f"{root}\0{name}")[:16]
