"""Population-based training at work (the ``pbt`` config, engine/pauses.py, records/checkpoints.py):
the example sweep of configs/pbt.yaml beats its best fixed learning rate within the grid's steps,
runs nothing again, and survives kill -9 at random moments with each exploit made once and no
checkpoint half-copied."""

import contextlib
import json
import os
import random
import sqlite3
import subprocess
import sys

import gts_test_tasks as tasks
import pytest
from conftest import marked_pids, wait_until
from helpers import ledger_rows, make_config
from test_process_control import finish

from gpu_task_scheduler import ConfigError, GPUTaskScheduler
from gpu_task_scheduler.gpu.devices import format_size
from gpu_task_scheduler.records.ledger import Ledger
from gpu_task_scheduler.records.lineage import lineages
from gpu_task_scheduler.records.metrics import attempt_files, read_all, run_points
from gpu_task_scheduler.records.paths import RootPaths, RunPaths
from gpu_task_scheduler.sweep.expand import Sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "examples"))
from pbt_schedule import fixed_score  # noqa: E402

LRS = [1.0, 0.61, 0.37, 0.23, 0.14, 0.085, 0.052, 0.032]
KILL_SEED = int(os.environ.get("GTS_KILL_SEED", "20261126"))


def _example(folder, seconds="0.1", slots=8, judged="metric: score, mode: max"):
    """configs/pbt.yaml and its script in ``folder``, each step taking ``seconds``, on ``slots``,
    judged as ``judged`` says (the script reports its score and its lr)."""
    (folder / "configs").mkdir()
    (folder / "examples").mkdir()
    for path in ("configs/pbt.yaml", "examples/pbt_schedule.py"):
        (folder / path).write_text(open(os.path.join(REPO, path), encoding="utf-8").read())
    config = folder / "configs" / "pbt.yaml"
    text = config.read_text().replace('--seconds, "0.1"', f'--seconds, "{seconds}"')
    text = text.replace("metric: score, mode: max", judged)
    config.write_text(text.replace("[cpu, cpu, cpu, cpu, cpu, cpu, cpu, cpu]", "[" + ", ".join(["cpu"] * slots) + "]"))
    return [sys.executable, "-m", "gpu_task_scheduler", "run", "configs/pbt.yaml", "--plain"]


def _executed_steps(root):
    """The steps the members trained, over all their attempts (one metrics line a step)."""
    count = 0
    for name in os.listdir(root):
        meta = root / name / ".gts"
        for folder in (meta, meta / "logs"):
            for entry in os.listdir(folder) if folder.is_dir() else ():
                if entry.endswith("metrics.jsonl"):
                    count += sum(1 for _ in open(folder / entry, encoding="utf-8"))
    return count


def _events(root):
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:
        return db.execute("SELECT name, kind, rung, decision, detail FROM trial_events ORDER BY seq").fetchall()


def exploits_of(root, name):
    """The exploits ``name``'s weights went through, back to step 0 (its donors' before it copied them)."""
    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.lineage import lineages
    from gpu_task_scheduler.records.paths import RootPaths

    ledger = Ledger.read_only(RootPaths(str(root)))
    try:
        return [s for s in lineages(ledger.trial_events())[name].schedule if s.donor is not None]
    finally:
        ledger.close()


def copy_faults_of(root, judged="metric: score, mode: max"):
    """Every exploit the ledger records that broke the copy rule (tuning/pbt.py): a snapshot of a
    lineage its donor dropped, or one recorded worse than the copier's own value there."""
    from gpu_task_scheduler.records.lineage import copy_faults
    from gpu_task_scheduler.tuning.base import Ranking

    several = "objectives" in judged
    ranking = Ranking(["max", "min"] if several else ["min" if "mode: min" in judged else "max"])

    def value_of(event):
        if not several:
            return event.value
        return tuple((event.detail or {}).get("objectives", {}).get(key) for key in ("score", "lr"))

    ledger = Ledger.read_only(RootPaths(str(root)))
    try:
        return copy_faults(ledger.trial_events(), interval=4, value_of=value_of, worse=ranking.worse)
    finally:
        ledger.close()


# Sweeps of the example the test makes at most. PBT is a search, and its result depends on the
# order the members' reports come in (which member is ahead when a quarter is ranked): measured
# here, 20 sweeps of the example on 2 busy cores reached a median of 1.77x the best fixed learning
# rate, and 2 of the 20 ended below 1.15x (1.13x, 1.15x). So one sweep below the bound is not a
# failure; three in a row (about 1 in 1,000) are.
EXAMPLE_SWEEPS = 3


