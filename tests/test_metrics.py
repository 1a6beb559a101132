"""Runs that report as they train: the metrics file, its tolerant reader, and what status and results show."""

import itertools
import json
import os
import subprocess
import sys

import gts_test_tasks as tasks
import pytest
from helpers import ledger_rows, make_config

from gpu_task_scheduler import GPUTaskScheduler, report
from gpu_task_scheduler.cli.main import main as gts
from gpu_task_scheduler.records.metrics import MAX_LINE, MetricsReader, latest, read_all, sample_curve
from gpu_task_scheduler.reports.status import format_status, status
from gpu_task_scheduler.results import rows


def test_a_python_task_reports_and_status_and_results_show_it(in_tmp):
    root = in_tmp / "r"
    summary = GPUTaskScheduler(make_config(root, [{"lr": [0.5, 0.9]}], max_retries=0), tasks.ReportingTask).start()
    assert summary.ok
    recorded = json.loads(ledger_rows(root)["lr-0.5,"]["metrics"])
    assert recorded["loss"] == {"last": 0.125, "step": 3, "min": 0.125, "max": 0.5}
    assert recorded["acc"]["max"] == 0.875
    by_name = {row["name"]: row for row in rows(str(root))}
    assert by_name["lr-0.5,"]["metrics.loss"] == 0.125 and by_name["lr-0.9,"]["metrics.acc"] == pytest.approx(0.999)
    text = format_status(status(str(root), runs="table"))
    assert "loss 0.125 @ step 3, acc 0.875 @ step 3" in text  # a loss first
    first = json.loads((root / "lr-0.5," / ".gts" / "metrics.jsonl").read_text().splitlines()[0])
    assert isinstance(first.pop("@time"), float)  # when it was reported
    assert first == {"step": 1, "loss": 0.5, "acc": 0.5}


def test_status_shows_the_declared_metric_and_the_loss_before_counters_and_timings(in_tmp):
    """A Hugging Face Trainer's evaluation reports epoch, eval_runtime and eval_samples_per_second
    beside its loss and accuracy: the short view shows the metric the config declares and the loss."""
    root = in_tmp / "r"
    line = "epoch=1.0, eval_runtime=0.5, eval_samples_per_second=100.0, eval_loss=0.3, eval_accuracy=0.9"
    config = make_config(root, [{"i": [0]}])
    config["command"] = [sys.executable, "-c", f"from gpu_task_scheduler import report; report(1, {line})"]
    config["early_stop"] = {"method": "median", "metric": "eval_accuracy", "mode": "max"}
    assert GPUTaskScheduler(config).start().ok
    text = format_status(status(str(root), runs="table"))
    assert "eval_accuracy 0.9 @ step 1, eval_loss 0.3 @ step 1, epoch 1 @ step 1, +2 more" in text, text


def test_each_attempt_reports_its_own_curve(in_tmp):
    root = in_tmp / "r"
    config = make_config(root, [{"lr": [0.5]}], global_config={"fail_first": True}, max_retries=1)
    assert GPUTaskScheduler(config, tasks.ReportingTask).start().ok
    folder = root / "lr-0.5,"
    assert len((folder / ".gts" / "logs" / "attempt-1-metrics.jsonl").read_text().splitlines()) == 3
    assert len((folder / ".gts" / "metrics.jsonl").read_text().splitlines()) == 3  # not 6: its own
    assert json.loads(ledger_rows(root)["lr-0.5,"]["metrics"])["loss"]["step"] == 3
    # It started again from its first step: its curve is its last attempt's, not both.
    from gpu_task_scheduler.results import curve_rows

    assert [row["step"] for row in curve_rows(str(root))] == [1, 2, 3]


