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
import statistics
import subprocess
import sys

import pytest
import yaml
from conftest import wait_until
from helpers import ledger_rows, report_to_free
from run_side import ONE_THREAD, framework

from gpu_task_scheduler.records.metrics import attempt_files, run_points
from gpu_task_scheduler.records.paths import RunPaths

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
    the promoted run the best of the grid at the rung (what a sweep never killed decides there), and
    its numbers at the end those of a training never paused. (Not the whole grid trained again by
    hand: four times the promoted run's training, 40 s of Lightning on 2 cores, for a check of
    ASHA's choice that the values at the rung already make.)"""
    rule = config["early_stop"]
    rows = ledger_rows(root)
    assert len(rows) == runs and {row["status"] for row in rows.values()} <= {"succeeded", "paused"}
    lines = {run: reported(row["work_dir"]) for run, row in rows.items()}
    steps = {run: [line["step"] for line in reported_lines] for run, reported_lines in lines.items()}
    assert all(len(s) == len(set(s)) and s == sorted(s) for s in steps.values()), steps  # no step trained twice
    assert sum(map(len, steps.values())) <= len(rows) * rule["max_step"] / 2
    at_rung = {
        run: next(line[rule["metric"]] for line in found if line["step"] == rule["min_step"])
        for run, found in lines.items()
    }
    best = min(at_rung, key=at_rung.get) if rule["mode"] == "min" else max(at_rung, key=at_rung.get)
    assert [run for run, row in rows.items() if row["status"] == "succeeded"] == [best], at_rung
    by_hand = {"out": str(tmp_path / "by-hand")} if "out" in inspect.signature(example.train).parameters else {}
    whole = example.train(**config.get("global_config", {}), **json.loads(rows[best]["params"]), **by_hand)
    kept = lines[best][-1]
    assert kept["step"] == rule["max_step"] and kept[rule["metric"]] == pytest.approx(whole[rule["metric"]], rel=1e-5)
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


KILLED_AT_A_REPORT = """
import json, os, signal, sys
sys.path.insert(0, {repo!r})
from gpu_task_scheduler import reporting
report = reporting.report

def killed_at_the_first(step, **metrics):  # after its checkpoint of that step is in place
    if step == 2 and not os.path.exists({mark!r}):
        open({mark!r}, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    report(step, **metrics)

reporting.report = killed_at_the_first
with open(os.path.join(sys.argv[1], "resumed.txt"), "a") as handle:
    handle.write(os.environ["GTS_RESUME_STEP"] + "\\n")
from examples.integrations.{name} import train
with open(os.path.join(sys.argv[1], "result.json"), "w") as handle:
    json.dump(train(*{args!r}), handle)
"""


@pytest.mark.parametrize(
    "name, args, metric", [("lightning", (0.1, 8, 3), "val_loss"), ("xgboost", (0.3, 3, 3), "valid-rmse")]
)
def test_a_run_killed_between_its_checkpoint_and_its_report_goes_on_from_the_step_it_holds(
    tmp_path, name, args, metric
):
    """A framework callback's run killed (SIGKILL) once its checkpoint of step 2 is in place and
    before it reports step 2: its retry goes on from step 2 (gts recorded the report kept beside the
    checkpoint), not from step 1 with the checkpoint of step 2; every step is reported once, with
    the numbers of a run never killed."""
    example = framework(name)
    script = tmp_path / "killed.py"
    script.write_text(KILLED_AT_A_REPORT.format(repo=REPO, mark=str(tmp_path / "killed"), name=name, args=args))
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": str(tmp_path / "root"), "max_retries": 1},
        "command": [sys.executable, str(script), "{work_dir}"],
        "test_config": [{"seed": [0]}],
    }
    (tmp_path / "killed.yaml").write_text(yaml.safe_dump(config))
    gts("run", str(tmp_path / "killed.yaml"), "--plain")
    (row,) = ledger_rows(tmp_path / "root").values()
    assert (row["status"], row["attempts"]) == ("succeeded", 2) and (tmp_path / "killed").exists()
    with open(os.path.join(row["work_dir"], "resumed.txt")) as handle:
        assert handle.read().split("\n") == ["", "2", ""]  # the first afresh, its retry from step 2
    assert [line["step"] for line in reported(row["work_dir"])] == [1, 2, 3]
    with open(os.path.join(row["work_dir"], "result.json")) as handle:
        assert json.load(handle)[metric] == pytest.approx(example.train(*args)[metric], rel=1e-5)


