"""Which parameters mattered: Optuna's evaluators on the ledger's rows (gts importance, gts plot --contour)."""

import json
import math
import random
import sys

import pytest
from helpers import ledger_rows, record_started

from gpu_task_scheduler import GPUTaskScheduler
from gpu_task_scheduler.cli.main import main as gts
from gpu_task_scheduler.errors import ConfigError
from gpu_task_scheduler.records.ledger import Ledger
from gpu_task_scheduler.records.paths import RootPaths
from gpu_task_scheduler.records.status import RunStatus
from gpu_task_scheduler.reports.importance import ABSENT, importance, spaces

pytest.importorskip("optuna")


def plant(root, runs, *, metric="loss", reported=False):
    """A root whose ledger records ``runs`` ((params, value) pairs) as succeeded, with the value as
    the result's ``metric`` (``reported``: as the last value the run reported instead)."""
    with Ledger(RootPaths(str(root))) as ledger, ledger.batch():
        for index, (params, value) in enumerate(runs):
            name = f"r{index}"
            record_started(ledger, root, index, name, params)
            if reported:
                summary = {metric: {"last": value, "step": 10, "min": value, "max": value}}
                ledger.finish(name, RunStatus.SUCCEEDED, result=json.dumps({"other": 1}), metrics=json.dumps(summary))
            else:
                ledger.finish(name, RunStatus.SUCCEEDED, result=json.dumps({metric: value}))
    return str(root)


def held_out(rng, count):
    """A function the evaluators never saw: a Rosenbrock valley in (x, y) with y nearly flat,
    a learning rate on a log scale that dominates, an optimizer that matters a little, a width
    that does not, and a key only one block of the grid has."""
    runs = []
    for _ in range(count):
        params = {
            "lr": 10 ** rng.uniform(-5, 0),
            "x": rng.uniform(-2, 2),
            "y": rng.uniform(-1, 3),
            "optimizer": rng.choice(["sgd", "adam", "rmsprop"]),
            "width": rng.choice([64, 128, 256, 512]),
        }
        if rng.random() < 0.5:
            params["dropout"] = rng.choice([0.0, 0.1])
        value = 25 * (math.log10(params["lr"]) + 2.7) ** 2  # the planted dominant parameter
        value += 0.05 * ((1 - params["x"]) ** 2 + 100 * (params["y"] - params["x"] ** 2) ** 2) / 100
        value += {"sgd": 1.0, "adam": 0.0, "rmsprop": 0.5}[params["optimizer"]]
        runs.append((params, value + rng.gauss(0, 0.1)))
    return runs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_planted_dominant_parameter_ranks_first(tmp_path, seed):
    root = plant(tmp_path, held_out(random.Random(seed), 400))
    found = importance(root, "loss", mode="min")
    names = [parameter["name"] for parameter in found["parameters"]]
    assert names[0] == "lr", found
    assert found["parameters"][0]["kind"] == "log range"
    assert sum(parameter["importance"] for parameter in found["parameters"]) == pytest.approx(1.0)
    assert found["runs"] == 400 and found["evaluator"] == "ped-anova" and found["constant"] == []


def test_fanova_ranks_the_planted_parameter_first_too(tmp_path):
    pytest.importorskip("sklearn")
    root = plant(tmp_path, held_out(random.Random(4), 150))
    found = importance(root, "loss", mode="min", evaluator="fanova")
    assert found["parameters"][0]["name"] == "lr" and found["evaluator"] == "fanova"


def test_a_reported_metric_is_ranked_when_no_result_has_it(tmp_path):
    rng = random.Random(5)
    runs = [({"a": rng.random(), "b": rng.random()}, 0.0) for _ in range(40)]
    runs = [(params, 10 * params["b"] + 0.1 * params["a"]) for params, _ in runs]
    root = plant(tmp_path, runs, reported=True)
    assert importance(root, "loss", mode="min")["parameters"][0]["name"] == "b"


@pytest.mark.parametrize(
    "values, kind",
    [
        ([0.001, 0.01, 0.1], "log range"),  # a log grid
        ([0.0003, 0.02, 0.05, 0.07, 0.1], "range"),  # a uniform sample that happens to span 300x
        ([1, 2, 3], "integer"),
        ([1, 10, 100, 1000], "log integer"),
        (["sgd", "adam"], "category"),
        ([True, False], "category"),
        ([[1, 2], [3]], "category"),
        ([1, "auto"], "category"),
        ([0.5, float("nan")], "category"),
    ],
)
def test_a_parameters_kind_is_inferred_from_its_values(values, kind):
    from gpu_task_scheduler.reports.importance import _kind

    rows = [({"p": value}, float(i)) for i, value in enumerate(values)]
    found, constant = spaces(rows, "loss")
    assert _kind(found["p"]) == kind and constant == []


def test_a_key_some_runs_lack_is_a_category_with_absent_and_a_constant_is_listed():
    rows = [({"p": 1, "c": "same", "q": 0.1}, 1.0), ({"p": 1, "c": "same"}, 2.0)]
    found, constant = spaces(rows, "loss")
    assert constant == ["c", "p"] and ABSENT in found["q"].choices and 0.1 in found["q"].choices


