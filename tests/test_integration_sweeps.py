"""Each framework's example sweep (examples/integrations/<framework>.yaml) run by ``gts run``, for
real, on the CPU, its scheduler killed (SIGKILL) once a run is paused: the next ``gts run`` takes
the 8 configurations under promotion ASHA to the end, training at most half the grid's steps, keeps
the configuration the whole grid finds best (with the numbers the whole grid gives it, also where
it was paused and resumed), reports no step twice, and a second ``gts run`` trains nothing.
Lightning's also runs as a DDP command (2 processes, gloo), paused and resumed."""

import glob
import inspect
import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import wait_until
from helpers import ledger_rows
from run_side import ONE_THREAD, framework

# The sweeps train real models in every run's process: one at a time (one worker, with the
# TensorBoard sweep), so that two of them never share the 2 cores of a CI machine with each other
# as well as with the rest (two groups side by side made the suite slower, not faster).
# One worker runs these one after another. Each attempt imports torch and its framework (seconds of
# CPU): on 2 cores with the other workers busy and the machine loaded, the DDP case took over 180 s
# (the suite's bound for a hang), 47 s alone; these get 480 s.
pytestmark = [pytest.mark.xdist_group("frameworks"), pytest.mark.timeout(480)]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
# The framework each example needs, and the metric its sweep ranks by.
FRAMEWORKS = {
    "lightning": "lightning",
    "xgboost": "xgboost",
    "lightgbm": "lightgbm",
    "keras": "keras",
    "transformers": "accelerate",
}


def gts(*args, cwd=REPO):
    done = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **ONE_THREAD},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def reported(run_dir):
    """Every step the run reported, over all its attempts, in order."""
    files = sorted(glob.glob(os.path.join(run_dir, ".gts", "logs", "attempt-*-metrics.jsonl")))
    files.append(os.path.join(run_dir, ".gts", "metrics.jsonl"))
    lines = []
    for path in files:
        if os.path.exists(path):
            with open(path) as handle:
                lines += [json.loads(line) for line in handle]
    return lines


def example_sweep(name):
    """The example's module, its config file (relative to the repository) and its config."""
    example = framework(name, needs=FRAMEWORKS[name])
    config_file = os.path.join("examples", "integrations", f"{name}.yaml")
    with open(os.path.join(REPO, config_file)) as handle:
        config = yaml.safe_load(handle)
    assert config["early_stop"]["method"] == "asha" and config["early_stop"]["promotion"] is True
    return example, config_file, config


def check_the_sweep(example, config, root, tmp_path, runs):
    """Every run paused or succeeded, no step reported twice, at most half the grid's steps trained,
    and the best of the whole grid kept, with the numbers the whole grid gives it."""
    rule = config["early_stop"]
    rows = ledger_rows(root)
    assert len(rows) == runs and {row["status"] for row in rows.values()} <= {"succeeded", "paused"}
    steps = {run: [line["step"] for line in reported(row["work_dir"])] for run, row in rows.items()}
    assert all(len(s) == len(set(s)) and s == sorted(s) for s in steps.values()), steps  # no step trained twice
    assert sum(map(len, steps.values())) <= len(rows) * rule["max_step"] / 2
    # The whole grid, trained by hand (where the callback does nothing): its best is the one kept.
    by_hand = {"out": str(tmp_path / "by-hand")} if "out" in inspect.signature(example.train).parameters else {}
    whole = {
        run: example.train(**config.get("global_config", {}), **json.loads(row["params"]), **by_hand)[rule["metric"]]
        for run, row in rows.items()
    }
    best = min(whole, key=whole.get) if rule["mode"] == "min" else max(whole, key=whole.get)
    assert rows[best]["status"] == "succeeded"
    for run, row in rows.items():  # those paused and promoted too: as if trained without a pause
        if row["status"] == "succeeded":
            kept = reported(row["work_dir"])[-1]
            assert kept["step"] == rule["max_step"] and kept[rule["metric"]] == pytest.approx(whole[run], rel=1e-5)
    return rows


# Killed: one framework on PyTorch and the two boosting libraries. Keras saves through the same
# commit as Lightning (integrations/common.py, tested whole in test_integrations_common.py), and the
# Trainer's own half-written checkpoint is skipped on resume (test_integration_transformers.py);
# both are paused and resumed through `gts run` below. Each kill here costs 10 to 45 CPU-seconds.
KILLED = ["lightgbm", "lightning", "xgboost"]