# From a paused attempt's report (its checkpoint saved before it) to its slot being free, the median
# of a sweep's paused attempts: the verdict, the framework's end of its training, the process's end.
PAUSE_FREED = 0.3
# Two ranks under DDP take longer: 1.5 s measured (2 cores, a CI run beside it), not yet within the
# bound above (where it goes is not profiled yet); this bound holds the rest, and catches a hang.
DDP_PAUSE_FREED = 5.0


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
    freed = report_to_free(root)  # both ranks end (the process group torn down), and the slot is free
    assert len(freed) == 2 and statistics.median(freed) <= DDP_PAUSE_FREED, freed
    assert [line["step"] for line in reported(resumed[0]["work_dir"])] == [1, 2, 3, 4]
    os.mkdir(by_hand)
    subprocess.run(
        [sys.executable, script, "--lr", "0.1", "--width", "8", "--epochs", "4", "--devices", "2"]
        + ["--out", str(by_hand)],
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, **ONE_THREAD},  # as the sweep's runs: two processes of two threads each spun on 2 cores
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
    freed = report_to_free(tmp_path / "root")  # from each pause's report (after its save) to its slot free
    assert len(freed) == 2 and statistics.median(freed) <= PAUSE_FREED, freed
    steps = [line["step"] for line in reported(rows[0]["work_dir"])]
    assert steps == sorted(set(steps)) and steps[-1] == config["early_stop"]["max_step"]  # no step trained twice
    by_hand = {"out": str(tmp_path / "by-hand")} if "out" in inspect.signature(example.train).parameters else {}
    whole = example.train(**config.get("global_config", {}), **json.loads(rows[0]["params"]), **by_hand)
    metric = config["early_stop"]["metric"]
    with open(os.path.join(rows[0]["work_dir"], "result.json")) as handle:
        assert json.load(handle)[metric] == pytest.approx(whole[metric], rel=1e-5)


PBT_EPOCHS, PBT_STEPS_PER_EPOCH = 6, 8  # 256 samples in batches of 32 (both scripts)
# Per framework: its PBT script (tests/pbt_<name>.py), the package it needs, the metric its callback
# reports, the schedule the script trains under (the factor of the base rate at each step), the
# grid's rates (SGD's and AdamW's; none a factor of 2 from another, so a copy's rate is a new one;
# the last barely trains: the worst wherever it is ranked, and behind the others, so that at the
# intervals it reaches they are judged there before it, with snapshots it can copy (with four rates
# that all trained, a loaded CI run saw no copy at all; with the bad one first, it was the first
# judged at each interval, alone or before the others, and copied nothing once in four runs)),
# and what a copied member's log says of the restored rate (Keras's schedule is the script's own
# object, built from its config: never restored).
PBT_FRAMEWORKS = {
    "lightning": (
        "pbt_lightning.py",
        "lightning",
        "val_loss",
        "cosine",
        [0.3, 0.17, 0.04, 0.002],
        "(this run's config)",
    ),
    "transformers": (
        "pbt_trainer.py",
        "accelerate",
        "eval_loss",
        "linear",
        [0.01, 0.0051, 0.0012, 0.00002],
        "(this run's config)",
    ),
    "keras": ("pbt_keras.py", "keras", "val_loss", "cosine", [0.3, 0.17, 0.04, 0.002], "this run's own schedule"),
}


