"""Early stopping: the rules as decision tables, their config, Pruned, and sweeps that prune."""

import json
import os
import sqlite3
import subprocess
import sys
import time

import gts_test_tasks as tasks
import pytest
from helpers import journal_lines, ledger_rows, make_config

from gpu_task_scheduler import ConfigError, GPUTaskScheduler, Pruned, RunStatus, report
from gpu_task_scheduler.records.ledger import Ledger
from gpu_task_scheduler.records.paths import RootPaths
from gpu_task_scheduler.records.prior import settle_running
from gpu_task_scheduler.tuning.stopping import Asha, Curve, Median, parse_early_stop, quantile

ASHA = {"method": "asha", "metric": "loss", "mode": "min", "min_step": 1, "max_step": 27, "reduction_factor": 3}


# --- the rules, as tables ------------------------------------------------------------


def test_asha_rungs_are_min_step_times_powers_of_the_factor_below_max_step():
    assert parse_early_stop(ASHA).rungs == [1, 3, 9]
    assert parse_early_stop({**ASHA, "min_step": 2, "max_step": 100, "reduction_factor": 4}).rungs == [2, 8, 32]
    assert parse_early_stop({**ASHA, "max_step": 9}).rungs == [1, 3]  # max_step is no rung


@pytest.mark.parametrize(
    "step, recorded, rung",
    [
        (0.5, {}, None),  # before the first rung
        (1, {}, 1),
        (2, {1: 0.5}, None),  # between rungs, the lower one recorded
        (3, {1: 0.5}, 3),
        (3, {1: 0.5, 3: 0.4}, None),  # a rung is recorded once
        (10, {}, 9),  # a run that reports sparsely is recorded at the highest rung it passed
        (27, {}, None),  # at max_step: never judged
        (40, {}, None),
    ],
)
def test_asha_records_a_run_once_at_the_highest_rung_it_passed(step, recorded, rung):
    assert parse_early_stop(ASHA).rung_for(step, recorded) == rung


@pytest.mark.parametrize(
    "mode, value, others, stop, cutoff",
    [
        ("min", 0.9, [], False, None),  # the first at a rung always goes on
        ("min", 0.2, [0.1, 0.3, 0.5], False, 0.2333),  # within the best third
        ("min", 0.25, [0.1, 0.3, 0.5], True, 0.2333),
        ("min", 0.5, [0.5, 0.5], False, 0.5),  # a tie with the cutoff goes on
        ("min", 0.6, [0.5], True, 0.5),
        ("max", 0.45, [0.1, 0.3, 0.5], False, 0.3667),  # higher is better: the top third
        ("max", 0.35, [0.1, 0.3, 0.5], True, 0.3667),
    ],
)
def test_asha_keeps_a_run_only_within_the_best_share_of_its_rung(mode, value, others, stop, cutoff):
    rule = parse_early_stop({**ASHA, "mode": mode})
    verdict = rule.judge(3, 3.5, value, others)
    assert verdict.stop is stop and verdict.rung == 3 and verdict.step == 3.5
    if stop:
        assert verdict.cause == f"loss {value:.4g}, rung cutoff {cutoff:.4g}"


@pytest.mark.parametrize(
    "mode, value, best, stop",
    [
        ("min", 0.9, 0.3, False),  # a noisy loss whose latest report jumps up: its best beats the median
        ("min", 0.3, 0.9, True),  # its best is worse than the median, whatever it reports now
        ("max", 0.2, 0.8, False),  # an accuracy whose latest report dips
        ("max", 0.8, 0.2, True),
    ],
)
def test_the_median_rule_judges_a_runs_best_value_not_its_latest(mode, value, best, stop):
    rule = parse_early_stop({"method": "median", "metric": "m", "mode": mode, "min_step": 1, "min_runs": 3})
    others = [_curve(rule, [(1, 0.5), (2, 0.5)])] * 3  # running averages 0.5 at step 2
    verdict = rule.judge(2, value, best, others)
    assert verdict.stop is stop and verdict.value == value
    if stop:
        assert verdict.cause.startswith(f"best m {best:.4g}, median of 3 runs 0.5")


@pytest.mark.parametrize("mode, points, best", [("min", [0.5, 0.2, 0.9], 0.2), ("max", [0.5, 0.8, 0.1], 0.8)])
def test_a_curve_keeps_its_best_value_by_the_rules_mode(mode, points, best):
    rule = parse_early_stop({"method": "median", "metric": "m", "mode": mode, "min_step": 1})
    assert _curve(rule, list(enumerate(points, start=1))).best == best


