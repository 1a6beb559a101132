"""``gts export``: a sweep into TensorBoard, MLflow and W&B, each read back with that tool's own
reader (TensorBoard's event loader, MLflow's client, the offline run files W&B writes); a second
export adds nothing, and one after more runs adds only them."""

import glob
import json
import os
import subprocess
import sys

import pytest
import yaml
from helpers import ledger_rows
from wandb_files import offline_runs

from gpu_task_scheduler.records.metrics import run_points
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


def test_a_pbt_members_lineage_is_exported(tmp_path):
    mlflow = pytest.importorskip("mlflow", reason="pip install mlflow")
    from gpu_task_scheduler.records.lineage import lineages
    from gpu_task_scheduler.results import open_ledger

    root = str(tmp_path / "root")
    gts("run", "configs/pbt.yaml", f"scheduler_config.result_root_folder={root}", "--plain", cwd=REPO)
    uri = f"sqlite:///{tmp_path / 'pbt.db'}"
    gts("export", root, "--to", "mlflow", uri, cwd=tmp_path)
    ledger = open_ledger(root)
    try:
        copies = {name: lineage.own[1:] for name, lineage in lineages(ledger.trial_events()).items()}
    finally:
        ledger.close()
    mlflow.set_tracking_uri(uri)
    table = mlflow.search_runs(experiment_names=["gts: root"])
    members = table[table["tags.gts.parent"] != "true"]
    assert len(members) == 8 and any(copies.values())
    for _, member in members.iterrows():
        made = copies.get(member["tags.gts.run"], [])
        expected = "; ".join(f"step {s.step:g}: copied {s.donor}" for s in made) if made else None
        assert (member.get("tags.gts.lineage") if isinstance(member.get("tags.gts.lineage"), str) else None) == expected
