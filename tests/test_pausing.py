"""Runs that pause at a rung and resume from their checkpoints: the config of the pausing methods,
sweeps of Python tasks and commands that pause and are promoted, the paused state wherever runs
are shown, and kill -9 at any moment (tuning/trials.py decides; engine/pauses.py records)."""

import collections
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import types

import gts_test_tasks as tasks
import pytest
from conftest import marked_pids, wait_until
from helpers import ledger_rows, make_config, report_to_free
from test_process_control import finish, launch

from gpu_task_scheduler import ConfigError, GPUTaskScheduler, Paused, RunStatus
from gpu_task_scheduler.records.ledger.trials import paused_cause
from gpu_task_scheduler.tuning.base import PAUSE
from gpu_task_scheduler.tuning.methods import method_for
from gpu_task_scheduler.tuning.stopping import Asha, Pausing, parse_early_stop

ASHA = {"method": "asha", "metric": "loss", "mode": "min", "min_step": 1, "max_step": 27, "reduction_factor": 3}
PROMOTION = {**ASHA, "promotion": True}
HYPERBAND = {**ASHA, "method": "hyperband"}
CURVES = [{"start": [1.0], "floor": [0.1, 0.3, 0.5], "decay": [0.5, 0.8, 0.95]}]  # best: floor 0.1, decay 0.5
BEST = "decay-0.5,floor-0.1,start-1.0,"
# Two objectives (ResumingCurveTask with latency: 1 / decay): a fast learner is a slow model, and
# the runs of floor 0.1 make the front at every rung.
TWO = {"loss": "min", "latency": "min"}
MO_HYPERBAND = {key: value for key, value in HYPERBAND.items() if key not in ("metric", "mode")} | {"objectives": TWO}
MO_PROMOTION = {**MO_HYPERBAND, "method": "asha", "promotion": True}


# --- the config ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, kind, method",
    [
        (ASHA, Asha, None),
        ({**ASHA, "promotion": False}, Asha, None),
        (PROMOTION, Pausing, "asha"),
        (HYPERBAND, Pausing, "hyperband"),
    ],
)
def test_promotion_and_hyperband_are_pausing_methods_with_asha_keys(raw, kind, method):
    rule = parse_early_stop(raw)
    assert type(rule) is kind and rule.rungs == [1, 3, 9]
    if method is not None:
        assert rule.method == method and "pause at rungs" in rule.describe()


@pytest.mark.parametrize(
    "raw, words",
    [
        ({**ASHA, "promotion": "yes"}, "promotion must be true"),
        ({**HYPERBAND, "max_step": None}, "hyperband needs max_step"),
        ({**HYPERBAND, "promotion": True}, "unknown key 'promotion' in early_stop \\(method hyperband\\)"),
        ({**PROMOTION, "brackets": 2}, "unknown key 'brackets'"),
        ({**HYPERBAND, "min_runs": 3}, "unknown key 'min_runs'"),
        ({**HYPERBAND, "reduction_factor": 1}, "reduction_factor must be a number above 1"),
    ],
)
def test_a_bad_pausing_method_is_refused_with_what_to_write(raw, words):
    with pytest.raises(ConfigError, match=words):
        parse_early_stop(raw)


@pytest.mark.parametrize("raw, method", [(MO_PROMOTION, "asha"), (MO_HYPERBAND, "hyperband")])
def test_the_pausing_methods_take_several_objectives(raw, method):
    rule = parse_early_stop(raw)
    assert type(rule) is Pausing and rule.method == method and rule.objectives == (("loss", "min"), ("latency", "min"))
    assert rule.metric == "loss" and rule.metrics == ("loss", "latency")
    assert "on min loss and min latency (by Pareto rank): runs pause at rungs" in rule.describe()
    with pytest.raises(ConfigError, match="give objectives, or metric and mode for one, not both"):
        parse_early_stop({**raw, "metric": "loss"})


def _simulated(early_stop, configs):
    """What the pausing method decides for these runs' curves, run to the end one at a time by a
    plain loop (no processes): each run's status. Hyperband's brackets judge a rung once it is full,
    so a sweep that begins every run before its first rung is full ends the same."""
    rule = parse_early_stop(early_stop)
    method = method_for(rule)
    reached = {}

    def train(run, after):
        for step in range(int(after) + 1, 28):
            reached[run] = step
            rung = method.rung_reached(run, step)
            values = tasks.ResumingCurveTask.metrics(types.SimpleNamespace(_config=configs[run]), step)
            if rung is not None and method.report(run, rung, tuple(values[m] for m in rule.metrics)) == PAUSE:
                return
        method.ended(run)

    for run in configs:
        method.began(run, method.next(more_new=True).bracket)
    method.close()
    for run in configs:
        train(run, 0)
    while (decided := method.next(more_new=False)).kind == "resume":
        method.resumed(decided.run)
        train(decided.run, decided.step)
    return {run: "succeeded" if reached[run] == 27 else "paused" for run in configs}


