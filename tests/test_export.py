"""``gts export``: a sweep into TensorBoard, MLflow and W&B, each read back with that tool's own
reader (TensorBoard's event loader, MLflow's client, the offline run files W&B writes); a second
export adds nothing, and one after more runs adds only them."""

import glob
import importlib.util
import json
import os
import re
import subprocess
import sys
import time

import pytest
import yaml
from helpers import ledger_rows
from wandb_files import offline_runs

from gpu_task_scheduler.records.metrics import run_points, run_times
from gpu_task_scheduler.records.paths import RunPaths

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gts(*args, cwd):
    done = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A root of runs that succeeded and runs paused by promotion ASHA, and a way to add one more run."""
    folder = tmp_path_factory.mktemp("export")
    config = {
        "scheduler_config": {"gpu": ["cpu", "cpu"], "result_root_folder": str(folder / "root")},
        "command": [sys.executable, os.path.join(REPO, "examples", "curve_train.py")]
        + ["--lr", "{lr}", "--width", "512", "--epochs", "9", "--out", "{work_dir}"],
        "test_config": [{"lr": [0.3, 0.1, 0.03]}],
        "early_stop": {"method": "asha", "promotion": True, "metric": "loss", "mode": "min"}
        | {"min_step": 3, "max_step": 9, "reduction_factor": 3},
    }
    with open(folder / "sweep.yaml", "w") as handle:
        yaml.safe_dump(config, handle)
    gts("run", "sweep.yaml", "--plain", cwd=folder)

    lrs = [0.3, 0.1, 0.03]

    def more():  # one more run each time
        lrs.append(lrs[-1] / 3)
        gts("run", "sweep.yaml", "lr=" + ",".join(map(str, lrs)), "--plain", cwd=folder)

    return folder, str(folder / "root"), more


def curves(root):
    """Each recorded run's every reported step, as the ledger and the metrics files hold them."""
    return {name: run_points(RunPaths(row["work_dir"], None)) for name, row in ledger_rows(root).items()}


def test_tensorboard_round_trips_through_its_own_loader(sweep):
    pytest.importorskip("tensorboard", reason="pip install tensorboard")
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata

    from gpu_task_scheduler.records.tensorboard import scalar

    folder, root, more = sweep
    target = str(folder / "tb")

    def read():
        found = {}
        for path in glob.glob(os.path.join(target, "**", "*tfevents*"), recursive=True):
            run = os.path.relpath(os.path.dirname(path), target)
            for event in EventFileLoader(path).Load():
                for value in event.summary.value:
                    found.setdefault(run, []).append((event.step, value))
        return found

    assert "3 new run(s)" in gts("export", root, "--to", "tensorboard", target, cwd=folder)
    events = read()
    for name, points in curves(root).items():
        scalars = [(s, v.tag, scalar(v)) for s, v in events[name] if scalar(v) is not None]
        expected = [(step, "loss", pytest.approx(values["loss"], rel=1e-6)) for step, values in points]
        assert scalars[: len(points)] == expected  # the curve, then the final numbers
        tags = {v.tag for _, v in events[name]}
        assert {metadata.SESSION_START_INFO_TAG, metadata.SESSION_END_INFO_TAG, "gts/status"} <= tags
        start = next(v for _, v in events[name] if v.tag == metadata.SESSION_START_INFO_TAG)
        info = metadata.parse_session_start_info_plugin_data(start.metadata.plugin_data.content)
        assert info.hparams["lr"].number_value == json.loads(ledger_rows(root)[name]["params"])["lr"]
        assert info.hparams["gts/status"].string_value in ("succeeded", "paused")
    assert metadata.EXPERIMENT_TAG in {v.tag for _, v in events["."]}
    files = sorted(glob.glob(os.path.join(target, "**", "*tfevents*"), recursive=True))
    assert "0 new run(s), 0 new step(s), 0 new state(s)" in gts(
        "export", root, "--to", "tensorboard", target, cwd=folder
    )
    assert sorted(glob.glob(os.path.join(target, "**", "*tfevents*"), recursive=True)) == files  # nothing written
    more()
    assert "1 new run(s)" in gts("export", root, "--to", "tensorboard", target, cwd=folder)
    added = read()
    assert len(added) == len(events) + 1 and all(added[name] == events[name] for name in events if name != ".")