def test_the_example_beats_its_best_fixed_learning_rate_in_the_grids_steps(in_tmp):
    best_fixed = max(fixed_score(lr) for lr in LRS)
    ratios = []
    for sweep in range(EXAMPLE_SWEEPS):
        folder = in_tmp / f"sweep{sweep}"
        folder.mkdir()
        argv = _example(folder)
        run = subprocess.run(argv, cwd=str(folder), capture_output=True, text=True, timeout=180)
        assert run.returncode == 0, run.stderr
        root = folder / "results" / "pbt"
        rows = ledger_rows(root)
        assert len(rows) == 8 and {row["status"] for row in rows.values()} == {"succeeded"}
        scores = {name: json.loads((root / name / "result.json").read_text())["score"] for name in rows}
        assert _executed_steps(root) <= 1.25 * 8 * 40
        assert copy_faults_of(root) == []  # each copy: the donor's current weights, no worse than the copier's
        ratios.append(max(scores.values()) / best_fixed)
        if ratios[-1] >= 1.15:
            break
    assert ratios[-1] >= 1.15, ratios
    exploits = [event for event in _events(root) if event[3] == "exploit"]
    assert exploits, "no member copied another"
    for name, _, _, _, detail in exploits:  # a copied member went on with the donor's values, explored
        assert json.loads(detail)["donor"] in rows and name in rows
    again = subprocess.run(argv, cwd=str(folder), capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "0 succeeded, 0 failed, 8 skipped" in again.stderr
    # The winner's schedule, from step 0: each line's lr is one the population had, the last its own.
    winner = max(scores, key=scores.get)
    shown = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "results", str(root), "--best", "score", "--max", "--schedule"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.split("trained with (population-based training):\n")[1].splitlines()
    assert lines[0].startswith("steps 0-") and len(lines) == 1 + sum(1 for e in exploits_of(root, winner))
    last_lr = json.loads((root / winner / "result.json").read_text())["lr"]
    assert f"lr={last_lr!r}" in lines[-1]
    status = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "status", str(root), "--json"], capture_output=True, text=True
    )
    from gpu_task_scheduler.reports.plots import _copied_steps, plot_curves

    assert {name: len(steps) for name, steps in _copied_steps(str(root)).items() if steps} == {
        name: sum(1 for n, *_ in exploits if n == name) for name in {n for n, *_ in exploits}
    }  # the steps gts plot --curves rings: one a copy
    pytest.importorskip("matplotlib")
    assert os.path.getsize(plot_curves(str(root), "score", "lr", str(in_tmp / "curves.png"))) > 0
    copied = {run["name"]: run.get("copied") for run in json.loads(status.stdout)["runs"]}
    assert all(copied[name] for name, *_ in exploits) and all(
        text.split(",")[0].isdigit() for text in filter(None, copied.values())
    )