def _curve(rule, points):
    curve = Curve()
    for step, value in points:
        curve.add(step, value, rule)
    return curve


@pytest.mark.parametrize(
    "step, best, others, stop",
    [
        (1, 9.0, [[(1, 1.0)]] * 3, False),  # before min_step
        (2, 0.5, [[(1, 1.0), (2, 1.0)]] * 2, False),  # fewer than min_runs others got there
        (2, 0.5, [[(1, 1.0), (2, 0.0)]] * 3, False),  # running averages 0.5: a tie goes on
        (2, 0.6, [[(1, 1.0), (2, 0.0)]] * 3, True),
        (2, 0.6, [[(1, 1.0)]] * 3, False),  # the others have not reached step 2
        (3, 0.6, [[(1, 0.2), (4, 9.0)]] * 3, True),  # the average up to step 3 counts (0.2), not
        (3, 0.6, [[(1, 0.8), (4, 0.0)]] * 3, False),  # what came after it
        (10, 9.0, [[(9, 0.1), (10, 0.1)]] * 3, False),  # at max_step: never stopped
    ],
)
def test_median_rule_stops_a_run_worse_than_the_median_running_average(step, best, others, stop):
    rule = parse_early_stop(
        {"method": "median", "metric": "loss", "mode": "min", "min_step": 2, "max_step": 10, "min_runs": 3}
    )
    curves = [_curve(rule, points) for points in others]
    verdict = rule.judge(step, best, best, curves)
    assert verdict.stop is stop
    if stop:
        assert verdict.cause.startswith(f"best loss {best:.4g}, median of 3 runs")


def test_quantile_interpolates_between_ranks():
    assert quantile([3.0], 0.3) == 3.0
    assert quantile([0.0, 10.0], 0.25) == 2.5
    assert quantile([5.0, 1.0, 3.0], 0.5) == 3.0


@pytest.mark.parametrize(
    "raw, words",
    [
        ("asha", "must be a dict"),
        ({"metric": "loss", "mode": "min"}, "method must be one of asha, median"),
        ({**ASHA, "metirc": "loss"}, "unknown key 'metirc' in early_stop (method asha); did you mean 'metric'?"),
        ({**ASHA, "min_runs": 3}, "unknown key 'min_runs'"),
        ({**ASHA, "metric": ""}, "metric must name a reported metric"),
        ({**ASHA, "metric": "step"}, "metric must name a reported metric"),
        ({**ASHA, "mode": "minimize"}, "mode must be min (lower is better) or max"),
        ({k: v for k, v in ASHA.items() if k != "mode"}, "mode must be min"),
        ({**ASHA, "min_step": 0}, "min_step must be a number above 0"),
        ({**ASHA, "min_step": True}, "min_step must be a number above 0"),
        ({k: v for k, v in ASHA.items() if k != "max_step"}, "asha needs max_step"),
        ({**ASHA, "max_step": 1}, "max_step must be a number above min_step"),
        ({**ASHA, "max_step": float("inf")}, "max_step must be a number above min_step"),
        ({**ASHA, "reduction_factor": 1}, "reduction_factor must be a number above 1"),
        # Rungs that barely grow looped forever (and overflowed GTS_RUNGS) after validation passed.
        ({**ASHA, "reduction_factor": 1.0000000000000002}, "gives more than 40 rungs"),
        ({**ASHA, "min_step": 5e-324}, "gives more than 40 rungs"),
        ({**ASHA, "min_step": 5e-324, "reduction_factor": 1.2}, "does not grow the rungs"),
        ({**ASHA, "min_step": 1, "max_step": 1e30, "reduction_factor": 2}, "raise reduction_factor"),
        ({"method": "median", "metric": "loss", "mode": "min", "min_runs": 0}, "min_runs must be a whole number"),
        ({"method": "median", "metric": "loss", "mode": "min", "reduction_factor": 2}, "unknown key"),
    ],
)
def test_a_bad_early_stop_is_refused_with_what_to_write(tmp_path, raw, words):
    config = make_config(tmp_path / "r", [{"a": [1]}])
    config["early_stop"] = raw
    with pytest.raises(ConfigError) as error:
        GPUTaskScheduler(config, tasks.CurveTask)
    assert words in str(error.value)
    assert not (tmp_path / "r").exists()


