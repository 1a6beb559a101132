"""Searching instead of a grid: spaces, the search key, samplers, the budget across starts."""

import json
import math
import statistics
import sys

import gts_test_tasks as tasks
import pytest
from helpers import journal_lines, ledger_rows, make_config

from gpu_task_scheduler import ConfigError, ConfigManager, GPUTaskScheduler, RunStatus
from gpu_task_scheduler.cli.main import main as gts
from gpu_task_scheduler.tuning.search import objective
from gpu_task_scheduler.tuning.space import Choice, Int, LogUniform, Uniform, parse_distribution

SPACE = {"x1": {"uniform": [-5, 10]}, "x2": {"uniform": [0, 15]}}


def search_config(root, *, sampler="random", n_runs=8, space=None, slots=("cpu", "cpu"), **search):
    config = make_config(root, [dict(space or SPACE)], slots=slots, scheduler_log_file_path=None)
    config["search"] = {"sampler": sampler, "n_runs": n_runs, "metric": "value", "mode": "min", **search}
    return config


# --- spaces ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        ({"uniform": [0, 1]}, Uniform(0.0, 1.0)),
        ({"loguniform": [1e-5, 1e-1]}, LogUniform(1e-5, 1e-1)),
        ({"int": [2, 8]}, Int(2, 8)),
        ({"int": [16, 512], "log": True}, Int(16, 512, 1, True)),
        ({"int": [0, 64], "step": 16}, Int(0, 64, 16)),
        ({"choice": ["adam", "sgd"]}, Choice(("adam", "sgd"))),
        (["adam", "sgd"], Choice(("adam", "sgd"))),  # a list is a choice
    ],
)
def test_each_space_kind(value, expected):
    assert parse_distribution(value, "lr") == expected


@pytest.mark.parametrize(
    "value, words",
    [
        ({"uniform": [1, 0]}, "uniform needs numbers low < high"),
        ({"uniform": [0, float("inf")]}, "uniform needs numbers low < high"),
        ({"uniform": [0]}, "uniform needs [low, high]"),
        ({"loguniform": [0, 1]}, "loguniform needs low > 0"),
        ({"int": [1.5, 4]}, "int needs whole numbers low <= high"),
        ({"int": [0, 10], "step": 3}, "is not a multiple of step 3"),
        ({"int": [0, 10], "log": True}, "a log int needs low >= 1"),
        ({"choice": []}, "choice needs a non-empty list"),
        ([], "an empty list"),
        ({"uniform": [0, 1], "step": 2}, "uniform takes uniform; unknown: step"),
        ({"uniform": [0, 1], "choice": [1]}, "must name one of"),
        ("0..1", "must be a distribution"),
        # Values a sampler could record and a restart then refused as "the space changed?".
        ({"choice": [float("nan"), 1.0]}, "a choice must not hold nan"),
        ([1, [float("inf")]], "a choice must not hold inf"),
        ({"choice": [{"a": float("-inf")}]}, "a choice must not hold -inf"),
        ({"uniform": [-1e308, 1e308]}, "width high - low overflows a float"),
        ({"int": [0, 2**60]}, "int bounds must be within +-2**53"),
    ],
)
def test_each_bad_space_is_refused_naming_the_key(value, words):
    with pytest.raises(ConfigError) as error:
        parse_distribution(value, "test_config[0]['lr']")
    assert words in str(error.value) and "test_config[0]['lr']" in str(error.value)


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_the_widest_spaces_allowed_give_values_a_restart_accepts(in_tmp, sampler):
    if sampler == "tpe":
        pytest.importorskip("optuna")
    space = {"x1": {"uniform": [-8e307, 8e307]}, "x2": {"loguniform": [1e-300, 1.7e308]}, "k": {"int": [0, 2**53]}}
    space["c"] = [0.5, "a", None, [1, 2]] if sampler == "random" else [0.5, "a", None]
    root = in_tmp / "r"
    first = GPUTaskScheduler(search_config(root, sampler=sampler, n_runs=3, space=space), tasks.BraninTask).start()
    assert len(first.outcomes) == 3  # a huge x1 fails the task's arithmetic: what matters is the restart
    again = GPUTaskScheduler(search_config(root, sampler=sampler, n_runs=4, space=space), tasks.BraninTask).start()
    assert len(again.outcomes) >= 1 and len(ledger_rows(root)) == 4