def test_a_population_larger_than_its_slots_takes_turns_and_every_member_gets_them(in_tmp):
    """8 members on 2 slots: a member that goes on from an interval while others wait behind it
    pauses for its turn, so the population trains together (ranked against members at about its
    own step), and the sweep still ends with every member at max_step, each turn taken."""
    argv = _example(in_tmp, seconds="0.02", slots=2)
    run = subprocess.run(argv, cwd=str(in_tmp), capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    root = in_tmp / "results" / "pbt"
    rows = ledger_rows(root)
    assert {row["status"] for row in rows.values()} == {"succeeded"} and len(rows) == 8
    decisions = [decision for _, kind, _, decision, _ in _events(root) if kind == "rung"]
    assert {"yield", "snapshot+yield"} & set(decisions), decisions
    assert "takes its turn" in run.stderr
    turns = sum(1 for decision in decisions if decision in ("yield", "snapshot+yield"))
    resumed = sum(1 for _, kind, _, decision, _ in _events(root) if kind == "resumed")
    exploits = sum(1 for decision in decisions if decision == "exploit")
    assert resumed == turns + exploits  # each member that waited for its turn got it
    assert _executed_steps(root) <= 1.25 * 8 * 40
    # The snapshots the method no longer needs are gone from disk, not only from its list: a member
    # keeps its latest and its best (the copy rule offers no other), of about 9 it took.
    for name in rows:
        folder = root / name / ".gts" / "snapshots"
        kept = sorted(os.listdir(folder)) if folder.exists() else []
        assert len(kept) <= 2, (name, kept)


@pytest.mark.parametrize("seed", [KILL_SEED, KILL_SEED + 1])
@pytest.mark.parametrize(
    "judged", ["metric: score, mode: max", "objectives: {score: max, lr: min}"], ids=["score", "two-objectives"]
)
def test_sigkill_at_random_moments_makes_each_exploit_once_and_copies_no_checkpoint_by_half(
    in_tmp, no_leaked_processes, judged, seed
):
    """Killed again and again (the scheduler and, by its process group, its runs' parent), the sweep
    ends with every member trained to max_step; each exploit decided is made once (resumed once);
    and every resumed member found a whole checkpoint of the step it resumed from (the example
    exits with an error otherwise), with no copy left half-made."""
    rng = random.Random(seed)
    argv = _example(in_tmp, seconds="0.05", judged=judged)
    root, kills = in_tmp / "results" / "pbt", 0
    for _ in range(12):
        scheduler = subprocess.Popen(argv, cwd=str(in_tmp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            scheduler.wait(timeout=rng.uniform(0.3, 1.2))
        except subprocess.TimeoutExpired:
            scheduler.kill()
            kills += 1
        finish(scheduler)
        wait_until(lambda: not marked_pids(no_leaked_processes), timeout=10, message="the runs to die")
        if scheduler.returncode == 0:
            break
    last = subprocess.run(argv, cwd=str(in_tmp), capture_output=True, text=True, timeout=180)
    assert last.returncode == 0, last.stderr
    assert kills >= 3, f"only {kills} launches were killed; the sweep is too short"
    rows = ledger_rows(root)
    assert {row["status"] for row in rows.values()} == {"succeeded"}, rows
    for name in rows:
        # its curve across its attempts (a last attempt that went on from step 40 reported nothing)
        steps = [step for step, _ in run_points(RunPaths(str(root / name), None))]
        assert steps and steps[-1] == 40, (name, steps)
        meta = root / name / ".gts"
        assert not (meta / "checkpoint.new").exists() and not (meta / "checkpoint.old").exists()
        assert (
            not any(entry.endswith(".new") for entry in os.listdir(meta / "snapshots"))
            if (meta / "snapshots").exists()
            else True
        )
    pending, late, turns = {}, set(), set()
    for name, kind, rung, decision, detail in _events(root):
        if kind == "rung" and decision == "exploit":
            assert name not in pending, f"{name} exploited again before it resumed"
            pending[name] = rung
            if json.loads(detail or "{}").get("late"):
                late.add(name)
        elif kind == "rung" and decision in ("yield", "snapshot+yield"):
            turns.add(name)  # it waits for the members behind it
        elif kind == "resumed":
            assert pending.pop(name, None) is not None or name in turns, f"{name} resumed without an exploit or a turn"
            turns.discard(name)
        elif kind == "ended" and name in late:
            # Decided on a report read after a restart, of an attempt that had already trained to
            # the end (the scheduler was killed after its last report, before reading it): dropped
            # by its end (Pbt.ended), never a copy in its lineage. Seen in a loaded CI run.
            pending.pop(name, None)
        if kind in ("resumed", "ended"):
            late.discard(name)
    assert not pending, f"exploits never made: {pending}"
    assert copy_faults_of(root, judged) == []  # through every kill and replay too
    if "objectives" in judged:  # each judgement recorded with both values
        told = [json.loads(detail or "{}") for _, kind, _, _, detail in _events(root) if kind == "rung"]
        assert told and all(set(found.get("objectives", ())) == {"score", "lr"} for found in told)


KILL_POINTS = ["decided", "owed", "installed", "set-aside", "committed", "prepared"]  # tests/pbt_kill_driver.py


def _pending_exploit(root, name):
    """``name``'s latest exploit decided (``(index among its exploits, detail)``)."""
    exploits = [
        json.loads(detail) for who, kind, _, decision, detail in _events(root) if who == name and decision == "exploit"
    ]
    return len(exploits) - 1, exploits[-1]


def _first_lines(root, name):
    """The first line each of ``name``'s attempts reported (step, lr), over its kept metrics files."""
    firsts = []
    for path in attempt_files(RunPaths(str(root / name), None)):
        points = read_all(path, keep_points=True).points
        if points:
            firsts.append((points[0][0], points[0][1]["lr"]))
    return firsts


def test_a_kill_at_each_point_of_an_exploit_leaves_a_member_that_resumes_from_the_checkpoint_it_holds(
    in_tmp, no_leaked_processes
):
    """gts killed (SIGKILL) at each point between an exploit's decision and the member's next start
    (engine/pauses.py lists them), one after another in one sweep: each member so interrupted ends
    the sweep having resumed from the donor's step with the exploit's values (the example exits with
    an error when its checkpoint is not of the step it resumes from), and its lineage holds that
    exploit once."""
    # The driver kills at exploits from a donor at another step than the member's (where resuming
    # at the member's own step would be wrong). Whether a sweep makes one depends on when reports
    # are read: on 4 slots the members train in step, and a loaded CI run saw a whole sweep make
    # none. A sweep that reached none of the points left is followed by another (at most 4 in all).
    judged = "metric: score, mode: max"
    argv = _example(in_tmp, seconds="0.02", slots=4, judged=judged)
    root, note = in_tmp / "results" / "pbt", in_tmp / "killed.json"
    driver = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pbt_kill_driver.py")
    killed, points, sweeps = [], list(KILL_POINTS), 0
    while points:
        point = points[0]
        process = subprocess.Popen(
            [sys.executable, driver, point, str(note), *argv[3:]],
            cwd=str(in_tmp),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        output = finish(process, timeout=120)
        wait_until(lambda: not marked_pids(no_leaked_processes), timeout=10, message="the runs to die")
        if process.returncode == 0:  # the sweep ended before another exploit came: checked,
            _check_kills(in_tmp, argv, root, killed, judged)  # then the next points in a sweep of their own
            os.rename(in_tmp / "results", in_tmp / f"results-{sweeps}")
            killed, sweeps = [], sweeps + 1
            assert sweeps < 4, f"{sweeps} sweeps ended with points not reached ({points}):\n{output}"
            continue
        assert process.returncode == -9, f"the sweep ended before an exploit reached {point}:\n{output}"
        name = json.loads(note.read_text())["name"]
        killed.append((point, name, *_pending_exploit(root, name)))
        points.pop(0)
    _check_kills(in_tmp, argv, root, killed, judged)
    assert sweeps <= 3, sweeps  # the six points come in one sweep, now and then in two or three


def _check_kills(in_tmp, argv, root, killed, judged):
    """The sweep goes on to its end; each kill of ``killed`` left a member that resumed from its
    exploit's step with its values, its lineage holding the exploit once; no exploit is left unmade."""
    last = subprocess.run(argv, cwd=str(in_tmp), capture_output=True, text=True, timeout=180)
    assert last.returncode == 0, last.stdout + last.stderr
    rows = ledger_rows(root)
    assert {row["status"] for row in rows.values()} == {"succeeded"}, rows
    found = lineages_of(root)
    for point, name, index, exploit in killed:
        made = found[name].exploits[index]
        assert (made.donor, made.step, made.values) == (exploit["donor"], exploit["step"], exploit["values"]), point
        # Recorded once: a member copies the same snapshot again only in another attempt (its donor,
        # held for its turn under load, may still hold it at the member's next rung).
        copies = sum(1 for s in found[name].exploits if (s.donor, s.step) == (made.donor, made.step))
        went_on = sum(1 for first, _ in _first_lines(root, name) if first == exploit["step"] + 1)
        assert 1 <= copies <= went_on, (point, copies, went_on)
        # an attempt went on from the donor's step with the exploit's values
        assert (exploit["step"] + 1, exploit["values"]["lr"]) in _first_lines(root, name), (point, name, exploit)
    pending = {}
    for name, kind, rung, decision, _ in _events(root):
        if decision == "exploit":
            assert name not in pending, f"{name} exploited again before it resumed"
            pending[name] = rung
        elif kind == "resumed":
            pending.pop(name, None)
    assert not pending, f"exploits never made: {pending}"
    assert copy_faults_of(root, judged) == []


def lineages_of(root):
    ledger = Ledger.read_only(RootPaths(str(root)))
    try:
        return lineages(ledger.trial_events())
    finally:
        ledger.close()


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"early_stop": {"method": "asha", "metric": "score", "mode": "max", "max_step": 9}}, "give pbt or early_stop"),
        (
            {"pbt": {"metric": "score", "mode": "max", "interval": 4, "max_step": 40, "perturb": {"lrr": [2]}}},
            "pbt.perturb.lrr: no run has the key 'lrr'; did you mean 'lr'",
        ),
    ],
)
def test_a_pbt_that_cannot_work_is_refused_before_anything_runs(extra, words):
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": "r"},
        "command": ["true"],
        "test_config": [{"lr": [0.1, 0.2]}],
        "pbt": {"metric": "score", "mode": "max", "interval": 4, "max_step": 40, "perturb": {"lr": [0.5, 2]}},
        **extra,
    }
    with pytest.raises(ConfigError, match=words):
        Sweep(config)