def test_mlflow_round_trips_through_its_client(sweep):
    mlflow = pytest.importorskip("mlflow", reason="pip install mlflow")
    from mlflow.tracking import MlflowClient

    folder, root, more = sweep
    uri = f"sqlite:///{folder / 'sweep.db'}"
    gts("export", root, "--to", "mlflow", uri, cwd=folder)
    mlflow.set_tracking_uri(uri)
    table = mlflow.search_runs(experiment_names=["gts: root"])
    children = table[table["tags.gts.parent"] != "true"]
    rows = ledger_rows(root)
    assert sorted(children["tags.gts.run"]) == sorted(rows)
    parent = table[table["tags.gts.parent"] == "true"]
    assert len(parent) == 1 and set(children["tags.mlflow.parentRunId"]) == {parent["run_id"].iloc[0]}
    client = MlflowClient(uri)
    for name, points in curves(root).items():
        child = children[children["tags.gts.run"] == name].iloc[0]
        assert child["params.lr"] == str(json.loads(rows[name]["params"])["lr"])
        assert child["tags.gts.status"] == rows[name]["status"]
        assert child["status"] == ("FINISHED" if rows[name]["status"] == "succeeded" else "KILLED")
        history = [(m.step, m.value) for m in client.get_metric_history(child["run_id"], "loss")]
        assert history == [(step, pytest.approx(values["loss"])) for step, values in points]
    assert "0 new run(s), 0 new step(s), 0 new state(s)" in gts("export", root, "--to", "mlflow", uri, cwd=folder)
    more()
    assert "1 new run(s)" in gts("export", root, "--to", "mlflow", uri, cwd=folder)
    again = mlflow.search_runs(experiment_names=["gts: root"])
    assert len(again) == len(table) + 1
    for name in rows:  # no step of the runs exported before was written twice
        run_id = again[again["tags.gts.run"] == name]["run_id"].iloc[0]
        assert len(client.get_metric_history(run_id, "loss")) == len(curves(root)[name])


def test_wandb_offline_runs_round_trip(sweep):
    pytest.importorskip("wandb", reason="pip install wandb")
    folder, root, more = sweep
    target = str(folder / "wb")
    gts("export", root, "--to", "wandb", target, cwd=folder)
    runs = {run["name"]: run for run in offline_runs(target).values()}
    rows = ledger_rows(root)
    assert sorted(runs) == sorted(rows) and {run["group"] for run in runs.values()} == {"root"}
    for name, points in curves(root).items():
        history = [(entry["gts_step"], entry["loss"]) for entry in runs[name]["history"] if "loss" in entry]
        assert history == [(step, pytest.approx(values["loss"])) for step, values in points]
        assert runs[name]["config"]["lr"] == json.loads(rows[name]["params"])["lr"]
        assert runs[name]["summary"]["gts.status"] == rows[name]["status"]
    made = sorted(glob.glob(os.path.join(target, "wandb", "offline-run-*")))
    assert "0 new run(s), 0 new step(s), 0 new state(s)" in gts("export", root, "--to", "wandb", target, cwd=folder)
    assert sorted(glob.glob(os.path.join(target, "wandb", "offline-run-*"))) == made
    before = curves(root)
    more()
    after = curves(root)
    assert "1 new run(s)" in gts("export", root, "--to", "wandb", target, cwd=folder)
    grown = [name for name in before if after[name] != before[name]]  # promoted by the new run: resumed
    assert len(glob.glob(os.path.join(target, "wandb", "offline-run-*"))) == len(made) + 1 + len(grown)
    merged = {run["name"]: run for run in offline_runs(target).values()}
    for name, points in after.items():  # each step once, across the run's offline folders
        assert [entry["gts_step"] for entry in merged[name]["history"] if "loss" in entry] == [s for s, _ in points]


