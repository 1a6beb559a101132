"""The contract every launcher keeps, run against each: the local one (real processes), the
fake one (no processes, fake clock) and the Ray one (a local Ray instance, see conftest.py).

Each case is a small sweep whose runs behave as their config says (``seconds``, ``exit``, ``oom``,
``trap_term``, ``term_takes``; see fake_launcher.py and gts_test_tasks.ContractTask).
"""

import contextlib
import json
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid

import gts_test_tasks as tasks
import pytest
from conftest import MARK, TESTS, marked_pids, wait_until
from fake_launcher import FakeWorld
from helpers import journal_lines, ledger_rows, make_config
from test_process_control import finish

from gpu_task_scheduler.backends.local.launcher import LocalLauncher
from gpu_task_scheduler.backends.ray.launcher import RayLauncher
from gpu_task_scheduler.backends.slurm.launcher import SlurmLauncher
from gpu_task_scheduler.backends.slurm.pool import PoolLauncher
from gpu_task_scheduler.engine.hooks import Hooks, Inbox
from gpu_task_scheduler.engine.launcher import Attempt
from gpu_task_scheduler.engine.loop import Scheduler
from gpu_task_scheduler.gpu.devices import Slot
from gpu_task_scheduler.records.ledger import Ledger
from gpu_task_scheduler.records.paths import RootPaths, RunPaths
from gpu_task_scheduler.records.status import RunStatus
from gpu_task_scheduler.sweep.expand import Sweep


class SignalOnStart(Hooks):
    """Posts a stop signal (once, or twice) once ``runs`` runs have started and are ready for it
    (their signal handlers are in place)."""

    def __init__(self, times=1, runs=1):
        self.times, self.runs = times, runs
        self.started = []
        self.scheduler = None

    def on_run_start(self, spec, slot):
        self.started.append(os.path.join(spec.work_dir, "ready"))
        if len(self.started) == self.runs:
            if self.scheduler.options.backend == "slurm":  # queued once the engine's pass is over: not here
                threading.Thread(target=self._signal, daemon=True).start()
            else:
                self._signal()

    def _signal(self):
        wait_until(lambda: all(os.path.exists(ready) for ready in self.started), timeout=60, message="the runs")
        for _ in range(self.times):
            self.scheduler.inbox.put("signal", signal.SIGINT)


def run_sweep(backend, config, hooks=None):
    if backend in ("ray", "slurm", "pool"):
        config["scheduler_config"]["backend"] = "slurm" if backend == "pool" else backend
    if backend in ("slurm", "pool"):
        config["scheduler_config"]["slurm"] = {"poll_interval": 0.5, **POOL.get(backend, {})}
    sweep = Sweep(config)
    if backend == "fake":
        world = FakeWorld()
        scheduler = Scheduler(sweep, world, clock=world.clock, inbox=world, hooks=hooks)
        launcher = contextlib.nullcontext()
    elif backend == "ray":
        launcher = RayLauncher(tasks.ContractTask, sweep.options)
        scheduler = Scheduler(sweep, launcher, inbox=Inbox(), hooks=hooks)
    elif backend in ("slurm", "pool"):
        launcher = (PoolLauncher if backend == "pool" else SlurmLauncher)(tasks.ContractTask, sweep.options)
        scheduler = Scheduler(sweep, launcher, inbox=Inbox(), hooks=hooks)
    else:
        launcher = LocalLauncher(tasks.ContractTask, grace_period=sweep.options.grace_period)
        scheduler = Scheduler(sweep, launcher, inbox=Inbox(), hooks=hooks)
        launcher = contextlib.nullcontext()
    if hooks is not None:
        hooks.scheduler = scheduler
    with launcher:
        return scheduler.run()