def test_hyperband_on_two_objectives_pauses_and_promotes_a_sweep_as_its_method_decides(in_tmp, caplog):
    """A sweep of Python runs reporting two objectives ends as the method decides on the same curves;
    each value at a rung is recorded with every objective's value, and a paused run says them; a
    second start replays the decisions (none differs) and runs nothing."""
    root = in_tmp / "r"
    config = _sweep(root, MO_HYPERBAND, slots=("cpu",) * 9, latency=True)  # every run begins before a rung fills
    summary = GPUTaskScheduler(config, tasks.ResumingCurveTask).start()
    assert summary.exit_code == 0, summary.report()
    rows = ledger_rows(root)
    configs = {name: {**json.loads(row["params"]), "latency": True} for name, row in rows.items()}
    assert {name: row["status"] for name, row in rows.items()} == _simulated(MO_HYPERBAND, configs)
    assert rows[BEST]["status"] == "succeeded" and "paused" in {row["status"] for row in rows.values()}
    _no_step_twice(_steps(root))
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:
        told = db.execute("SELECT name, value, detail FROM trial_events WHERE kind = 'rung'").fetchall()
    for name, value, detail in told:
        objectives = json.loads(detail)["objectives"]
        assert objectives == {"loss": pytest.approx(value), "latency": pytest.approx(1 / configs[name]["decay"])}
    paused = next(row for row in rows.values() if row["status"] == "paused")
    assert paused["cause"].startswith("paused at rung ") and ", latency " in paused["cause"]
    caplog.clear()
    again = GPUTaskScheduler(config, tasks.ResumingCurveTask).start()
    _ran_nothing_and_says_paused(again, root)
    assert "differ" not in caplog.text and "do not fit" not in caplog.text
    # Values damaged by hand (an objective gone, a string, a list, no JSON) are left out, said once.
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:
        seqs = [seq for (seq,) in db.execute("SELECT seq FROM trial_events WHERE kind = 'rung' ORDER BY seq")]
        damaged = [
            '{"objectives": {"loss": 0.5}}',
            '{"objectives": {"loss": "x", "latency": 1}}',
            '{"objectives": [1, 2]}',
        ]
        for seq, detail in zip(seqs[-4:], [*damaged, "not json"], strict=True):
            db.execute("UPDATE trial_events SET detail = ? WHERE seq = ?", (detail, seq))
    caplog.clear()
    third = GPUTaskScheduler(config, tasks.ResumingCurveTask).start()
    assert third.exit_code == 0 and "4 recorded event(s) of the early_stop method do not fit it" in caplog.text


def test_a_two_objective_search_whose_runs_pause_by_pareto_rank_tells_each_run_once_with_both_values(in_tmp):
    """A search of two objectives under two-objective Hyperband: exactly n_runs, each told its two
    values once (a paused run: those it reported at the rung it paused at, BOHB-like)."""
    optuna = pytest.importorskip("optuna")
    root = in_tmp / "r"
    space = [{"start": [1.0], "floor": {"uniform": [0.1, 0.5]}, "decay": {"uniform": [0.5, 0.95]}}]
    config = make_config(
        root,
        space,
        slots=("cpu",) * 3,
        global_config={"steps": 27, "pause": 0.005, "journal": f"{root}.journal", "latency": True},
    )
    config["early_stop"] = MO_HYPERBAND
    config["search"] = {"sampler": "tpe", "n_runs": 9, "seed": 3, "objectives": TWO}
    summary = GPUTaskScheduler(config, tasks.ResumingCurveTask).start()
    assert summary.exit_code == 0, summary.report()
    rows = ledger_rows(root)
    assert len(rows) == 9 and {row["status"] for row in rows.values()} == {"succeeded", "paused"}
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(root / ".gts" / "optuna.journal"))
    )
    study = optuna.load_study(study_name="gts", storage=storage)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(t.user_attrs["gts_run"] for t in complete) == sorted(rows)
    for trial in complete:
        row = rows[trial.user_attrs["gts_run"]]
        metrics = json.loads(row["metrics"])
        assert trial.values == pytest.approx([metrics["loss"]["last"], metrics["latency"]["last"]])
        params = json.loads(row["params"])
        assert metrics["latency"]["last"] == pytest.approx(1 / params["decay"])
        assert (metrics["loss"]["step"] == 27) == (row["status"] == "succeeded")
    _no_step_twice(_steps(root))


def test_promotion_asha_on_two_objectives_trains_a_front_run_to_the_end_and_replays_the_same(in_tmp, caplog):
    root = in_tmp / "r"
    config = _sweep(root, MO_PROMOTION, latency=True)
    summary = GPUTaskScheduler(config, tasks.ResumingCurveTask).start()
    assert summary.exit_code == 0, summary.report()
    statuses = {name: row["status"] for name, row in ledger_rows(root).items()}
    assert set(statuses.values()) == {"succeeded", "paused"}
    front = {name for name in statuses if "floor-0.1," in name}  # the front at every rung
    assert {name for name, status in statuses.items() if status == "succeeded"} <= front
    _no_step_twice(_steps(root))
    caplog.clear()
    again = GPUTaskScheduler(config, tasks.ResumingCurveTask).start()
    _ran_nothing_and_says_paused(again, root)
    assert "differ" not in caplog.text and "do not fit" not in caplog.text


# --- sweeps that pause --------------------------------------------------------------------


def _sweep(root, early_stop, *, slots=("cpu", "cpu"), **global_config):
    config = make_config(
        root,
        CURVES,
        slots=slots,
        global_config={"steps": 27, "pause": 0.005, "journal": f"{root}.journal", **global_config},
        grace_period=5,
    )
    config["early_stop"] = early_stop
    return config


def _steps(root):
    """Each run's journal: ``{run: [event, ...]}`` (``start``, ``resume N``, ``stepN``, ``paused``, ``end``)."""
    runs = collections.defaultdict(list)
    with open(f"{root}.journal") as handle:
        for line in handle.read().splitlines():
            event, run = line.rsplit(" ", 1)
            runs[run].append(event)
    return runs


def _no_step_twice(runs):
    """No run executes a step twice, and each resumed attempt goes on from the step it paused at."""
    for run, events in runs.items():
        steps = [int(e[4:]) for e in events if e.startswith("step")]
        assert steps == list(range(1, len(steps) + 1)), (run, events)
        for index, event in enumerate(events):
            if event.startswith("resume "):
                before = [int(e[4:]) for e in events[:index] if e.startswith("step")]
                assert int(event.split()[1]) == before[-1], (run, events)