def test_a_distribution_without_a_search_is_refused_with_what_to_add(tmp_path):
    config = make_config(tmp_path / "r", [{"lr": {"loguniform": [1e-5, 1e-1]}}])
    with pytest.raises(ConfigError, match="only a search samples: add a search section"):
        GPUTaskScheduler(config, tasks.BraninTask)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "search, words",
    [
        ({"sampler": "bayes"}, "sampler must be one of random, tpe, nsga2, cmaes, qmc"),
        ({"n_runs": 0}, "n_runs must be a whole number from 1"),
        ({"n_runs": "40"}, "n_runs must be a whole number from 1"),
        ({"metric": None}, "metric must name the value to optimize"),
        ({"mode": "minimize"}, "mode must be min (lower is better) or max"),
        ({"seed": -1}, "seed must be a whole number"),
        ({"budget": 3}, "unknown key 'budget' in search"),
    ],
)
def test_a_bad_search_is_refused(tmp_path, search, words):
    config = search_config(tmp_path / "r")
    config["search"].update(search)
    config["search"] = {k: v for k, v in config["search"].items() if v is not None}
    with pytest.raises(ConfigError) as error:
        GPUTaskScheduler(config, tasks.BraninTask)
    assert words in str(error.value)


def test_a_search_samples_one_block(tmp_path):
    config = search_config(tmp_path / "r")
    config["test_config"] = [SPACE, SPACE]
    with pytest.raises(ConfigError, match="a search samples one space"):
        GPUTaskScheduler(config, tasks.BraninTask)


def staged_search(root, n_runs=4, **eval_stage):
    config = search_config(root, n_runs=n_runs)
    del config["test_config"]
    config["stages"] = [
        {"name": "train", "test_config": [SPACE]},
        {"name": "eval", "after": "train", "test_config": [{"split": ["val", "test"]}], **eval_stage},
    ]
    return config


@pytest.mark.parametrize(
    "eval_stage, words",
    [
        ({"after": []}, "each later stage follows the search's stage 'train' alone"),
        ({"match": ["x1"]}, "each later stage follows the search's stage 'train' alone"),
        ({"test_config": [{"x1": [1.0]}]}, "sweeps ['x1'], which the search samples"),
    ],
)
def test_a_search_with_stages_is_checked(tmp_path, eval_stage, words):
    with pytest.raises(ConfigError) as error:
        GPUTaskScheduler(staged_search(tmp_path / "r", **eval_stage), tasks.BraninTask)
    assert words in str(error.value)


def test_the_later_stages_of_a_search_follow_each_sampled_run(in_tmp):
    root = in_tmp / "r"
    config = staged_search(root)
    config["global_config"] = {"journal": str(in_tmp / "journal"), "fail_below": 1.0}  # trial 0 (x1 0.14) fails
    summary = GPUTaskScheduler(config, tasks.BraninTask).start()
    rows = ledger_rows(root)
    train = {name: row for name, row in rows.items() if row["stage"] == "train"}
    evals = {name: row for name, row in rows.items() if row["stage"] == "eval"}
    assert len(train) == 4 and len(evals) == 8
    lines = journal_lines(str(in_tmp / "journal"))
    for name, row in evals.items():
        values = json.loads(row["params"])
        (parent,) = [t for t in train if json.loads(train[t]["params"]) == {"x1": values["x1"], "x2": values["x2"]}]
        assert name == parent.replace("train.", "eval.", 1) + f"split-{values['split']},"
        if train[parent]["status"] == "succeeded":
            assert row["status"] == "succeeded"
            assert lines.index(f"end {parent}") < lines.index(f"start {name}")
        else:
            assert row["status"] == "blocked" and parent in row["cause"]
    assert sorted(r["status"] for r in train.values()) == ["failed", "succeeded", "succeeded", "succeeded"]
    assert summary.exit_code == 1 and len(summary.blocked) == 2
    again = GPUTaskScheduler(config, tasks.BraninTask).start()
    assert not again.succeeded and len(ledger_rows(root)) == 12


