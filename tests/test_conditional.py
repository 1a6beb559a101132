"""Conditional keys in a search's space: ``momentum: {uniform: [0, 0.99], when: {optimizer: sgd}}``
is sampled only for the runs whose optimizer is sgd, and the other runs do not have it at all."""

import json
import sys

import gts_test_tasks as tasks
import pytest
from helpers import ledger_rows, make_config

from gpu_task_scheduler import ConfigError, GPUTaskScheduler
from gpu_task_scheduler.cli.main import main as gts
from gpu_task_scheduler.tuning.space import complete, describe, parse_space

SPACE = {
    "momentum": {"uniform": [0.0, 0.99], "when": {"optimizer": "sgd"}},
    "optimizer": ["sgd", "adam", "rmsprop"],
    "nesterov": {"choice": [True, False], "when": {"optimizer": "sgd", "momentum_kind": ["classic"]}},
    "momentum_kind": {"choice": ["classic", "none"], "when": {"optimizer": ["sgd"]}},
    "lr": {"loguniform": [1e-4, 1e-1]},
}


def conditions_hold(values):
    """What SPACE promises of one run's values."""
    sgd = values["optimizer"] == "sgd"
    assert ("momentum" in values) == sgd and ("momentum_kind" in values) == sgd, values
    assert ("nesterov" in values) == (sgd and values.get("momentum_kind") == "classic"), values
    assert "lr" in values


def test_a_conditional_key_comes_after_the_keys_its_when_names():
    space = parse_space(SPACE)
    assert list(space) == ["optimizer", "momentum", "momentum_kind", "nesterov", "lr"]
    assert "momentum uniform [0, 0.99] when optimizer=sgd" in describe(space)
    assert "nesterov one of [True, False] when optimizer=sgd and momentum_kind=classic" in describe(space)
    assert complete(space, {"optimizer": "adam", "lr": 0.1})
    assert not complete(space, {"optimizer": "sgd", "lr": 0.1})  # a sampler stopped before momentum


@pytest.mark.parametrize(
    "space, words",
    [
        (
            {"m": {"uniform": [0, 1], "when": {"optimiser": "sgd"}}, "optimizer": ["sgd"]},
            "when names 'optimiser', which is not a key of the space; did you mean 'optimizer'?",
        ),
        (
            {"m": {"uniform": [0, 1], "when": {"o": "sgdd"}}, "o": ["sgd", "adam"]},
            "when o: 'sgdd', which o never takes",
        ),
        ({"m": {"uniform": [0, 1], "when": {"n": 9}}, "n": {"int": [1, 3]}}, "when n: 9, which n never takes (n int"),
        (
            {"a": {"choice": [1, 2], "when": {"b": 1}}, "b": {"choice": [1, 2], "when": {"a": 1}}},
            "the when conditions form a cycle: a -> b -> a",
        ),
        ({"a": {"choice": [1, 2], "when": {"a": 1}}}, "when names the key itself"),
        ({"a": {"uniform": [0, 1], "when": {"b": []}}, "b": [1]}, "when b: an empty list"),
        ({"a": {"uniform": [0, 1], "when": "b"}, "b": [1]}, "when must be a dict"),
    ],
)
def test_a_when_that_cannot_work_is_an_error_before_anything_runs(space, words):
    with pytest.raises(ConfigError) as raised:
        parse_space(space)
    assert words in str(raised.value)