BACKENDS = [
    "local",
    "fake",
    pytest.param("ray", marks=[pytest.mark.xdist_group("clusters")]),
    pytest.param("slurm", marks=[pytest.mark.xdist_group("clusters")]),
    pytest.param("pool", marks=[pytest.mark.xdist_group("clusters")]),
]
# The pool: one allocation of the two-node test Slurm, two slots a node (conftest.slurm_pool).
POOL = {"pool": {"pool": {"nodes": 2, "slots_per_node": 2, "idle_exit": 2}}}


@pytest.fixture(params=BACKENDS)
def backend(request):
    if request.param == "ray":
        request.getfixturevalue("ray_instance")
    if request.param == "slurm":
        request.getfixturevalue("slurm")
    if request.param == "pool":
        request.getfixturevalue("slurm_pool")
    return request.param


def test_one_run(backend, tmp_path):
    summary = run_sweep(backend, make_config(tmp_path / "r", [{"seconds": [0.1]}]))
    (outcome,) = summary.succeeded
    assert outcome.result == {"name": "seconds-0.1,"} and outcome.attempts == 1
    assert ledger_rows(tmp_path / "r")["seconds-0.1,"]["status"] == "succeeded"


def test_many_runs_share_the_slots_one_run_each(backend, tmp_path):
    if backend in ("slurm", "pool"):
        pytest.skip(
            "Slurm's slots are places in its queue (max_parallel: test_slurm.py; a pool's nodes: test_slurm_pool.py)"
        )
    root = tmp_path / "r"
    summary = run_sweep(backend, make_config(root, [{"i": list(range(6)), "seconds": [0.2]}], slots=("cpu", "cpu")))
    assert len(summary.succeeded) == 6 and summary.ok
    rows = ledger_rows(root).values()
    for slot in ("cpu0", "cpu1"):
        spans = sorted((r["started_at"], r["ended_at"]) for r in rows if r["slot"] == slot)
        assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:], strict=False))


def test_what_a_run_reports_reaches_the_ledger(backend, tmp_path):
    if backend == "fake":
        pytest.skip("the fake launcher's runs are no processes: they write no file")
    run_sweep(backend, make_config(tmp_path / "r", [{"report": [4], "seconds": [0.05]}]))
    (row,) = ledger_rows(tmp_path / "r").values()
    assert json.loads(row["metrics"]) == {"loss": {"last": 0.25, "step": 4, "min": 0.25, "max": 1.0}}


def test_a_run_the_early_stop_rule_stops_is_pruned_at_its_next_report(backend, tmp_path):
    """The 0.9 run reports its step 1 only once the 0.1 run's step 1 is in its metrics file (it
    wrote its step 2 line): a cluster may place the two runs seconds apart, in either order, and
    ASHA's verdict depends on which reached the rung first."""
    if backend == "fake":
        pytest.skip("the fake launcher's runs are no processes: they write no file")
    journal = str(tmp_path / "journal")
    after = {"loss-0.9,pause-0.05,report-60,": "step2 loss-0.1,pause-0.05,report-60,"}
    blocks = [{"loss": [0.1, 0.9], "report": [60], "pause": [0.05]}]
    config = make_config(tmp_path / "r", blocks, grace_period=30, global_config={"journal": journal, "after": after})
    config["early_stop"] = {"method": "asha", "metric": "loss", "mode": "min", "min_step": 1, "max_step": 60}
    summary = run_sweep(backend, config)
    assert summary.ok and summary.exit_code == 0
    assert summary.outcomes["loss-0.1,pause-0.05,report-60,"].status is RunStatus.SUCCEEDED
    pruned = summary.outcomes["loss-0.9,pause-0.05,report-60,"]
    assert pruned.status is RunStatus.PRUNED and pruned.cause == "pruned at step 1: loss 0.9, rung cutoff 0.1"
    assert pruned.signal is None and pruned.duration < 20  # Pruned ended it, long before the grace period did
    assert ledger_rows(tmp_path / "r")["loss-0.9,pause-0.05,report-60,"]["status"] == "pruned"


def test_a_failing_run(backend, tmp_path):
    summary = run_sweep(backend, make_config(tmp_path / "r", [{"exit": [3], "seconds": [0.05]}]))
    (failed,) = summary.failed
    assert failed.status is RunStatus.FAILED and failed.exit_code == 3