def _population(root, **extra):
    """4 members, 32 steps (8 intervals). In a simulation of this population (the method driven by
    a loop), some random orders of its reports made no copy at all in 16 steps (5 of 2,000 judged by
    the score, 33 of 2,000 by score and cost), none of 2,000 in 32: the tests that need a copy
    failed now and then with 16."""
    config = make_config(
        root,
        [{"lr": [1.0, 0.37, 0.14, 0.052]}],
        slots=("cpu",) * 4,
        global_config={"steps": 32, "pause": 0.02, "journal": f"{root}.journal"},
        grace_period=5,
    )
    config["pbt"] = {"metric": "score", "mode": "max", "interval": 4, "max_step": 32, "perturb": {"lr": [0.5, 2.0]}}
    config.update(extra)
    return config


def test_a_python_members_values_change_in_its_config_and_its_lineage(in_tmp):
    """A GPUTask member that copies another starts its next attempt with the explored values in
    ``self._config`` (and in its folder's .gts/config.json), from the donor's checkpoint."""
    root = in_tmp / "r"
    summary = GPUTaskScheduler(_population(root), tasks.ScheduleTask).start()
    assert len(summary.succeeded) == 4 and not summary.failed
    journaled = [line.rsplit(" ", 1) for line in (in_tmp / "r.journal").read_text().splitlines()]
    ledger = Ledger.read_only(RootPaths(str(root)))
    try:
        found = lineages(ledger.trial_events())
    finally:
        ledger.close()
    assert set(found) == {run.name for run in summary.succeeded} and any(lineage.exploits for lineage in found.values())
    rows = ledger_rows(root)
    for name, lineage in found.items():
        attempts = [event.split() for event, run in journaled if run == name]
        # its first attempt with its grid value, then one attempt per resumption: a copy's with the
        # copy's values, from the donor's step; a turn's (it waited for members behind it) with its
        # own, from its own step
        lr = json.loads(rows[name]["params"])["lr"]
        wanted, steps = [lr], []
        copies = iter(lineage.exploits)
        with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:
            events = db.execute("SELECT kind, step, decision FROM trial_events WHERE name = ? ORDER BY seq", (name,))
            for kind, at, decision in events.fetchall():
                if kind == "rung" and decision == "exploit":
                    copy = next(copies)
                    lr, step = copy.values["lr"], copy.step
                elif kind == "rung" and decision in ("yield", "snapshot+yield"):
                    step = at
                elif kind == "resumed":
                    wanted.append(lr)
                    steps.append(step)
        assert [float(words[-1]) for words in attempts] == pytest.approx(wanted), (name, attempts)
        assert [words[0] for words in attempts] == ["start"] + ["resume"] * len(steps)
        assert [float(words[1]) for words in attempts[1:]] == steps
        assert json.loads(rows[name]["result"])["lr"] == pytest.approx(wanted[-1])
        assert json.loads((root / name / ".gts" / "config.json").read_text())["lr"] == pytest.approx(wanted[-1])


def test_a_searchs_first_n_runs_are_the_population(in_tmp):
    root = in_tmp / "r"
    config = _population(root, search={"sampler": "random", "n_runs": 4, "metric": "score", "mode": "max", "seed": 3})
    config["test_config"] = [{"lr": {"loguniform": [0.03, 1.0]}}]
    summary = GPUTaskScheduler(config, tasks.ScheduleTask).start()
    assert len(summary.succeeded) == 4 and not summary.failed
    events = _events(root)
    assert sum(1 for event in events if event[1] == "began") == 4
    assert any(event[3] == "exploit" for event in events)


def test_a_population_judged_by_two_objectives_copies_by_pareto_rank_and_replays_the_same(in_tmp, caplog):
    """Members report a score to maximize and a cost (their lr) to minimize: each judgement is
    recorded with both values, an exploit's member is ranked below its donor by Pareto rank there,
    and a second start replays every decision (none differs) and runs nothing."""
    root = in_tmp / "r"
    config = _population(root)
    config["global_config"]["cost"] = True
    config["pbt"] = {key: value for key, value in config["pbt"].items() if key not in ("metric", "mode")}
    config["pbt"]["objectives"] = {"score": "max", "cost": "min"}
    summary = GPUTaskScheduler(config, tasks.ScheduleTask).start()
    assert len(summary.succeeded) == 4 and not summary.failed
    from gpu_task_scheduler.tuning.pareto import pareto_order

    def ahead(table, donor, name):
        ranked = [sorted(table)[i] for i in pareto_order([table[n] for n in sorted(table)])]
        return ranked.index(donor) < ranked.index(name)

    # Each exploit against the values as they stood when it was decided (the events in order; a
    # member that went on from a copy stands at that interval with its donor's value): ranked at
    # an interval up to its own, below its donor there.
    values, pending, exploits = {}, {}, 0
    for name, kind, rung, how, detail in _events(root):
        if kind == "resumed" and name in pending:
            level, donor = pending.pop(name)
            values[level][name] = values[level][donor]
        if kind != "rung":
            continue
        objectives = json.loads(detail)["objectives"]
        assert set(objectives) == {"score", "cost"}
        values.setdefault(rung, {})[name] = (-objectives["score"], objectives["cost"])  # both minimized
        if how == "exploit":
            exploits += 1
            copied = json.loads(detail)
            donor = copied["donor"]
            levels = [level for level in values if level <= rung and {name, donor} <= set(values[level])]
            assert any(ahead(values[level], donor, name) for level in levels), (name, donor, rung, values)
            pending[name] = (copied["step"] - copied["step"] % config["pbt"]["interval"], donor)
    assert exploits, "no member copied another"
    caplog.clear()
    again = GPUTaskScheduler(config, tasks.ScheduleTask).start()
    assert again.outcomes == {} and len(again.skipped) == 4
    assert "differ" not in caplog.text and "do not fit" not in caplog.text