def test_each_exported_step_carries_the_time_it_was_reported(sweep, tmp_path):
    """Every tracker got the export's time for every step: W&B's history, MLflow's metrics and
    TensorBoard's events said the run trained when it was exported. ``report()`` now writes each
    line's time (``@time``), and each export gives it to the tracker for that step."""
    folder, root, _ = sweep
    reported = {name: run_times(RunPaths(row["work_dir"], None)) for name, row in ledger_rows(root).items()}
    exported_at = time.time()
    assert all(reported.values()) and all(at < exported_at for times in reported.values() for at in times.values())
    for name, points in curves(root).items():
        assert sorted(reported[name]) == [step for step, _ in points], name  # every step has its time
    seen = {}
    if importlib.util.find_spec("tensorboard"):
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        gts("export", root, "--to", "tensorboard", str(tmp_path / "tb"), cwd=folder)
        for name in reported:
            events = [
                event
                for path in glob.glob(str(tmp_path / "tb" / name / "*tfevents*"))
                for event in EventFileLoader(path).Load()
                if any(value.tag == "loss" for value in event.summary.value)
            ]
            first = {}  # the curve's event of each step (the final numbers come after it, at the last step)
            for event in events:
                first.setdefault(event.step, event.wall_time)
            seen.setdefault("tensorboard", {})[name] = first
    if importlib.util.find_spec("mlflow"):
        from mlflow.tracking import MlflowClient

        uri = f"sqlite:///{tmp_path / 'times.db'}"
        gts("export", root, "--to", "mlflow", uri, cwd=folder)
        client = MlflowClient(uri)
        for run in client.search_runs([client.get_experiment_by_name("gts: root").experiment_id]):
            name = run.data.tags.get("gts.run")
            if name in reported:
                history = client.get_metric_history(run.info.run_id, "loss")
                seen.setdefault("mlflow", {})[name] = {m.step: m.timestamp / 1000 for m in history}
    if importlib.util.find_spec("wandb"):
        gts("export", root, "--to", "wandb", str(tmp_path / "wb"), cwd=folder)
        for run in offline_runs(str(tmp_path / "wb")).values():
            rows = [entry for entry in run["history"] if "loss" in entry]
            seen.setdefault("wandb", {})[run["name"]] = {entry["gts_step"]: entry["_timestamp"] for entry in rows}
    if not seen:
        pytest.skip("none of TensorBoard, MLflow and W&B is installed")
    for tracker, runs in seen.items():
        assert sorted(runs) == sorted(reported), tracker
        for name, times in runs.items():
            expected = {step: pytest.approx(at, abs=1e-3) for step, at in reported[name].items()}
            assert times == expected, (tracker, name)


def test_bad_targets_are_refused(sweep, tmp_path):
    folder, root, _ = sweep
    for args, said in (
        (["--to", "neptune", "x"], "give one of tensorboard, mlflow, wandb"),
        (["--to", "tensorboard"], "--to tensorboard DIR"),
        (["--to", "mlflow", "a", "b"], "--to mlflow URI"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "gpu_task_scheduler", "export", root, *args], capture_output=True, text=True
        )
        assert done.returncode != 0 and said in done.stderr
    (tmp_path / "other").mkdir()
    with open(tmp_path / "other" / "gts-export.json", "w") as handle:
        json.dump({"root": "/elsewhere", "runs": {}}, handle)
    done = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "export", root, "--to", "tensorboard", str(tmp_path / "other")],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "holds the export of another root" in done.stderr