@pytest.mark.parametrize("early_stop", [PROMOTION, HYPERBAND], ids=["promotion", "hyperband"])
def test_a_pausing_sweep_resumes_runs_from_their_checkpoints_and_runs_nothing_again(in_tmp, early_stop):
    root = in_tmp / "r"
    config = _sweep(root, early_stop)
    summary = GPUTaskScheduler(config, tasks.ResumingCurveTask).start()
    assert summary.exit_code == 0 and summary.ok, summary.report()
    assert summary.outcomes[BEST].status is RunStatus.SUCCEEDED  # the best is trained to max_step
    assert summary.paused and summary.to_dict()["counts"]["paused"] == len(summary.paused)
    assert f"{len(summary.paused)} paused (not promoted)" in summary.report()
    runs = _steps(root)
    _no_step_twice(runs)
    # Some run was promoted and resumed from its checkpoint (the best too, unless it reached each
    # rung when it was promotable at once and went on without pausing).
    assert any(e.startswith("resume ") for events in runs.values() for e in events)
    assert sum(e.startswith("step") for events in runs.values() for e in events) <= 0.6 * 27 * 9
    rows = ledger_rows(root)
    # The ledger's summary of a resumed run is of its whole curve: its max is its first step's loss.
    assert json.loads(rows[BEST]["metrics"])["loss"] == {
        "last": pytest.approx(0.1 + 0.9 * 0.5**27),
        "step": 27,
        "min": pytest.approx(0.1 + 0.9 * 0.5**27),
        "max": pytest.approx(0.55),
    }
    for outcome in summary.paused:
        assert rows[outcome.name]["status"] == "paused"
        assert rows[outcome.name]["cause"].startswith("paused at rung ")
        assert runs[outcome.name][-1] == "paused"  # Paused reached the task
    journal = (root.parent / "r.journal").read_text()
    again = GPUTaskScheduler(config, tasks.ResumingCurveTask).start()
    _ran_nothing_and_says_paused(again, root)
    assert (root.parent / "r.journal").read_text() == journal


def _ran_nothing_and_says_paused(again, root):
    """A start of a sweep that ended ran nothing: its summary counts the runs an earlier start paused
    as paused, with their cause (as ``gts status`` does), and the rest as skipped."""
    rows = ledger_rows(root)
    paused = {name for name, row in rows.items() if row["status"] == "paused"}
    assert paused and {outcome.name for outcome in again.paused} == paused and len(again.outcomes) == len(paused)
    assert all(outcome.cause == rows[outcome.name]["cause"] for outcome in again.paused)
    assert set(again.skipped) == set(rows) - paused and again.exit_code == 0
    assert f"{len(paused)} paused (not promoted), {len(rows) - len(paused)} skipped" in again.report()


def test_the_live_status_line_counts_a_paused_run_apart_until_it_is_resumed():
    import io

    from gpu_task_scheduler.cli.progress import LiveStatus
    from gpu_task_scheduler.engine.summary import RunOutcome
    from gpu_task_scheduler.gpu.devices import Slot
    from gpu_task_scheduler.sweep.expand import Sweep

    live = LiveStatus(3, io.StringIO(), width=200)
    runs = list(Sweep({"scheduler_config": {"gpu": ["cpu"]}, "test_config": [{"a": [1, 2, 3]}]}))
    live.on_skip(runs[2])  # paused at an earlier start
    live.on_run_start(runs[0], Slot("cpu0", ()))
    live.on_run_end(RunOutcome(name=runs[0].name, work_dir="", status=RunStatus.PAUSED, duration=1.0))
    assert "0 done, 0 failed, 1 paused, 0 running, 1 pending, 1 skipped" in live.line()  # not failed
    live.on_run_start(runs[0], Slot("cpu0", ()))  # promoted
    live.on_run_start(runs[2], Slot("cpu1", ()))  # promoted too
    assert "0 done, 0 failed, 2 running, 1 pending, 0 skipped" in live.line()
    live.on_run_end(RunOutcome(name=runs[0].name, work_dir="", status=RunStatus.SUCCEEDED, duration=3.0))
    assert "1 done, 0 failed, 1 running, 1 pending" in live.line()
    live.close()


def test_promotion_asha_takes_a_grid_in_a_drawn_order_the_same_at_every_start_and_hyperband_as_written(in_tmp):
    """ASHA assumes configurations come at random: a grid written from its worst up would have each
    new one promoted as the best yet. Hyperband fills its rungs before judging: the order is moot."""
    from gpu_task_scheduler import Sweep

    written = [spec.name for spec in Sweep(_sweep(in_tmp / "w", PROMOTION))]
    started = {}
    for method, early_stop in (("promotion-1", PROMOTION), ("promotion-2", PROMOTION), ("hyperband", HYPERBAND)):
        root = in_tmp / method
        GPUTaskScheduler(_sweep(root, early_stop, slots=("cpu",)), tasks.ResumingCurveTask).start()
        started[method] = list(_steps(root))  # each run's first line: the order runs first started in
    assert started["promotion-1"] == started["promotion-2"] != written
    assert sorted(started["promotion-1"]) == sorted(written)
    assert started["hyperband"] == written


def test_a_paused_run_is_shown_as_paused_by_status_and_results(in_tmp):
    root = in_tmp / "r"
    GPUTaskScheduler(_sweep(root, HYPERBAND), tasks.ResumingCurveTask).start()
    shown = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "status", str(root), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    status = json.loads(shown.stdout)
    paused = [run for run in status["runs"] if run["status"] == "paused"]
    assert paused and all(run["cause"].startswith("paused at rung ") for run in paused)
    text = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "status", str(root)], capture_output=True, text=True
    ).stdout
    assert f"{len(paused)} paused" in text


def test_the_page_and_the_report_show_paused_runs_with_their_whole_curves(in_tmp):
    from gpu_task_scheduler.web.report import report_data, report_html

    root = in_tmp / "r"
    GPUTaskScheduler(_sweep(root, HYPERBAND), tasks.ResumingCurveTask).start()
    shown = report_data(str(root))
    paused = [run["name"] for run in shown["runs"] if run["status"] == "paused"]
    assert paused and sorted(paused) == sorted(n for n, r in ledger_rows(root).items() if r["status"] == "paused")
    # a resumed run's curve goes on across its attempts: steps 1..27, each once
    assert shown["curves"][BEST]["steps"] == list(range(1, 28))
    assert "<option>paused</option>" in report_html(str(root))