def test_a_paused_run_gives_up_its_task_and_is_resumed_as_a_new_attempt(backend, tmp_path):
    """Promotion ASHA over three runs: whichever order they reach rung 1 in, the best goes on to the
    end (promoted and resumed from its checkpoint, its step, unless it reached the rung last and
    went on at once, as on a loaded Slurm); the other two stay paused, holding no task."""
    if backend == "fake":
        pytest.skip("the fake launcher's runs are no processes: they write no file")
    journal = str(tmp_path / "journal")
    blocks = [{"loss": [0.1, 0.5, 0.9], "report": [9], "pause": [0.02], "seconds": [0]}]
    config = make_config(tmp_path / "r", blocks, grace_period=30, global_config={"journal": journal})
    config["early_stop"] = {
        "method": "asha",
        "promotion": True,
        "metric": "loss",
        "mode": "min",
        "min_step": 1,
        "max_step": 9,
    }
    summary = run_sweep(backend, config)
    assert summary.ok and summary.exit_code == 0, summary.report()
    best = "loss-0.1,pause-0.02,report-9,seconds-0,"
    assert summary.outcomes[best].status is RunStatus.SUCCEEDED
    assert {o.name for o in summary.paused} == {best.replace("0.1", "0.5"), best.replace("0.1", "0.9")}
    assert [line for line in journal_lines(journal) if line.endswith(f" {best}")] == [
        f"step{step} {best}" for step in range(1, 10)
    ]  # each step once: the resumed attempts went on from where the run paused
    for name in (best.replace("0.1", "0.5"), best.replace("0.1", "0.9")):
        assert ledger_rows(tmp_path / "r")[name]["status"] == "paused"


def test_population_based_training_copies_checkpoints_between_runs_and_resumes_them(backend, tmp_path):
    """PBT over three members: a member in the bottom pauses, its checkpoint folder becomes a copy
    of a top member's snapshot, and it resumes from that step with that member's values (the task
    checks its checkpoint is of the step it resumes from). Every member ends at max_step; each
    exploit is made once."""
    if backend == "fake":
        pytest.skip("the fake launcher's runs are no processes: they write no file")
    journal = str(tmp_path / "journal")
    blocks = [{"loss": [0.1, 0.5, 0.9], "report": [9], "pause": [0.2], "seconds": [0], "checkpoint": [True]}]
    root = tmp_path / "r"
    config = make_config(root, blocks, slots=("cpu",) * 3, grace_period=30, global_config={"journal": journal})
    config["pbt"] = {"metric": "loss", "mode": "min", "interval": 3, "max_step": 9, "perturb": {"loss": [1.0]}}
    summary = run_sweep(backend, config)
    assert summary.ok and len(summary.succeeded) == 3, summary.report()
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:
        events = db.execute("SELECT name, kind, decision, detail, step FROM trial_events ORDER BY seq").fetchall()
    made, waited, paused_for = {}, {}, {}
    for name, kind, decision, detail, step in events:
        if decision == "exploit":
            made.setdefault(name, []).append(json.loads(detail)["step"])
        elif decision in ("yield", "snapshot+yield"):  # it goes on from its own step, at its turn
            waited.setdefault(name, []).append(int(step))
        if decision in ("exploit", "yield", "snapshot+yield"):
            paused_for[name] = decision
        elif kind == "resumed":
            # Each resumption has a decision before it: an exploit, or a turn a member ahead of
            # the population waited (PBT keeps a population with a slot for every member
            # together: under load one member can be an interval ahead of another).
            assert paused_for.pop(name, None), (name, events)
    lines = journal_lines(journal)
    for name in summary.outcomes:
        mine = [line.split()[0] for line in lines if line.endswith(f" {name}")]
        assert mine[-1] == "step9", mine  # trained to max_step
        resumed = sorted(int(line[6:]) for line in mine if line.startswith("resume"))
        assert resumed == sorted(made.get(name, []) + waited.get(name, [])), (mine, made, waited)
        if name.startswith("loss-0.9,"):  # the worst copied a better one: it ended with its values
            assert made.get(name) and json.loads(ledger_rows(root)[name]["metrics"])["loss"]["last"] < 0.9