def test_a_late_report_under_pbt_takes_no_snapshot_and_is_recorded_late(in_tmp):
    """A report of an earlier attempt, told after the run went past it: its checkpoint is of a later
    step than the one recorded, so no snapshot is taken for it (a donor's copy would resume from the
    wrong step), and the event says so for the replay; an on-time report of the same takes one."""
    from gpu_task_scheduler.engine.pauses import Pauses

    root = in_tmp / "r"
    config = make_config(root, [{"lr": [0.1, 0.2, 0.3]}], slots=("cpu",) * 3)
    config["command"] = ["true"]
    config["pbt"] = {"metric": "loss", "mode": "min", "interval": 4, "max_step": 40, "perturb": {"lr": [0.5, 2]}}
    sweep = Sweep(config)
    first, second, third = list(sweep)
    for spec in (first, second):
        os.makedirs(RunPaths(spec.work_dir, None).checkpoint)
    with Ledger(RootPaths(str(root))) as ledger:
        pauses = Pauses(sweep, ledger, root=str(root))
        for spec in (first, second, third):
            pauses.began(spec)
        assert pauses.reached(first, 5, 0.1, late=True) == (4, "continue")
        assert not os.path.exists(os.path.join(first.work_dir, ".gts", "snapshots"))
        assert pauses.reached(second, 5, 0.05) == (4, "copying")  # the top of those at 4: kept, off the loop
        assert pauses.copying
        settled = pauses.settle(wait=True)
        assert settled is not None and settled[3].startswith("snapshot") and not pauses.copying
        assert os.path.isdir(os.path.join(second.work_dir, ".gts", "snapshots", "5"))
        ledger.commit()
        told = {event.name: event.detail for event in ledger.trial_events() if event.kind == "rung"}
    assert told[first.name] == {"late": True} and not (told[second.name] or {}).get("late")


def test_the_loop_stays_responsive_while_a_snapshot_is_copied(in_tmp, monkeypatch, no_leaked_processes):
    """A checkpoint of many GB takes seconds to copy. The copy runs off the loop: here it never
    ends, and a stop asked meanwhile still stops the sweep at once, with nothing recorded of the
    snapshot that was never whole."""
    import threading
    import time

    from gpu_task_scheduler.records import checkpoints
    from gpu_task_scheduler.records.control import request_stop

    entered, release = threading.Event(), threading.Event()

    def stuck(paths, step, cancelled=None):
        entered.set()
        release.wait(120)
        raise OSError("the copy was given up")

    monkeypatch.setattr(checkpoints, "take_snapshot", stuck)
    root = in_tmp / "r"
    asked = []

    def stop_when_copying():
        if entered.wait(60):
            asked.append(time.monotonic())
            request_stop(str(root), "now")

    stopper = threading.Thread(target=stop_when_copying)
    stopper.start()
    try:
        summary = GPUTaskScheduler(_population(root), tasks.ScheduleTask).start()
        ended = time.monotonic()
    finally:
        release.set()
        stopper.join(60)
    assert asked and entered.is_set(), "no snapshot was taken"
    assert ended - asked[0] < 10, f"the stop took {ended - asked[0]:.1f} s while a snapshot was copied"
    assert summary.exit_code != 0 and not summary.succeeded
    events = _events(root)
    assert not any(decision and decision.startswith("snapshot") for _, _, _, decision, _ in events)


def test_pbts_metric_and_mode_declare_which_way_is_better_as_early_stop_and_search_do(in_tmp, capsys):
    """``gts results --best score`` and ``gts importance --metric score`` once asked for a mode the
    config declared under ``pbt``; the page and the report opened on another metric."""
    pytest.importorskip("optuna")
    from gpu_task_scheduler.cli.main import main as gts
    from gpu_task_scheduler.results import declared_modes
    from gpu_task_scheduler.web.data import overview

    root = in_tmp / "r"
    summary = GPUTaskScheduler(_population(root), tasks.ScheduleTask).start()
    assert summary.ok, summary.report()
    assert declared_modes(str(root)) == {"score": "max"}
    assert overview(str(root))["declared"] == [{"metric": "score", "mode": "max"}]
    capsys.readouterr()
    assert gts(["results", str(root), "--best", "score", "--format", "json"]) == 0
    best = json.loads(capsys.readouterr().out)
    scores = {o.name: o.result["score"] for o in summary.succeeded}
    # The best score, whichever member has it: members that copied one checkpoint can tie, and ties
    # are ranked in the sweep's order (the summary lists runs as they ended).
    assert scores[best[0]["name"]] == max(scores.values())
    assert gts(["importance", str(root), "--metric", "score"]) == 0
    assert "score (max, 4 runs)" in capsys.readouterr().out


