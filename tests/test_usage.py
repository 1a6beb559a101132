"""What runs cost: GPU-seconds split by measured memory, energy from NVML's counter, and the
GPU-hour budget (a sweep that starts no run once it is spent, also across kill -9)."""

import json
import os
import random
import sqlite3
import subprocess
import sys
import time

import fake_nvml
import gts_test_tasks as tasks
import pytest
from conftest import marked_pids, wait_until
from helpers import ledger_rows, make_config
from test_process_control import finish

from gpu_task_scheduler import GPUTaskScheduler
from gpu_task_scheduler.gpu.capacity import Capacity
from gpu_task_scheduler.gpu.devices import Slot
from gpu_task_scheduler.gpu.usage import GpuClock, Usage
from gpu_task_scheduler.sweep.options import parse_scheduler_config

GB = 10**9
TESTS = os.path.dirname(os.path.abspath(__file__))
KILL_SEED = int(os.environ.get("GTS_KILL_SEED", "0"))


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


# --- the arithmetic ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "steps, expected",
    [
        # one run alone on one GPU: its duration
        ([("begin", 1, ("0",)), (10, "end", 1)], {1: 10.0}),
        # a slot of two GPUs: two GPU-seconds a second
        ([("begin", 1, ("0", "1")), (4, "end", 1)], {1: 8.0}),
        # two runs on one GPU, nothing measured: equal shares
        ([("begin", 1, ("0",)), ("begin", 2, ("0",)), (10, "end", 1), (20, "end", 2)], {1: 5.0, 2: 15.0}),
        # measured 3 GB and 1 GB: 3/4 and 1/4 from the look on
        (
            [
                ("begin", 1, ("0",)),
                ("begin", 2, ("0",)),
                ("look", {1: {"0": 3}, 2: {"0": 1}}),
                (8, "end", 1),
                (8, "end", 2),
            ],
            {1: 6.0, 2: 2.0},
        ),
        # runs on different GPUs do not share
        ([("begin", 1, ("0",)), ("begin", 2, ("1",)), (5, "end", 1), (5, "end", 2)], {1: 5.0, 2: 5.0}),
        # nothing allocated yet by either: equal, even after a look
        ([("begin", 1, ("0",)), ("begin", 2, ("0",)), ("look", {}), (4, "end", 1), (4, "end", 2)], {1: 2.0, 2: 2.0}),
    ],
)
def test_gpu_seconds_split_the_busy_time_by_measured_memory(steps, expected):
    clock = Clock()
    gpu_clock = GpuClock(clock)
    got = {}
    for step in steps:
        if isinstance(step[0], (int, float)):
            clock.now = step[0]  # the time of what follows
            step = step[1:]
        kind, *args = step
        if kind == "begin":
            gpu_clock.begin(*args)
        elif kind == "look":
            gpu_clock.look(*args)
        else:
            got[args[0]] = gpu_clock.end(args[0]).gpu_seconds
    assert got == pytest.approx(expected)
    assert gpu_clock.total == pytest.approx(sum(expected.values()))  # they add up to the busy time


def test_energy_is_split_as_time_is_and_a_reset_counter_loses_only_its_interval():
    clock = Clock()
    gpu_clock = GpuClock(clock)
    gpu_clock.begin(1, ("0",), {"0": 1_000_000})  # mJ
    gpu_clock.begin(2, ("0",), {"0": 1_000_000})
    clock.now = 10
    gpu_clock.look({1: {"0": 3}, 2: {"0": 1}}, {"0": 3_000_000})  # 2,000 J in equal shares
    clock.now = 20
    gpu_clock.look(None, {"0": 4_000_000})  # 1,000 J at 3:1
    clock.now = 30
    gpu_clock.look(None, {"0": 500})  # the driver reloaded: the counter started again, that interval is lost
    clock.now = 40
    first = gpu_clock.end(1, {"0": 400_500})  # 400 J at 3:1
    assert first == Usage(pytest.approx(5 + 7.5 + 7.5 + 7.5), pytest.approx(1000 + 750 + 300))
    assert gpu_clock.end(2, {"0": 400_500}).joules == pytest.approx(1000 + 250 + 100)


def test_a_gpu_without_an_energy_counter_gives_no_energy_not_zero():
    clock = Clock()
    gpu_clock = GpuClock(clock)
    gpu_clock.begin(1, ("0",), {"0": None})
    clock.now = 5
    assert gpu_clock.end(1, {"0": None}) == Usage(5.0, None)