def test_a_run_over_its_timeout(backend, tmp_path):
    config = make_config(tmp_path / "r", [{"seconds": [30]}], timeout=0.3, grace_period=0.5)
    (failed,) = run_sweep(backend, config).failed
    assert failed.status is RunStatus.TIMED_OUT and failed.cause == "timed out after 0.3s"


def test_stop_gives_the_grace_period_then_kills(backend, tmp_path):
    root = tmp_path / "r"
    blocks = [{"seconds": [30], "term_takes": [0.2]}, {"seconds": [30], "trap_term": [True]}]
    config = make_config(root, blocks, slots=("cpu", "cpu"), grace_period=0.8)
    started = time.monotonic()
    summary = run_sweep(backend, config, SignalOnStart(runs=2))
    assert summary.interrupted_by == "SIGINT" and time.monotonic() - started < 20
    statuses = {o.name: (o.status, o.signal) for o in summary.failed}
    # The first stops on SIGTERM within the grace; the second ignores it and is killed when it ends.
    assert statuses["seconds-30,term_takes-0.2,"][0] is RunStatus.INTERRUPTED
    assert statuses["seconds-30,trap_term-True,"] == (RunStatus.INTERRUPTED, "SIGKILL")


def test_a_second_signal_kills_at_once(backend, tmp_path):
    config = make_config(tmp_path / "r", [{"seconds": [30], "trap_term": [True]}], grace_period=60)
    started = time.monotonic()
    summary = run_sweep(backend, config, SignalOnStart(times=2))
    (outcome,) = summary.failed
    assert outcome.status is RunStatus.INTERRUPTED and outcome.signal == "SIGKILL"
    assert time.monotonic() - started < 30  # not the 60 s grace period


def test_runs_that_succeeded_are_skipped(backend, tmp_path):
    config = make_config(tmp_path / "r", [{"i": [0, 1], "seconds": [0.05]}])
    assert len(run_sweep(backend, config).succeeded) == 2
    again = run_sweep(backend, config)
    assert sorted(again.skipped) == ["i-0,seconds-0.05,", "i-1,seconds-0.05,"] and not again.outcomes


def test_resume_after_the_scheduler_was_killed(backend, tmp_path):
    root = tmp_path / "r"
    config = make_config(root, [{"i": [0, 1], "seconds": [0.05]}])
    run_sweep(backend, config)
    sweep = Sweep(config)
    with Ledger(RootPaths(str(root))) as ledger:  # as a killed scheduler leaves it: one run marked running
        spec = next(iter(sweep))
        ledger.mark_running(
            name=spec.name, run_index=0, config_hash=spec.config_hash, slot="cpu0", token="gone", work_dir=spec.work_dir
        )
    summary = run_sweep(backend, config)
    assert [o.name for o in summary.succeeded] == [spec.name] and summary.skipped == ["i-1,seconds-0.05,"]


