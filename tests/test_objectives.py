"""A search of several objectives with constraints: Optuna's multi-objective samplers, the Pareto front
(gts results --pareto, results.pareto, gts plot --pareto), and every guarantee of a search kept."""

import json
import os
import random
import subprocess
import sys

import pytest
from conftest import marked_pids, wait_until
from helpers import ledger_rows
from test_process_control import finish

from gpu_task_scheduler import ConfigError
from gpu_task_scheduler import results as results_module
from gpu_task_scheduler.results import dominates, front
from gpu_task_scheduler.tuning.search import parse_constraint, parse_search

pytest.importorskip("optuna")

KILL_SEED = int(os.environ.get("GTS_KILL_SEED", "0"))

# Binh and Korn's problem (held out: nothing in gts was tuned on it): minimize both, subject to two
# constraints; about a fifth of the box is infeasible.
BNH = """import json, sys, time
x, y, out = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
time.sleep(float(sys.argv[4]))
json.dump({"f1": 4 * x * x + 4 * y * y, "f2": (x - 5) ** 2 + (y - 5) ** 2,
           "c1": (x - 5) ** 2 + y * y, "c2": (x - 8) ** 2 + (y + 3) ** 2}, open(out + "/result.json", "w"))
"""


def write_sweep(folder, *, sampler="tpe", n_runs=30, sleep=0.0, slots=2):
    (folder / "bnh.py").write_text(BNH)
    config = {
        "scheduler_config": {"gpu": ["cpu"] * slots, "result_root_folder": "results"},
        "command": [sys.executable, str(folder / "bnh.py"), "{x}", "{y}", "{work_dir}", str(sleep)],
        "test_config": [{"x": {"uniform": [0, 5]}, "y": {"uniform": [0, 3]}}],
        "search": {
            "sampler": sampler,
            "n_runs": n_runs,
            "seed": 1,
            "objectives": {"f1": "min", "f2": "min"},
            "constraints": ["c1 <= 25", "c2 >= 7.7"],
        },
    }
    (folder / "sweep.json").write_text(json.dumps(config))
    return [sys.executable, "-m", "gpu_task_scheduler", "run", "sweep.json", "--plain"]


def expected_front(root):
    """The feasible non-dominated runs, worked out here from the ledger alone."""
    runs = []
    for row in ledger_rows(root).values():
        result = json.loads(row["result"])
        if result["c1"] <= 25 and result["c2"] >= 7.7:
            runs.append((row["name"], (result["f1"], result["f2"])))
    return {name for name, point in runs if not any(dominates(other, point) for _, other in runs)}


@pytest.mark.parametrize("sampler", ["tpe", "nsga2"])
def test_a_two_objective_search_with_constraints_runs_its_budget_and_lists_its_front(in_tmp, sampler):
    argv = write_sweep(in_tmp, sampler=sampler)
    run = subprocess.run(argv, cwd=in_tmp, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    root = in_tmp / "results"
    rows = ledger_rows(root)
    # NSGA-II's crossover of a small generation can ask again for a run's very values: a twin, told
    # with that run, not run twice (the study still holds 30 trials).
    assert len(rows) == 30 if sampler == "tpe" else 25 <= len(rows) <= 30
    assert {row["status"] for row in rows.values()} == {"succeeded"}
    listed = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "results", "results", "--pareto", "--format", "json"],
        cwd=in_tmp,
        capture_output=True,
        text=True,
    )
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    assert {row["name"] for row in found} == expected_front(root) and found
    assert all(row["feasible"] for row in found)
    assert [row["objectives"][0] for row in found] == sorted(row["objectives"][0] for row in found)
    assert {row["name"] for row in results_module.pareto(str(root))} == expected_front(root)
    again = subprocess.run(argv, cwd=in_tmp, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "0 succeeded" in again.stderr and len(ledger_rows(root)) == len(rows)
    import optuna

    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(root / ".gts" / "optuna.journal"))
    )
    assert len(optuna.load_study(study_name="gts", storage=storage).trials) == 30