def test_early_stop_with_stages_belongs_to_a_stage(tmp_path):
    config = make_config(tmp_path / "r", None)
    del config["test_config"]
    config["stages"] = [{"name": "train", "test_config": [{"a": [1]}], "early_stop": ASHA}]
    scheduler = GPUTaskScheduler(config, tasks.CurveTask)
    assert isinstance(scheduler.sweep.stopping["train"], Asha)
    config["early_stop"] = ASHA
    with pytest.raises(ConfigError, match="give it in the stage whose runs it may stop"):
        GPUTaskScheduler(config, tasks.CurveTask)


def test_median_needs_no_max_step():
    rule = parse_early_stop({"method": "median", "metric": "acc", "mode": "max"})
    assert isinstance(rule, Median) and rule.max_step is None and rule.min_runs == 3 and rule.min_step == 1


# --- Pruned, in the run's process -------------------------------------------------


def test_pruned_is_raised_by_report_and_not_swallowed_by_except_exception(tmp_path, monkeypatch):
    metrics, marker = tmp_path / "metrics.jsonl", tmp_path / "pruned"
    monkeypatch.setenv("GTS_METRICS_FILE", str(metrics))
    monkeypatch.setenv("GTS_PRUNE_FILE", str(marker))
    report(1, loss=0.5)  # no marker: nothing happens
    marker.write_text("pruned at step 1: loss 0.5, rung cutoff 0.2")
    caught = None
    try:
        try:
            report(2, loss=0.4)
        except Exception:  # what a training loop often has
            caught = "Exception"
    except Pruned as error:
        caught = str(error)
    assert caught == "pruned at step 1: loss 0.5, rung cutoff 0.2"
    assert issubclass(Pruned, BaseException) and not issubclass(Pruned, Exception)
    assert metrics.read_text().count("\n") == 2  # the step that raised was recorded first


def test_each_report_says_when_it_was_made_and_no_metric_may_take_that_name(tmp_path, monkeypatch):
    """A line's ``@time`` is when ``report()`` wrote it (the exports give it to the trackers); a
    metric named so is refused, in ``report()`` and in the command-line form (exit 2)."""
    metrics = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("GTS_METRICS_FILE", str(metrics))
    before = time.time()
    report(1, loss=0.5)
    line = json.loads(metrics.read_text())
    assert line["step"] == 1 and line["loss"] == 0.5 and before - 0.001 <= line["@time"] <= time.time() + 0.001
    with pytest.raises(ValueError, match="'@time' is when a step was reported"):
        report(2, **{"@time": 1.0})
    from gpu_task_scheduler.reporting import main

    assert main(["3", "@time=1"]) == 2
    assert metrics.read_text().count("\n") == 1  # neither was written


# --- sweeps that prune ----------------------------------------------------------------

CURVES = [{"start": [1.0], "floor": [0.1, 0.3, 0.5], "decay": [0.5, 0.8, 0.95]}]  # best: floor 0.1, decay 0.5


def _curve_sweep(root, *, slots=("cpu",), early_stop=ASHA, **global_config):
    config = make_config(
        root,
        CURVES,
        slots=slots,
        global_config={"steps": 27, "pause": 0.01, "journal": str(root) + ".journal", **global_config},
        grace_period=5,
    )
    config["early_stop"] = early_stop
    return config


def test_an_asha_sweep_prunes_runs_exits_0_and_runs_nothing_again(in_tmp):
    root = in_tmp / "r"
    config = _curve_sweep(root)
    summary = GPUTaskScheduler(config, tasks.CurveTask).start()
    assert summary.exit_code == 0 and summary.ok
    assert len(summary.pruned) >= 6 and summary.to_dict()["counts"]["pruned"] == len(summary.pruned)
    best = "decay-0.5,floor-0.1,start-1.0,"
    assert summary.outcomes[best].status is RunStatus.SUCCEEDED
    lines = journal_lines(str(root) + ".journal")
    assert not any(line.startswith("swallowed") for line in lines)
    rows = ledger_rows(root)
    for outcome in summary.pruned:
        assert f"pruned {outcome.name}" in lines  # Pruned reached the task, which could save
        assert rows[outcome.name]["status"] == "pruned"
        assert rows[outcome.name]["cause"].startswith("pruned at step ")
        assert "rung cutoff" in rows[outcome.name]["cause"]
    steps = sum(1 for line in lines if line.startswith("step"))
    assert steps <= 0.6 * 27 * 9
    again = GPUTaskScheduler(config, tasks.CurveTask).start()
    assert again.outcomes == {} and len(again.skipped) == 9
    assert journal_lines(str(root) + ".journal") == lines