def test_unsaved_hands_out_each_part_once_and_spent_counts_the_current_interval():
    clock = Clock()
    gpu_clock = GpuClock(clock)
    gpu_clock.begin(7, ("0",))
    clock.now = 3
    assert gpu_clock.spent() == pytest.approx(3.0)
    assert gpu_clock.unsaved() == {7: Usage(pytest.approx(3.0), None)}
    assert gpu_clock.unsaved() == {}
    clock.now = 5
    assert gpu_clock.saved(7).gpu_seconds == pytest.approx(3.0)
    assert gpu_clock.end(7).gpu_seconds == pytest.approx(5.0)  # all of it; the ledger adds 5 - 3 at the end


def test_a_cluster_slot_costs_its_duration_times_the_gpus_it_asked_for():
    options = parse_scheduler_config({"gpu": ["cpu"], "result_root_folder": "/nonexistent"})
    slots = [Slot("gpu0", ()), Slot("gpu1", ())]
    capacity = Capacity(options, slots=slots, slot_gpus=lambda slot: 2.0)
    try:
        capacity.take(0, -1, None, "a")
        released = capacity.release(0, -1, 30.0)
        assert released.usage == Usage(60.0) and released.unsaved == Usage(60.0)
        assert capacity.gpus_of(slots[1]) == 2.0
    finally:
        capacity.close()


# --- a sweep on fake GPUs ----------------------------------------------------------------------


@pytest.fixture
def one_gpu(in_tmp, monkeypatch):
    path = in_tmp / "nvml.json"
    monkeypatch.setenv(fake_nvml.ENV, str(path))
    fake_nvml.write_state(str(path), [{"name": "Fake H100 80GB", "total": 80 * GB, "power": 200.0}])
    return path


def test_two_runs_sharing_a_gpu_add_up_to_its_busy_time(one_gpu, in_tmp):
    """The done-when case: two runs packed on one (fake NVML) GPU; their GPU-seconds add up to the
    time the GPU was busy with either, within 5 %, the one that holds more memory gets more, and
    the energy is what the GPU drew meanwhile (its steady 200 W)."""
    config = make_config(
        in_tmp / "r",
        [{"alloc_gb": [30, 10]}],
        slots=("0",),
        max_runs_per_gpu=2,
        gpu_poll_interval=0.1,
        global_config={"gpu_memory": "20GB", "hold": 2.0},
    )
    summary = GPUTaskScheduler(config, tasks.FakeGpuTask, nvml=fake_nvml).start()
    assert summary.ok and len(summary.succeeded) == 2
    rows = ledger_rows(in_tmp / "r")
    together = min(r["ended_at"] for r in rows.values()) - max(r["started_at"] for r in rows.values())
    assert together > 1.5  # side by side for most of their 2 s
    # Two at a time on the one GPU: its busy time is the union of the runs' intervals.
    intervals = sorted((row["started_at"], row["ended_at"]) for row in rows.values())
    busy, (start, end) = 0.0, intervals[0]
    for begin, finish_at in intervals[1:]:
        if begin > end:
            busy, start = busy + end - start, begin
        end = max(end, finish_at)
    busy += end - start
    total = sum(row["gpu_seconds"] for row in rows.values())
    assert total == pytest.approx(busy, rel=0.05)
    assert sum(row["energy"] for row in rows.values()) == pytest.approx(200.0 * total, rel=0.05)
    for outcome in summary.succeeded:
        assert outcome.gpu_seconds == pytest.approx(rows[outcome.name]["gpu_seconds"])
    # 30 GB and 10 GB held side by side: from the first look that saw both, 3/4 and 1/4.
    heavy, light = rows["alloc_gb-30,"]["gpu_seconds"], rows["alloc_gb-10,"]["gpu_seconds"]
    assert heavy > 2 * light, (heavy, light)


def test_a_gpu_without_an_energy_counter_records_no_energy(one_gpu, in_tmp):
    fake_nvml.set_gpu(0, power=None)
    config = make_config(in_tmp / "r", [{"alloc_gb": [1]}], slots=("0",), global_config={"hold": 0.2})
    assert GPUTaskScheduler(config, tasks.FakeGpuTask, nvml=fake_nvml).start().ok
    (row,) = ledger_rows(in_tmp / "r").values()
    assert row["gpu_seconds"] > 0.1 and row["energy"] is None