def test_a_changed_method_starts_its_decisions_again_and_paused_runs_go_on_from_their_checkpoints(in_tmp, caplog):
    root = in_tmp / "r"
    GPUTaskScheduler(_sweep(root, HYPERBAND), tasks.ResumingCurveTask).start()
    paused = {name for name, row in ledger_rows(root).items() if row["status"] == "paused"}
    summary = GPUTaskScheduler(_sweep(root, {**HYPERBAND, "reduction_factor": 2}), tasks.ResumingCurveTask).start()
    assert summary.ok, summary.report()
    assert "the early_stop method's keys changed since its decisions were recorded" in caplog.text
    assert paused & set(summary.outcomes)  # judged again under the new keys
    _no_step_twice(_steps(root))  # each went on from where it had paused


def test_a_run_paused_for_good_blocks_the_runs_that_depend_on_it_and_a_promoted_one_lets_them_run(in_tmp):
    root = in_tmp / "r"
    config = _sweep(root, HYPERBAND)
    del config["test_config"], config["early_stop"]
    config["stages"] = [
        {"name": "train", "test_config": CURVES, "early_stop": HYPERBAND},
        {"name": "eval", "after": "train", "test_config": CURVES, "global_config": {"steps": 1}},
    ]
    summary = GPUTaskScheduler(config, tasks.ResumingCurveTask).start()
    assert summary.paused and summary.exit_code == 1  # blocked runs are not a clean sweep, as with pruned ones
    for outcome in summary.paused:
        blocked = summary.outcomes[outcome.name.replace("train.", "eval.", 1)]
        assert (
            blocked.status is RunStatus.BLOCKED
            and f"{outcome.name} is paused (not promoted by its early_stop method)" in blocked.cause
        )
    trained = [o.name for o in summary.succeeded if o.name.startswith("train.")]
    assert trained and all(
        summary.outcomes[n.replace("train.", "eval.", 1)].status is RunStatus.SUCCEEDED for n in trained
    )
    again = GPUTaskScheduler(config, tasks.ResumingCurveTask).start()  # the paused runs are skipped, and still block
    assert {o.name for o in again.blocked} == {o.name for o in summary.blocked} and not again.succeeded


def test_a_dry_run_says_which_runs_are_paused_and_where(in_tmp):
    from gpu_task_scheduler import Sweep
    from gpu_task_scheduler.engine.api import plan

    root = in_tmp / "r"
    config = _sweep(root, HYPERBAND)
    GPUTaskScheduler(config, tasks.ResumingCurveTask).start()
    labels = {spec.name: decision.label for spec, decision in plan(Sweep(config))}
    for name, row in ledger_rows(root).items():
        if row["status"] == "paused":
            rung = row["cause"].split()[3]
            assert labels[name] == f"skip (paused at rung {rung})"
        else:
            assert labels[name] == "skip (succeeded)"


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_search_with_hyperband_tells_each_run_once_its_value_at_the_highest_rung_it_reached(in_tmp, sampler):
    if sampler == "tpe":
        pytest.importorskip("optuna")
    root = in_tmp / "r"
    config = _sweep(root, HYPERBAND)
    config["test_config"] = [{"floor": {"uniform": [0.1, 0.5]}, "decay": {"uniform": [0.5, 0.95]}, "start": [1.0]}]
    config["search"] = {"sampler": sampler, "n_runs": 9, "seed": 3, "metric": "loss", "mode": "min"}
    summary = GPUTaskScheduler(config, tasks.ResumingCurveTask).start()
    assert summary.ok, summary.report()
    rows = ledger_rows(root)
    assert len(rows) == 9 and summary.paused and {r["status"] for r in rows.values()} == {"succeeded", "paused"}
    _no_step_twice(_steps(root))
    values = _told(root, sampler)
    assert sorted(values) == sorted(rows)  # each of the 9 told, once
    for name, row in rows.items():
        last = json.loads(row["metrics"])["loss"]["last"]  # where it paused, or its end
        assert values[name] == pytest.approx(last)
    again = GPUTaskScheduler(config, tasks.ResumingCurveTask).start()
    assert again.outcomes == {} and len(ledger_rows(root)) == 9


def _told(root, sampler):
    """{run name: the value its trial was told} from the search's own records."""
    if sampler == "random":
        lines = [json.loads(line) for line in (root / ".gts" / "search.jsonl").read_text().splitlines()]
        names = {line["number"]: line["name"] for line in lines if "name" in line}
        told = [line for line in lines if line.get("told")]
        assert len(told) == len({line["number"] for line in told})
        return {names[line["number"]]: line["value"] for line in told}
    from test_search import _optuna_states

    states = _optuna_states(root)
    assert {state for state, _ in states.values()} == {"COMPLETE"}  # no trial is left running or told twice
    return {name: value for name, (_, value) in states.items()}


# A command's start and its steps as the journal sees them (its report follows, one way or another).
COMMAND_STEPS = (
    "import json, os, subprocess, sys, time\n"
    "first = int(os.environ['GTS_RESUME_STEP'] or 0) + 1\n"
    "journal = open(sys.argv[2], 'a')\n"
    "name = os.path.basename(os.environ['GTS_RUN_DIR'])\n"
    "journal.write(('resume %d' % (first - 1) if first > 1 else 'start') + ' ' + name + '\\n'); journal.flush()\n"
    "for step in range(first, 28):\n"
    "    journal.write('step%d %s\\n' % (step, name)); journal.flush()\n"
    "    loss = 0.1 + float(sys.argv[1]) * 0.8 ** step\n"
)
COMMAND = (
    COMMAND_STEPS + "    with open(os.environ['GTS_METRICS_FILE'], 'a') as m:\n"
    "        m.write(json.dumps({'step': step, 'loss': loss}) + '\\n')\n"
    "    time.sleep(0.03)\n"
)