def test_without_optuna_a_sampler_of_optuna_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'gts-sweep\[search\]'"):
        GPUTaskScheduler(search_config(tmp_path / "r", sampler="tpe"), tasks.BraninTask)
    GPUTaskScheduler(search_config(tmp_path / "r"), tasks.BraninTask)  # random needs nothing


def test_the_objective_is_the_result_key_else_the_reported_metric():
    assert objective({"value": 2}, {}, "value") == 2.0
    assert objective(None, {"value": {"last": 0.5, "step": 3}}, "value") == 0.5
    assert objective({"value": "low"}, {}, "value") is None
    assert objective({"value": float("nan")}, {}, "value") is None
    assert objective({"other": 1}, {}, "value") is None


# --- sweeps that search -------------------------------------------------------------


@pytest.mark.parametrize("sampler", ["random", "tpe", "qmc", "cmaes"])
def test_a_search_runs_exactly_its_budget_inside_the_space_in_unique_folders(in_tmp, sampler):
    root = in_tmp / "r"
    space = {**SPACE, "layers": {"int": [2, 8]}, "opt": ["adam", "sgd"], "lr": {"loguniform": [1e-4, 1e-1]}}
    summary = GPUTaskScheduler(search_config(root, sampler=sampler, n_runs=12, space=space), tasks.BraninTask).start()
    assert summary.ok and len(summary.succeeded) == 12
    rows = ledger_rows(root)
    assert len(rows) == 12 and len({row["work_dir"] for row in rows.values()}) == 12
    for name in rows:
        config = json.loads((root / name / ".gts" / "config.json").read_text())
        assert -5 <= config["x1"] <= 10 and 0 <= config["x2"] <= 15 and 1e-4 <= config["lr"] <= 1e-1
        assert config["layers"] in range(2, 9) and config["opt"] in ("adam", "sgd")
        assert f"x1-{config['x1']:.4g}," in name  # its name shows the values rounded; config.json has them exact
    again = GPUTaskScheduler(search_config(root, sampler=sampler, n_runs=12, space=space), tasks.BraninTask).start()
    assert again.outcomes == {}  # the budget is spent: nothing runs again


def test_the_budget_holds_across_starts_and_a_seed_gives_the_same_runs(in_tmp):
    root, other = in_tmp / "r", in_tmp / "other"
    GPUTaskScheduler(search_config(root, n_runs=5, seed=3), tasks.BraninTask).start()
    more = GPUTaskScheduler(search_config(root, n_runs=8, seed=3), tasks.BraninTask).start()
    assert len(more.succeeded) == 3 and len(ledger_rows(root)) == 8
    GPUTaskScheduler(search_config(other, n_runs=8, seed=3), tasks.BraninTask).start()
    assert sorted(ledger_rows(root)) == sorted(ledger_rows(other))  # the same values, so the same names


def test_failed_runs_are_told_as_failed(in_tmp):
    optuna = pytest.importorskip("optuna")
    root = in_tmp / "r"
    config = search_config(root, sampler="tpe", n_runs=10)
    config["global_config"] = {"fail_below": 2.5}
    summary = GPUTaskScheduler(config, tasks.BraninTask).start()
    assert summary.failed and summary.succeeded and summary.exit_code == 1
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(root / ".gts" / "optuna.journal"))
    )
    study = optuna.load_study(study_name="gts", storage=storage)
    states = {t.user_attrs["gts_run"]: t.state.name for t in study.trials}
    assert len(states) == 10
    for outcome in summary.failed:
        assert states[outcome.name] == "FAIL"
    for outcome in summary.succeeded:
        assert states[outcome.name] == "COMPLETE"
    values = {t.user_attrs["gts_run"]: t.value for t in study.trials if t.state.name == "COMPLETE"}
    assert all(values[o.name] == pytest.approx(o.result["value"]) for o in summary.succeeded)