def test_a_task_that_catches_pruned_and_returns_is_pruned_with_its_result(in_tmp):
    root = in_tmp / "r"
    config = _curve_sweep(root, catch=True)
    summary = GPUTaskScheduler(config, tasks.CurveTask).start()
    assert summary.pruned and summary.exit_code == 0
    rows = ledger_rows(root)
    for outcome in summary.pruned:
        assert outcome.cause.startswith("pruned at step ")
        assert json.loads(rows[outcome.name]["result"])["saved_at"] >= 1


IGNORES_TERM = (
    "trap '' TERM; i=1; while [ $i -le 9 ]; do "
    'echo "{{\\"step\\": $i, \\"loss\\": $0}}" >> "$GTS_METRICS_FILE"; i=$((i+1)); sleep 0.05; done; sleep 600'
)


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_period_and_is_pruned(in_tmp):
    root = in_tmp / "r"
    config = make_config(root, [{"loss": [0.1, 0.9]}], grace_period=0.5, max_retries=2)
    config["command"] = ["sh", "-c", IGNORES_TERM.replace("sleep 600", "[ $0 = 0.1 ] || sleep 600"), "{loss}"]
    config["early_stop"] = {**ASHA, "max_step": 9}
    summary = GPUTaskScheduler(config, None).start()
    assert summary.exit_code == 0
    assert summary.outcomes["loss-0.1,"].status is RunStatus.SUCCEEDED
    pruned = summary.outcomes["loss-0.9,"]
    assert pruned.status is RunStatus.PRUNED and pruned.attempts == 1  # not failed, never retried
    assert pruned.signal == "SIGKILL" and pruned.cause == "pruned at step 1: loss 0.9, rung cutoff 0.1"
    log = (root / "scheduler.log").read_text()
    assert "loss-0.9, did not stop within 0.5s of SIGTERM; sending SIGKILL" in log


def _retry(root, *args):
    env = {**os.environ, "PYTHONPATH": os.path.dirname(tasks.__file__)}
    return subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "retry", str(root), *args, "--plain"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_retry_pruned_runs_the_pruned_runs_to_their_end(in_tmp):
    root = in_tmp / "r"
    config = _curve_sweep(root)
    summary = GPUTaskScheduler(config, tasks.CurveTask).start()
    pruned = sorted(o.name for o in summary.pruned)
    assert pruned
    done = _retry(root, "--pruned")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"running {len(pruned)} run(s) again" in done.stdout
    rows = ledger_rows(root)
    assert all(row["status"] == "succeeded" for row in rows.values())
    lines = journal_lines(str(root) + ".journal")
    assert all(lines.count(f"end {name}") == 1 for name in pruned)
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:  # their old verdicts went with the new start
        assert not db.execute("SELECT * FROM verdicts WHERE stop = 1").fetchall()
    assert _retry(root).returncode != 0  # says which runs to retry


def test_a_pruned_run_blocks_the_runs_that_depend_on_it(in_tmp):
    root = in_tmp / "r"
    config = _curve_sweep(root)
    del config["test_config"], config["early_stop"]
    config["stages"] = [
        {"name": "train", "test_config": CURVES, "early_stop": ASHA},
        {"name": "eval", "after": "train", "test_config": CURVES, "global_config": {"steps": 1}},
    ]
    summary = GPUTaskScheduler(config, tasks.CurveTask).start()
    assert summary.pruned and len(summary.blocked) == len(summary.pruned)
    for outcome in summary.pruned:
        blocked = summary.outcomes[outcome.name.replace("train.", "eval.", 1)]
        assert blocked.status is RunStatus.BLOCKED
        assert f"{outcome.name} was stopped early (pruned at step" in blocked.cause
    assert not any(o.status is RunStatus.PRUNED for o in summary.outcomes.values() if o.name.startswith("eval."))
    again = GPUTaskScheduler(config, tasks.CurveTask).start()  # the pruned runs are skipped, and still block
    assert {o.name for o in again.blocked} == {o.name for o in summary.blocked} and not again.succeeded