def test_a_dry_run_says_what_a_start_says_of_pbt_promotion_and_a_budget_on_cpu_slots(in_tmp, capsys):
    from gpu_task_scheduler.cli.main import main as gts

    (in_tmp / "p.yaml").write_text(
        "scheduler_config: {gpu: [cpu, cpu], result_root_folder: r, budget: {gpu_hours: 1}}\n"
        'command: ["true"]\n'
        "test_config: [{lr: [0.1, 0.2, 0.3]}]\n"
        "pbt: {metric: score, mode: max, interval: 4, max_step: 40, perturb: {lr: [0.5, 2]}}\n"
    )
    assert gts(["run", str(in_tmp / "p.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "pbt: population-based training on max score: every 4 steps" in out
    assert "a population of 3 on 2 slot(s); members take turns" in out
    assert "no slot of this sweep has a GPU: it is never spent" in out
    text = (
        (in_tmp / "p.yaml")
        .read_text()
        .replace(
            "pbt: {metric: score, mode: max, interval: 4, max_step: 40, perturb: {lr: [0.5, 2]}}",
            "early_stop: {method: asha, promotion: true, metric: loss, mode: min, min_step: 1, max_step: 27}",
        )
    )
    (in_tmp / "p.yaml").write_text(text)
    assert gts(["run", str(in_tmp / "p.yaml"), "--dry-run"]) == 0
    assert "in a drawn order (the same at every start), not as listed" in capsys.readouterr().out


def _snapshots_left(root):
    """Each member's snapshot folders on disk (a member that has none: left out)."""
    left = {}
    for name in sorted(os.listdir(root)):
        folder = root / name / ".gts" / "snapshots"
        if folder.is_dir() and os.listdir(folder):
            left[name] = sorted(os.listdir(folder))
    return left


@pytest.mark.parametrize("keep", [0, 2])
def test_a_finished_population_leaves_no_snapshot_but_keeps_of_the_best_member(in_tmp, caplog, keep):
    """Once every member has ended, no member copies a snapshot: each is removed, but the ``keep``
    latest of the member that ended best (its value at its latest judgement the highest)."""
    import logging

    root = in_tmp / "r"
    caplog.set_level(logging.INFO, logger="gpu_task_scheduler")
    config = _population(root)
    config["pbt"]["keep"] = keep
    summary = GPUTaskScheduler(config, tasks.ScheduleTask).start()
    assert len(summary.succeeded) == 4 and not summary.failed
    events = _events(root)
    assert any(kind == "rung" and decision.startswith("snapshot") for _, kind, _, decision, _ in events if decision)
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:  # each member's latest judgement
        last = dict(db.execute("SELECT name, value FROM trial_events WHERE kind = 'rung' ORDER BY seq").fetchall())
    best = max(last, key=lambda name: last[name])
    left = _snapshots_left(root)
    assert set(left) <= {best} and all(len(steps) <= keep for steps in left.values()), left
    if keep:  # the best member kept a snapshot of its latest weights, at least (its last interval's)
        assert best in left
    assert "population-based training ended: its members' snapshots removed" in caplog.text


def test_a_snapshot_left_half_copied_by_a_kill_is_cleared_at_the_next_start(in_tmp):
    """A kill -9 while a member's snapshot was copied leaves ``<step>.new``, and a kill after the
    last member ended leaves the snapshots it had not removed yet: the next start clears both."""
    argv = _example(in_tmp, seconds="0")
    subprocess.run(argv, cwd=str(in_tmp), check=True, capture_output=True, timeout=180)
    root = in_tmp / "results" / "pbt"
    assert _snapshots_left(root) == {}
    members = [name for name in sorted(os.listdir(root)) if name.startswith("lr-")]
    for name in members:
        (root / name / ".gts" / "snapshots" / "12.new" / "weights").mkdir(parents=True)
        (root / name / ".gts" / "snapshots" / "8" / "weights").mkdir(parents=True)
    subprocess.run(argv, cwd=str(in_tmp), check=True, capture_output=True, timeout=180)
    assert _snapshots_left(root) == {}


def test_a_snapshot_that_failed_is_recorded_unsaved_and_no_member_copies_it_after_a_restart(in_tmp, monkeypatch):
    """The first snapshot's copy fails (a full disk, say) and the sweep is stopped then: the next
    start replays it as no snapshot, and no member ever copies that member's weights of that step."""
    from gpu_task_scheduler.records import checkpoints
    from gpu_task_scheduler.records.control import request_stop

    root = in_tmp / "r"
    real, failed = checkpoints.take_snapshot, []

    def failing(paths, step, cancelled=None):
        if not failed:
            failed.append((os.path.basename(paths.work_dir), float(step)))
            request_stop(str(root), "now")
            raise OSError(28, "No space left on device")
        return real(paths, step, cancelled=cancelled)

    monkeypatch.setattr(checkpoints, "take_snapshot", failing)
    GPUTaskScheduler(_population(root), tasks.ScheduleTask).start()
    assert failed, "no snapshot was taken"
    monkeypatch.setattr(checkpoints, "take_snapshot", real)
    summary = GPUTaskScheduler(_population(root), tasks.ScheduleTask).start()
    assert summary.exit_code == 0, summary.report()
    (member, step) = failed[0]
    recorded = [
        json.loads(detail or "{}")
        for name, kind, rung, decision, detail in _events(root)
        if name == member and kind == "rung" and decision in ("continue", "yield") and rung is not None
    ]
    assert any(found.get("unsaved") for found in recorded), recorded
    copied = [json.loads(detail) for _, _, _, decision, detail in _events(root) if decision == "exploit"]
    assert all((found["donor"], float(found["step"])) != (member, step) for found in copied), copied


def test_a_member_that_went_on_from_a_copy_has_its_own_snapshots_removed_at_its_first_report(in_tmp):
    """Its own snapshots are of weights it dropped (no member copies them): they go at its first
    report after it went on (its attempt committed), not at its next snapshot, which may never come.
    The donor's snapshot it copied stays while it is the donor's latest (others may copy it)."""
    from gpu_task_scheduler.engine.pauses import Pauses

    root = in_tmp / "r"
    sweep = _three_members(root)
    a, b, c = list(sweep)

    def snapshots():
        folders = {key: os.path.join(spec.work_dir, ".gts", "snapshots") for key, spec in (("a", a), ("c", c))}
        return {key: sorted(os.listdir(folder)) if os.path.isdir(folder) else [] for key, folder in folders.items()}

    with Ledger(RootPaths(str(root))) as ledger:
        pauses = Pauses(sweep, ledger, root=str(root))
        for spec in sweep:
            pauses.began(spec)

        def report(spec, step, value):
            told = pauses.reached(spec, step, value)
            if told is not None and told[1] == "copying":
                return pauses.settle(wait=True)[3]
            if told is not None and told[1] == "exploit":  # it pauses, and goes on from the copy at once
                pauses.paused(spec)
                assert pauses.owed() == spec
                pauses.resuming(spec)
                pauses.resumed(spec)
            return None if told is None else told[1]

        for spec, step, value in [(c, 4, 0.05), (a, 4, 0.1), (b, 4, 0.2), (c, 8, 0.02), (a, 8, 0.01), (b, 8, 0.5)]:
            report(spec, step, value)
        assert snapshots() == {"a": ["8"], "c": ["8"]}  # each one's latest
        assert report(c, 12, 0.9) == "exploit"  # c copies a's snapshot of 8
        assert snapshots() == {"a": ["8"], "c": ["8"]}  # until its attempt is committed
        assert report(c, 10, 0.5) is None  # its first report: at no interval
        assert snapshots() == {"a": ["8"], "c": []}


def test_a_snapshot_that_would_pass_checkpoints_max_disk_is_not_taken_and_gts_status_says_so(in_tmp, caplog):
    """``checkpoints: {max_disk}`` bounds what the population's checkpoints and snapshots take: a
    snapshot that would pass it is not taken (recorded unsaved: the member is offered to no one
    there), the log says why, and gts status shows the disk used and the snapshots refused."""
    from gpu_task_scheduler.engine.pauses import Pauses
    from gpu_task_scheduler.records import checkpoints
    from gpu_task_scheduler.reports.status import format_status, status

    root = in_tmp / "r"
    one = _three_members(in_tmp / "measure")  # what a member's checkpoint takes on this file system
    size = checkpoints.disk_use(RunPaths(next(iter(one)).work_dir, None))
    assert size > 0
    sweep = _three_members(root, checkpoints={"max_disk": 4 * size})  # the 3 checkpoints and 1 snapshot
    a, b, c = list(sweep)
    with Ledger(RootPaths(str(root))) as ledger:
        pauses = Pauses(sweep, ledger, root=str(root))
        for spec in sweep:
            pauses.began(spec)
        decided = []
        for spec, step, value in [(c, 4, 0.05), (a, 4, 0.1), (b, 4, 0.2), (c, 8, 0.02)]:
            told = pauses.reached(spec, step, value)
            decided.append(pauses.settle(wait=True)[3] if told is not None and told[1] == "copying" else told[1])
        ledger.commit()
        rungs = [(e.name, e.rung, e.decision, e.detail or {}) for e in ledger.trial_events() if e.kind == "rung"]
    assert decided[0] == "snapshot" and decided[3] == "continue"  # c's second would need 5 checkpoints' room
    assert rungs[-1][3].get("over_disk") and rungs[-1][3].get("unsaved")
    assert "past checkpoints: {max_disk: " in caplog.text and "no member copies it there" in caplog.text
    assert sorted(os.listdir(os.path.join(c.work_dir, ".gts", "snapshots"))) == ["4"]
    shown = format_status(status(str(root)))
    assert f"checkpoints: {format_size(4 * size)} on disk" in shown, shown
    assert "1 snapshot(s) not taken for it" in shown, shown


def _three_members(root, **options):
    config = make_config(root, [{"lr": [0.1, 0.2, 0.3]}], slots=("cpu",) * 3, **options)
    config["command"] = ["true"]
    config["pbt"] = {"metric": "loss", "mode": "min", "interval": 4, "max_step": 40, "perturb": {"lr": [0.5, 2]}}
    sweep = Sweep(config)
    for spec in sweep:
        os.makedirs(RunPaths(spec.work_dir, None).checkpoint)
        with open(os.path.join(RunPaths(spec.work_dir, None).checkpoint, "w.pt"), "wb") as handle:
            handle.write(b"w")
    return sweep


def _held_copy(monkeypatch):
    """take_snapshot that copies, then waits until released before it puts the copy in place."""
    import threading

    from gpu_task_scheduler.records import checkpoints

    real, entered, release = checkpoints.take_snapshot, threading.Event(), threading.Event()

    def held(paths, step, cancelled=None):
        def asked():
            entered.set()
            release.wait(30)
            return cancelled is not None and cancelled()

        return real(paths, step, cancelled=asked)

    monkeypatch.setattr(checkpoints, "take_snapshot", held)
    return entered, release


@contextlib.contextmanager
def _first_members_snapshot_held(root, monkeypatch):
    """Three members began; the first reported at its interval and its snapshot is being copied,
    held before it is put in place until ``release`` is set: ``(sweep, ledger, pauses, release)``."""
    from gpu_task_scheduler.engine.pauses import Pauses

    sweep = _three_members(root)
    entered, release = _held_copy(monkeypatch)
    with Ledger(RootPaths(str(root))) as ledger:
        pauses = Pauses(sweep, ledger, root=str(root))
        for spec in sweep:
            pauses.began(spec)
        assert pauses.reached(next(iter(sweep)), 4, 0.1) == (4, "copying")
        assert entered.wait(30)
        yield sweep, ledger, pauses, release


def test_a_member_that_ends_during_its_own_snapshots_copy_gives_it_up_and_no_snapshot_comes_before_its_end(
    in_tmp, monkeypatch
):
    import threading

    with _first_members_snapshot_held(in_tmp / "r", monkeypatch) as (sweep, ledger, pauses, release):
        first = next(iter(sweep))
        pauses.abandon(first.name)  # it ended (stopped, killed) while its snapshot was copied
        pauses.ended(first.name)
        release.set()
        assert not pauses.copying
        for thread in threading.enumerate():  # the given-up copy, as it clears what it made
            if thread.name == f"gts-snapshot-{first.name}":
                thread.join(30)
        ledger.commit()
        events = [(e.kind, e.name, e.decision, e.detail) for e in ledger.trial_events() if e.name == first.name]
    snapshots = os.path.join(first.work_dir, ".gts", "snapshots")
    assert not os.path.exists(snapshots) or os.listdir(snapshots) == []  # nothing left of the copy
    kinds = [kind for kind, *_ in events]
    assert kinds[-2:] == ["rung", "ended"]  # the no-snapshot decision, then its end
    assert events[-2][2] == "continue" and events[-2][3].get("unsaved")


def test_an_end_told_while_another_members_snapshot_is_copied_is_recorded_after_that_decision(
    in_tmp, monkeypatch, caplog
):
    from gpu_task_scheduler.engine.pauses import Pauses

    root = in_tmp / "r"
    with _first_members_snapshot_held(root, monkeypatch) as (sweep, ledger, pauses, release):
        first, _, third = list(sweep)
        pauses.ended(third.name)  # another member ends meanwhile
        release.set()
        settled = pauses.settle(wait=True)
        assert settled is not None and settled[3].startswith("snapshot")
        ledger.commit()
        order = [(e.kind, e.name) for e in ledger.trial_events() if e.kind in ("rung", "ended")]
        assert order == [("rung", first.name), ("ended", third.name)]
        caplog.clear()
        Pauses(sweep, ledger, root=str(root))  # a restart replays the same decisions
    assert "differ" not in caplog.text and "do not fit" not in caplog.text


def test_a_decision_that_kept_no_snapshot_then_replays_without_one_under_a_rule_that_keeps_it(in_tmp, caplog):
    """A sweep begun by a version that kept no snapshot of a member first at an interval (ranked at
    an earlier one, in the middle): replayed now, the rule would keep one, but none was taken. It
    is offered to no member (a copy of it would find nothing) and the log says the decision differs."""
    _, method, (_, second, third) = _replayed(
        in_tmp,
        caplog,
        [
            (0, 4, 0.9, "snapshot"),
            (1, 4, 0.1, "snapshot"),
            (2, 4, 0.5, "continue"),
            (2, 8, 0.4, "continue"),  # the first at 8: kept now, not by the version that decided it
        ],
    )
    assert method.needed_snapshots(third) == set()
    assert method.needed_snapshots(second) == {4}
    assert "1 recorded decision(s)" in caplog.text and "another version" in caplog.text


def test_a_copy_that_a_later_rule_decides_is_not_made_by_a_replay_of_a_member_that_went_on(in_tmp, caplog):
    """A sweep begun by a version whose bottom quantile held a member that had ended: a member that
    trains on, the worst of those that do, went on there. Replayed now, the rule sends it to copy
    the top member; the copy was never made, so nothing waits for it: it goes on as it did."""
    pauses, method, (_, _, third) = _replayed(
        in_tmp,
        caplog,
        [
            (0, 4, 0.9, "snapshot"),
            (0, "ended"),  # it ended there (failed, or ran ahead to its end)
            (1, 4, 0.1, "snapshot"),
            (2, 4, 0.5, "continue"),
        ],
    )
    assert method.exploit_of(third) is None and not method.paused and pauses.owed() is None
    assert method.rung_reached(third, 8) == 8  # judged at its next interval, as it went on
    assert "1 recorded decision(s)" in caplog.text and "another version" in caplog.text


def test_a_wait_that_a_later_rule_decides_is_not_made_by_a_replay_of_a_member_that_went_on(in_tmp, caplog):
    """A sweep begun by a version that held back no member of a population with a slot each: a
    member judged at 8 before the others reached 4 went on. Replayed now, the rule makes it wait for
    them; it did not, so it waits for nothing, and it is judged at its next interval."""
    pauses, method, (first, _, _) = _replayed(
        in_tmp, caplog, [(0, 4, 0.9, "snapshot"), (0, 8, 0.8, "snapshot")], slots=3
    )
    assert not method.paused and pauses.owed() is None
    assert method.rung_reached(first, 12) == 12 and method.needed_snapshots(first) == {8}
    assert "1 recorded decision(s)" in caplog.text and "another version" in caplog.text


def _replayed(in_tmp, caplog, events, slots=1):
    """Three members' ledger as an earlier start left it, then replayed by a new start (running
    ``slots`` at once): its Pauses, its method and the members' names. ``events``: (member's index,
    step, value, decision) for a judgement, (index, "ended") for an end; the log is cleared before
    the replay."""
    from gpu_task_scheduler.engine.pauses import Pauses

    root = in_tmp / "r"
    sweep = _three_members(root)
    sweep.parallel = slots  # as the engine sets it
    names = [spec.name for spec in sweep]
    with Ledger(RootPaths(str(root))) as ledger:
        Pauses(sweep, ledger, root=str(root))  # records the method's keys, as a start does
        for spec in sweep:
            ledger.record_trial_event("began", name=spec.name, bracket=0, detail={"values": {"lr": spec.config["lr"]}})
        for index, *event in events:
            if event == ["ended"]:
                ledger.record_trial_event("ended", name=names[index])
                continue
            step, value, decision = event
            ledger.record_trial_event(
                "rung", name=names[index], rung=float(step), step=float(step), value=value, decision=decision
            )
        ledger.commit()
        caplog.clear()
        pauses = Pauses(sweep, ledger, root=str(root))
    return pauses, pauses._methods[None], names