@pytest.mark.parametrize("shell", [False, True])
def test_a_command_reports_through_the_variable_in_any_language(in_tmp, capsys, shell):
    python = "import gpu_task_scheduler as g; [g.report(s, loss=1 / s) for s in (1, 2, 4)]"
    command = (
        # A template's braces are doubled: {{ }} is a literal brace, {a} a placeholder.
        'echo \'{{"step": 1, "loss": 3}}\' >> "$GTS_METRICS_FILE"; '
        'echo \'{{"step": 2, "loss": 2.5}}\' >> "$GTS_METRICS_FILE"'
        if shell
        else ["python", "-c", python]
    )
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": str(in_tmp / "r"), "scheduler_log_file_path": None},
        "command": command,
        "shell": shell,
        "test_config": [{"a": [1]}],
    }
    (in_tmp / "s.json").write_text(json.dumps(config))
    assert gts(["run", str(in_tmp / "s.json"), "--plain"]) == 0
    capsys.readouterr()
    assert gts(["results", str(in_tmp / "r"), "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["metrics.loss"] == (2.5 if shell else 0.25)


def test_report_outside_a_sweep_does_nothing_and_refuses_what_would_be_skipped(monkeypatch, tmp_path):
    monkeypatch.delenv("GTS_METRICS_FILE", raising=False)
    report(1, loss=0.5)  # a script run by hand: nothing written, no error
    for bad in ({"loss": float("nan")}, {"loss": "0.5"}, {"loss": True}):
        with pytest.raises(ValueError, match="not a finite number"):
            report(1, **bad)
    with pytest.raises(ValueError, match="step"):
        report(None, loss=1.0)
    monkeypatch.setenv("GTS_METRICS_FILE", str(tmp_path / "m.jsonl"))
    for step, why in (
        (1e300, "above 2\\*\\*53"),
        (2**63, "above 2\\*\\*53"),
        (-1, "below 0"),
        (float("inf"), "finite"),
    ):
        with pytest.raises(ValueError, match=f"is no step: it is .*{why}"):
            report(step, loss=1.0)
    assert not (tmp_path / "m.jsonl").exists()  # nothing written of a step refused
    report(2.5, loss=1)
    report(2**53, loss=1)  # the largest step
    written = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in line.items() if k != "@time"} for line in written] == [
        {"step": 2.5, "loss": 1},
        {"step": 9007199254740992, "loss": 1},
    ]


@pytest.mark.parametrize(
    "argv, code, words",
    [
        (["10", "step=1"], 2, "'step' is the first argument"),
        (["1e300", "loss=1"], 2, "above 2**53"),
        (["-3", "loss=1"], 2, "below 0"),
        (["3", "=1"], 2, "give the metric's name"),
        (["3", "loss"], 2, "NAME=VALUE"),
        (["3", "loss=x"], 2, "could not convert"),
        ([], 2, "give a step"),
    ],
)
def test_the_reporting_module_answers_bad_arguments_with_exit_2_and_a_message(
    monkeypatch, tmp_path, capsys, argv, code, words
):
    from gpu_task_scheduler.reporting import main

    monkeypatch.setenv("GTS_METRICS_FILE", str(tmp_path / "m.jsonl"))
    assert main(argv) == code
    assert words in capsys.readouterr().err
    assert not (tmp_path / "m.jsonl").exists()


@pytest.mark.parametrize("told", ["GTS_PAUSE_FILE", "GTS_PRUNE_FILE"])
def test_the_reporting_module_exits_3_when_the_run_is_paused_or_stopped_early(monkeypatch, tmp_path, capsys, told):
    from gpu_task_scheduler import reporting

    monkeypatch.setenv("GTS_METRICS_FILE", str(tmp_path / "m.jsonl"))
    monkeypatch.setenv(told, str(tmp_path / "told"))
    monkeypatch.setattr(reporting, "_paused", None)
    monkeypatch.setattr(reporting, "_pruned", None)
    assert reporting.main(["1", "loss=0.5"]) == 0  # not told yet: go on
    (tmp_path / "told").write_text("at rung 1")
    assert reporting.main(["2", "loss=0.25"]) == 3
    assert ("paused" if told == "GTS_PAUSE_FILE" else "pruned") in capsys.readouterr().err
    assert reporting.STOP_EXIT == 3