@pytest.mark.parametrize("name", KILLED)
def test_the_example_sweep_killed_while_runs_are_paused_ends_as_a_whole_one(name, tmp_path):
    """The scheduler is killed (SIGKILL) once a run is paused and another runs: the next `gts run`
    loses nothing and trains no reported step again, and the sweep ends as one never killed would.
    Half the example's grid (its first key's first and last values, as `gts run` overrides): 4
    configurations under promotion ASHA are what the 8 are, at half the cost."""
    example, config_file, config = example_sweep(name)
    root = str(tmp_path / "root")
    (block,) = config["test_config"]
    first = next(iter(block))
    block[first] = [block[first][0], block[first][-1]]
    overrides = [f"{first}={','.join(map(str, block[first]))}", f"scheduler_config.result_root_folder={root}"]
    argv = [sys.executable, "-m", "gpu_task_scheduler", "run", config_file, *overrides, "--plain"]
    scheduler = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **ONE_THREAD}
    )
    try:
        ledger = os.path.join(root, ".gts", "ledger.sqlite3")

        def statuses():
            return {row["status"] for row in ledger_rows(root).values()} if os.path.exists(ledger) else set()

        wait_until(lambda: {"paused", "running"} <= statuses(), timeout=120, message="a paused run and a running one")
    finally:
        scheduler.kill()  # its runs end with it (their lifeline)
        scheduler.wait()
    gts("run", config_file, *overrides, "--plain")
    rows = check_the_sweep(example, config, root, tmp_path, runs=4)
    attempts = {run: row["attempts"] for run, row in rows.items()}
    again = gts("run", config_file, *overrides, "--plain")
    assert "0 succeeded, 0 failed" in again and {run: r["attempts"] for run, r in ledger_rows(root).items()} == attempts


def test_a_lightning_ddp_command_is_paused_and_resumed(tmp_path):
    pytest.importorskip("lightning", reason="the integrations extra: pip install -e '.[integrations]'")
    root, by_hand = tmp_path / "root", tmp_path / "by-hand"
    script = os.path.join(REPO, "examples", "integrations", "lightning.py")
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": str(root)},
        "command": [sys.executable, script, "--lr", "{lr}", "--width", "8", "--epochs", "4"]
        + ["--devices", "2", "--out", "{work_dir}"],
        "test_config": [{"lr": [0.1, 0.003]}],
        "early_stop": {"method": "asha", "promotion": True, "metric": "val_loss", "mode": "min"}
        | {"min_step": 2, "max_step": 4, "reduction_factor": 2},
    }
    with open(tmp_path / "ddp.yaml", "w") as handle:
        yaml.safe_dump(config, handle)
    gts("run", str(tmp_path / "ddp.yaml"), "--plain")
    rows = ledger_rows(root)
    resumed = [row for row in rows.values() if row["status"] == "succeeded"]
    assert len(resumed) == 1 and resumed[0]["attempts"] == 2
    assert [line["step"] for line in reported(resumed[0]["work_dir"])] == [1, 2, 3, 4]
    os.mkdir(by_hand)
    subprocess.run(
        [sys.executable, script, "--lr", "0.1", "--width", "8", "--epochs", "4", "--devices", "2"]
        + ["--out", str(by_hand)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    with open(by_hand / "result.json") as handle, open(os.path.join(resumed[0]["work_dir"], "result.json")) as kept:
        assert json.load(kept)["val_loss"] == pytest.approx(json.load(handle)["val_loss"], rel=1e-5)


@pytest.mark.parametrize("name", ["keras", "lightgbm", "transformers", "xgboost"])
def test_the_example_as_a_command_is_paused_and_resumed(name, tmp_path):
    """The same script as a `command:` (Lightning's: the DDP test above), one slot: the first
    configuration (the better at the rung) is paused there, then promoted once the second is judged,
    and resumed from its checkpoint to the end, with the numbers it has trained without a pause."""
    example, _, config = example_sweep(name)
    first, second = config["test_config"][0]
    values = {first: [config["test_config"][0][first][0], config["test_config"][0][first][-1]]}
    values[second] = config["test_config"][0][second][:1]
    keys = [*config.get("global_config", {}), first, second]
    config["command"] = [sys.executable, os.path.join(REPO, "examples", "integrations", f"{name}.py")]
    config["command"] += [part for key in keys for part in (f"--{key.replace('_', '-')}", f"{{{key}}}")]
    config["command"] += ["--out", "{work_dir}"]
    del config["task"]
    config["test_config"] = [values]
    config["early_stop"]["reduction_factor"] = 2
    config["scheduler_config"] = {"gpu": ["cpu"], "result_root_folder": str(tmp_path / "root")}
    with open(tmp_path / "command.yaml", "w") as handle:
        yaml.safe_dump(config, handle)
    gts("run", str(tmp_path / "command.yaml"), "--plain")
    rows = sorted(ledger_rows(tmp_path / "root").values(), key=lambda row: row["run_index"])
    assert [(row["status"], row["attempts"]) for row in rows] == [("succeeded", 2), ("paused", 1)]
    steps = [line["step"] for line in reported(rows[0]["work_dir"])]
    assert steps == sorted(set(steps)) and steps[-1] == config["early_stop"]["max_step"]  # no step trained twice
    by_hand = {"out": str(tmp_path / "by-hand")} if "out" in inspect.signature(example.train).parameters else {}
    whole = example.train(**config.get("global_config", {}), **json.loads(rows[0]["params"]), **by_hand)
    metric = config["early_stop"]["metric"]
    with open(os.path.join(rows[0]["work_dir"], "result.json")) as handle:
        assert json.load(handle)[metric] == pytest.approx(whole[metric], rel=1e-5)