def test_a_command_is_paused_with_sigterm_and_resumed_from_its_last_reported_step(in_tmp):
    root = in_tmp / "r"
    config = make_config(root, [{"scale": [0.5, 1.0, 2.0]}], slots=("cpu",), grace_period=5)
    script = in_tmp / "train.py"
    script.write_text(COMMAND)
    config["command"] = [sys.executable, str(script), "{scale}", f"{root}.journal"]
    config["early_stop"] = PROMOTION
    summary = GPUTaskScheduler(config).start()
    assert summary.ok, summary.report()
    assert summary.outcomes["scale-0.5,"].status is RunStatus.SUCCEEDED
    paused = summary.paused
    assert paused and all(o.signal == "SIGTERM" or o.exit_code is not None for o in paused)
    runs = _steps(root)
    # Told only by SIGTERM, a command may have begun the next step (journaled, not reported) when
    # it comes: it resumes after the step it reported last, so that one step may run again, never
    # more (the test below: one that reports through the module runs none again).
    for run, events in runs.items():
        for index, event in enumerate(events):
            if event.startswith("resume "):
                before = [int(e[4:]) for e in events[:index] if e.startswith("step")]
                assert int(event.split()[1]) in (before[-1], before[-1] - 1), (run, events)
    assert any(e.startswith("resume ") for e in runs["scale-0.5,"])


PLAIN_COMMAND = """
import os, sys
from gpu_task_scheduler import report
folder, start = os.environ["GTS_CHECKPOINT_DIR"], int(os.environ.get("GTS_RESUME_STEP") or 0)
for step in range(start + 1, 28):
    with open(os.path.join(folder, "step.new"), "w") as handle:
        handle.write(str(step))
    os.replace(os.path.join(folder, "step.new"), os.path.join(folder, "step"))
    report(step, loss=float(sys.argv[1]) + 0.5 / step)
"""


@pytest.mark.parametrize("kind", ["task", "command"])
def test_a_paused_run_frees_its_slot_within_a_third_of_a_second_of_its_report(in_tmp, kind):
    """From a paused attempt's last report to its slot being free: the verdict, the run's end and
    the scheduler's reading of it, with nothing of the run's own to do (it saved before it
    reported): at most 0.3 s, the median of the sweep's paused attempts, read from its records."""
    root = in_tmp / "r"
    config = _sweep(root, PROMOTION, pause=0)
    if kind == "command":
        (in_tmp / "plain.py").write_text(PLAIN_COMMAND)
        config["command"] = [sys.executable, str(in_tmp / "plain.py"), "{floor}"]
    summary = GPUTaskScheduler(config, tasks.ResumingCurveTask if kind == "task" else None).start()
    assert summary.exit_code == 0 and summary.paused, summary.report()
    freed = report_to_free(root)
    assert len(freed) >= len(summary.paused) and statistics.median(freed) <= 0.3, freed


def test_a_python_task_that_catches_paused_and_returns_is_paused(in_tmp):
    """main() may catch Paused (to save, say) and return: the run is paused all the same, and what it
    returned is no result."""
    root = in_tmp / "r"
    config = make_config(root, [{"loss": [0.9, 0.5, 0.1]}], slots=("cpu",), grace_period=5)
    config["early_stop"] = {**PROMOTION, "max_step": 3}
    summary = GPUTaskScheduler(config, tasks.CatchPausedTask).start()
    assert summary.ok, summary.report()
    paused = {o.name for o in summary.paused}
    assert paused and "loss-0.1," not in paused
    rows = ledger_rows(root)
    for name in paused:
        assert rows[name]["status"] == "paused" and rows[name]["result"] is None


def test_paused_is_a_base_exception_raised_by_report(tmp_path, monkeypatch):
    from gpu_task_scheduler import reporting

    marker = tmp_path / "pause"
    monkeypatch.setenv("GTS_METRICS_FILE", str(tmp_path / "metrics.jsonl"))
    monkeypatch.setenv("GTS_PAUSE_FILE", str(marker))
    monkeypatch.setattr(reporting, "_paused", None)
    reporting.report(1, loss=0.5)  # not told: it goes on
    marker.write_text(paused_cause(1.0, 0.5))
    with pytest.raises(Paused, match="paused at rung 1 \\(0.5 there\\)") as raised:
        try:
            reporting.report(2, loss=0.4)
        except Exception:  # what training loops often have: it must not swallow Paused
            pytest.fail("Paused was caught by except Exception")
    assert not isinstance(raised.value, Exception) and reporting.paused_cause() == str(raised.value)


# --- kill -9 ------------------------------------------------------------------------------


KILL_SEED = int(os.environ.get("GTS_KILL_SEED", "20261126"))