def test_cpu_runs_cost_no_gpu_seconds_and_a_budget_there_is_said_to_be_never_spent(in_tmp, caplog):
    config = make_config(in_tmp / "r", [{"i": [0, 1]}], budget={"gpu_hours": 1})
    assert GPUTaskScheduler(config, tasks.RecordTask).start().ok
    assert {row["gpu_seconds"] for row in ledger_rows(in_tmp / "r").values()} == {None}
    assert "no slot of this sweep has a GPU: it is never spent" in caplog.text


def test_a_ledger_of_the_schema_before_gains_the_columns(one_gpu, in_tmp):
    config = make_config(in_tmp / "r", [{"alloc_gb": [1]}], slots=("0",), global_config={"hold": 0})
    assert GPUTaskScheduler(config, tasks.FakeGpuTask, nvml=fake_nvml).start().ok
    db = sqlite3.connect(in_tmp / "r" / ".gts" / "ledger.sqlite3")
    db.execute("ALTER TABLE runs DROP COLUMN gpu_seconds")
    db.execute("ALTER TABLE runs DROP COLUMN energy")
    db.execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    config["scheduler_config"]["force_rerun"] = True
    assert GPUTaskScheduler(config, tasks.FakeGpuTask, nvml=fake_nvml).start().ok
    (row,) = ledger_rows(in_tmp / "r").values()
    assert row["gpu_seconds"] > 0


# --- the budget ----------------------------------------------------------------------------------


def _budget_config(root, *, runs, hold, gpu_hours):
    return make_config(
        root,
        [{"i": list(range(runs))}],
        slots=("0",),
        gpu_poll_interval=0.1,
        budget={"gpu_hours": gpu_hours},
        global_config={"alloc_gb": 1, "hold": hold},
    )


def test_a_spent_budget_starts_no_new_run_and_says_so(one_gpu, in_tmp):
    config = _budget_config(in_tmp / "r", runs=10, hold=0.4, gpu_hours=1.0 / 3600)  # 1 GPU-second
    summary = GPUTaskScheduler(config, tasks.FakeGpuTask, nvml=fake_nvml).start()
    ran = len(summary.succeeded)
    assert 2 <= ran <= 4, ran  # 0.4 s each (and a little more): the third start finds about 1 s spent
    assert summary.exit_code == 0 and summary.interrupted_by is None
    assert len(summary.not_started) == 10 - ran
    assert summary.budget_spent.startswith("the budget of 1 GPU-hours is spent") is False  # 1 s, not 1 h
    assert "the budget of 0.0002778 GPU-hours is spent" in summary.budget_spent
    report = summary.report()
    assert "stopped: the budget of" in report and "the budget was spent before their turn" in report
    spent = sum(row["gpu_seconds"] or 0 for row in ledger_rows(in_tmp / "r").values())
    assert spent < 1.0 + 0.6  # overshot by at most the one run that was running
    again = GPUTaskScheduler(config, tasks.FakeGpuTask, nvml=fake_nvml).start()
    assert not again.succeeded and again.budget_spent and again.exit_code == 0


def _attempts(marks):
    """Each attempt's (start, end or None) from the lines the runs appended to ``marks``."""
    started, ended = {}, {}
    with open(marks) as handle:
        for line in handle:
            kind, token, at = line.split()
            (started if kind == "start" else ended)[token] = float(at)
    return [(at, ended.get(token)) for token, at in started.items()]