BAD_LINES = {
    "not JSON": b"loss: 0.3",
    "not an object": b"[1, 2]",
    "no step": b'{"loss": 0.3}',
    "a step that is not a number": b'{"step": "3", "loss": 0.3}',
    "a value that is not a number": b'{"step": 3, "loss": "low"}',
    "NaN": b'{"step": 3, "loss": NaN}',
    "a step going back": b'{"step": 1, "loss": 0.3}',
    "a step above 2**53": b'{"step": 1e300, "loss": 0.3}',
    "a step below 0": b'{"step": -3, "loss": 0.3}',
    "a megabyte line": b'{"step": 3, "pad": "' + b"x" * (1 << 20) + b'"}',
}


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_bad_lines_are_skipped_and_the_first_is_named(tmp_path, kind):
    path = tmp_path / "metrics.jsonl"
    good = [b'{"step": 1, "loss": 0.9}', b'{"step": 2, "loss": 0.5}']
    path.write_bytes(b"\n".join([*good, BAD_LINES[kind], b'{"step": 4, "loss": 0.1}']) + b"\n")
    reader = read_all(str(path))
    assert reader.summary["loss"] == {"last": 0.1, "step": 4, "min": 0.1, "max": 0.9}
    assert reader.lines == 3 and reader.problem is not None and "line 3" in reader.problem, reader.problem


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_metrics_file_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    path = tmp_path / "metrics.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        (tmp_path / "elsewhere").write_text('{"step": 1, "secret": 1}\n')
        path.symlink_to(tmp_path / "elsewhere")
    reader = read_all(str(path))
    assert reader.summary == {} and "not read" in reader.problem
    assert latest(str(path)) is None


def test_the_reader_takes_what_is_new_and_waits_for_a_line_to_end(tmp_path):
    path = tmp_path / "metrics.jsonl"
    reader = MetricsReader(str(path))
    assert reader.read() == 0  # no file yet
    with open(path, "ab") as handle:
        handle.write(b'{"step": 1, "loss": 0.9}\n{"step": 2, "lo')
        handle.flush()
        assert reader.read() == 1 and reader.summary["loss"]["step"] == 1
        handle.write(b'ss": 0.4}\n')
        handle.flush()
        assert reader.read() == 1 and reader.summary["loss"] == {"last": 0.4, "step": 2, "min": 0.4, "max": 0.9}
    assert reader.problem is None
    assert latest(str(path)) == (2, {"loss": 0.4})


def test_a_line_longer_than_a_read_is_skipped_without_filling_memory(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "pad": "' + b"x" * (3 * MAX_LINE) + b'"}\n{"step": 2, "loss": 1}\n')
    reader = MetricsReader(str(path))
    while reader.offset < path.stat().st_size:  # small reads: the long line never sits whole in memory
        reader.read(limit=MAX_LINE // 2)
        assert len(reader._partial) <= MAX_LINE
    assert reader.summary == {"loss": {"last": 1, "step": 2, "min": 1, "max": 1}} and "over 64 KiB" in reader.problem


def test_a_run_writing_junk_metrics_gets_one_warning_and_succeeds(in_tmp):
    junk = (  # a template's braces are doubled
        'for i in 1 2 3; do echo "not json $i" >> "$GTS_METRICS_FILE"; done; '
        'echo \'{{"step": 1, "x": 2}}\' >> "$GTS_METRICS_FILE"'
    )
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": "r", "scheduler_log_file_path": "log.txt"},
        "command": junk,
        "shell": True,
        "test_config": [{"a": [1]}],
    }
    (in_tmp / "s.json").write_text(json.dumps(config))
    result = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "run", "s.json", "--plain"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("reported metrics the scheduler skips") == 1
    assert "line 1 is skipped: it is not JSON" in result.stderr
    assert json.loads(ledger_rows(in_tmp / "r")["a-1,"]["metrics"])["x"]["last"] == 2