@pytest.mark.parametrize(
    "early_stop", [HYPERBAND, PROMOTION, MO_HYPERBAND], ids=["hyperband", "promotion", "hyperband-two-objectives"]
)
def test_sigkill_at_random_moments_repeats_no_reported_step_and_tells_each_rung_once(
    in_tmp, no_leaked_processes, early_stop
):
    """Hyperband decides by values only (its rungs wait until full), so a sweep killed again and again
    must end with the same runs succeeded and the same paused as an uninterrupted one; promotion ASHA
    decides by the order runs reach a rung, so it must end with the best trained to the end and the
    rest paused. Either way no step runs twice after it was reported (what a kill interrupts between
    a step and its report runs again, as the protocol says), and each rung's value is told once."""
    rng = random.Random(KILL_SEED)

    def config(root):
        return {**_sweep(root, early_stop, pause=0.03, latency="objectives" in early_stop), "early_stop": early_stop}

    once = launch(config(in_tmp / "once"), "ResumingCurveTask")
    assert once.wait(timeout=120) == 0, finish(once)
    finish(once)
    expected = {name: row["status"] for name, row in ledger_rows(in_tmp / "once").items()}
    assert set(expected.values()) == {"succeeded", "paused"} and expected[BEST] == "succeeded"
    root, kills = in_tmp / "r", 0
    for _ in range(12):  # killed until a start ends by itself
        scheduler = launch(config(root), "ResumingCurveTask")
        try:
            scheduler.wait(timeout=rng.uniform(0.1, 1.0))
        except subprocess.TimeoutExpired:
            scheduler.kill()
            kills += 1
        finish(scheduler)
        wait_until(lambda: not marked_pids(no_leaked_processes), timeout=5, message="the runs to die")
        if scheduler.returncode == 0:
            break
    last = launch(config(root), "ResumingCurveTask")
    output = finish(last, timeout=120)
    assert last.returncode == 0, output
    assert kills >= 4, f"only {kills} launches were killed; the sweep is too short"
    statuses = {name: row["status"] for name, row in ledger_rows(root).items()}
    if early_stop["method"] == "hyperband":
        assert statuses == expected
    else:
        assert set(statuses.values()) == {"succeeded", "paused"} and statuses[BEST] == "succeeded"
    for run, events in _steps(root).items():
        for index, event in enumerate(events):
            if event.startswith("resume "):  # from the last step it reported: the last journaled, or the one before
                journaled = [int(e[4:]) for e in events[:index] if e.startswith("step")]
                assert journaled[-1] - 1 <= int(event.split()[1]) <= journaled[-1], (run, events)
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:
        rungs = db.execute("SELECT name, rung, COUNT(*) FROM trial_events WHERE kind = 'rung' GROUP BY name, rung")
        assert all(count == 1 for _, _, count in rungs)  # each value at a rung was told once
    again = launch(config(root), "ResumingCurveTask")
    paused = sum(status == "paused" for status in statuses.values())
    said = f"Sweep summary: 0 succeeded, 0 failed, {paused} paused (not promoted), {9 - paused} skipped"
    assert said in finish(again, timeout=60)


@pytest.mark.parametrize("prewarm", [True, False], ids=["warm", "cold"])
def test_a_report_at_a_rung_its_scheduler_was_killed_before_judging_is_judged_before_the_run_starts_again(
    in_tmp, no_leaked_processes, prewarm
):
    """The scheduler is killed between a run's report at a rung and its decision there (the run
    waits in report() for it). The next start resumes the run from that step, where report() waits
    at no rung: were the report judged once the run started again, the pause would come after the
    run had trained on past it (a LightGBM run trains its next 30 rounds in less than a second; seen
    under load, a run paused at round 10 trained to 40). It is judged before the run starts: paused
    there, it does not start, and the sweep ends as one never killed does, step for step."""
    early_stop = {**PROMOTION, "min_step": 3, "max_step": 9}
    grid = [{"start": [1.0], "floor": [0.1, 0.3, 0.5], "decay": [0.8]}]

    def config(root):
        extra = {"steps": 9, "pause": 0, "freeze_at": 3, "scheduler_pid": f"{root}.pid"}
        swept = {**_sweep(root, early_stop, slots=("cpu",), **extra), "test_config": grid}
        swept["scheduler_config"]["prewarm"] = prewarm
        return swept

    once = in_tmp / "once"
    open(f"{once}.pid.frozen", "w").close()  # never frozen
    scheduler = launch(config(once), "ResumingCurveTask")
    assert scheduler.wait(timeout=120) == 0, finish(scheduler)
    finish(scheduler)
    expected = {name: row["status"] for name, row in ledger_rows(once).items()}
    assert sorted(expected.values()) == ["paused", "paused", "succeeded"]

    root = in_tmp / "r"
    scheduler = launch(config(root), "ResumingCurveTask")
    try:
        with open(f"{root}.pid.new", "w") as handle:
            handle.write(str(scheduler.pid))
        os.replace(f"{root}.pid.new", f"{root}.pid")

        def reported_at_the_rung():
            if not os.path.exists(f"{root}.pid.frozen"):
                return None
            metrics = root / open(f"{root}.pid.frozen").read() / ".gts" / "metrics.jsonl"
            return metrics.exists() and '"step": 3,' in metrics.read_text()

        wait_until(reported_at_the_rung, timeout=60, message="the first run to report at its rung")
    finally:
        scheduler.kill()  # stopped (SIGSTOP) since before that report: it never judged it
        finish(scheduler)
    wait_until(lambda: not marked_pids(no_leaked_processes), timeout=10, message="the run to end with its scheduler")
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:
        assert not db.execute("SELECT 1 FROM trial_events WHERE kind = 'rung'").fetchall()  # never judged
    again = launch(config(root), "ResumingCurveTask")
    output = finish(again, timeout=120)
    assert again.returncode == 0, output
    assert {name: row["status"] for name, row in ledger_rows(root).items()} == expected, output

    def trained(journal):  # each run's steps and where each attempt went on from
        return {run: [e for e in events if e.startswith(("step", "resume"))] for run, events in _steps(journal).items()}

    assert trained(root) == trained(once), output
    assert f"{open(f'{root}.pid.frozen').read()}: its report at step 3 was never judged" in output, output