def test_a_budget_killed_twice_is_never_overshot_by_more_than_the_runs_running(one_gpu, in_tmp, no_leaked_processes):
    """``gts run`` on a command sweep with a budget of 3 GPU-seconds on one GPU, killed with -9 twice at
    random moments: what every attempt actually ran, measured by the runs themselves, stays within
    the budget plus the run running (0.5 s) at each kill and at the end."""
    rng = random.Random(KILL_SEED)
    marks = in_tmp / "marks"
    script = (
        "import os, sys, time, uuid; t = uuid.uuid4().hex; m = sys.argv[1]\n"
        "open(m, 'a').write(f'start {t} {time.time()}\\n')\n"
        "time.sleep(0.5)\n"
        "open(m, 'a').write(f'end {t} {time.time()}\\n')\n"
    )
    (in_tmp / "run.py").write_text(script)
    (in_tmp / "sweep.yaml").write_text(
        "scheduler_config:\n"
        "  gpu: ['0']\n"
        f"  result_root_folder: {in_tmp / 'r'}\n"
        "  gpu_poll_interval: 0.1\n"
        "  grace_period: 1\n"
        "  budget: {gpu_hours: %r}\n"
        "test_config:\n"
        "  - i: [%s]\n"
        "command: ['%s', '%s', '%s', '--i', '{i}']\n"
        % (3.0 / 3600, ", ".join(map(str, range(30))), sys.executable, in_tmp / "run.py", marks)
    )
    env = {
        **os.environ,
        "GTS_NVML_MODULE": "fake_nvml",
        "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]),
    }
    argv = [sys.executable, "-m", "gpu_task_scheduler", "run", str(in_tmp / "sweep.yaml"), "--plain"]
    kills = []
    for _ in range(2):
        scheduler = subprocess.Popen(argv, cwd=str(in_tmp), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            scheduler.wait(timeout=rng.uniform(0.7, 1.6))
        except subprocess.TimeoutExpired:
            scheduler.kill()
            kills.append(time.time())
        finish(scheduler)
        wait_until(lambda: not marked_pids(no_leaked_processes), timeout=10, message="the runs to die")
    last = subprocess.run(argv, cwd=str(in_tmp), env=env, capture_output=True, text=True, timeout=120)
    assert last.returncode == 0, last.stderr
    assert "stopped: the budget of" in last.stderr
    assert len(kills) == 2
    attempts = _attempts(marks)
    ran = 0.0
    for start, end in attempts:
        if end is None:  # killed: it ran until the kill after its start
            # (None after it: its scheduler was killed as its interpreter started, and its first line
            # came after that kill; the keeper then killed it at once, so it ran no time to speak of.)
            end = min((kill for kill in kills if kill >= start), default=start)
        ran += end - start
    # A run the kill left running ends by itself (engine: NATURAL_END) after the last look saved its
    # GPU-seconds: each kill and the last start may each overshoot by the one run running then. The
    # recorded GPU-seconds also count each attempt's start (the interpreter, before its first line).
    assert 2.0 <= ran <= 3.0 + 3 * 0.5 + 0.3, attempts
    recorded = sum(row["gpu_seconds"] or 0 for row in ledger_rows(in_tmp / "r").values())
    # Unrecorded: at most the run running at each kill, as long as a run took here (0.5 s and its
    # lines' writes: 0.52 s quiet, more on a loaded machine; a fixed 0.6 s failed a loaded CI run
    # by 17 ms).
    longest = max(end - start for start, end in attempts if end is not None)
    assert ran - 2 * (longest + 0.1) <= recorded <= ran + 0.2 * len(attempts), (attempts, recorded)


# --- where the cost shows ----------------------------------------------------------------------


def _gts(*args):
    return subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", *map(str, args)], capture_output=True, text=True, timeout=60
    )


def test_status_results_and_gpu_hours_to_show_what_the_runs_cost(one_gpu, in_tmp):
    root = in_tmp / "r"
    config = make_config(root, [{"i": [3, 1, 2]}], slots=("0",), global_config={"alloc_gb": 1, "hold": 0.3})
    assert GPUTaskScheduler(config, tasks.FakeGpuTask, nvml=fake_nvml).start().ok
    rows = ledger_rows(root)
    seconds = {name: row["gpu_seconds"] for name, row in rows.items()}
    # Each held its GPU for a while, and never longer than it held its slot: its GPU time runs from
    # the scheduler's look as it starts to its look as it ends (how much of the 0.3 s hold that
    # covers depends on how soon the scheduler looks, on a loaded machine).
    assert all(0 < value <= rows[name]["slot_seconds"] + 0.05 for name, value in seconds.items()), (seconds, rows)

    status = _gts("status", root)
    assert f"spent: {sum(seconds.values()) / 3600:.4g} GPU-hours" in status.stdout, status.stdout
    assert "gpu h" in status.stdout.splitlines()[2]
    report = json.loads(_gts("status", root, "--json").stdout)
    assert report["gpu_seconds"] == pytest.approx(sum(seconds.values()))
    assert {run["name"]: run["gpu_seconds"] for run in report["runs"]} == pytest.approx(seconds)

    table = json.loads(_gts("results", root, "--format", "json").stdout)
    assert {row["name"]: row["gpu_hours"] * 3600 for row in table} == pytest.approx(seconds)
    assert all(row["energy_kwh"] > 0 for row in table)

    # One slot: the runs ran one after another, so i <= 1 was first reached when i-1 ended, after
    # the GPU-seconds of i-3 and i-1.
    told = _gts("results", root, "--gpu-hours-to", "i<=1", "--format", "json")
    found = json.loads(told.stdout)
    assert found["reached"] and found["run"] == "i-1," and found["runs_ended"] == 2
    assert found["gpu_hours"] * 3600 == pytest.approx(seconds["i-3,"] + seconds["i-1,"])
    text = _gts("results", root, "--gpu-hours-to", "i <= 1")
    assert text.returncode == 0 and "i <= 1: first reached by i-1," in text.stdout
    never = _gts("results", root, "--gpu-hours-to", "i<0")
    assert never.returncode == 1 and "no run reached it (the best value: 1)" in never.stderr
    for bad, words in [("i=1", "is no condition"), ("i<=x", "'x' is not a number"), ("ii<=1", "did you mean 'i'")]:
        refused = _gts("results", root, "--gpu-hours-to", bad)
        assert refused.returncode != 0 and words in refused.stderr, (bad, refused.stderr)