def test_a_run_the_rule_stopped_before_its_scheduler_was_killed_is_settled_pruned(in_tmp):
    root = in_tmp / "r"
    with Ledger(RootPaths(str(root))) as ledger:
        for name in ("a", "b"):
            ledger.mark_running(
                name=name, run_index=0, config_hash="h", slot="cpu0", token="t", work_dir=str(root / name)
            )
        ledger.record_verdict("a", rung=1, step=1, value=0.5, stop=False, cause="")
        ledger.record_verdict("a", rung=3, step=3, value=0.9, stop=True, cause="loss 0.9, rung cutoff 0.2")
        ledger.record_verdict("b", rung=1, step=1, value=0.1, stop=False, cause="")
        settle_running(ledger)
        assert ledger.get("a").status is RunStatus.PRUNED
        assert ledger.get("a").cause == "pruned at step 3: loss 0.9, rung cutoff 0.2"
        assert ledger.get("b").status is RunStatus.INTERRUPTED
        # b resumes: its rung is kept (it is not judged there twice); a, started again, is judged afresh
        for name in ("a", "b"):
            ledger.mark_running(
                name=name, run_index=0, config_hash="h", slot="cpu0", token="u", work_dir=str(root / name)
            )
        assert [v[:2] for v in ledger.verdicts()] == [("b", 1.0)]