def test_damaged_trial_events_a_huge_bracket_or_a_name_out_of_the_root_are_left_out_with_a_message(in_tmp, caplog):
    """A ``began`` event with a bracket of 10**12 once made brackets for ever at every start (and in
    ``--dry-run``), deaf to Ctrl-C; an event naming ``../victim`` made the methods treat a folder
    outside the root as a run. Both are left out of the replay, each said, and nothing outside moves."""
    from gpu_task_scheduler import Sweep
    from gpu_task_scheduler.engine.api import plan

    root = in_tmp / "r"
    config = _sweep(root, HYPERBAND)
    assert GPUTaskScheduler(config, tasks.ResumingCurveTask).start().exit_code == 0
    victim = in_tmp / "victim"
    (victim / ".gts" / "snapshots" / "1").mkdir(parents=True)
    (victim / ".gts" / "checkpoint").mkdir()
    (victim / ".gts" / "checkpoint" / "keep").write_text("precious")
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:
        (seq,) = db.execute("SELECT min(seq) FROM trial_events WHERE kind = 'began'").fetchone()
        db.execute("UPDATE trial_events SET bracket = ? WHERE seq = ?", (10**12, seq))
        db.execute(
            "INSERT INTO trial_events (kind, stage, name, bracket) SELECT kind, stage, '../victim', 0 "
            "FROM trial_events WHERE seq = ?",
            (seq,),
        )
    caplog.clear()
    labels = {spec.name: decision.label for spec, decision in plan(Sweep(config))}  # --dry-run's reading
    assert len(labels) == 9
    assert "1 recorded event(s) of the early_stop method do not fit it" in caplog.text
    assert "name 1 run(s) that cannot be run folders" in caplog.text and "../victim" in caplog.text
    again = GPUTaskScheduler(config, tasks.ResumingCurveTask).start()
    assert again.exit_code == 0
    assert (victim / ".gts" / "checkpoint" / "keep").read_text() == "precious"
    assert sorted(os.listdir(victim / ".gts")) == ["checkpoint", "snapshots"]


WAITING_COMMAND = (
    COMMAND_STEPS + "    told = subprocess.run([sys.executable, '-m', 'gpu_task_scheduler.reporting',\n"
    "                           str(step), 'loss=%r' % loss])\n"
    "    if told.returncode == 3:\n"
    "        sys.exit(0)  # paused (or stopped): the step just reported is the one it resumes after\n"
    "    time.sleep(0.01)\n"
)


@pytest.fixture
def busy_machine():
    """The test and every process it starts confined to one core, which two spinning processes keep
    busy: the sweep sees a loaded machine (its runs get a third of a core each), and the tests that
    run beside it (pytest-xdist) keep the other cores. Stopped, and the core set restored, after."""
    cores = os.sched_getaffinity(0)
    one = {max(cores)}
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for spinner in spinners:
            os.sched_setaffinity(spinner.pid, one)
        os.sched_setaffinity(0, one)  # this thread: the sweep's threads and processes inherit it
        yield
    finally:
        os.sched_setaffinity(0, cores)
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.mark.parametrize("early_stop", [PROMOTION, HYPERBAND], ids=["promotion", "hyperband"])
def test_a_command_that_reports_through_the_module_waits_at_a_rung_and_trains_no_step_twice_under_load(
    in_tmp, early_stop, busy_machine
):
    """A command is told of a pause by SIGTERM, which may come after it began the next step: that
    step ran twice (steps 1, 2, 3, resumed at 2, 3 again). Reporting through
    ``python -m gpu_task_scheduler.reporting``, it waits at each rung for the verdict, exits when
    paused, and trains each step once, with its core busy."""
    root = in_tmp / "r"
    config = make_config(root, CURVES, slots=("cpu", "cpu"), grace_period=5)
    script = in_tmp / "train.py"
    script.write_text(WAITING_COMMAND)
    config["command"] = [sys.executable, str(script), "{decay}", f"{root}.journal"]
    config["early_stop"] = {**early_stop, "max_step": 9}
    summary = GPUTaskScheduler(config).start()
    assert summary.exit_code == 0 and summary.ok, summary.report()
    assert summary.paused and all(o.status is RunStatus.PAUSED for o in summary.paused)
    runs = _steps(root)
    _no_step_twice(runs)
    assert any(e.startswith("resume ") for events in runs.values() for e in events)


def _replayed_method(events, early_stop):
    """A fresh method told ``events`` in order, as a start replays them; with the ``began``
    events at which a promotion was owed (a new configuration started before a promoted run)."""
    rule = parse_early_stop(early_stop)
    method = method_for(rule, population=9, slots=1)
    early = []
    for kind, name, bracket, rung, step, value in events:
        if kind == "closed":
            method.close()
        elif kind == "began":
            if method.next(more_new=True).kind == "resume":
                early.append(name)
            method.began(name, bracket or 0)
        elif kind == "rung" and method.rung_reached(name, step) == rung:
            method.report(name, rung, value, step)
        elif kind == "resumed":
            method.resumed(name)
        elif kind == "ended":
            method.ended(name)
    return method, early


@pytest.mark.parametrize("early_stop", [PROMOTION, HYPERBAND], ids=["promotion", "hyperband"])
def test_a_promoted_run_resumes_before_anything_new_starts(in_tmp, early_stop):
    """Replayed in the order the ledger recorded them, no new configuration began while the
    method owed a promotion: a grid larger than its slots would otherwise start every new run
    first, and judge a promoted run's next rung against more runs than it was."""
    root = in_tmp / "r"
    summary = GPUTaskScheduler(_sweep(root, early_stop, slots=("cpu",)), tasks.ResumingCurveTask).start()
    assert summary.exit_code == 0, summary.report()
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:
        events = db.execute("SELECT kind, name, bracket, rung, step, value FROM trial_events ORDER BY seq").fetchall()
    assert any(kind == "resumed" for kind, *_ in events)
    _, early = _replayed_method(events, early_stop)
    assert early == []