def test_gpu_hours_to_counts_a_run_still_running_then_only_up_to_that_moment(tmp_path):
    """A run that ran on past the moment the condition was first met counts the part of its
    GPU-seconds up to that moment, by time, not all of them."""
    import sqlite3

    from helpers import record_started

    from gpu_task_scheduler.errors import ConfigError
    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.paths import RootPaths
    from gpu_task_scheduler.records.status import RunStatus
    from gpu_task_scheduler.results import gpu_hours_to

    root = tmp_path / "r"
    planted = {  # name: (loss, started, ended, GPU-seconds)
        "first": (0.1, 0.0, 100.0, 100.0),  # reaches loss <= 0.2 when it ends, at 100
        "longer": (0.5, 50.0, 250.0, 200.0),  # ran 50 of its 200 s by then: 50 count
        "later": (0.4, 150.0, 200.0, 40.0),  # began after: nothing counts
    }
    with Ledger(RootPaths(str(root))) as ledger:
        for index, (name, (loss, *_)) in enumerate(planted.items()):
            record_started(ledger, root, index, name, {"k": index})
            ledger.finish(name, RunStatus.SUCCEEDED, result=json.dumps({"loss": loss}))
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:
        for name, (_, started, ended, seconds) in planted.items():
            db.execute(
                "UPDATE runs SET started_at = ?, ended_at = ?, gpu_seconds = ? WHERE name = ?",
                (1e9 + started, 1e9 + ended, seconds, name),
            )
    found = gpu_hours_to(str(root), "loss<=0.2")
    assert found["reached"] and found["run"] == "first" and found["runs_ended"] == 1
    assert found["gpu_hours"] * 3600 == pytest.approx(100 + 50)
    assert found["total_gpu_hours"] * 3600 == pytest.approx(340)
    for bad in ("loss<=nan", "loss<=inf", "loss" + " " * 20000 + "<=x y"):
        with pytest.raises(ConfigError):
            gpu_hours_to(str(root), bad)


def test_a_running_runs_held_time_and_spans_include_its_current_attempt(tmp_path):
    """Its ended attempts (10 s) and the one running since 100 s (until now, 130 s): 40 s, in the
    run's record, in the root's total and in its spans."""
    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.paths import RootPaths
    from gpu_task_scheduler.records.status import RunStatus

    now = [0.0]
    with Ledger(RootPaths(str(tmp_path)), clock=lambda: now[0]) as ledger:
        ledger.mark_running(name="a,", run_index=0, config_hash="h", slot="cpu0", token="t1", work_dir="a,")
        now[0] = 10.0
        ledger.finish("a,", RunStatus.INTERRUPTED, cause="stopped")
        now[0] = 100.0
        ledger.mark_running(name="a,", run_index=0, config_hash="h", slot="cpu1", token="t2", work_dir="a,")
        record = ledger.get("a,")
        assert record is not None and record.status is RunStatus.RUNNING
        assert record.held_seconds(130.0) == 40.0
        assert ledger.held_seconds(130.0) == 40.0
        assert record.attempt_spans(130.0, running=True) == [("cpu0", 0.0, 10.0), ("cpu1", 100.0, 130.0)]
        now[0] = 150.0
        ledger.finish("a,", RunStatus.SUCCEEDED)
        ended = ledger.get("a,")
        assert ended.held_seconds(1000.0) == 60.0 and ledger.held_seconds(1000.0) == 60.0