def test_a_reported_metric_is_the_objective_when_the_result_has_none(in_tmp):
    root = in_tmp / "r"
    config = search_config(root, n_runs=3)
    config["global_config"] = {"report": True}
    summary = GPUTaskScheduler(config, tasks.BraninTask).start()
    assert len(summary.succeeded) == 3
    told = [json.loads(line) for line in (root / ".gts" / "search.jsonl").read_text().splitlines()]
    values = [line["value"] for line in told if line.get("told")]
    assert len(values) == 3 and all(isinstance(v, float) and v >= 0.39 for v in values)


def test_close_floats_get_unique_folders_and_keep_their_exact_values(in_tmp):
    root = in_tmp / "r"
    space = {"x1": {"uniform": [1.0, 1.00001]}, "x2": [5.0]}
    summary = GPUTaskScheduler(search_config(root, n_runs=6, space=space), tasks.BraninTask).start()
    assert len(summary.succeeded) == 6
    names = sorted(ledger_rows(root))
    assert len(set(names)) == 6 and all(name.startswith("x1-1,x2-5,") for name in names)  # 4 digits: all alike
    exact = {json.loads((root / n / ".gts" / "config.json").read_text())["x1"] for n in names}
    assert len(exact) == 6


def test_search_keys_and_bounds_can_be_overridden(in_tmp, capsys, caplog):
    root = in_tmp / "r"
    path = in_tmp / "s.json"
    config = search_config(root, n_runs=4)
    config["task"] = "gts_test_tasks:BraninTask"
    path.write_text(json.dumps(config))
    assert gts(["run", str(path), "search.n_runs=3", "x1.uniform=[0,1]", "--plain"]) == 0
    rows = ledger_rows(root)
    assert len(rows) == 3
    assert all(0 <= json.loads((root / n / ".gts" / "config.json").read_text())["x1"] <= 1 for n in rows)
    capsys.readouterr()
    assert gts(["run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "3 runs asked so far: 3 skip" in out and "random search of 4 runs (minimizing value, seed 0)" in out
    assert "a start asks for up to 1 more run(s)" in out
    # Its budget spent, a start and a dry run say so, and how to sample more.
    assert gts(["run", str(path), "search.n_runs=3", "--dry-run"]) == 0
    spent = "the search's budget is spent: it has asked all n_runs=3 runs, and samples no more"
    assert spent in capsys.readouterr().out
    with caplog.at_level("INFO", logger="gpu_task_scheduler"):
        summary = GPUTaskScheduler({**config, "search": {**config["search"], "n_runs": 3}}, tasks.BraninTask).start()
    assert summary.ok and not summary.outcomes  # nothing ran
    assert spent in caplog.text and "give e.g. search.n_runs=6 on gts run's command line" in caplog.text


def test_config_manager_sees_the_runs_a_search_asked(in_tmp):
    root = in_tmp / "r"
    GPUTaskScheduler(search_config(root, n_runs=4), tasks.BraninTask).start()
    manager = ConfigManager(search_config(root, n_runs=4))
    runs = list(manager.iter_runs())
    assert sorted(run.name for run in runs) == sorted(ledger_rows(root))
    assert all(isinstance(run.config["x1"], float) and not math.isnan(run.config["x1"]) for run in runs)
    # The original's methods speak of the same runs: not the ranges' lower bounds, not n_runs.
    grown = ConfigManager(search_config(root, n_runs=10))
    assert grown.get_num_left_config() == 4
    assert grown.get_all_test_config() == [run.test_config for run in runs]
    assert grown.get_next_config()["work_dir"] == runs[0].work_dir and grown.get_num_left_config() == 3
    fresh = ConfigManager(search_config(in_tmp / "new", n_runs=10))
    assert fresh.get_num_left_config() == 0 and fresh.get_all_test_config() == []
    assert fresh.get_next_config() == {"config": None}


def test_tpe_learns_from_what_it_is_told(in_tmp):
    """Its later runs sample where Branin is low, unlike random's (5 seeds: bench/search_bench.py)."""
    pytest.importorskip("optuna")
    later = {}
    for sampler in ("random", "tpe"):
        root = in_tmp / sampler
        config = search_config(root, sampler=sampler, n_runs=40, slots=("cpu",) * 4, seed=0)
        assert len(GPUTaskScheduler(config, tasks.BraninTask).start().succeeded) == 40
        by_trial = sorted((row["run_index"], json.loads(row["result"])["value"]) for row in ledger_rows(root).values())
        assert [index for index, _ in by_trial] == list(range(40))
        later[sampler] = statistics.median(value for _, value in by_trial[20:])
    assert later["tpe"] < later["random"] / 2


def test_a_pruned_search_run_is_told_pruned(in_tmp):
    root = in_tmp / "r"
    config = search_config(root, n_runs=8, slots=("cpu",))
    config["global_config"] = {"report": True, "hold": 0.5}  # reports its value twice, 0.5 s apart
    config["early_stop"] = {"method": "median", "metric": "value", "mode": "min", "min_step": 1, "min_runs": 1}
    summary = GPUTaskScheduler(config, tasks.BraninTask).start()
    assert summary.pruned and summary.ok
    told = {}
    for line in (root / ".gts" / "search.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("told"):
            told[record["number"]] = record["pruned"]
    names = {}
    for line in (root / ".gts" / "search.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "name" in record:
            names[record["name"]] = record["number"]
    assert len(told) == 8
    for outcome in summary.outcomes.values():
        assert told[names[outcome.name]] is (outcome.status is RunStatus.PRUNED)


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_dry_run_and_config_manager_write_nothing_to_the_search(in_tmp, capsys, sampler):
    if sampler == "tpe":
        pytest.importorskip("optuna")
    root = in_tmp / "r"
    config = search_config(root, sampler=sampler, n_runs=3)
    GPUTaskScheduler(config, tasks.BraninTask).start()

    def state():
        return {path.name: (path.stat().st_size, path.stat().st_mtime_ns) for path in (root / ".gts").iterdir()}

    before = state()
    config["task"] = "gts_test_tasks:BraninTask"
    (in_tmp / "s.json").write_text(json.dumps(config))
    assert gts(["run", str(in_tmp / "s.json"), "search.n_runs=5", "--dry-run"]) == 0
    assert "a start asks for up to 2 more run(s)" in capsys.readouterr().out
    assert len(list(ConfigManager(config).iter_runs())) == 3
    assert state() == before


# --- promises of the search's records, each next to what keeps it ------------------------------


def _optuna_states(root):
    """{run name: (state, value)} as the study records it (read with the scheduler's own lock)."""
    import optuna

    from gpu_task_scheduler.tuning.search import _FlockLock

    path = str(root / ".gts" / "optuna.journal")
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(path, lock_obj=_FlockLock(path + ".lock"))
    )
    study = optuna.load_study(study_name="gts", storage=storage)
    return {t.user_attrs.get("gts_run"): (t.state.name, t.value) for t in study.get_trials(deepcopy=False)}


def test_an_optuna_sampler_is_told_pruned_for_a_pruned_run_not_failed(in_tmp):
    pytest.importorskip("optuna")
    root = in_tmp / "r"
    config = search_config(root, sampler="tpe", n_runs=6, slots=("cpu",))
    config["global_config"] = {"report": True, "hold": 0.3}
    config["early_stop"] = {"method": "median", "metric": "value", "mode": "min", "min_step": 1, "min_runs": 1}
    summary = GPUTaskScheduler(config, tasks.BraninTask).start()
    assert summary.pruned
    states = _optuna_states(root)
    for outcome in summary.outcomes.values():
        assert states[outcome.name][0] == ("PRUNED" if outcome.status is RunStatus.PRUNED else "COMPLETE")


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_an_int_recorded_outside_a_changed_range_is_refused_at_restart(in_tmp, sampler):
    if sampler == "tpe":
        pytest.importorskip("optuna")
    root = in_tmp / "r"
    space = {**SPACE, "layers": {"int": [2, 8]}}
    GPUTaskScheduler(search_config(root, sampler=sampler, n_runs=4, space=space), tasks.BraninTask).start()
    recorded = {json.loads((root / n / ".gts" / "config.json").read_text())["layers"] for n in ledger_rows(root)}
    narrower = {**space, "layers": {"int": [min(recorded) + 1, 9]}}  # leaves out the lowest value recorded
    with pytest.raises(ConfigError, match="the space changed"):
        GPUTaskScheduler(search_config(root, sampler=sampler, n_runs=6, space=narrower), tasks.BraninTask).start()


def test_a_trial_that_asked_for_a_running_runs_values_is_told_when_that_run_ends(in_tmp):
    """In a small discrete space a trial can ask for the values of a run still running: it runs
    nothing, and is told that run's value when it ends, never left unfinished."""
    pytest.importorskip("optuna")
    root = in_tmp / "r"
    space = {"x1": [1.0], "x2": [2.0, 3.0]}  # two configs, six trials: four are twins
    config = search_config(root, sampler="tpe", n_runs=6, space=space, slots=("cpu", "cpu"))
    config["global_config"] = {"sleep": 0.3}
    summary = GPUTaskScheduler(config, tasks.BraninTask).start()
    assert len(summary.succeeded) == 2
    from gpu_task_scheduler.tuning.search import Search, open_searcher

    trials = open_searcher(Search("tpe", 6, 0, "value", "min"), {}, str(root / ".gts"), read_only=True).trials()
    assert len(trials) == 6 and all(trial.done for trial in trials)
    values = {row["name"]: json.loads(row["result"])["value"] for row in ledger_rows(root).values()}
    study = _optuna_states(root)
    for trial in trials:
        assert study[trial.name] == ("COMPLETE", pytest.approx(values[trial.name]))


def test_a_retried_run_of_a_finished_trial_does_not_tell_the_sampler_again(in_tmp):
    pytest.importorskip("optuna")
    root = in_tmp / "r"
    config = search_config(root, sampler="tpe", n_runs=3)
    GPUTaskScheduler(config, tasks.BraninTask).start()
    journal = root / ".gts" / "optuna.journal"
    before = journal.read_bytes()
    name = sorted(ledger_rows(root))[0]
    assert gts(["retry", str(root), name, "--force", "--task", "gts_test_tasks:BraninTask", "--plain"]) == 0
    assert ledger_rows(root)[name]["attempts"] == 2  # it ran again
    told = [json.loads(line) for line in journal.read_bytes()[len(before) :].splitlines()]
    assert not any(entry.get("op_code") == 6 for entry in told)  # 6: a trial's state set (told)


def test_the_methods_know_nothing_of_the_sweep():
    """tuning/ (the samplers, the stopping rules, the spaces) imports nothing of sweep/, engine/ or
    backends/ (type-only and lazy imports included): sweep/ and the engine use it, never the other way."""
    import ast
    import os

    import gpu_task_scheduler.tuning as tuning

    folder = os.path.dirname(tuning.__file__)
    for name in os.listdir(folder):
        if name.endswith(".py"):
            for node in ast.walk(ast.parse(open(os.path.join(folder, name)).read())):
                if isinstance(node, ast.ImportFrom) and node.level >= 2:
                    assert (node.module or "").split(".")[0] not in ("sweep", "engine", "backends", "cli"), (
                        name,
                        node.module,
                    )