def test_a_handle_knows_its_run_ended_before_the_loop_hears_of_it(backend, tmp_path):
    """The loop's deadline check trusts has_exited() (a run that ended while the loop was not
    looking, e.g. suspended, is not timed out): it is True once the run's exit is reported."""
    sweep = Sweep(make_config(tmp_path / "r", [{"seconds": [0.05]}]))
    spec = next(iter(sweep))
    heard = threading.Event()
    world = FakeWorld() if backend == "fake" else None
    launcher = world or LocalLauncher(tasks.ContractTask, grace_period=1)
    if backend == "ray":
        launcher = RayLauncher(tasks.ContractTask, sweep.options)
    if backend in ("slurm", "pool"):
        config = make_config(tmp_path / "r", [{}], backend="slurm")
        config["scheduler_config"]["slurm"] = {"poll_interval": 0.5, **POOL.get(backend, {})}
        launcher = (PoolLauncher if backend == "pool" else SlurmLauncher)(tasks.ContractTask, Sweep(config).options)
    os.makedirs(sweep.options.result_root_folder)
    root = os.open(tmp_path, os.O_RDONLY)
    try:
        launcher.open(root)
        attempt = Attempt(spec, Slot("cpu0", ()), RunPaths(spec.work_dir, sweep.options.log_file), "t", 1)
        handle = launcher.start(attempt, heard.set)
        getattr(launcher, "flush", lambda: None)()  # a launcher that submits in batches (Slurm) submits now
        if world is not None:
            with pytest.raises(queue.Empty):  # the fake clock runs past the run's end; nothing was posted
                world.get(1.0)
        assert heard.wait(timeout=30) and handle.has_exited()
        ended = handle.reap()
        # If not: the run's log says why, or the launcher's own words (Ray's error, in ended.lost).
        assert ended.returncode == 0, (ended, attempt.paths.tail())
    finally:
        os.close(root)
        if backend == "ray":
            launcher.shutdown()
        if backend in ("slurm", "pool"):
            launcher.close()


# --- machines that go away (backends whose runs run on machines the scheduler does not own) -----------

# The partition first: it finds the sweep's stop channel among the script's processes (one, then).
LOST_MACHINE_CASES = ["partition", "busy", "at:0.75", "at:0.95"]


@pytest.fixture(scope="module")
def ray_cluster_sweeps(tmp_path_factory):
    """One sweep per case of LOST_MACHINE_CASES, each of 8 runs on 4 slots of a two-machine Ray
    cluster (tests/ray_cluster.py: one cluster, one process, for all of them): for each case, its
    root, its journal, the runs hit and the script's output for that sweep. Its processes carry a
    mark of their own, and none may outlive it."""
    pytest.importorskip("ray")
    folder = tmp_path_factory.mktemp("lost-machines")
    cases, found = [], {}
    for index, when in enumerate(LOST_MACHINE_CASES):
        root, journal = folder / f"r{index}", folder / f"journal{index}"
        # The lease is renewed every 0.5 s, so a supervisor stops its run after 1.5 s with no word
        # from the scheduler. With 0.2 s (0.6 s), a loaded CI machine (the suite beside two
        # spinning processes) kept the scheduler's words back that long outside any cut: runs
        # were stopped again and again, and the partition's sweep failed. The partition cuts the
        # scheduler off for 3.5 s, through its runs' first 1.5 s and more: they run 5 s. The other
        # cases' runs run 4 s: with 2.5 s, under that load the second run on the machine to be lost
        # started 2 s after the first, which then ended before the machine went ("busy" failed).
        sleep = 5.0 if when == "partition" else 4.0
        config = make_config(root, [{"i": list(range(8))}], global_config={"journal": str(journal), "sleep": sleep})
        config["scheduler_config"].update(
            gpu=["0", "1", "2", "3"], backend="ray", lease_interval=0.5, grace_period=0.5, node_failure_retries=10
        )
        cases.append([config, when])
        found[when] = {"root": root, "journal": journal}
    mark = uuid.uuid4().hex
    script = os.path.join(TESTS, "ray_cluster.py")
    process = subprocess.Popen(
        [sys.executable, script, json.dumps(cases)],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, MARK: mark},
    )
    output = finish(process, timeout=400)
    assert process.returncode == 0, output
    wait_until(lambda: not marked_pids(mark), timeout=30, message="the Ray cluster's processes to exit")
    for part in ("\n" + output).split("\nCASE ")[1:]:
        when, said = part.split("\n", 1)
        found[when]["output"] = said
        found[when]["lost"] = json.loads(said.split("LOST ", 1)[1].splitlines()[0])
        found[when]["exit"] = int(said.split("EXIT ", 1)[1].splitlines()[0])
    assert all("output" in case for case in found.values()), output
    return found


