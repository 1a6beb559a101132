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
import time
from typing import Any

from ..errors import ConfigError
from ..recordclass import Record
from ..records.metrics import Point, run_points
from ..records.paths import atomic_write_json
from ..records.provenance import short
from ..records.status import RunStatus

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
        curve = run_points(paths) if paths.unsafe(records_only=True) is None else []
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
        if record.name in lineage and lineage[record.name].own[1:]:
            tags["gts.lineage"] = "; ".join(
                f"step {s.step:g}: copied {s.donor}" for s in lineage[record.name].own[1:] if s.donor is not None
            )
        if front is not None:
            tags["gts.pareto"] = "true" if record.name in front else "false"
        found.append(
            ExportedRun(
                name=record.name,
                stage=record.stage,
                params=record.params_value,
                status=record.status.value,
                running=record.status is RunStatus.RUNNING,
                curve=curve,
                finals=finals,
                tags=tags,
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
    """What each run was exported with, in an export folder (written whole, by a rename)."""

    def __init__(self, folder: str, root: str) -> None:
        self.path = os.path.join(folder, STATE_FILE)
        self.root = os.path.abspath(root)
        try:
            with open(self.path) as handle:
                saved = json.load(handle)
        except FileNotFoundError:
            saved = {"root": self.root, "runs": {}}
        except (OSError, ValueError) as error:
            raise ConfigError(f"{self.path} cannot be read ({error}): export to another folder") from None
        if not isinstance(saved, dict) or not isinstance(saved.get("runs"), dict):
            raise ConfigError(f"{self.path} is not an export's record: export to another folder")
        if saved.get("root") != self.root:
            raise ConfigError(
                f"{folder} holds the export of another root ({saved.get('root')}): export to another folder"
            )
        self.runs: dict[str, dict[str, Any]] = saved["runs"]

    def of(self, name: str) -> dict[str, Any]:
        return self.runs.setdefault(name, {"step": None, "status": None, "session": False})

    def save(self) -> None:
        atomic_write_json(self.path, {"root": self.root, "runs": self.runs})


def new_points(run: ExportedRun, after: float | None) -> list[Point]:
    """The run's points past the step exported last."""
    return [point for point in run.curve if after is None or point[0] > after]


class Counts:
    def __init__(self) -> None:
        self.runs = self.points = self.states = 0

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
    state, counts = _State(folder, root), Counts()
    statuses = {
        "succeeded": api_pb2.STATUS_SUCCESS,
        "failed": api_pb2.STATUS_FAILURE,
        "running": api_pb2.STATUS_RUNNING,
    }

    def write(where: str, values: list[Any], step: float) -> None:
        writer = writers.get(where)
        if writer is None:
            writer = writers[where] = EventFileWriter(where, filename_suffix=".gts")
        event = event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values))
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
                if not float(step).is_integer():
                    continue  # TensorBoard's steps are whole numbers
                write(where, [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in values.items()], step)
                done["step"] = step
                counts.points += 1
            last = done["step"] if done["step"] is not None else 0
            if not run.running and not done["session"]:
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
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise ConfigError("gts export --to mlflow needs MLflow: pip install mlflow") from None
    runs = gather(root)
    client, counts = MlflowClient(tracking_uri=uri), Counts()
    absolute = os.path.abspath(root)
    name = f"gts: {sweep_name(root)}"
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment is not None else client.create_experiment(name)
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.`gts.root` = '{_quoted(absolute)}'", max_results=50000
    )
    parent = next((r for r in found if r.data.tags.get("gts.parent") == "true"), None)
    if parent is None:
        parent = client.create_run(
            experiment_id, run_name=sweep_name(root), tags={"gts.root": absolute, "gts.parent": "true"}
        )
    children = {r.data.tags.get("gts.run"): r for r in found if r.data.tags.get("gts.parent") != "true"}
    finished = {"succeeded": "FINISHED", "failed": "FAILED", "timed_out": "FAILED"}
    for run in runs:
        child = children.get(run.name)
        if child is None:
            tags = {"gts.root": absolute, "gts.run": run.name, "mlflow.parentRunId": parent.info.run_id}
            child = client.create_run(experiment_id, run_name=run.name, tags=tags)
            params = [Param(k, _text(v)) for k, v in run.params.items()]
            for at in range(0, len(params), 100):
                client.log_batch(child.info.run_id, params=params[at : at + 100])
            counts.runs += 1
        run_id, tags_now = child.info.run_id, child.data.tags
        after = float(tags_now["gts.exported_step"]) if "gts.exported_step" in tags_now else None
        points = new_points(run, after)
        stamp = int(time.time() * 1000)
        batch = [
            Metric(k, v, stamp, int(step))
            for step, values in points
            if float(step).is_integer()
            for k, v in values.items()
        ]
        for at in range(0, len(batch), 1000):
            client.log_batch(run_id, metrics=batch[at : at + 1000])
        counts.points += len(points)
        new_tags = {k: v for k, v in run.tags.items() if tags_now.get(k) != v}
        if points:
            new_tags["gts.exported_step"] = repr(points[-1][0])
        if new_tags:
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in new_tags.items()])
        if tags_now.get("gts.status") != run.status:
            counts.states += 1
            if not run.running:
                client.set_terminated(run_id, status=finished.get(run.status, "KILLED"))
    client.set_terminated(parent.info.run_id, status="RUNNING" if any(r.running for r in runs) else "FINISHED")
    return counts


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


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
    state, counts = _State(folder, root), Counts()
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
                config=run.params,
                tags=[run.status],
                settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
            )
            try:
                live.define_metric("gts_step")
                live.define_metric("*", step_metric="gts_step")
                for step, values in points:
                    live.log({"gts_step": step, **values})
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