def _search(root, sampler, *, command=None, shell=False, n_runs=12):
    config = make_config(root, [dict(SPACE)], slots=("cpu", "cpu"), scheduler_log_file_path=None)
    config["search"] = {"sampler": sampler, "n_runs": n_runs, "seed": 3, "metric": "value", "mode": "min"}
    if command is not None:
        config["command"] = command
        config["shell"] = shell
    return config


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_python_runs_have_a_conditional_key_exactly_when_its_condition_holds(in_tmp, sampler):
    """In each run's config, folder name and ledger parameters: sampled by our random sampler and by
    Optuna's TPE (define-by-run)."""
    pytest.importorskip("optuna") if sampler == "tpe" else None
    root = in_tmp / "r"
    summary = GPUTaskScheduler(_search(root, sampler), tasks.RecordTask).start()
    assert summary.ok and len(summary.succeeded) == 12
    optimizers = set()
    for outcome in summary.succeeded:
        config = outcome.result["config"]
        values = {key: config[key] for key in SPACE if key in config}
        conditions_hold(values)
        optimizers.add(values["optimizer"])
        assert ("momentum-" in outcome.name) == ("momentum" in values)
        assert outcome.name.startswith("momentum-" if "momentum" in values else "optimizer-"), outcome.name
    assert optimizers >= {"sgd", "adam"}  # both sides of the condition were sampled
    for row in ledger_rows(root).values():
        conditions_hold(json.loads(row["params"]))
    again = GPUTaskScheduler(_search(root, sampler), tasks.RecordTask).start()  # a restart reads them back
    assert again.ok and not again.succeeded and len(ledger_rows(root)) == 12


def test_a_commands_argument_of_a_key_the_run_lacks_is_left_out_with_its_option(in_tmp):
    script = in_tmp / "argv.py"
    script.write_text("import json, sys; json.dump(sys.argv[1:], open(sys.argv[-1] + '/result.json', 'w'))\n")
    command = [
        sys.executable,
        str(script),
        "--optimizer",
        "{optimizer}",
        "--momentum",
        "{momentum}",
        "--nesterov={nesterov}",
        "--lr",
        "{lr}",
        "{work_dir}",
    ]
    root = in_tmp / "r"
    summary = GPUTaskScheduler(_search(root, "random", command=command)).start()
    assert summary.ok and len(summary.succeeded) == 12
    for row in ledger_rows(root).values():
        values, argv = json.loads(row["params"]), json.loads(row["result"])
        conditions_hold(values)
        assert ("--momentum" in argv) == ("momentum" in values), argv
        assert any(arg.startswith("--nesterov=") for arg in argv) == ("nesterov" in values), argv
        assert argv[:2] == ["--optimizer", values["optimizer"]] and "--lr" in argv


def test_a_shell_command_or_pbt_that_uses_a_conditional_key_is_refused(in_tmp, capsys):
    config = _search(in_tmp / "r", "random", command="echo {momentum} {lr}", shell=True)
    with pytest.raises(ConfigError, match="uses momentum, which only some runs have"):
        GPUTaskScheduler(config).start()
    config = _search(in_tmp / "r", "random", command=["echo", "{lr}"])
    config["pbt"] = {"metric": "value", "mode": "min", "interval": 2, "max_step": 4, "perturb": {"momentum": [2]}}
    with pytest.raises(ConfigError, match="pbt changes 'momentum', which only some runs have"):
        GPUTaskScheduler(config).start()
    assert not (in_tmp / "r").exists()


def test_the_dry_run_shows_the_conditions(in_tmp, capsys):
    (in_tmp / "sweep.json").write_text(json.dumps(_search(in_tmp / "r", "random", command=["echo", "{lr}"])))
    assert gts(["run", str(in_tmp / "sweep.json"), "--dry-run"]) == 0
    assert "momentum uniform [0, 0.99] when optimizer=sgd" in capsys.readouterr().out


def test_a_trial_asked_without_its_active_conditional_key_is_told_failed_and_not_counted(in_tmp):
    """As a scheduler killed between a define-by-run trial's suggestions leaves it: optimizer sgd,
    no momentum. No run ever had those values; the budget is still n_runs complete runs."""
    import os

    root = in_tmp / "r"
    os.makedirs(root / ".gts")
    (root / ".gts" / "search.jsonl").write_text(
        json.dumps({"number": 0, "values": {"optimizer": "sgd", "lr": 0.01}}) + "\n"
    )
    summary = GPUTaskScheduler(_search(root, "random", n_runs=4), tasks.RecordTask).start()
    assert summary.ok and len(summary.succeeded) == 4
    records = [json.loads(line) for line in (root / ".gts" / "search.jsonl").read_text().splitlines()]
    assert {"number": 0, "told": True, "value": None, "pruned": False} in records
    for row in ledger_rows(root).values():
        conditions_hold(json.loads(row["params"]))