def test_a_pbt_members_lineage_and_values_are_exported(tmp_path):
    """Each member's params are the values it ended with (its last copy's), its starting ones are
    ``start.lr``, its lineage tag names the donor, the step and the values, and ``gts/hp/lr`` is the
    value it trained with at each step; a second export adds nothing."""
    mlflow = pytest.importorskip("mlflow", reason="pip install mlflow")
    from gpu_task_scheduler.records.lineage import lineages
    from gpu_task_scheduler.results import open_ledger

    root = str(tmp_path / "root")
    gts("run", "configs/pbt.yaml", f"scheduler_config.result_root_folder={root}", "--plain", cwd=REPO)
    uri = f"sqlite:///{tmp_path / 'pbt.db'}"
    gts("export", root, "--to", "mlflow", uri, cwd=tmp_path)
    ledger = open_ledger(root)
    try:
        found = lineages(ledger.trial_events())
    finally:
        ledger.close()
    mlflow.set_tracking_uri(uri)
    table = mlflow.search_runs(experiment_names=["gts: root"])
    members = table[table["tags.gts.parent"] != "true"]
    assert len(members) == 8 and any(lineage.exploits for lineage in found.values())
    client = mlflow.tracking.MlflowClient(uri)
    for _, member in members.iterrows():
        lineage = found[member["tags.gts.run"]]
        made = lineage.exploits
        expected = "; ".join(f"step {s.step:g}: copied {s.donor}, {s.change_text()}" for s in made) if made else None
        assert (member.get("tags.gts.lineage") if isinstance(member.get("tags.gts.lineage"), str) else None) == expected
        assert float(member["params.lr"]) == lineage.own[-1].values["lr"]  # what it ended with
        assert float(member["params.start.lr"]) == lineage.start.values["lr"]
        if made:
            assert re.fullmatch(r"step \d+: copied lr-[0-9.]+,, lr [0-9.e-]+ x(0\.5|2) = [0-9.e-]+(; .*)?", expected)
            history = client.get_metric_history(member["run_id"], "gts/hp/lr")
            shown = {m.step: m.value for m in history}
            for step, value in shown.items():
                at = next(s for s in reversed(lineage.own) if s.step < step or s is lineage.own[0])
                assert value == pytest.approx(at.values["lr"])
            assert shown  # every step it reported, with the value it trained with there
    said = gts("export", root, "--to", "mlflow", uri, cwd=tmp_path)
    assert "0 new run(s), 0 new step(s), 0 new state(s)" in said, said
    if importlib.util.find_spec("wandb") is not None:  # W&B's config: the same values
        gts("export", root, "--to", "wandb", str(tmp_path / "wb"), cwd=tmp_path)
        for run in offline_runs(str(tmp_path / "wb")).values():
            lineage = found[run["name"]]
            assert run["config"]["lr"] == lineage.own[-1].values["lr"]
            assert run["config"]["start.lr"] == lineage.start.values["lr"]


RAW_METRICS = """import json, os, sys
lines = [{"step": 1, "acc@1": 0.5, "loss": 2.0}, {"step": 1.5, "loss": 1.5}, {"step": 1e300, "loss": 9.0},
         {"step": 2, "acc@1": 0.75, "loss": 1.0}]
if sys.argv[1] == "bad":
    lines.insert(0, {"step": 2**63, "loss": 9.0})
with open(os.environ["GTS_METRICS_FILE"], "a") as handle:  # written by hand, as any language can
    handle.write("".join(json.dumps(line) + "\\n" for line in lines))
"""


@pytest.fixture(scope="module")
def hostile_root(tmp_path_factory):
    """A root whose path holds ', " and \\, whose runs report a metric named acc@1, a fractional step,
    and steps of 1e300 and 2**63 (written to the metrics file by hand, past report())."""
    folder = tmp_path_factory.mktemp("hostile")
    (folder / "raw.py").write_text(RAW_METRICS)
    root = folder / 'it\'s a "root" \\ here'
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": str(root)},
        "command": [sys.executable, str(folder / "raw.py"), "{kind}"],
        "test_config": [{"kind": ["bad", "good", "fine"]}],
    }
    with open(folder / "sweep.yaml", "w") as handle:
        yaml.safe_dump(config, handle)
    gts("run", "sweep.yaml", "--plain", cwd=folder)
    return folder, str(root)


def export(root, *target, cwd):
    done = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "export", root, "--to", *target],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, done.stderr


def test_mlflow_takes_hostile_names_steps_and_roots_and_a_second_export_adds_nothing(hostile_root):
    """A metric MLflow refuses (acc@1) is exported under a name it takes, the same every time, with
    the original in a tag; a fractional step is left out and said; steps above 2**53 never reach the
    export; a root whose path holds ', " and \\ is found again (its second export adds nothing)."""
    mlflow = pytest.importorskip("mlflow", reason="pip install mlflow")
    from mlflow.tracking import MlflowClient

    from gpu_task_scheduler.reports.export import mlflow_name

    folder, root = hostile_root
    uri = f"sqlite:///{folder / 'hostile.db'}"
    out, err = export(root, "mlflow", uri, cwd=folder)
    assert "3 new run(s)" in out
    assert "not exported: MLflow's steps are whole numbers" in err and "at step 1.5" in err
    assert export(root, "mlflow", uri, cwd=folder)[0].startswith("0 new run(s), 0 new step(s), 0 new state(s)")
    mlflow.set_tracking_uri(uri)
    table = mlflow.search_runs(search_all_experiments=True)
    assert len(table) == 4  # one parent and three runs: nothing exported twice
    client, mapped = MlflowClient(uri), mlflow_name("acc@1")
    assert mapped != "acc@1" and mlflow_name("acc@1") == mapped
    for name in ("kind-bad,", "kind-good,", "kind-fine,"):
        child = table[table["tags.gts.run"] == name].iloc[0]
        assert child[f"tags.gts.name.{mapped}"] == "acc@1"
        assert [(m.step, m.value) for m in client.get_metric_history(child["run_id"], mapped)] == [(1, 0.5), (2, 0.75)]
        assert [m.step for m in client.get_metric_history(child["run_id"], "loss")] == [1, 2]