def test_the_curves_of_pruned_runs_end_where_they_stopped_and_are_plotted(in_tmp):
    pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    from gpu_task_scheduler.cli.main import main as gts
    from gpu_task_scheduler.results import curves

    root = in_tmp / "r"
    assert GPUTaskScheduler(_curve_sweep(root), tasks.CurveTask).start().ok
    frame = curves(str(root))
    last_step = frame.groupby("name")["step"].max()
    status = frame.groupby("name")["status"].first()
    assert set(status) == {"succeeded", "pruned"}
    assert (last_step[status == "pruned"] < 27).all() and (last_step[status == "succeeded"] == 27).all()
    assert gts(["plot", str(root), "--curves", "loss", "--by", "decay", "-o", str(in_tmp / "c.png")]) == 0
    assert (in_tmp / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_stopped_at_a_rung_trains_no_further_step(in_tmp):
    root = in_tmp / "r"
    config = _curve_sweep(root)
    config["test_config"] = [{"start": [0.5, 1.0], "floor": [0.1], "decay": [0.8]}]
    summary = GPUTaskScheduler(config, tasks.CurveTask).start()
    worse = "decay-0.8,floor-0.1,start-1.0,"
    assert summary.outcomes[worse].status is RunStatus.PRUNED
    lines = journal_lines(str(root) + ".journal")
    # report() at rung 1 waited for the verdict: the run never began its second step
    assert [line for line in lines if line.endswith(f" {worse}")] == [
        f"start {worse}",
        f"step1 {worse}",
        f"pruned {worse}",
    ]


def test_a_resumed_run_is_not_judged_again_at_a_rung_it_passed(in_tmp):
    from gpu_task_scheduler.reporting import RUNG_WAIT

    root = in_tmp / "r"
    config = _curve_sweep(root)
    config["test_config"] = [{"start": [0.5, 1.0], "floor": [0.1], "decay": [0.8]}]
    GPUTaskScheduler(config, tasks.CurveTask).start()
    run = "decay-0.8,floor-0.1,start-0.5,"
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:  # as if its sweep had been stopped at step 2
        db.execute("UPDATE runs SET status = 'interrupted' WHERE name = ?", (run,))
        (root / run / ".gts" / "outcome.json").unlink()  # a stopped attempt records no outcome
        before = db.execute("SELECT rung, value FROM verdicts WHERE name = ? ORDER BY rung", (run,)).fetchall()
    summary = GPUTaskScheduler(config, tasks.CurveTask).start()
    assert summary.outcomes[run].status is RunStatus.SUCCEEDED
    assert summary.outcomes[run].duration < RUNG_WAIT  # told at once that it had passed its rungs
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:
        after = db.execute("SELECT rung, value FROM verdicts WHERE name = ? ORDER BY rung", (run,)).fetchall()
    assert after == before
    assert [rung for rung, _ in after] == [1.0, 3.0, 9.0]
    assert [value for _, value in after] == pytest.approx([0.1 + 0.4 * 0.8**step for step in (1, 3, 9)])


def test_a_median_sweep_stops_runs_behind_the_median_of_the_others(in_tmp):
    root = in_tmp / "r"
    rule = {"method": "median", "metric": "loss", "mode": "min", "min_step": 3, "min_runs": 2}
    summary = GPUTaskScheduler(_curve_sweep(root, early_stop=rule), tasks.CurveTask).start()
    assert summary.ok and summary.pruned
    assert summary.outcomes["decay-0.5,floor-0.1,start-1.0,"].status is RunStatus.SUCCEEDED  # the best
    for outcome in summary.pruned:
        assert outcome.cause.startswith("pruned at step ") and ", median of " in outcome.cause
    assert {o.name for o in summary.pruned} == {
        name for name, row in ledger_rows(root).items() if row["status"] == "pruned"
    }


@pytest.mark.parametrize(
    "metric, words",
    [
        ("los", "has reported 'loss' but not 'los', the metric early_stop judges by; did you mean 'loss'?"),
        ("val_acc", "ended having reported 'loss' but not 'val_acc', the metric early_stop judges by."),
    ],
)
def test_an_early_stop_metric_no_run_reports_is_warned_about_once(in_tmp, caplog, metric, words):
    """A misspelt metric is said while the first run trains ("has reported": its close spelling is
    reported); any other, at that run's end. Either way once, and the sweep runs on unjudged."""
    root = in_tmp / "r"
    config = _curve_sweep(root, early_stop={**ASHA, "metric": metric})
    config["test_config"] = [{**CURVES[0], "floor": [0.1], "decay": [0.5, 0.8]}]
    with caplog.at_level("INFO", logger="gpu_task_scheduler"):
        summary = GPUTaskScheduler(config, tasks.CurveTask).start()
    assert summary.ok and not summary.pruned
    warnings = [r.getMessage() for r in caplog.records if "the metric early_stop judges by" in r.getMessage()]
    assert len(warnings) == 1 and words in warnings[0], warnings
    assert "A run that does not report it is never stopped early" in warnings[0]


def test_asha_decides_after_a_restart_as_the_start_before_it_would_have(in_tmp):
    """The values earlier starts recorded at each rung are read back at start: a run first judged
    in a later start is measured against them, not waved through as the first at its rungs."""
    root = in_tmp / "r"
    good = {"floor": [0.1], "start": [1.0], "decay": [0.5], "seed": [1, 2, 3]}  # one curve: none is pruned
    config = _curve_sweep(root, steps=9, early_stop={**ASHA, "max_step": 9})
    config["test_config"] = [good]
    first = GPUTaskScheduler(config, tasks.CurveTask).start()
    assert len(first.succeeded) == 3 and not first.pruned
    config["test_config"] = [good, {"floor": [0.9], "start": [2.0], "decay": [0.9], "seed": [4]}]
    second = GPUTaskScheduler(config, tasks.CurveTask).start()
    bad = "decay-0.9,floor-0.9,seed-4,start-2.0,"
    assert list(second.outcomes) == [bad] and second.outcomes[bad].status is RunStatus.PRUNED
    assert ledger_rows(root)[bad]["cause"] == "pruned at step 1: loss 1.89, rung cutoff 0.55"


def test_the_stop_verdict_is_on_disk_before_the_run_is_told(in_tmp, monkeypatch):
    """A kill -9 between the two must not leave a run the rule stopped to be settled interrupted
    and run again: when the run is told (its pruned file written), the ledger already holds the
    verdict, as another connection sees it."""
    import sqlite3

    from gpu_task_scheduler.engine import running

    root = in_tmp / "r"
    seen = []
    tell = running._tell

    def told(active, path, text):
        if path == active.paths.pruned:
            db = sqlite3.connect(root / ".gts" / "ledger.sqlite3")
            seen.append(db.execute("SELECT stop FROM verdicts WHERE name = ?", (active.spec.name,)).fetchall())
            db.close()
        return tell(active, path, text)

    monkeypatch.setattr(running, "_tell", told)
    summary = GPUTaskScheduler(_curve_sweep(root), tasks.CurveTask).start()
    assert summary.pruned and len(seen) == len(summary.pruned)
    assert all((1,) in rows for rows in seen)


def test_a_pruned_python_run_that_never_reports_again_gets_sigterm_then_sigkill(in_tmp):
    """Its next report() would raise Pruned; one that never comes costs it the grace period, then
    SIGTERM, then (ignored) another grace period and SIGKILL: pruned, never left running."""
    root = in_tmp / "r"
    config = make_config(
        root, [{"loss": [0.1]}, {"loss": [0.9], "stuck": [True]}], grace_period=0.5, global_config={"journal": "j"}
    )
    config["early_stop"] = {**ASHA, "max_step": 9}
    summary = GPUTaskScheduler(config, tasks.StuckAfterReportTask).start()
    stuck = summary.outcomes["loss-0.9,stuck-True,"]
    assert stuck.status is RunStatus.PRUNED and stuck.signal == "SIGKILL" and stuck.attempts == 1
    assert "sigterm loss-0.9,stuck-True," in journal_lines(in_tmp / "j")
    log = (root / "scheduler.log").read_text()
    assert "did not report again within 0.5s of being stopped early; sending SIGTERM" in log
    assert "did not stop within 0.5s of SIGTERM; sending SIGKILL" in log
    assert 1.0 <= stuck.duration < 1.0 + 5


LATE_REPORTER = """
import json, os, signal, sys, time
values, late = json.loads(sys.argv[1]), sys.argv[2] == "late"
path = os.environ["GTS_METRICS_FILE"]

def report(step, value):
    with open(path, "a") as handle:
        handle.write(json.dumps({"step": step, "loss": value}) + "\\n")

def stopped(signum, frame):
    if late:  # stopped at rung 1, it goes on reporting the best values at rung 3
        for step in range(2, 6):
            report(step, 0.0)
    sys.exit(0)

signal.signal(signal.SIGTERM, stopped)
for step, value in enumerate(values, start=1):
    report(step, value)
    time.sleep(0.1)
"""


def test_what_a_stopped_command_reports_in_its_grace_period_counts_for_nothing(in_tmp):
    """B is stopped at rung 1 and reports loss 0 at rung 3 on its way out. Counted, it would lower
    rung 3's cutoff and stop C (0.4), which is within the best third of what A (0.5) recorded."""
    (in_tmp / "late.py").write_text(LATE_REPORTER)
    root = in_tmp / "r"
    runs = {"a": ([0.6, 0.6, 0.5] + [0.5] * 6, "-"), "b": ([5.0] * 9, "late"), "c": ([0.6, 0.6, 0.4] + [0.4] * 6, "-")}
    blocks = [{"run": [name], "values": [json.dumps(v)], "late": [late]} for name, (v, late) in runs.items()]
    config = make_config(root, blocks, grace_period=5, ignored_keys_for_folder_name=["values", "late"])
    config["command"] = [sys.executable, str(in_tmp / "late.py"), "{values}", "{late}"]
    config["early_stop"] = {**ASHA, "max_step": 9}
    summary = GPUTaskScheduler(config, None).start()
    statuses = {name: outcome.status for name, outcome in summary.outcomes.items()}
    assert statuses == {"run-a,": RunStatus.SUCCEEDED, "run-b,": RunStatus.PRUNED, "run-c,": RunStatus.SUCCEEDED}
    rung3 = {name: value for name, rung, _s, value, _stop, _cause in _verdicts(root) if rung == 3}
    assert rung3 == {"run-a,": 0.5, "run-c,": 0.4}  # nothing of b's at rung 3


def _verdicts(root):
    import sqlite3

    db = sqlite3.connect(root / ".gts" / "ledger.sqlite3")
    try:
        return db.execute("SELECT name, rung, step, value, stop, cause FROM verdicts").fetchall()
    finally:
        db.close()


def test_a_dry_run_of_an_asha_grid_says_that_its_order_matters(in_tmp, capsys):
    """Until runs can pause at a rung, the first run to reach one always goes on."""
    from gpu_task_scheduler.cli.main import main as gts

    config = _curve_sweep(in_tmp / "r")
    config["task"] = "gts_test_tasks:CurveTask"
    (in_tmp / "s.json").write_text(json.dumps(config))
    assert gts(["run", str(in_tmp / "s.json"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "early_stop (asha): the first run to reach a rung always goes on" in out and "the order matters" in out
    config["early_stop"] = {"method": "median", "metric": "loss", "mode": "min", "min_step": 3}
    (in_tmp / "s.json").write_text(json.dumps(config))
    assert gts(["run", str(in_tmp / "s.json"), "--dry-run"]) == 0
    assert "the order matters" not in capsys.readouterr().out