def _pbt_sweep(folder, name):
    script, needs, metric, _, rates, _ = PBT_FRAMEWORKS[name]
    framework(name, needs=needs)
    config = {
        "scheduler_config": {
            "gpu": ["cpu", "cpu"],
            "result_root_folder": str(folder / "results"),
            "prewarm": {"imports": ["torch", name]},
        },
        "command": [
            sys.executable,
            os.path.join(os.path.dirname(os.path.abspath(__file__)), script),
            "--lr",
            "{lr}",
            "--epochs",
            str(PBT_EPOCHS),
            "--out",
            "{work_dir}",
        ],
        "test_config": [{"lr": rates}],
        "pbt": {
            "metric": metric,
            "mode": "min",
            "interval": 2,
            "quantile": 0.25,
            "perturb": {"lr": [0.5, 2.0]},
            "max_step": PBT_EPOCHS,
        },
    }
    path = folder / "pbt.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _factors(schedule, total):
    """The factor the schedule gives the base rate at each step, as torch computes it, for a base
    of 1: a cosine (its recursive form), or the Trainer's linear decay with no warm-up."""
    if schedule == "linear":
        return [(total - step) / total for step in range(total)]
    return _cosine_factors(total)


def _cosine_factors(total):
    """The factor a cosine schedule over ``total`` steps gives the base rate at each step, as torch
    computes it (its recursive form), for a base of 1."""
    import torch

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    factors = []
    for _ in range(total):
        factors.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        cosine.step()
    return factors


def _check_members_trained_at_their_own_rates(root, schedule, said):
    """Every member succeeded; each attempt trained on from an epoch's checkpoint, one step after
    another, the last to the end; at every optimizer step of every attempt it trained at its
    config's rate times the schedule's factor at that step (after a copy too: not the rate it
    restored); at least one member copied another, trained at a perturbed rate, and its log says
    what was put back."""
    rows = ledger_rows(root)
    assert len(rows) == 4 and {row["status"] for row in rows.values()} == {"succeeded"}, rows
    total = PBT_EPOCHS * PBT_STEPS_PER_EPOCH
    factors = _factors(schedule, total)
    copied = {name for name, kind, *_ in _pbt_events(root) if kind == "resumed"} & {
        name for name, _, _, decision, _ in _pbt_events(root) if decision == "exploit"
    }
    assert copied, "no member copied another"
    for name in rows:
        with open(root / name / "rates.jsonl") as handle:
            lines = [json.loads(line) for line in handle]
        attempts = []  # the steps each attempt trained, in order
        for line in lines:
            if not attempts or attempts[-1][0] != line["pid"]:
                attempts.append((line["pid"], []))
            attempts[-1][1].append(line["step"])
        for _, steps in attempts:  # each from a checkpoint's step (a killed one's too), one after another
            assert steps == list(range(steps[0], steps[0] + len(steps))), (name, steps)
        # Each attempt went on from the step of the checkpoint it restored (Lightning's global step),
        # which is the step gts said it resumes from (after a copy: the donor's).
        starts = [(lines[index]["step"], lines[index]["resume"]) for index in _first_lines(lines)]
        assert all(step == int(float(resume or 0)) * PBT_STEPS_PER_EPOCH for step, resume in starts), (name, starts)
        assert attempts[-1][1][-1] == total - 1, (name, attempts)
        for line in lines:
            # (rel 1e-5: Keras computes its schedule in float32; a donor's rate is off by 2x)
            assert line["lr"] == pytest.approx(line["config"] * factors[line["step"]], rel=1e-5), (name, line)
        logs = glob.glob(str(root / name / "*.log")) + glob.glob(str(root / name / ".gts" / "logs" / "attempt-*.log"))
        log = "".join(open(path).read() for path in logs)  # every attempt's
        if name in copied:
            assert said in log, log[-3000:]
    assert {line_config for name in copied for line_config in _configs(root / name)} - {
        json.loads(rows[name]["params"])["lr"] for name in copied
    }, "no copied member trained at a perturbed rate"


def _first_lines(lines):
    return [index for index, line in enumerate(lines) if index == 0 or lines[index - 1]["pid"] != line["pid"]]


