"""Best results and averages over seeds, in Python and from `gts results`; numbers checked by hand."""

import json

import pytest
from helpers import make_config

from gpu_task_scheduler import ConfigError, GPUTaskScheduler, results
from gpu_task_scheduler.cli.main import main

# loss = 10 * lr + seed, written by the run itself: lr 0.1 -> 2, 3, 4; lr 0.2 -> 3, 4, 5.
# One run (lr 0.3, seed 1) fails and has no loss.
SCRIPT = (  # no braces: they would be the command template's placeholders
    "import json, sys; lr, seed = float(sys.argv[1]), int(sys.argv[2]); "
    "sys.exit(1) if lr == 0.3 else "
    'json.dump(dict(loss=10 * lr + seed, ok=True), open(sys.argv[3] + "/result.json", "w"))'
)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ranking")
    config = make_config(folder / "r", [{"lr": [0.1, 0.2], "seed": [1, 2, 3]}, {"lr": [0.3], "seed": [1]}])
    config["command"] = ["python3", "-c", SCRIPT, "{lr}", "{seed}", "{work_dir}"]
    GPUTaskScheduler(config).start(reraise_signals=False)
    return str(folder / "r")


def test_best_is_the_succeeded_run_with_the_lowest_or_highest_value(root):
    assert results.best(root, "loss")["name"] == "lr-0.1,seed-1,"
    assert results.best(root, "loss")["result.loss"] == pytest.approx(2.0)
    assert results.best(root, "loss", maximize=True)["name"] == "lr-0.2,seed-3,"
    assert results.best(root, "missing") is None


def test_averages_over_the_seed(root):
    table = {row["lr"]: row for row in results.aggregate(root, over="seed")}
    assert set(table) == {0.1, 0.2}  # the failed run has no result
    assert table[0.1]["runs"] == 3 and table[0.1]["result.loss.count"] == 3
    assert table[0.1]["result.loss.mean"] == pytest.approx(3.0)
    assert table[0.1]["result.loss.std"] == pytest.approx(1.0)  # sample std of 2, 3, 4
    assert table[0.2]["result.loss.mean"] == pytest.approx(4.0) and table[0.2]["result.loss.std"] == pytest.approx(1.0)
    assert "result.ok.mean" not in table[0.1]  # True is not a number to average
    with pytest.raises(ConfigError, match="no run of .* has the parameter 'sed'"):
        results.aggregate(root, over="sed")


def test_the_same_from_gts_results(root, capsys):
    assert main(["results", root, "--sort", "loss", "--top", "2", "--format", "json"]) == 0
    assert [row["name"] for row in json.loads(capsys.readouterr().out)] == ["lr-0.1,seed-1,", "lr-0.1,seed-2,"]
    assert main(["results", root, "--sort", "loss", "--desc", "--format", "json"]) == 0
    ranked = json.loads(capsys.readouterr().out)
    assert ranked[0]["name"] == "lr-0.2,seed-3," and ranked[-1]["name"] == "lr-0.3,seed-1,"  # no loss: last
    assert main(["results", root, "--best", "loss", "--min", "--format", "json"]) == 0
    assert [row["name"] for row in json.loads(capsys.readouterr().out)] == ["lr-0.1,seed-1,"]
    assert main(["results", root, "--average-over", "seed", "--sort", "loss", "--desc"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].split()[:3] == ["lr", "runs", "result.loss.mean"]
    assert text[1].split()[:3] == ["0.2", "3", "4"] and text[2].split()[:3] == ["0.1", "3", "3"]
    assert main(["results", root, "--best", "loss", "--sort", "loss"]) == 2