def test_curves_are_a_row_per_run_and_step_and_the_plot_draws_them(in_tmp, capsys):
    pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    from gpu_task_scheduler.results import curves

    root = in_tmp / "r"
    config = make_config(root, [{"lr": [0.1, 0.3, 0.5, 0.9], "steps": [5]}])
    assert GPUTaskScheduler(config, tasks.ReportingTask).start().ok
    frame = curves(str(root))
    assert list(frame.columns) == ["name", "lr", "steps", "status", "step", "loss", "acc"]
    assert len(frame) == 20 and sorted(frame["step"].unique()) == [1, 2, 3, 4, 5]
    last = frame[frame["step"] == 5].set_index("lr")["loss"]
    assert last[0.5] == pytest.approx(0.5**5) and last[0.9] < last[0.1]
    assert gts(["plot", str(root), "--curves", "loss", "--by", "lr", "-o", str(in_tmp / "curves.png")]) == 0
    assert (in_tmp / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert gts(["plot", str(root), "--curves", "los", "-o", str(in_tmp / "x.png")]) == 2
    assert "no run reported 'los' as it trained; did you mean 'loss'? Reported: acc, loss" in capsys.readouterr().err
    assert gts(["plot", str(root), "--curves", "loss", "--by", "l", "-o", str(in_tmp / "x.png")]) != 0
    assert "no parameter 'l'" in capsys.readouterr().err


def test_the_curves_of_a_search_get_a_colour_bar_and_a_grids_a_legend_in_order(in_tmp, monkeypatch):
    """``gts plot --curves M --by lr``: 20 values of lr (a search) are a colour bar, log-scaled where
    they span decades (which colour is which lr could not be read: no legend, no bar); 4 values (a
    grid) are a legend, each value once, by size."""
    pytest.importorskip("matplotlib")
    from gpu_task_scheduler.reports import plots

    drawn = []
    monkeypatch.setattr(plots, "_save", lambda figure, output: drawn.append(figure))
    search = [round(0.9 * 0.6**index, 8) for index in range(20)]  # 0.9 down to 5e-5
    for root, rates in (("search", search), ("grid", [0.5, 0.1, 0.9, 0.3])):
        config = make_config(in_tmp / root, [{"lr": rates, "steps": [3]}], slots=("cpu", "cpu"))
        assert GPUTaskScheduler(config, tasks.ReportingTask).start().ok
        plots.plot_curves(str(in_tmp / root), "loss", "lr", str(in_tmp / f"{root}.png"))
    search_figure, grid_figure = drawn
    curves, bar = search_figure.axes  # the curves, and their colour bar
    assert curves.get_legend() is None and len(curves.get_lines()) == 20
    assert (
        bar.get_ylabel() == "lr" and bar.get_yscale() == "log" and bar.get_ylim() == pytest.approx((min(search), 0.9))
    )
    search_figure.canvas.draw()
    ticks = [label.get_text() for label in bar.get_yticklabels() if label.get_text()]
    assert "0.001" in ticks and not any("$" in tick for tick in ticks)  # plain numbers, no formulas
    (axes,) = grid_figure.axes
    assert [text.get_text() for text in axes.get_legend().get_texts()] == ["lr=0.1", "lr=0.3", "lr=0.5", "lr=0.9"]


def test_runs_over_seeds_are_one_mean_curve_with_its_95_percent_band():
    from gpu_task_scheduler.reports.plots import mean_curves

    runs = {  # lr 0.1 over seeds 1..3 (one cut short at step 1), lr 0.2 with one seed
        "a": [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}],
        "b": [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}],
        "c": [{"step": 1, "loss": 4.0}],
        "d": [{"step": 1, "loss": 5.0}],
    }
    params = {"a": {"lr": 0.1, "seed": 1}, "b": {"lr": 0.1, "seed": 2}, "c": {"lr": 0.1, "seed": 3}}
    params["d"] = {"lr": 0.2, "seed": 1}
    first, second = mean_curves(runs, params, "loss", "seed")
    assert first["params"] == {"lr": 0.1} and first["runs"] == 3 and first["steps"] == [1, 2]
    assert first["mean"] == [3.0, 1.5] and first["n"] == [3, 2]
    # step 1: 2, 3, 4 (std 1, t(0.975, 2) = 4.303); step 2: 1, 2 (std 0.7071, t(0.975, 1) = 12.706)
    assert first["high"][0] - 3.0 == pytest.approx(4.303 / 3**0.5)
    assert first["low"][1] == pytest.approx(1.5 - 12.706 * 0.5**0.5 / 2**0.5)
    assert second == {
        "params": {"lr": 0.2},
        "runs": 1,
        "steps": [1],
        "mean": [5.0],
        "low": [5.0],
        "high": [5.0],
        "n": [1],
    }