def test_the_sampler_is_told_each_objective_and_each_constraint_once(in_tmp):
    """What Optuna's study holds: two values per finished trial, and the constraints as its
    constraints_func reads them (infeasible runs have a positive violation)."""
    import optuna

    argv = write_sweep(in_tmp, n_runs=12)
    assert subprocess.run(argv, cwd=in_tmp, capture_output=True, timeout=300).returncode == 0
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(in_tmp / "results" / ".gts" / "optuna.journal"))
    )
    study = optuna.load_study(study_name="gts", storage=storage)
    assert len(study.directions) == 2 and len(study.trials) == 12
    rows = {row["name"]: json.loads(row["result"]) for row in ledger_rows(in_tmp / "results").values()}
    for trial in study.trials:
        result = rows[trial.user_attrs["gts_run"]]
        assert trial.values == pytest.approx([result["f1"], result["f2"]])
        c1, c2 = trial.user_attrs["gts_constraints"]
        assert (c1 <= 0) == (result["c1"] <= 25) and (c2 <= 0) == (result["c2"] >= 7.7)


def test_a_multi_objective_search_killed_twice_ends_with_exactly_its_budget_each_told_once(in_tmp, no_leaked_processes):
    import optuna

    rng = random.Random(KILL_SEED)
    argv = write_sweep(in_tmp, n_runs=16, sleep=0.6)  # 8 rounds of 0.6 s on 2 slots: both kills land mid-sweep
    kills = 0
    for _ in range(2):
        scheduler = subprocess.Popen(argv, cwd=in_tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            scheduler.wait(timeout=rng.uniform(1.0, 2.0))
        except subprocess.TimeoutExpired:
            scheduler.kill()
            kills += 1
        finish(scheduler)
        wait_until(lambda: not marked_pids(no_leaked_processes), timeout=10, message="the runs to die")
    last = subprocess.run(argv, cwd=in_tmp, capture_output=True, text=True, timeout=300)
    assert last.returncode == 0, last.stderr
    assert kills == 2
    rows = ledger_rows(in_tmp / "results")
    assert len(rows) == 16 and {row["status"] for row in rows.values()} == {"succeeded"}
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(in_tmp / "results" / ".gts" / "optuna.journal"))
    )
    study = optuna.load_study(study_name="gts", storage=storage)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    # Each run told once, with its own values (a trial killed before its values were all given is told failed).
    assert sorted(t.user_attrs["gts_run"] for t in complete) == sorted(rows)


@pytest.mark.parametrize(
    "raw, words",
    [
        ({"objectives": {"a": "min"}, "metric": "a"}, "give objectives, or metric and mode"),
        ({"objectives": {}}, "objectives must be a dict of metric -> min or max"),
        ({"objectives": {"a": "least"}}, "each metric is min or max"),
        ({"objectives": {"a": "min", "b": "max"}, "sampler": "cmaes"}, "cmaes optimizes one objective"),
        ({"metric": "a", "mode": "min", "constraints": ["a = 3"]}, "is no constraint"),
        ({"metric": "a", "mode": "min", "constraints": ["gpu_peak <= lots"]}, "neither a number nor a memory size"),
        ({"metric": "a", "mode": "min", "constraints": "a <= 3"}, "constraints must be a list of strings"),
    ],
)
def test_objectives_and_constraints_that_cannot_work_are_refused(raw, words):
    with pytest.raises(ConfigError) as raised:
        parse_search({"n_runs": 5, **raw})
    assert words in str(raised.value)


def test_constraints_parse_numbers_and_memory_sizes():
    assert parse_constraint("params <= 1e6").bound == 1e6
    assert parse_constraint("gpu_peak<=20GiB").bound == 20 * 2**30
    assert parse_constraint("accuracy >= 0.9").violation(0.95) < 0 < parse_constraint("accuracy >= 0.9").violation(0.8)


