"""Best results and averages over seeds, in Python and from `gts results`; numbers checked by hand."""

import json

import pytest
from helpers import make_config, record_started

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


def test_an_average_has_its_95_percent_confidence_interval(root):
    table = {row["lr"]: row for row in results.aggregate(root, over="seed")}
    # losses 2, 3, 4: std 1, n 3; t(0.975, 2) = 4.303, so the half-width is 4.303 / sqrt(3)
    assert table[0.1]["result.loss.ci95"] == pytest.approx(4.303 / 3**0.5)
    assert list(table[0.1])[:6] == [
        "lr",
        "runs",
        "result.loss.mean",
        "result.loss.std",
        "result.loss.ci95",
        "result.loss.count",
    ]


@pytest.mark.parametrize(
    "df, t",
    [(1, 12.706), (2, 4.303), (9, 2.262), (29, 2.045), (30, 2.042), (50, 2.009), (100, 1.984), (10**6, 1.960)],
)
def test_the_t_quantile_is_within_a_thousandth_of_the_exact_one(df, t):
    assert results.t975(df) == pytest.approx(t, abs=0.001)


def test_a_paper_table_in_markdown_and_latex_gives_mean_and_std_in_one_cell(root, capsys):
    assert main(["results", root, "--average-over", "seed", "--sort", "loss", "--format", "markdown"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "| lr | runs | loss (mean ± std) |",
        "|---:|---:|---:|",
        "| 0.1 | 3 | 3 ± 1 |",
        "| 0.2 | 3 | 4 ± 1 |",
    ]
    assert "no best in bold in loss: the config declares no mode for it" in err
    assert main(["results", root, "--average-over", "seed", "--sort", "loss", "--format", "latex"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "\\begin{tabular}{rrr}",
        "\\toprule",
        "lr & runs & loss (mean $\\pm$ std) \\\\",
        "\\midrule",
        "0.1 & 3 & 3 $\\pm$ 1 \\\\",
        "0.2 & 3 & 4 $\\pm$ 1 \\\\",
        "\\bottomrule",
        "\\end{tabular}",
    ]


def test_a_paper_tables_plus_minus_says_what_it_is_and_can_be_the_95_interval_and_bold_said_on_the_line(root, capsys):
    """``0.115 $\\pm$ 0.0066`` under a header of ``loss`` said neither what the ± was nor let the best
    be bolded where the config declares no way."""
    argv = ["results", root, "--average-over", "seed", "--sort", "loss", "--format", "markdown"]
    assert main([*argv, "--spread", "ci95", "--bold", "loss=min"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == "| lr | runs | loss (mean ± 95% CI) |"
    table = {row["lr"]: row for row in results.aggregate(root, "seed")}
    assert lines[2] == f"| 0.1 | 3 | **3 ± {table[0.1]['result.loss.ci95']:.2g}** |" and "no best in bold" not in err
    assert main([*argv, "--bold", "loss=lowest"]) == 2
    assert "--bold takes KEY=min or KEY=max" in capsys.readouterr().err
    assert main([*argv[:-1], "latex", "--spread", "ci95"]) == 0
    assert "loss (mean $\\pm$ 95\\% CI)" in capsys.readouterr().out


def test_a_paper_table_bolds_the_best_where_the_way_is_known_and_escapes_what_latex_reads():
    table = [
        {"name": "a_1", "opt": "sgd & co", "result.loss.mean": 0.5, "result.loss.std": 0.1, "result.acc.mean": 0.9},
        {"name": "b|2", "opt": "adam", "result.loss.mean": 0.25, "result.loss.std": None, "result.acc.mean": 0.8},
    ]
    latex = results.format_paper(table, {"loss": "min", "acc": "max"}, "latex").splitlines()
    assert latex[2] == "name & opt & loss (mean $\\pm$ std) & acc \\\\"
    assert latex[4] == "a\\_1 & sgd \\& co & 0.5 $\\pm$ 0.1 & \\textbf{0.9} \\\\"
    assert latex[5] == "b|2 & adam & \\textbf{0.25} & 0.8 \\\\"
    markdown = results.format_paper(table, {"loss": "min"}, "markdown").splitlines()
    assert markdown[2:] == ["| a\\_1 | sgd &amp; co | 0.5 ± 0.1 | 0.9 |", "| b\\|2 | adam | **0.25** | 0.8 |"]


def test_a_markdown_table_shows_every_value_as_text_in_its_own_cell():
    """``\\|`` once ended a cell early (the backslash escaped, the bar not), and raw HTML went
    through as HTML: rendered by Python-Markdown, each value is the text of its one cell."""
    markdown = pytest.importorskip("markdown")
    values = ["a\\|b", "<img src=x onerror=alert(1)>", "*bold* _it_ `code` [link](x)", "x\\", "&amp;"]
    table = [{"name": f"r{k}", "tag": value, "result.loss": k} for k, value in enumerate(values)]
    rendered = markdown.markdown(results.format_paper(table, {"loss": "min"}, "markdown"), extensions=["tables"])
    import html.parser

    class Cells(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.rows, self.tags, self.text = [], [], None

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                self.rows.append([])
            elif tag in ("td", "th"):
                self.text = ""
            else:
                self.tags.append(tag)

        def handle_endtag(self, tag):
            if tag in ("td", "th"):
                self.rows[-1].append(self.text)
                self.text = None

        def handle_data(self, data):
            if self.text is not None:
                self.text += data

    parsed = Cells()
    parsed.feed(rendered)
    assert [tag for tag in parsed.tags if tag not in ("table", "thead", "tbody")] == ["strong"]  # the best only
    assert [row[1] for row in parsed.rows[1:]] == values and all(len(row) == 3 for row in parsed.rows)


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


def _reference_aggregate(root, over):
    """What aggregate gives, worked out from results.records() and run_result() in plain Python (how
    it worked before SQLite read the groups)."""
    import math
    import statistics

    groups, params = {}, {}
    for record in results.records(root):
        if record.status.value != "succeeded":
            continue
        rest = {k: v for k, v in record.params_value.items() if k != over}
        if record.stage is not None:
            rest = {"stage": record.stage, **rest}
        key = json.dumps(rest, sort_keys=True)
        groups.setdefault(key, []).append(record)
        params.setdefault(key, rest)
    table = []
    for key, members in groups.items():
        row = {**params[key], "runs": len(members)}
        numbers = {}
        for record in members:
            result = results.run_result(root, record)
            items = result.items() if isinstance(result, dict) else [("", result)]
            for name, value in items:
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    numbers.setdefault(f"result.{name}" if name else "result", []).append(float(value))
        for name, found in numbers.items():
            row[f"{name}.mean"] = statistics.fmean(found)
            row[f"{name}.std"] = statistics.stdev(found) if len(found) > 1 else None
            row[f"{name}.count"] = len(found)
        table.append(row)
    return table


def test_averages_read_by_sqlite_equal_the_plain_python_ones_whatever_the_results_look_like(tmp_path):
    """Results of every shape the ledger can hold: dicts (nested, with bools, strings, NaN), bare
    numbers, lists, none in the ledger but in the run's folder, parameters in another key order,
    and a run whose parameters were damaged by hand."""
    import os
    import random

    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.paths import RootPaths
    from gpu_task_scheduler.records.status import RunStatus

    rng = random.Random(3)
    shapes = [
        lambda: {"loss": rng.random(), "acc": rng.randint(0, 100), "ok": True, "note": "x"},
        lambda: {"loss": rng.random(), "nested": {"a": 1}},
        lambda: rng.random(),
        lambda: [1, 2],
        lambda: {"loss": float("nan"), "acc": 3},
        lambda: None,  # its result is its folder's result.json
    ]
    root = tmp_path / "r"
    with Ledger(RootPaths(str(root))) as ledger, ledger.batch():
        for index in range(120):
            lr, seed = rng.choice([0.1, 0.2, 0.3]), index % 5
            params = {"lr": lr, "seed": seed} if index % 2 else {"seed": seed, "lr": lr}
            name = f"run-{index}"
            record_started(ledger, root, index, name, params)
            result = shapes[index % len(shapes)]()
            if result is None:
                os.makedirs(root / name)
                (root / name / "result.json").write_text(json.dumps({"loss": rng.random()}))
            status = RunStatus.SUCCEEDED if index % 7 else RunStatus.FAILED
            ledger.finish(name, status, result=None if result is None else json.dumps(result))
    import sqlite3

    db = sqlite3.connect(root / ".gts" / "ledger.sqlite3")
    db.execute("UPDATE runs SET params = '{broken' WHERE name = 'run-1'")
    db.commit()
    db.close()
    got = results.aggregate(str(root), "seed")
    expected = _reference_aggregate(str(root), "seed")
    assert len(got) == len(expected) == 4  # lr 0.1, 0.2, 0.3, and the run whose parameters are unknown

    def by_params(table):
        return {
            json.dumps({k: v for k, v in row.items() if "." not in k and k != "runs"}, sort_keys=True): row
            for row in table
        }

    for key, row in by_params(expected).items():
        mine = by_params(got)[key]
        assert mine["runs"] == row["runs"]
        assert {k for k in mine if k.endswith(".count")} == {k for k in row if k.endswith(".count")}
        for column, value in row.items():
            if column.endswith((".mean", ".std")) and value is None:  # one member: no std (approx(None) is
                assert mine[column] is None, column  # a TypeError from pytest 9.2 on)
            elif column.endswith((".mean", ".std")):
                assert mine[column] == pytest.approx(value, rel=1e-12), column
            elif column.endswith(".count"):
                assert mine[column] == value