def test_gts_plot_draws_the_mean_curves_over_seeds(in_tmp, capsys):
    pytest.importorskip("matplotlib")
    root = in_tmp / "r"
    config = make_config(root, [{"lr": [0.1, 0.5], "seed": [1, 2], "steps": [4]}])
    assert GPUTaskScheduler(config, tasks.ReportingTask).start().ok
    out = in_tmp / "seeds.png"
    assert gts(["plot", str(root), "--curves", "loss", "--by", "lr", "--over", "seed", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert gts(["plot", str(root), "--curves", "loss", "--over", "sed", "-o", str(out)]) == 2
    assert "the runs have no parameter 'sed' to average over; did you mean 'seed'?" in capsys.readouterr().err
    assert gts(["plot", str(root), "--timeline", "--over", "seed", "-o", str(out)]) == 2
    assert "--over PARAMETER goes with --curves NAME" in capsys.readouterr().err


# --- curves for a chart: bounded whatever the run wrote ----------------------------------------


def _metrics_file(path, steps, *, junk_every=0, long_every=0):
    with open(path, "wb") as handle:
        for step in steps:
            if junk_every and step % junk_every == 0 and step >= 2:  # and a step that goes back
                handle.write(b"not json\n" + json.dumps({"step": step - 2, "loss": 9.0}).encode() + b"\n")
            extra = {"pad": "x" * 20_000} if long_every and step % long_every == 0 else {}
            handle.write(json.dumps({"step": step, "loss": 1.0 / (step + 1), **extra}).encode() + b"\n")
    return str(path)


def test_a_small_curve_is_read_whole(tmp_path):
    path = _metrics_file(tmp_path / "m.jsonl", range(10), junk_every=4)
    points = sample_curve(path)
    assert [step for step, _ in points] == list(range(10))  # junk and steps going back skipped
    assert points[-1][1]["loss"] == pytest.approx(0.1)


@pytest.mark.parametrize("whole", [1 << 20, 4096])  # read whole then thinned; sampled at places
@pytest.mark.parametrize("long_every", [0, 7])  # lines longer than a sampling window
def test_a_long_curve_is_thinned_evenly_and_keeps_its_last_point(tmp_path, whole, long_every):
    path = _metrics_file(tmp_path / "m.jsonl", range(20_000), junk_every=13, long_every=long_every * 50)
    points = sample_curve(path, most=200, whole=whole)
    steps = [step for step, _ in points]
    assert 100 <= len(points) <= 200 and steps == sorted(steps)
    assert steps[0] < 200 and steps[-1] == 19_999  # from its start to its very end
    assert max(b - a for a, b in itertools.pairwise(steps)) < 20_000 / 50  # no stretch left out
    assert all(values["loss"] == pytest.approx(1.0 / (step + 1)) for step, values in points)


def test_a_curve_of_a_link_or_a_fifo_is_empty_at_once(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(_metrics_file(tmp_path / "m.jsonl", range(3)))
    assert sample_curve(str(tmp_path / "fifo")) == [] and sample_curve(str(tmp_path / "link")) == []
    assert sample_curve(str(tmp_path / "missing")) == []


CHATTY = """
import os, sys, time
role, flag, lines = sys.argv[1], sys.argv[2], int(sys.argv[3])
if role == "chatty":  # a whole curve at once, then it ends
    with open(os.environ["GTS_METRICS_FILE"], "w") as handle:
        for start in range(0, lines, 50_000):
            handle.write("".join(f'{{"step": {s}, "loss": {1 / (s + 1)!r}}}\\n' for s in range(start, start + 50_000)))
    open(flag, "w").close()
else:  # ends 0.3 s after the chatty run did
    while not os.path.exists(flag):
        time.sleep(0.01)
    time.sleep(0.3)
"""


def test_a_chatty_run_neither_holds_up_the_others_ends_nor_lengthens_their_durations(in_tmp):
    """A run that wrote 500,000 lines at once: reading them for its summary takes seconds, off the
    loop's thread, so the run that ends 0.3 s later is recorded then, with its own duration."""
    (in_tmp / "chatty.py").write_text(CHATTY)
    config = make_config(in_tmp / "r", [{"role": ["chatty", "quiet"]}], slots=("cpu", "cpu"))
    config["command"] = [sys.executable, str(in_tmp / "chatty.py"), "{role}", str(in_tmp / "flag"), "500000"]
    summary = GPUTaskScheduler(config).start()
    assert summary.ok and len(summary.succeeded) == 2
    rows = ledger_rows(in_tmp / "r")
    quiet, chatty = rows["role-quiet,"], rows["role-chatty,"]
    chatty_done = os.stat(in_tmp / "flag").st_mtime  # the chatty run's last act
    assert quiet["ended_at"] - chatty_done < 0.3 + 0.7  # its 0.3 s and its exit, not the others' lines
    assert quiet["ended_at"] < chatty["ended_at"]  # recorded while the chatty run's lines were read
    summary_of = json.loads(chatty["metrics"])["loss"]
    assert summary_of["step"] == 499_999 and summary_of["max"] == 1.0


def test_a_steps_time_is_a_plausible_one_and_a_later_attempts(tmp_path):
    """When each step was reported (what the exports give the trackers): a line's @time of 0, a
    negative one, 1e-300 (1970) or one far ahead (the year 5138) is no time; a step an attempt
    reported again has the later attempt's time."""
    from gpu_task_scheduler.records.metrics import run_times
    from gpu_task_scheduler.records.paths import RunPaths

    paths = RunPaths(str(tmp_path), None)
    os.makedirs(paths.old_logs)
    now = 1764432000.0

    def lines(*records):
        return "".join(json.dumps(record) + "\n" for record in records)

    with open(os.path.join(paths.old_logs, "attempt-1-metrics.jsonl"), "w") as handle:
        handle.write(lines({"step": 1, "loss": 1.0, "@time": now}, {"step": 2, "loss": 0.9, "@time": now + 1}))
    os.makedirs(os.path.dirname(paths.metrics), exist_ok=True)
    with open(paths.metrics, "w") as handle:
        handle.write(
            lines(
                {"step": 2, "loss": 0.8, "@time": now + 50},  # again, by the second attempt
                {"step": 3, "loss": 0.7, "@time": 0},
                {"step": 4, "loss": 0.6, "@time": -5},
                {"step": 5, "loss": 0.5, "@time": 1e-300},
                {"step": 6, "loss": 0.4, "@time": 99999999999.9},
                {"step": 7, "loss": 0.3, "@time": now + 60},
            )
        )
    assert run_times(paths) == {1: now, 2: now + 50, 7: now + 60}