def test_front_and_dominance_on_a_table():
    points = [[1, 5], [2, 2], [3, 1], [2, 3], [1, 5], [4, 4]]
    assert front(points) == [0, 4, 1, 2]  # equal points are both on it; [2, 3] and [4, 4] are beaten


def test_best_on_a_multi_objective_root_points_to_pareto_and_the_plot_draws_the_front(in_tmp, capsys):
    from gpu_task_scheduler.cli.main import main

    argv = write_sweep(in_tmp, sampler="random", n_runs=10)
    assert subprocess.run(argv, cwd=in_tmp, capture_output=True, timeout=300).returncode == 0
    root = str(in_tmp / "results")
    assert main(["results", root, "--best", "f1", "--min"]) != 0
    assert "gts results ROOT --pareto" in capsys.readouterr().err
    pytest.importorskip("matplotlib")
    assert main(["plot", root, "--pareto", "f1", "f2", "-o", str(in_tmp / "front.png")]) == 0
    assert (in_tmp / "front.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plot", root, "--pareto", "f1", "f3", "-o", str(in_tmp / "front.png")]) != 0
    assert "'f3' is not an objective of" in capsys.readouterr().err


def test_the_page_and_the_report_mark_and_draw_the_front_gts_results_lists(in_tmp):
    """The same front in the runs table (a pareto column), the chart's data, and --pareto."""
    from gpu_task_scheduler.web import data
    from gpu_task_scheduler.web.report import report_data

    argv = write_sweep(in_tmp, sampler="random", n_runs=14)
    assert subprocess.run(argv, cwd=in_tmp, capture_output=True, timeout=300).returncode == 0
    root = str(in_tmp / "results")
    listed = {row["name"] for row in results_module.pareto(root)}
    view = data.pareto_view(root)
    assert view["objectives"] == [["f1", "min"], ["f2", "min"]] and len(view["runs"]) == 14
    assert {run["name"] for run in view["runs"] if run["rank"] == 0} == listed
    feasible = [run for run in view["runs"] if run["feasible"]]
    for run in feasible:  # its rank: one more than the highest rank of the runs that dominate it
        above = [other["rank"] for other in feasible if dominates(other["values"], run["values"])]
        assert run["rank"] == (max(above) + 1 if above else 0), (run, view)
    assert max(run["rank"] for run in feasible) >= 1
    page = data.runs_page(root, limit=50)["runs"]
    assert {run["name"] for run in page if run["pareto"] == "front"} == listed
    assert report_data(root)["pareto"] == view


# --- early stopping with several objectives (MO-ASHA) --------------------------------------------

MO_ASHA = {
    "method": "asha",
    "objectives": {"loss": "min", "latency": "min"},
    "min_step": 1,
    "max_step": 9,
    "reduction_factor": 3,
}
TWO_METRICS = """import json, os, sys, time
loss, latency = float(sys.argv[1]), float(sys.argv[2])
for step in range(1, 10):
    with open(os.environ["GTS_METRICS_FILE"], "a") as handle:
        handle.write(json.dumps({"step": step, "loss": loss, "latency": latency}) + "\\n")
    time.sleep(0.15)  # the scheduler looks every 0.1 s: a run it stops at step 1 is stopped well before step 9
"""