def _copy_faults(root):
    """The exploits that broke the copy rule (a snapshot of a dropped lineage, or one worse than the
    copier's own value there), as the PBT battery audits them."""
    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.lineage import copy_faults
    from gpu_task_scheduler.records.paths import RootPaths
    from gpu_task_scheduler.tuning.base import Ranking

    ledger = Ledger.read_only(RootPaths(str(root)))
    try:
        return copy_faults(
            ledger.trial_events(), interval=2, value_of=lambda event: event.value, worse=Ranking(["min"]).worse
        )
    finally:
        ledger.close()


def _configs(folder):
    with open(folder / "rates.jsonl") as handle:
        return {json.loads(line)["config"] for line in handle}


def _pbt_events(root):
    import sqlite3

    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:
        return db.execute("SELECT name, kind, rung, decision, detail FROM trial_events ORDER BY seq").fetchall()


@pytest.mark.parametrize("name", list(PBT_FRAMEWORKS))
def test_a_pbt_sweep_killed_at_a_pause_and_at_an_exploits_copy_trains_each_member_at_its_own_rate(tmp_path, name):
    """PBT through `gts run` on a real Lightning script with a cosine LR schedule, a ``Trainer``
    script with its own linear one (the restored scheduler brought back the donor's rate; with the
    ``Trainer``, PBT perturbed nothing) and a Keras script with a ``CosineDecay``: 4 members, 2
    slots, an exploit every 2 epochs. The scheduler is killed (SIGKILL, tests/pbt_kill_driver.py)
    once it committed an exploit's pause (before the run is told), then once it put a donor's
    checkpoint in place of a member's (before the member's new attempt is committed; where no such
    exploit comes before the end, the sweep ends), and run again to its end. At every step after
    every copy, the optimizer's rate is the member's own (perturbed) rate times the schedule's
    factor at that step, and its log says so; every member resumed from the step of the checkpoint
    it holds; no copy broke the rule; no attempt reports a step twice. (One sweep for all of it:
    each costs half a minute of the suite.)"""
    path = _pbt_sweep(tmp_path, name)
    root, note = tmp_path / "results", tmp_path / "killed.json"
    driver = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pbt_kill_driver.py")
    killed = []
    for point in ("exploit-pause", "installed"):
        done = subprocess.run(
            [sys.executable, driver, point, str(note), "run", str(path), "--plain"],
            cwd=str(tmp_path),
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, **ONE_THREAD},
        )
        if done.returncode == 0:
            break  # the sweep ended before an exploit's copy came
        assert done.returncode == -9, done.stdout + done.stderr
        killed.append(json.loads(note.read_text())["point"])
    # Every sweep exploits (its worst member barely trains): the first kill always comes. (A kill at
    # the first pause of all, a turn's, could come as the top member reported: its report then read
    # late, after its next attempt had begun, no snapshot of it could be taken there, and in a CI run
    # no member had a donor at either interval.)
    assert killed[:1] == ["exploit-pause"], killed
    gts("run", str(path), "--plain", cwd=str(tmp_path))
    _check_members_trained_at_their_own_rates(root, PBT_FRAMEWORKS[name][3], PBT_FRAMEWORKS[name][5])
    assert _copy_faults(root) == []
    for name, row in ledger_rows(root).items():
        # Each attempt reported each step once, in order. A member that copied a donor goes on from
        # the donor's step: one behind it (its next attempt reports those steps again, on the
        # donor's weights: seen in a CI run), or one ahead (the steps between were the donor's).
        # Its curve is each step once, in order, to the last.
        for path in attempt_files(RunPaths(row["work_dir"], None)):
            with open(path) as handle:
                steps = [json.loads(line)["step"] for line in handle if line.strip()]
            assert steps == sorted(set(steps)), (name, path, steps)
        curve = [step for step, _ in run_points(RunPaths(row["work_dir"], None))]
        assert curve == sorted(set(curve)) and curve[-1] == PBT_EPOCHS, (name, curve)