def test_a_promotion_is_written_to_trial_events_when_it_is_made(in_tmp):
    """Once a promoted run resumes, its resumption is in trial_events (committed with its attempt):
    a start after a kill then finds it no longer paused, and owes it nothing."""
    from gpu_task_scheduler import Sweep
    from gpu_task_scheduler.engine.pauses import Pauses
    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.paths import RootPaths

    root = in_tmp / "r"
    sweep = Sweep(_sweep(root, PROMOTION))
    specs = list(sweep)
    with Ledger(RootPaths(str(root))) as ledger:
        pauses = Pauses(sweep, ledger, root=str(root))
        promoted = None
        for spec, value in zip(specs, [0.1, 0.5, 0.9, 0.95, 0.8, 0.7], strict=False):  # the first is promoted later
            pauses.began(spec)
            rung, decision = pauses.reached(spec, 1, value)
            if decision == PAUSE:
                pauses.paused(spec)
            if (owed := pauses.owed()) is not None:
                promoted = owed
                break
        assert promoted is not None, "no run was promoted"
        pauses.resumed(promoted)
        ledger.commit()
        again = Pauses(sweep, ledger, root=str(root))
        assert again.paused_at(promoted.name) is None
        for spec in specs:
            again.paused(spec)
        assert again.owed() is None or again.owed().name != promoted.name


@pytest.mark.parametrize("task", ["CurveTask", "ReportThenSaveTask"])
def test_a_resumed_run_that_trains_again_what_its_checkpoint_holds_is_said_once(in_tmp, task, capsys):
    """A run that never reads GTS_RESUME_STEP retrains from step 1 at every promotion; one that
    reports before it saves retrains one step: each is said once, naming the run and the protocol,
    in the log, `gts status` and the page (the ledger's notes)."""
    from gpu_task_scheduler.cli.main import main as gts
    from gpu_task_scheduler.web.data import overview

    root = in_tmp / "r"
    config = _sweep(root, PROMOTION, slots=("cpu",))
    summary = GPUTaskScheduler(config, getattr(tasks, task)).start()
    assert summary.exit_code == 0, summary.report()
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:
        resumed = {name for (name,) in db.execute("SELECT DISTINCT name FROM trial_events WHERE kind = 'resumed'")}
    assert resumed, "no run was promoted"
    notes = overview(str(root))["notes"]
    assert set(notes) == resumed
    assert all("again, and will at every resume" in note and "GTS_RESUME_STEP" in note for note in notes.values())
    if task == "ReportThenSaveTask":  # one step again each time, not from the start
        assert all(" again: it trained step " in note for note in notes.values())
    capsys.readouterr()
    assert gts(["status", str(root)]) == 0
    shown = capsys.readouterr().out
    assert all(f"note: {note}" in shown for note in notes.values())


def test_gts_retry_refuses_a_paused_run_with_the_reason_and_force_trains_it_from_step_0(in_tmp, capsys):
    """``gts retry ROOT RUN`` on a paused run said "running 1 run(s) again", skipped it and exited 0."""
    from gpu_task_scheduler.cli.main import main as gts

    root = in_tmp / "r"
    config = _sweep(root, PROMOTION)
    assert GPUTaskScheduler(config, tasks.ResumingCurveTask).start().exit_code == 0
    paused = sorted(name for name, row in ledger_rows(root).items() if row["status"] == "paused")
    assert paused
    capsys.readouterr()
    assert gts(["retry", str(root), paused[0], "--task", "gts_test_tasks:ResumingCurveTask"]) == 2
    said = capsys.readouterr()
    assert "is paused (paused at rung" in said.err and "has not promoted it" in said.err
    assert "running" not in said.out
    assert gts(["retry", str(root), paused[0], "--force", "--task", "gts_test_tasks:ResumingCurveTask"]) == 0
    assert f"running 1 run(s) again: {paused[0]} (--force: from step 0, their checkpoints set aside)" in (
        capsys.readouterr().out
    )
    assert ledger_rows(root)[paused[0]]["status"] in ("succeeded", "paused")
    assert _steps(root)[paused[0]].count("start") == 2  # from its first step again


def test_on_cpu_slots_a_sweep_says_what_its_runs_cost_in_slot_hours_across_their_attempts(in_tmp, capsys):
    """No GPU measured: gts results had no cost column, --gpu-hours-to said "after 0 GPU-hours", a
    resumed run's duration was its last attempt's and the timeline showed last attempts only."""
    from gpu_task_scheduler.cli.main import main as gts
    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.paths import RootPaths
    from gpu_task_scheduler.results import gpu_hours_to, rows
    from gpu_task_scheduler.web.data import overview, timeline

    root = in_tmp / "r"
    assert GPUTaskScheduler(_sweep(root, PROMOTION, pause=0.01), tasks.ResumingCurveTask).start().exit_code == 0
    ledger = Ledger.read_only(RootPaths(str(root)))
    try:
        records = {record.name: record for record in ledger.records()}
    finally:
        ledger.close()
    resumed = [r for r in records.values() if len(r.spans_value) > 1]
    assert resumed, "no run was resumed"
    table = {row["name"]: row for row in rows(str(root))}
    for record in resumed:
        spans = record.spans_value
        assert table[record.name]["duration"] == pytest.approx(sum(end - start for _, start, end in spans), abs=1e-3)
        assert table[record.name]["duration"] > record.ended_at - record.started_at  # not the last attempt's
    assert all("gpu_hours" not in row and row["slot_hours"] > 0 for row in table.values())
    found = gpu_hours_to(str(root), "loss<=10")
    assert found["reached"] and found["unit"] == "slot-hours" and found["gpu_hours"] > 0
    drawn = timeline(str(root))["runs"]
    assert sum(1 for bar in drawn if bar["name"] == resumed[0].name) == len(resumed[0].spans_value)
    assert max(bar["end"] for bar in drawn) == pytest.approx(  # the whole sweep, not the last attempts'
        max(r.ended_at for r in records.values()) - min(s for r in records.values() for _, s, _ in r.spans_value),
        abs=1e-3,
    )
    assert overview(str(root))["slot_seconds"] > 0
    capsys.readouterr()
    assert gts(["status", str(root)]) == 0
    assert "slot-hours (no GPU measured)" in capsys.readouterr().out
    assert gts(["results", str(root), "--gpu-hours-to", "loss<=10"]) == 0
    assert "slot-hours" in capsys.readouterr().out