@pytest.mark.parametrize(
    "values, others, stop",
    [
        ([0.5, 5.0], [], False),  # the first at a rung goes on
        ([0.9, 1.0], [[0.1, 9.0]], False),  # both on the front, both ends: a tie does not count against it
        ([0.5, 5.0], [[0.1, 9.0], [0.9, 1.0]], True),  # on the front, but the ends are more isolated
        ([0.95, 9.5], [[0.1, 9.0], [0.9, 1.0], [0.5, 5.0]], True),  # dominated
        ([0.05, 0.5], [[0.1, 9.0], [0.9, 1.0], [0.5, 5.0], [0.95, 9.5]], False),  # dominates them all
    ],
)
def test_mo_asha_keeps_a_run_within_the_best_share_by_pareto_rank_and_crowding(values, others, stop):
    from gpu_task_scheduler.tuning.stopping import parse_early_stop

    rule = parse_early_stop(MO_ASHA)
    verdict = rule.judge_several(1.0, 1.0, values, others)
    assert verdict.stop is stop and verdict.value == values[0]
    if stop:
        assert "Pareto rank" in verdict.cause and f"of the {len(others) + 1} runs" in verdict.cause


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"metric": "loss"}, "give objectives, or metric and mode for one, not both"),
        ({"method": "median"}, "unknown key 'objectives' in early_stop (method median)"),
        ({"objectives": {"loss": "min"}}, "two or more metric -> min or max"),
        ({"objectives": {"loss": "min", "latency": "fast"}}, "mode must be min"),
    ],
)
def test_mo_asha_that_cannot_work_is_refused(extra, words):
    from gpu_task_scheduler.tuning.stopping import parse_early_stop

    with pytest.raises(ConfigError) as raised:
        parse_early_stop({**MO_ASHA, **extra})
    assert words in str(raised.value)


def test_a_grid_with_mo_asha_prunes_the_runs_others_beat_at_a_rung_and_decides_so_after_a_restart(in_tmp):
    from helpers import make_config

    from gpu_task_scheduler import GPUTaskScheduler, RunStatus

    (in_tmp / "two.py").write_text(TWO_METRICS)
    root = in_tmp / "r"
    runs = [(0.1, 9.0), (0.9, 1.0), (0.5, 5.0), (0.95, 9.5), (0.05, 0.5)]
    blocks = [{"order": [index], "loss": [loss], "latency": [latency]} for index, (loss, latency) in enumerate(runs)]
    config = make_config(root, blocks)  # one slot: each run is judged against those before it
    config["command"] = [sys.executable, str(in_tmp / "two.py"), "{loss}", "{latency}"]
    config["early_stop"] = MO_ASHA
    summary = GPUTaskScheduler(config).start()
    status = {f"order-{o.name.split('order-')[1].split(',')[0]}": o.status for o in summary.outcomes.values()}
    assert status == {
        "order-0": RunStatus.SUCCEEDED,
        "order-1": RunStatus.SUCCEEDED,
        "order-2": RunStatus.PRUNED,
        "order-3": RunStatus.PRUNED,
        "order-4": RunStatus.SUCCEEDED,
    }
    rows = ledger_rows(root)
    pruned = next(row for name, row in rows.items() if "order-2," in name)
    assert pruned["cause"].startswith("pruned at step 1: loss 0.5, latency 5: Pareto rank 0, 2 of the 3 runs")
    import sqlite3

    db = sqlite3.connect(root / ".gts" / "ledger.sqlite3")
    vectors = [json.loads(text) for (text,) in db.execute("SELECT objectives FROM verdicts WHERE rung = 1")]
    db.close()
    assert sorted(map(tuple, vectors)) == sorted(runs)
    # A later start judges a new run against the values recorded before it: 6 runs at the rung.
    config["test_config"] = [*blocks, {"order": [5], "loss": [0.5], "latency": [5.0]}]
    second = GPUTaskScheduler(config).start()
    (late,) = second.outcomes.values()
    assert late.status is RunStatus.PRUNED and "of the 6 runs at the rung" in ledger_rows(root)[late.name]["cause"]


def test_mo_asha_lets_the_ceiling_of_n_over_the_factor_go_on():
    """4 runs at a rung, reduction factor 3: ceil(4 / 3) = 2 go on, not floor(4 / 3) = 1."""
    from gpu_task_scheduler.tuning.stopping import parse_early_stop

    rule = parse_early_stop(MO_ASHA)
    others = [[0.1, 0.1], [0.2, 0.2], [0.3, 0.3]]
    assert rule.judge_several(1.0, 1.0, [0.15, 0.15], others).stop is False  # second of 4: goes on
    assert rule.judge_several(1.0, 1.0, [0.25, 0.25], others).stop is True  # third of 4
    assert "the best 2 go on" in rule.judge_several(1.0, 1.0, [0.25, 0.25], others).cause