@pytest.mark.xdist_group("clusters")
@pytest.mark.timeout(480)  # the cases' module-wide sweeps run in the first one's setup
@pytest.mark.parametrize("when", LOST_MACHINE_CASES)
def test_a_run_whose_machine_is_lost_or_cut_off_runs_exactly_once(ray_cluster_sweeps, when):
    """A machine goes away with runs on it (as soon as they run, at 75 % of them, just before they end),
    or every run's supervisor is cut off from the scheduler for a while: each run's side effect (its
    journal's "end") happens once, no two attempts of a run ever overlap, and the sweep succeeds. A
    run is retried only once its old attempt is over (its lease), and one that finished in the
    meantime is recorded as succeeded, not run again."""
    case = ray_cluster_sweeps[when]
    root, output, lost = case["root"], case["output"], case["lost"]
    assert case["exit"] == 0, output
    assert len(lost) >= 2, output
    lines = journal_lines(case["journal"])
    assert "overlap" not in " ".join(lines), output
    assert [lines.count(f"end i-{i},") for i in range(8)] == [1] * 8, output  # each side effect once
    rows = ledger_rows(root)
    assert {row["status"] for row in rows.values()} == {"succeeded"}
    retried = [name for name in lost if rows[name]["attempts"] > 1]
    if when == "partition":
        assert retried, output  # cut off: stopped by their own supervisors, then run again
        logs = " ".join(log.read_text() for name in retried for log in (root / name / ".gts" / "logs").iterdir())
        assert "no word from the scheduler" in logs, output
    elif when == "busy":
        assert retried == lost and "went away or stopped answering" in output, output
        # Retried only once the old attempt was known to be over: its lease expired (its machine
        # took its supervisor down), or it had not started.
        assert "given up, its lease expired" in output or "given up, it had not started" in output, output
    if retried:  # the log says how the old attempt was known to be over before its run ran again
        assert "given up, " in output or "cut off from the scheduler" in output, output


@pytest.mark.parametrize(
    "make, declared",
    [
        (lambda o: LocalLauncher(tasks.ContractTask), {"watches"}),
        (lambda o: RayLauncher(tasks.ContractTask, o), {"cluster_slots"}),
        (lambda o: SlurmLauncher(tasks.ContractTask, o), {"cluster_slots", "batches", "queue_places", "adopts"}),
        (lambda o: FakeWorld(), set()),
    ],
)
def test_each_launcher_declares_what_it_can_do_and_the_engine_probes_nothing(in_tmp, make, declared):
    """What a launcher can do besides starting attempts is its typed Abilities: the engine asks
    for nothing else (no getattr of a launcher or the inbox anywhere in it)."""
    import ast

    from gpu_task_scheduler.engine import launcher as seam

    options = Sweep(make_config(in_tmp / "r", [{"a": [1]}])).options
    abilities = make(options).abilities
    flags = {name for name in seam.Abilities._fields if name != "runs_at_once" and getattr(abilities, name)}
    assert isinstance(abilities, seam.Abilities) and flags == declared
    engine = os.path.dirname(seam.__file__)
    for name in os.listdir(engine):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(engine, name)).read())
            probed = [
                ast.unparse(call.args[0])
                for call in ast.walk(tree)
                if isinstance(call, ast.Call) and getattr(call.func, "id", None) in ("getattr", "hasattr")
            ]
            assert not [what for what in probed if "launcher" in what or "inbox" in what], (name, probed)


def test_the_loop_only_sequences():
    """The loop class carries decisions out: what runs next (engine/starts.py), how running runs
    stop (engine/running.py) and what is recorded (engine/outcomes.py) are decided elsewhere."""
    import ast

    from gpu_task_scheduler.engine import loop

    (scheduler,) = [
        node for node in ast.parse(open(loop.__file__).read()).body if getattr(node, "name", "") == "Scheduler"
    ]
    assert scheduler.end_lineno - scheduler.lineno + 1 <= 250