def test_tensorboard_leaves_out_what_it_cannot_store_and_goes_on(hostile_root, tmp_path):
    pytest.importorskip("tensorboard", reason="pip install tensorboard")
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    from gpu_task_scheduler.records.tensorboard import scalar

    folder, root = hostile_root
    target = tmp_path / "tb"
    out, err = export(root, "tensorboard", str(target), cwd=folder)
    assert "3 new run(s), 6 new step(s)" in out
    assert "TensorBoard's steps are whole numbers" in err
    for name in ("kind-bad,", "kind-good,", "kind-fine,"):
        steps = {
            (event.step, value.tag)
            for path in glob.glob(str(target / name / "*tfevents*"))
            for event in EventFileLoader(path).Load()
            for value in event.summary.value
            if value.tag == "acc@1" and scalar(value) is not None
        }
        assert (1, "acc@1") in steps and (2, "acc@1") in steps


@pytest.mark.parametrize(
    "damage",
    [b'{"root": "%s", "runs": {"kind-bad,": "x", "kind-good,": {"step": "2", "status": null}}}', b"{not json", b"fifo"],
    ids=["entries", "json", "fifo"],
)
def test_a_damaged_or_hostile_export_record_starts_afresh_with_a_message(hostile_root, tmp_path, damage):
    folder, root = hostile_root
    target = tmp_path / "wb"
    target.mkdir()
    record = target / "gts-export.json"
    if damage == b"fifo":
        os.mkfifo(record)  # never opened blocking: the export does not wait for a writer
    else:
        record.write_bytes(damage.replace(b"%s", json.dumps(root)[1:-1].encode()))
    out, err = export(root, "tensorboard", str(target), cwd=folder)
    assert "gts export:" in err and ("damaged" in err or "not an export's record" in err)
    assert "3 new run(s)" in out  # each run whose record was damaged, or missing, exported afresh
    saved = json.loads(record.read_text())
    assert set(saved["runs"]) >= {"kind-bad,", "kind-good,", "kind-fine,"}
    assert all(saved["runs"][name]["step"] == 2 for name in ("kind-bad,", "kind-good,", "kind-fine,"))


def test_hparams_sessions_are_written_once_a_run_ended_with_its_final_status(tmp_path):
    """No session while a run is running; the first export that finds it ended writes it, with a
    failure status for a failed run."""
    pytest.importorskip("tensorboard", reason="pip install tensorboard")
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.paths import RootPaths
    from gpu_task_scheduler.records.status import RunStatus
    from gpu_task_scheduler.reports.export import to_tensorboard

    root = tmp_path / "root"
    (root / "a,").mkdir(parents=True)
    with Ledger(RootPaths(str(root))) as ledger:
        ledger.mark_running(name="a,", run_index=0, config_hash="h", slot="cpu0", token="t", work_dir=str(root / "a,"))
    target = tmp_path / "tb"

    def ends():
        found = []
        for path in glob.glob(str(target / "a," / "*tfevents*")):
            for event in EventFileLoader(path).Load():
                for value in event.summary.value:
                    if value.tag == metadata.SESSION_END_INFO_TAG:
                        data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                        found.append(data.session_end_info.status)
        return found

    to_tensorboard(str(root), str(target))
    assert ends() == []  # running: no session yet
    with Ledger(RootPaths(str(root))) as ledger:
        ledger.finish("a,", RunStatus.FAILED, exit_code=1, cause="the command failed")
    to_tensorboard(str(root), str(target))
    assert ends() == [api_pb2.STATUS_FAILURE]
    to_tensorboard(str(root), str(target))
    assert ends() == [api_pb2.STATUS_FAILURE]  # written once