def test_gts_importance_prints_a_ranked_table_and_json(tmp_path, capsys):
    root = plant(tmp_path, held_out(random.Random(6), 120))
    assert gts(["importance", root, "--metric", "loss", "--min"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "loss (min, 120 runs): importance by PED-ANOVA"
    assert out[1].split()[0] == "lr" and "#" in out[1] and out[1].endswith("(log range)")
    assert gts(["importance", root, "--metric", "loss", "--min", "--format", "json", "--quantile", "0.2"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["parameters"][0]["name"] == "lr" and found["runs"] == 120


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--metric", "loss"], "which way is 'loss' better? Say --min or --max"),
        (["--metric", "los", "--min"], "did you mean 'loss'"),
        (["--metric", "loss", "--min", "--quantile", "1.5"], "the quantile of the best runs must be in (0, 1)"),
    ],
)
def test_gts_importance_refuses_what_it_cannot_answer(tmp_path, capsys, argv, words):
    root = plant(tmp_path, held_out(random.Random(7), 20))
    assert gts(["importance", root, *argv]) != 0
    assert words in capsys.readouterr().err


def test_too_few_runs_are_refused(tmp_path):
    root = plant(tmp_path, [({"a": 1}, 1.0), ({"a": 2}, 2.0)])
    with pytest.raises(ConfigError, match="2 succeeded run.s. have a number for 'loss'; importance needs 4"):
        importance(root, "loss", mode="min")


def test_gts_plot_contour_draws_the_two_most_important_and_named_ones(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    root = plant(tmp_path / "r", held_out(random.Random(8), 80))
    output = tmp_path / "contour.png"
    assert gts(["plot", root, "--contour", "loss", "--min", "-o", str(output)]) == 0
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    named = tmp_path / "named.png"
    assert gts(["plot", root, "--contour", "loss", "--params", "optimizer", "width", "-o", str(named)]) == 0
    assert named.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert gts(["plot", root, "--contour", "loss", "--params", "lr", "widht", "-o", str(named)]) != 0
    assert "did you mean 'width'" in capsys.readouterr().err
    assert gts(["plot", root, "--metric", "loss", "--by", "lr", "--min", "-o", str(named)]) != 0
    assert "--params, --min and --max go with --contour NAME" in capsys.readouterr().err
    assert len(ledger_rows(root)) == 80  # read, never written


def test_values_a_sweep_accepts_rank_without_a_crash_tiny_numbers_and_ints_past_floats_range():
    """Tiny positive numbers once divided by zero (their product is 0 in floats) and ints past
    float's range overflowed, in gts importance, --contour, the report and the page alike."""
    pytest.importorskip("optuna")
    from gpu_task_scheduler.reports.importance import _axis, importance

    tiny = [5e-324, 1e-320, 1e-315, 1e-310, 1e-305, 1e-300]
    huge = [10**400, 10**401, 10**402, 10**403, 10**404, 10**405]
    pairs = enumerate(zip(tiny, huge, strict=True))
    rows = [({"eps": e, "big": b, "lr": 0.1 * (k + 1)}, float(k)) for k, (e, b) in pairs]
    found = importance("unused", "loss", mode="min", rows=rows)
    assert {p["name"] for p in found["parameters"]} == {"eps", "big", "lr"}
    kinds = {p["name"]: p["kind"] for p in found["parameters"]}
    assert kinds["eps"] == "log range" and kinds["big"] == "category"
    assert _axis(tiny)[2] is True and _axis(huge)[1] is not None  # a log axis; categories


def test_a_conditional_numeric_key_of_many_values_is_binned_not_a_category_a_value():
    """A `when:` key sampled from a range (momentum under sgd only): one category a value made the
    ranking grow with the square of the runs (4,000 runs: 55 s). Binned, it is bounded."""
    pytest.importorskip("optuna")
    import random

    from gpu_task_scheduler.reports.importance import ABSENT, MAX_CHOICES, importance, spaces

    rng = random.Random(0)
    rows = []
    for k in range(4000):
        params = {"optimizer": "sgd" if k % 2 else "adam", "lr": rng.uniform(0.001, 0.1)}
        if params["optimizer"] == "sgd":
            params["momentum"] = rng.uniform(0.5, 0.99)
        rows.append((params, params["lr"] + params.get("momentum", 0.7) / 10))
    bins = {}
    found, _ = spaces(rows, "loss", bins)
    assert len(found["momentum"].choices) == MAX_CHOICES + 1 and ABSENT in found["momentum"].choices
    assert bins["momentum"][1][0].startswith("0.5") and bins["momentum"][1][-1].endswith(" up")
    ranked = importance("unused", "loss", mode="min", rows=rows)
    assert {p["name"] for p in ranked["parameters"]} == {"optimizer", "lr", "momentum"}


@pytest.mark.parametrize("reported", [False, True], ids=["result", "reported"])
def test_a_metric_whose_name_holds_a_double_quote_is_found(tmp_path, reported):
    """No SQLite JSON path can name ``acc"top1``: such a key is looked up by name instead."""
    rng = random.Random(6)
    runs = [({"a": rng.random(), "b": rng.random()}, 0.0) for _ in range(30)]
    runs = [(params, 10 * params["a"] + 0.1 * params["b"]) for params, _ in runs]
    root = plant(tmp_path, runs, metric='acc"top1', reported=reported)
    found = importance(root, 'acc"top1', mode="max")
    assert found["runs"] == 30 and found["parameters"][0]["name"] == "a"


def test_a_dollar_sign_in_names_and_values_is_drawn_as_text_in_every_plot_mode(tmp_path):
    """matplotlib reads ``$...$`` as a formula: ``tag$1`` once made --pareto, --contour and the
    older plot modes die with ParseFatalException. A user's own figures keep their formulas."""
    pytest.importorskip("matplotlib")
    import matplotlib

    from gpu_task_scheduler.reports.importance import plot_contour
    from gpu_task_scheduler.reports.plots import plot_curves, plot_metric, plot_pareto, plot_timeline

    root = tmp_path / "r"
    command = (
        "import json, os, sys\n"
        "x, tag, folder = float(sys.argv[1]), sys.argv[2], sys.argv[3]\n"
        "with open(os.environ['GTS_METRICS_FILE'], 'a') as f:\n"
        "    for step in (1, 2):\n"
        "        f.write(json.dumps({'step': step, 'lo$s': x / step}) + '\\n')\n"
        "json.dump({'lo$s': x, 'cost$': len(tag) / x}, open(os.path.join(folder, 'result.json'), 'w'))\n"
    )
    (tmp_path / "train.py").write_text(command)
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": str(root)},
        "command": [sys.executable, str(tmp_path / "train.py"), "{x$}", "{ta$g}", "{work_dir}"],
        "test_config": [{"x$": {"uniform": [0.1, 0.5]}, "ta$g": ["$a$", "b$$", "c"]}],
        "search": {"sampler": "random", "n_runs": 8, "seed": 1, "objectives": {"lo$s": "min", "cost$": "min"}},
    }
    summary = GPUTaskScheduler(config).start()
    assert summary.ok and len(summary.succeeded) == 8
    for plot, args in (
        (plot_timeline, (str(root),)),
        (plot_curves, (str(root), "lo$s", "ta$g")),
        (plot_metric, (str(root), "lo$s", "x$")),
        (plot_pareto, (str(root), "lo$s", "cost$")),
        (plot_contour, (str(root), "lo$s")),
    ):
        output = tmp_path / f"{plot.__name__}.png"
        extra = {"mode": "min"} if plot is plot_contour else {}
        assert plot(*args, str(output), **extra) == str(output) and output.stat().st_size > 0
    assert matplotlib.rcParams["text.parse_math"] is True  # only while gts draws


def test_a_searchs_declared_log_scale_decides_the_scale_not_a_guess_from_values(tmp_path):
    """``lr: {loguniform: [1e-3, 0.5]}`` sampled uniformly on its log scale looks linear to the guess
    when most draws fall high: ranked and drawn on a linear 0 to 0.5 axis, most runs were squeezed
    left. A search's declared distributions decide; the guess is for grids."""
    from gpu_task_scheduler.reports.importance import _axis, declared_scales

    root = tmp_path / "r"
    (tmp_path / "train.py").write_text(
        "import json, os, sys\n"
        "lr, width = float(sys.argv[1]), float(sys.argv[2])\n"
        "json.dump({'loss': abs(lr - 0.1) + width / 1000}, open(os.path.join(sys.argv[3], 'result.json'), 'w'))\n"
    )
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": str(root)},
        "command": [sys.executable, str(tmp_path / "train.py"), "{lr}", "{width}", "{work_dir}"],
        "test_config": [{"lr": {"loguniform": [0.3, 0.5]}, "width": {"uniform": [1, 1000]}}],
        "search": {"sampler": "random", "n_runs": 8, "seed": 3, "metric": "loss", "mode": "min"},
    }
    assert GPUTaskScheduler(config).start().ok
    assert declared_scales(str(root)) == {"lr": True, "width": False}
    kinds = {p["name"]: p["kind"] for p in importance(str(root), "loss", mode="min")["parameters"]}
    assert kinds == {"lr": "log range", "width": "range"}  # 0.3 to 0.5 spans no 100x: a guess says linear
    assert _axis([0.3, 0.4, 0.5], True)[2] is True and _axis([0.3, 0.4, 0.5])[2] is False


def test_a_seed_is_left_out_of_the_ranking_and_said(tmp_path):
    rng = random.Random(9)
    runs = [({"lr": rng.random(), "seed": rng.randrange(5)}, 0.0) for _ in range(30)]
    runs = [(params, params["lr"] + rng.gauss(0, 0.01)) for params, _ in runs]
    found = importance(plant(tmp_path, runs), "loss", mode="min")
    assert [p["name"] for p in found["parameters"]] == ["lr"] and found["left_out"] == ["seed"]
    from gpu_task_scheduler.reports.importance import format_importance

    assert "left out: seed (a seed is not a hyperparameter)" in format_importance(found)
