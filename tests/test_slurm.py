"""The Slurm backend against a real Slurm (conftest.slurm_cluster: one node, 4 GPUs as GRES), and
its pure parts (throttles across arrays, Slurm's time format, the shared-file-system check).

Each run of the sweeps here appends ``start I GPUS TIME`` and ``end I TIME`` to a journal: the
side effects that must happen exactly once, and when, on which GPUs."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import wait_until
from helpers import journal_lines, ledger_rows
from test_process_control import finish

from gpu_task_scheduler.backends.slurm import commands, throttle
from gpu_task_scheduler.backends.slurm.launcher import END_LAG, HELD_WAIT, held_end_verdict
from gpu_task_scheduler.errors import ConfigError
from gpu_task_scheduler.sweep.options import parse_scheduler_config
from gpu_task_scheduler.sweep.slurm import parse_time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
slurm_only = pytest.mark.xdist_group("clusters")


def journal_command(journal, seconds):
    # `&&`: a run whose sleep a signal cut short writes no end and fails. Slurm's requeue signals a
    # job's processes one by one (proctrack/linuxproc); with `;`, a shell not yet signalled when its
    # sleep died went on to write the end and exit 0: a success of a run cut short, which made the
    # requeue test below fail now and then under a full suite.
    line = f"echo start {{i}} $CUDA_VISIBLE_DEVICES $(date +%s.%N) >> {journal}; sleep {seconds} && "
    return ["sh", "-c", line + f"echo end {{i}} $(date +%s.%N) >> {journal}"]


def write_sweep(folder, runs, seconds, **slurm):
    config = {
        "scheduler_config": {
            "gpu": "all",
            "result_root_folder": str(folder / "results"),
            "backend": "slurm",
            "grace_period": 2,
            "lease_interval": 0.5,
            # start_timeout: a batch step slurmd lost under load is given up in time for the test.
            "slurm": {"poll_interval": 0.5, "start_timeout": 30, **slurm},
        },
        "command": journal_command(folder / "journal", seconds),
        "test_config": [{"i": list(range(runs))}],
    }
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def gts(*args):
    return subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def starts_and_ends(journal):
    """Per run: its (start, end) times and its GPUs, for the runs that ended; and how many times
    each run's side effects happened."""
    starts, spans, ends = {}, [], {}
    for line in journal_lines(journal):
        word, run, *rest = line.split()
        if word == "start":
            starts[run] = (float(rest[-1]), rest[0] if len(rest) == 2 else "")
        else:
            ends[run] = ends.get(run, 0) + 1
            spans.append((starts[run][0], float(rest[-1]), starts[run][1]))
    return spans, ends


def most_at_once(spans):
    events = sorted([(start, 1) for start, _, _ in spans] + [(end, -1) for _, end, _ in spans])
    most = now = 0
    for _, change in events:
        now += change
        most = max(most, now)
    return most


def running_tasks(cluster):
    out = cluster.run("squeue", "-h", "-r", "-t", "running", "-o", "%i").stdout
    return out.split()


@slurm_only
def test_twelve_runs_four_at_once_each_once_through_a_requeue(slurm, in_tmp, no_leaked_processes):
    """12 runs of 3 s, one GPU each, max_parallel 4: 4 at once on distinct GPUs; a task requeued
    mid-sweep (scontrol requeue) is given up and its run runs again; every run's side effect
    happens once, the sweep exits 0, nothing is left in the queue, and fewer submissions than runs."""
    path = write_sweep(in_tmp, 12, 3, max_parallel=4)
    process = gts("run", path, "--plain")
    journal = in_tmp / "journal"
    wait_until(lambda: len(journal_lines(journal)) >= 2, timeout=60, message="runs to start")

    def mid_run():
        """A running task of the first array (task k runs i-k) whose 3 s run has over two seconds left
        (with one second, a full test suite on 2 cores once saw the run end before the requeue):
        one that squeue still lists as running after its run ended would have nothing to requeue."""
        begun = {}
        for line in journal_lines(journal):
            word, run, *rest = line.split()
            if word == "start":
                begun[run] = float(rest[-1])
            else:
                begun.pop(run, None)
        now = time.time()
        return [task for task in running_tasks(slurm) if now - begun.get(task.partition("_")[2], -1e9) < 1.0]

    (task, *_) = wait_until(mid_run, timeout=30, interval=0.05, message="a task in the middle of its run")
    slurm.run("scontrol", "requeue", task)
    output = finish(process, timeout=150)
    assert process.returncode == 0, output
    spans, ends = starts_and_ends(journal)
    assert sorted(ends) == sorted(str(i) for i in range(12)) and set(ends.values()) == {1}, output
    assert most_at_once(spans) == 4, spans
    for start, _, gpus in spans:  # the runs running when one started were on distinct GPUs
        beside = [g for s, e, g in spans if s <= start < e]
        assert len(beside) == len(set(beside)) and gpus in {"0", "1", "2", "3"}, spans
    rows = ledger_rows(in_tmp / "results")
    assert {row["status"] for row in rows.values()} == {"succeeded"}
    requeued = [row for row in rows.values() if row["attempts"] == 2]
    assert len(requeued) == 1 and re.search("Slurm (stopped|requeued) its job", output), output
    assert all(" job " in row["node"] for row in rows.values())  # node and job id, for gts status
    submissions = output.count("to Slurm as job array")
    assert 1 < submissions < 12, output  # the sweep, then the requeued run's retry
    assert not slurm.jobs()


@slurm_only
def test_a_stopped_sweep_leaves_nothing_in_the_queue(slurm, in_tmp, no_leaked_processes):
    """Ctrl-C: the running tasks get SIGTERM (their runs the grace period), the queued ones are
    cancelled; the runs are recorded interrupted and no job is left."""
    path = write_sweep(in_tmp, 6, 60, max_parallel=2)
    process = gts("run", path, "--plain")
    wait_until(lambda: len(journal_lines(in_tmp / "journal")) >= 2, timeout=60, message="two runs to start")
    process.send_signal(signal.SIGINT)
    output = finish(process, timeout=60)
    assert process.returncode == 130, output
    rows = ledger_rows(in_tmp / "results")
    statuses = sorted(row["status"] for row in rows.values())
    assert statuses == ["interrupted"] * 6, output
    assert not slurm.jobs()
    lines = journal_lines(in_tmp / "journal")  # the two that ran got SIGTERM; the queued ones never started
    assert [line.split()[0] for line in lines] == ["start", "start"], lines


def test_a_stop_cancels_outright_only_tasks_squeue_still_lists_as_queued(tmp_path, monkeypatch):
    """A stop asked before the driver saw a task start (its start file comes once its run runs;
    squeue is read every poll_interval): start files and squeue are read again first. A task
    squeue lists as running is stopped as running ones are (SIGTERM, the run's grace period);
    only one still pending is cancelled outright (a plain scancel of a running task ends it on
    Slurm's terms, and its run could be recorded succeeded though it was stopped)."""
    import gts_test_tasks as tasks
    from helpers import make_config

    from gpu_task_scheduler.backends.slurm.launcher import SlurmLauncher
    from gpu_task_scheduler.engine.launcher import Attempt
    from gpu_task_scheduler.gpu.devices import Slot
    from gpu_task_scheduler.records.paths import RunPaths
    from gpu_task_scheduler.sweep.expand import Sweep

    sweep = Sweep(make_config(tmp_path / "r", [{"seconds": [1, 2, 3]}], backend="slurm"))
    launcher = SlurmLauncher(tasks.ContractTask, sweep.options)
    os.makedirs(tmp_path / "r" / ".gts" / "slurm" / "events")
    calls = []
    monkeypatch.setattr(commands, "submit", lambda args, script: "7")
    monkeypatch.setattr(commands, "cancel", lambda names, signal_name=None, **kw: calls.append((names, signal_name)))
    squeue = {
        "7_0": commands.TaskState("RUNNING", "node1", "None"),  # started since the last look
        "7_1": commands.TaskState("PENDING", "", "Priority"),
        "7_2": commands.TaskState("RUNNING", "node1", "None"),  # its start file is there already
    }
    monkeypatch.setattr(commands, "states", lambda jobs: calls.append(("squeue", sorted(jobs))) or squeue)
    handles = []
    for index, spec in enumerate(sweep):
        attempt = Attempt(spec, Slot("cpu0", ()), RunPaths(spec.work_dir, None), f"token{index}", 1)
        handles.append(launcher.start(attempt, lambda: None, lambda node, pid, since=0.0: None))
    launcher.flush()
    start = {"node": "node1", "pid": 42, "job": "7_2", "incarnation": 0}
    (tmp_path / "r" / ".gts" / "slurm" / "events" / "token2.0.start").write_text(json.dumps(start))
    for handle in handles:
        handle.stop()
    launcher._send_requests()  # what the following thread does next
    sent = [call for call in calls if call[0]]  # the real cancel() sends nothing for no tasks
    assert sent == [("squeue", ["7"]), (["7_[1]"], None), (["7_[0,2]"], "TERM")], calls
    assert handles[2].node == "node1 job 7_2"  # its start was read before anything was sent


def test_a_task_slurm_still_lists_after_its_run_ended_is_cancelled(tmp_path, monkeypatch):
    """A task whose slurmstepd died after its run wrote its end stays RUNNING in Slurm's list for
    good, and would hold its place under the array's throttle: the sweep's queued tasks would never
    start. Once its end was heard, a task still listed SETTLE seconds later is cancelled, once."""
    import gts_test_tasks as tasks
    from helpers import make_config

    from gpu_task_scheduler.backends.slurm import launcher as slurm_launcher
    from gpu_task_scheduler.engine.launcher import Attempt
    from gpu_task_scheduler.gpu.devices import Slot
    from gpu_task_scheduler.records.paths import RunPaths
    from gpu_task_scheduler.sweep.expand import Sweep

    sweep = Sweep(make_config(tmp_path / "r", [{"seconds": [1, 2]}], backend="slurm"))
    launcher = slurm_launcher.SlurmLauncher(tasks.ContractTask, sweep.options)
    events = tmp_path / "r" / ".gts" / "slurm" / "events"
    os.makedirs(events)
    cancelled = []
    monkeypatch.setattr(commands, "submit", lambda args, script: "7")
    monkeypatch.setattr(commands, "cancel", lambda names, signal_name=None, **kw: cancelled.append(names))
    squeue = {name: commands.TaskState("RUNNING", "node1", "None") for name in ("7_0", "7_1")}
    monkeypatch.setattr(commands, "states", lambda jobs: squeue)
    ended = []
    for index, spec in enumerate(sweep):
        attempt = Attempt(spec, Slot("cpu0", ()), RunPaths(spec.work_dir, None), f"token{index}", 1)
        launcher.start(attempt, lambda index=index: ended.append(index), lambda node, pid, since=0.0: None)
    launcher.flush()
    for index in (0, 1):
        start = {"node": "node1", "pid": 42, "job": f"7_{index}", "incarnation": 0}
        (events / f"token{index}.0.start").write_text(json.dumps(start))
    (events / "token0.0.end").write_text(json.dumps({"returncode": 0, "strays": [], "unstoppable": []}))
    # Its end is read, and held until Slurm's list says the run was not requeued (it lists it a
    # moment longer, as it does): taken once it was seen END_LAG looks more.
    for _ in range(slurm_launcher.END_LAG + 1):
        launcher._look()
        assert cancelled == []
    assert ended == [0]
    launcher._ended["7_0"] -= slurm_launcher.SETTLE  # SETTLE seconds later, still listed
    launcher._look()
    assert cancelled == [["7_0"]]
    launcher._look()  # cancelled once; the task still running is left alone
    del squeue["7_0"]
    launcher._look()
    assert cancelled == [["7_0"]] and ended == [0]


@slurm_only
def test_an_adopted_task_the_engine_does_not_follow_is_given_up_and_over_before_the_run_is_submitted(
    tmp_path, monkeypatch
):
    """An earlier start's Slurm task of a run the engine runs again (its ledger knows another
    attempt) was dropped, and Slurm ran it beside the new one: it is told abandoned, cancelled and
    its lease waited for, before the new attempt is prepared."""
    import types

    import gts_test_tasks as tasks
    from helpers import make_config

    from gpu_task_scheduler.backends.slurm import launcher as slurm_launcher
    from gpu_task_scheduler.sweep.expand import Sweep

    sweep = Sweep(make_config(tmp_path / "r", [{"seconds": [1]}], backend="slurm"))
    launcher = slurm_launcher.SlurmLauncher(tasks.ContractTask, sweep.options)
    events = tmp_path / "r" / ".gts" / "slurm" / "events"
    os.makedirs(events)
    happened = []
    monkeypatch.setattr(commands, "cancel", lambda names, signal_name=None, **kw: happened.append(("cancel", names)))
    monkeypatch.setattr(slurm_launcher, "wait_over", lambda lease, token, terms: happened.append(("over", token)))
    launcher._adoptable["seconds-1,"] = ("t1", {"job": "7", "index": 3, "lease": str(tmp_path / "lease")}, None)

    class Prepared(Exception):
        pass

    def prepared(attempt):
        happened.append(("prepared", attempt.token))
        raise Prepared

    monkeypatch.setattr(launcher, "_prepared", prepared)
    with pytest.raises(Prepared):
        launcher.start(types.SimpleNamespace(spec=types.SimpleNamespace(name="seconds-1,"), token="t2"), lambda: None)
    assert happened == [("cancel", ["7_3"]), ("over", "t1"), ("prepared", "t2")]
    assert (events / "t1.abandoned").exists()


def test_detach_then_status_then_a_second_run_follows_the_jobs(slurm, in_tmp, no_leaked_processes):
    """--detach submits and exits; gts status shows the runs on their jobs; gts run again follows
    the live jobs (no run twice) and ends when they do."""
    path = write_sweep(in_tmp, 4, 4, max_parallel=4)
    process = gts("run", path, "--plain", "--detach")
    output = finish(process, timeout=60)
    assert process.returncode == 0, output
    assert "4 left running on the cluster (detached)" in output, output
    assert len(slurm.jobs()) == 4
    wait_until(lambda: len(journal_lines(in_tmp / "journal")) >= 4, timeout=60, message="the runs to start")
    status = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "status", str(in_tmp / "results"), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    runs = json.loads(status.stdout)["runs"]
    assert {run["status"] for run in runs} == {"running"}, status.stdout
    again = gts("run", path, "--plain")
    output = finish(again, timeout=120)
    assert again.returncode == 0, output
    _, ends = starts_and_ends(in_tmp / "journal")
    assert ends == {str(i): 1 for i in range(4)}, output
    assert [line.split()[0] for line in journal_lines(in_tmp / "journal")].count("start") == 4
    assert "following its attempt that is still queued or running" in output, output
    assert {row["status"] for row in ledger_rows(in_tmp / "results").values()} == {"succeeded"}
    assert not slurm.jobs()


@slurm_only
def test_the_readme_slurm_config_runs(slurm, in_tmp, no_leaked_processes):
    """configs/slurm.yaml, as the README shows it, with the partition of the tests' cluster."""
    config = yaml.safe_load(open(os.path.join(REPO, "configs", "slurm.yaml")))
    config["scheduler_config"]["result_root_folder"] = str(in_tmp / "results")
    config["scheduler_config"]["slurm"]["poll_interval"] = 0.5
    path = in_tmp / "slurm.yaml"
    path.write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler", "run", str(path), "--partition", "debug", "--plain", "steps=50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    output = finish(process, timeout=120)
    assert process.returncode == 0, output
    rows = ledger_rows(in_tmp / "results")
    assert rows and {row["status"] for row in rows.values()} == {"succeeded"}, output


@slurm_only
def test_a_partition_slurm_does_not_have_is_refused_before_anything_runs(slurm, in_tmp):
    path = write_sweep(in_tmp, 2, 0.1, partition="nosuch")
    process = gts("run", path, "--plain")
    output = finish(process, timeout=60)
    assert process.returncode != 0 and "invalid partition" in output.lower(), output
    assert not slurm.jobs() and not (in_tmp / "journal").exists()


@pytest.mark.parametrize(
    "slurm_options, words",
    [
        ({"job_name": "gts,other"}, "['job_name'] must be a job name"),  # squeue --name= splits at commas
        ({"extra": ["--job-name=renamed"]}, "other than --job-name (the backend sets it itself)"),
        ({"extra": ["-J", "renamed"]}, "other than --job-name"),
        ({"extra": "--job=renamed"}, "other than --job-name"),  # sbatch takes a unique prefix
        ({"extra": ["--array=0-9"]}, "other than --array"),
        ({"extra": ["--output=/tmp/x"]}, "other than --output"),
        ({"extra": ["--chdir=/"]}, "other than --chdir"),
        ({"extra": ["-p", "gpu"]}, "use scheduler_config['slurm']['partition']"),
        ({"extra": ["--time=10"]}, "use scheduler_config['slurm']['time']"),
    ],
)
@slurm_only
def test_a_renamed_array_is_refused_before_anything_is_submitted(slurm, in_tmp, slurm_options, words):
    """An array the next start could not find by its name (a comma in it, or a name of extra's)
    would have its runs submitted twice: such options are refused, on the real Slurm too."""
    path = write_sweep(in_tmp, 2, 0.1, **slurm_options)
    process = gts("run", path, "--plain")
    output = finish(process, timeout=60)
    assert process.returncode == 2 and words in output, output
    assert not slurm.jobs() and not (in_tmp / "journal").exists()


def test_a_root_only_this_machine_sees_is_refused_when_other_nodes_run_the_jobs():
    assert commands.shared_root_problem("/r", "nfs", ["n1", "n2"], "login") is None
    assert commands.shared_root_problem("/r", "ext4", ["login"], "login.cluster") is None  # a one-node cluster
    problem = commands.shared_root_problem("/r", "ext4", ["n1", "login"], "login")
    assert "ext4 file system, which only this machine sees" in problem and "n1" in problem


COUNTS_MEMORY = {"SelectTypeParameters": "CR_CORE_MEMORY", "DefMemPerNode": "UNLIMITED", "MaxArraySize": "1001"}


@pytest.mark.parametrize(
    "config, mem, extra, said",
    [
        (COUNTS_MEMORY, None, (), True),  # each run would hold a whole node: said, with slurm.mem
        (COUNTS_MEMORY, "16G", (), False),
        (COUNTS_MEMORY, None, ("--mem-per-gpu=20G",), False),
        ({**COUNTS_MEMORY, "DefMemPerCPU": "2000"}, None, (), False),  # the cluster has a default
        ({**COUNTS_MEMORY, "SelectTypeParameters": "CR_CORE"}, None, (), False),  # memory is not counted
    ],
)
def test_a_cluster_that_gives_a_run_a_whole_nodes_memory_is_said_before_submitting(config, mem, extra, said):
    problem = commands.memory_problem(config, mem=mem, extra=extra)
    assert (problem is not None) == said
    if said:
        assert "SelectTypeParameters=CR_CORE_MEMORY" in problem and "runs alone on its node" in problem
        assert "slurm: {mem: 16G}" in problem


@slurm_only
def test_the_clusters_own_config_is_read_as_scontrol_prints_it(slurm, monkeypatch):
    """The tests' Slurm counts cores only (CR_Core): no warning; its MaxArraySize is read."""
    text = slurm.run("scontrol", "show", "config").stdout
    monkeypatch.setattr(commands, "call", lambda argv, what: text)
    config = commands.show_config()
    assert config["SelectTypeParameters"] == "CR_CORE" and commands.max_array_size(config) > 1
    assert commands.memory_problem(config, mem=None, extra=()) is None
    assert commands.memory_problem({**config, "SelectTypeParameters": "CR_CORE_MEMORY"}, mem=None, extra=())


def test_the_file_system_of_a_path_is_read_from_the_mount_table(tmp_path):
    table = tmp_path / "mountinfo"
    table.write_text(
        "22 1 0:21 / / rw - ext4 /dev/sda1 rw\n"
        "40 22 0:40 / /home rw,relatime - nfs4 server:/home rw\n"
        "41 22 0:41 / /home/my\\040data rw - lustre x rw\n"
    )
    assert commands.file_system_of("/home/me/results", str(table)) == "nfs4"
    assert commands.file_system_of("/home/my data/r", str(table)) == "lustre"
    assert commands.file_system_of("/tmp", str(table)) == "ext4"


def test_max_parallel_is_shared_across_arrays_oldest_first_never_lowered():
    main = throttle.Array("1", running=3, pending=5, throttle=4, held=False)
    retry = throttle.Array("2", running=0, pending=2, throttle=1, held=True)
    assert throttle.free([main, retry], 4) == 0 and throttle.changes([main, retry], 4) == []  # the retry waits held
    drained = throttle.Array("1", running=3, pending=0, throttle=4, held=False)  # nothing left to start: uses 3
    assert throttle.changes([drained, retry], 4) == [throttle.Change("2", throttle=None, held=False)]
    done = throttle.Array("1", running=1, pending=0, throttle=4, held=False)
    assert throttle.changes([done, retry], 4) == [throttle.Change("2", throttle=2, held=False)]
    # A throttle is raised when budget frees up, the oldest array first; never lowered.
    older = throttle.Array("3", running=2, pending=4, throttle=2, held=False)
    newer = throttle.Array("4", running=1, pending=4, throttle=1, held=False)
    assert throttle.changes([older, newer], 5) == [throttle.Change("3", throttle=4)]
    assert all(change.throttle is None or change.throttle >= 1 for change in throttle.changes([older, newer], 9))


def test_throttles_never_add_up_to_more_than_max_parallel():
    import itertools

    for states in itertools.product(range(3), range(4), [1, 2, 3], [False, True], repeat=2):
        arrays = [throttle.Array(str(n), *states[4 * n : 4 * n + 4]) for n in range(2)]
        budget = 3
        if sum(array.share for array in arrays) > budget:
            continue  # not a state the driver leads to
        for change in throttle.changes(arrays, budget):  # lowered only as it is released (held: none of it ran)
            old = arrays[int(change.job)]
            assert change.throttle is None or change.throttle >= old.throttle or old.held
        after = {array.job: array for array in arrays}
        for change in throttle.changes(arrays, budget):  # applied in order, the sum stays within
            old = after[change.job]
            after[change.job] = throttle.Array(
                old.job,
                old.running,
                old.pending,
                change.throttle if change.throttle is not None else old.throttle,
                change.held if change.held is not None else old.held,
            )
            assert sum(array.share for array in after.values()) <= budget, (arrays, change)


def test_slurm_times_and_options_are_checked():
    assert parse_time("1:00:00") == 3600 and parse_time(30) == 1800 and parse_time("2-0") == 172800
    assert parse_time("10:30") == 630
    for bad in ("1h", "", "0", -1, True):
        with pytest.raises(ValueError):
            parse_time(bad)
    with pytest.raises(ConfigError, match="did you mean 'partition'"):
        parse_scheduler_config({"gpu": "all", "slurm": {"partiton": "gpu"}})
    with pytest.raises(ConfigError, match=r"\['slurm'\]\['partition'\] must be a Slurm name"):
        parse_scheduler_config({"gpu": "all", "slurm": {"partition": "gpu; rm -rf /"}})
    options = parse_scheduler_config({"gpu": "all", "backend": "slurm", "slurm": {"setup": "module load cuda"}})
    assert options.slurm.setup == ("module load cuda",) and options.slurm.max_queued == 1000
    assert options.slurm.start_timeout == 300.0  # a supervisor says it started within a second of its setup
    with pytest.raises(ConfigError, match=r"\['start_timeout'\] must be seconds between 5 and 86400"):
        parse_scheduler_config({"gpu": "all", "slurm": {"start_timeout": 1}})
    extra = ["--exclusive=user", "--mem-per-cpu=100M", "--time-min=5", "-x", "node13"]  # flags the backend leaves alone
    options = parse_scheduler_config({"gpu": "all", "slurm": {"job_name": "gts-mine", "extra": extra}})
    assert options.slurm.extra == tuple(extra) and options.slurm.job_name == "gts-mine"


def test_squeue_lines_and_task_lists():
    states = commands.parse_states("5_0|RUNNING|n1|None\n5_1|PENDING||JobArrayTaskLimit\nnoise\n")
    assert states["5_0"].live and states["5_1"].reason == "JobArrayTaskLimit" and len(states) == 2
    assert not commands.TaskState("NODE_FAIL", "n1", "").live
    assert commands.task_list("5", [0, 1, 2, 5, 7, 8]) == "5_[0-2,5,7-8]"


@slurm_only
def test_a_driver_killed_at_random_moments_loses_and_repeats_no_run(slurm, in_tmp, no_leaked_processes):
    """The kill battery on Slurm: `gts run` is SIGKILLed at random moments (before, during and after
    its submissions); its tasks run on, and each next `gts run` follows the live ones instead of
    submitting them again. Every run starts once and ends once; the last start exits 0."""
    rng = random.Random(int(os.environ.get("GTS_KILL_SEED", "20261125")))
    # Runs long enough that the sweep is not over before most of the starts were killed.
    path = write_sweep(in_tmp, 12, 1.5, max_parallel=4)
    journal = in_tmp / "journal"
    kills = 0
    for _ in range(8):
        process = gts("run", path, "--plain")
        try:
            process.wait(timeout=rng.uniform(0.2, 1.5))
        except subprocess.TimeoutExpired:
            process.kill()
            kills += 1
        finish(process)
    last = gts("run", path, "--plain")
    output = finish(last, timeout=120)
    assert last.returncode == 0, output
    assert kills >= 4, f"only {kills} of 8 starts were killed"
    words = [line.split()[:2] for line in journal_lines(journal)]
    for i in range(12):
        assert words.count(["start", str(i)]) == 1 and words.count(["end", str(i)]) == 1, words
    assert {row["status"] for row in ledger_rows(in_tmp / "results").values()} == {"succeeded"}
    assert not slurm.jobs()


@slurm_only
def test_an_attempt_a_restarted_driver_follows_keeps_its_clock(slurm, in_tmp, no_leaked_processes):
    """A run with an 8 s timeout, its driver killed 6 s into it: the next driver follows the live
    attempt and stops it 8 s after it started, not 8 s after the restart."""
    path = write_sweep(in_tmp, 1, 60)
    config = yaml.safe_load(path.read_text())
    config["scheduler_config"]["timeout"] = 8
    path.write_text(yaml.safe_dump(config))
    first = gts("run", path, "--plain")
    try:
        wait_until(lambda: any(line.startswith("start 0") for line in journal_lines(in_tmp / "journal")), timeout=60)
        started = float(journal_lines(in_tmp / "journal")[0].split()[-1])
        wait_until(lambda: time.time() - started >= 6, message="6 s of the run")
    finally:
        first.kill()
        finish(first)
    again = gts("run", path, "--plain")
    output = finish(again, timeout=120)
    (row,) = ledger_rows(in_tmp / "results").values()
    assert row["status"] == "timed_out", output
    # 8 s, then the grace period's SIGTERM and a poll or two: well short of 6 + 8 s.
    assert row["ended_at"] - started < 13, (row["ended_at"] - started, output)


@slurm_only
def test_a_root_other_nodes_cannot_see_is_refused_before_anything_is_submitted(slurm, in_tmp, monkeypatch, capsys):
    """The shared-file-system check at the start, with a partition whose nodes include another machine."""
    from gpu_task_scheduler.backends.slurm import launcher

    monkeypatch.setattr(launcher.commands, "partition_nodes", lambda partition: ["node7", "vm"])
    monkeypatch.setattr(launcher.commands, "file_system_of", lambda path: "ext4")
    path = write_sweep(in_tmp, 2, 0.1)
    from gpu_task_scheduler.cli.main import main

    assert main(["run", str(path), "--plain"]) == 1
    assert "ext4 file system, which only this machine sees" in capsys.readouterr().err
    assert not slurm.jobs() and not (in_tmp / "journal").exists()


def _task_batch(tmp_path, *, seconds, time_seconds=None, token="t0"):
    """A batch file as the driver writes it, of one command run, for task.py run by hand."""
    work = tmp_path / "run"
    (work / ".gts").mkdir(parents=True)
    (work / ".gts" / "config.json").write_text("{}")
    events = tmp_path / "events"
    events.mkdir()
    run = {
        "name": "run",
        "argv": ["sh", "-c", f'trap "echo got TERM >> {work}/seen; exit 143" TERM; sleep {seconds} & wait'],
        "env": {},
        "cwd": str(tmp_path),
        "log": str(work / "worker.log"),
        "token": token,
        "reports_outcome": False,
        "grace_period": 5,
        "python": sys.executable,
        "work_dir": str(work),
        "config_file": str(work / ".gts" / "config.json"),
        "lease": str(work / ".gts" / "lease"),
    }
    batch = {
        "runs": [run],
        "events": str(events),
        "lease_every": 0.2,
        "time": "1",
        "time_seconds": time_seconds,
        "signal_lead": 60,
    }
    path = tmp_path / "batch.json"
    path.write_text(json.dumps(batch))
    return path, events, work


def _task(path):
    env = dict(os.environ, SLURM_ARRAY_TASK_ID="0", SLURM_ARRAY_JOB_ID="7")
    return subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler.backends.slurm.task", str(path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_a_task_warned_of_its_time_limit_stops_its_run_and_says_so(tmp_path, no_leaked_processes):
    """SIGTERM to the supervisor near its job's time limit (Slurm's --signal): the run gets SIGTERM,
    and the end file says it was the time limit (the driver records the run timed_out)."""
    path, events, work = _task_batch(tmp_path, seconds=30, time_seconds=60)  # 60 s - lead 60: any time is near
    task = _task(path)
    wait_until(lambda: (events / "t0.0.start").exists(), message="the run to start")
    task.send_signal(signal.SIGTERM)
    output = finish(task)
    end = json.loads((events / "t0.0.end").read_text())
    assert end["signalled"] and end["limit"] == "stopped at Slurm's time limit (time: 1)", output
    assert (work / "seen").read_text() == "got TERM\n"
    assert json.loads((work / ".gts" / "lease").read_text())["state"] == "released"


def test_a_task_the_scheduler_gave_up_never_starts_its_run(tmp_path, no_leaked_processes):
    """A requeued task that starts again after the driver gave its attempt up leaves the run alone."""
    path, events, work = _task_batch(tmp_path, seconds=0.1)
    (events / "t0.abandoned").write_text("")
    task = _task(path)
    output = finish(task)
    assert task.returncode == 0, output
    end = json.loads((events / "t0.0.end").read_text())
    assert end["lost"] == "the scheduler gave the attempt up before it started", end
    assert not (events / "t0.0.start").exists() and not (work / "worker.log").exists()


def test_a_node_that_cannot_read_the_batch_file_says_why(tmp_path):
    task = _task(tmp_path / "elsewhere" / "batch.json")
    output = finish(task)
    assert task.returncode == 2 and "must be on a file system every node sees" in output, output


def held_verdicts(answers, every=0.5):
    """What the launcher makes of an end no signal came before, squeue answering ``answers`` (one a
    look, ``every`` seconds apart; a state, or None: not listed), up to its first verdict."""
    for looks, answer in enumerate(answers):
        state = None if answer is None else commands.TaskState(answer, "vm", "None")
        verdict = held_end_verdict(state, looks, looks * every)
        if verdict is not None:
            return verdict, looks
    return None, len(answers)


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        (["PENDING"], ("lost", 0)),  # requeued: queued again (BeginTime)
        (["REQUEUED"], ("lost", 0)),
        (["REQUEUE_HOLD"], ("lost", 0)),
        (["PREEMPTED"], ("lost", 0)),
        (["CANCELLED"], ("lost", 0)),
        (["COMPLETED"], ("end", 0)),
        (["FAILED"], ("end", 0)),
        # A requeued task is COMPLETING for as long as slurmd takes to end its processes.
        (["COMPLETING"] * 5 + ["PENDING"], ("lost", 5)),
        (["RUNNING", "COMPLETING", "COMPLETED"], ("end", 2)),
        (["RUNNING"] * 5, ("end", END_LAG)),  # listed for good (slurmstepd died): see the next test
        # Not listed for a moment, then its state; not listed for good: it ended (and was purged).
        ([None, "PENDING"], ("lost", 1)),
        ([None, None, None], ("end", END_LAG)),
        # Listed COMPLETING for good: taken as ended, after HELD_WAIT.
        (["COMPLETING"] * 100, ("end", int(HELD_WAIT / 0.5))),
    ],
)
def test_an_end_no_signal_came_before_waits_for_slurm_to_say_whether_it_took_the_task_down(answers, expected):
    """A requeue signals every process of the job, the run's now and then before its supervisor's:
    its end then says no signal came, and Slurm's state decides. A CI run recorded a run requeued
    0.7 s in as succeeded: a task still live was taken as ended after 2 looks."""
    assert held_verdicts(answers) == expected


def test_ends_that_each_ask_for_squeue_at_once_get_it_at_most_twice_a_second(tmp_path):
    """Each end no signal came before asks Slurm at once whether Slurm took its task down; a sweep
    of many short runs would then ask slurmctld (shared by everyone) many times a second."""
    import threading
    import time

    from helpers import make_config

    from gpu_task_scheduler.backends.slurm.following import LOOK_GAP, Following
    from gpu_task_scheduler.sweep.expand import Sweep

    looks, enough = [], threading.Event()

    class EndsAllTheTime(Following):
        def _send_requests(self):
            pass

        def _read_events(self):
            self._next_look = 0.0  # an end asks for a look at once, at every turn

        def _look(self):
            looks.append(time.monotonic())
            if len(looks) == 4:
                enough.set()

    options = Sweep(make_config(tmp_path / "r", [{}], backend="slurm")).options
    following = EndsAllTheTime(object, options, detach=False)
    thread = threading.Thread(target=following._follow, daemon=True)
    thread.start()
    try:
        assert enough.wait(30)
    finally:
        following._closing = True
        following._wake.set()
        thread.join(10)
    assert min(b - a for a, b in zip(looks, looks[1:], strict=False)) >= LOOK_GAP


@slurm_only
def test_a_run_that_saves_and_exits_0_on_a_requeues_sigterm_runs_again(slurm, in_tmp, no_leaked_processes):
    """A requeue signals every process of the job: a run that saves on SIGTERM and returns recorded a
    success of a run cut short. Its success came after the signal, so it is set aside and the run
    runs again, to its end."""
    from test_process_control import launch

    journal = in_tmp / "journal"
    config = {
        "scheduler_config": {
            "gpu": ["cpu"],
            "result_root_folder": str(in_tmp / "r"),
            "backend": "slurm",
            "grace_period": 5,
            "lease_interval": 0.5,
            "slurm": {"poll_interval": 0.5},
        },
        "global_config": {"journal": str(journal)},
        "test_config": [{"a": [1]}],
    }
    sweep = launch(config, "SavesOnTermTask")
    try:
        wait_until(lambda: journal_lines(journal) == ["start a-1,"], timeout=60, message="the run to start")
        wait_until(lambda: running_tasks(slurm), message="its task to be listed running")
        slurm.run("scontrol", "requeue", running_tasks(slurm)[0])
        output = finish(sweep, timeout=120)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            finish(sweep)
    assert sweep.returncode == 0, output
    assert journal_lines(journal) == ["start a-1,", "saved a-1,", "start a-1,", "end a-1,"], output
    (row,) = ledger_rows(in_tmp / "r").values()
    assert row["status"] == "succeeded" and json.loads(row["result"]) == {"done": True} and row["attempts"] == 2
    assert (in_tmp / "r" / "a-1," / ".gts" / "outcome.json.cut-short").exists()


@slurm_only
def test_a_run_the_early_stop_rule_stops_on_slurm_is_pruned(slurm, in_tmp, no_leaked_processes):
    """ASHA on Slurm, in an order Slurm cannot change (max_parallel 1): the good run reports its rungs
    first; the bad one is stopped at its first rung through its folder, as locally, and recorded pruned."""
    import gts_test_tasks as tasks

    from gpu_task_scheduler import GPUTaskScheduler
    from gpu_task_scheduler.records.status import RunStatus

    config = {
        "scheduler_config": {
            "gpu": ["cpu"],
            "result_root_folder": str(in_tmp / "r"),
            "backend": "slurm",
            "grace_period": 30,
            "slurm": {"max_parallel": 1, "poll_interval": 0.5},
        },
        "test_config": [
            {"loss": [0.1], "report": [3], "pause": [0.01]},
            {"loss": [0.9], "report": [200], "pause": [0.1]},
        ],
        "early_stop": {"method": "asha", "metric": "loss", "mode": "min", "min_step": 1, "max_step": 200},
    }
    summary = GPUTaskScheduler(config, tasks.ContractTask).start()
    assert summary.exit_code == 0, summary.report()
    pruned = summary.outcomes["loss-0.9,pause-0.1,report-200,"]
    assert pruned.status is RunStatus.PRUNED and pruned.cause.startswith("pruned at step 1: loss 0.9"), pruned
    assert pruned.duration < 15  # stopped at its first rung, not after its 200 reports (20 s)
    assert not slurm.jobs()


def test_a_submission_a_killed_start_left_running_is_found_by_its_arrays_name(tmp_path, no_leaked_processes):
    """sbatch outlives a scheduler killed while it submitted; the next start waits for it before it
    looks for that array in the queue, or it would submit the same runs a second time beside it."""
    sbatch = tmp_path / "sbatch"
    sbatch.symlink_to(sys.executable)  # a process whose argv[0] is sbatch, as the real one's
    reader, writer = os.pipe()
    process = subprocess.Popen(
        [str(sbatch), "-c", "import sys; sys.stdin.read()", "--job-name=gts.0a1b2c", "job.sh"], stdin=reader
    )
    os.close(reader)
    try:
        # Popen returns once the exec has closed the child's close-on-exec pipe, a moment before
        # the kernel sets up its new argv: /proc/PID/cmdline reads empty in between.
        wait_until(lambda: Path(f"/proc/{process.pid}/cmdline").read_bytes(), message="sbatch's argv")
        assert commands.submissions_in_flight(["gts.0a1b2c", "gts.other"]) == [process.pid]
        assert commands.submissions_in_flight(["gts.other"]) == []
    finally:
        os.close(writer)  # it ends
        process.wait()
    assert commands.submissions_in_flight(["gts.0a1b2c"]) == []


# --- the launcher's promises, against a faked squeue -----------------------------------------------


def _followed(tmp_path, monkeypatch, squeue, **options):
    """A Slurm launcher with one attempt submitted as task 7_0 and started (its start file read);
    ``squeue``: what Slurm lists, changed by the test. Returns the launcher, the attempt's handle,
    the event set when its end is reported, and the events folder."""
    import threading

    import gts_test_tasks as tasks
    from helpers import make_config

    from gpu_task_scheduler.backends.slurm.launcher import SlurmLauncher
    from gpu_task_scheduler.engine.launcher import Attempt
    from gpu_task_scheduler.gpu.devices import Slot
    from gpu_task_scheduler.records.paths import RunPaths
    from gpu_task_scheduler.sweep.expand import Sweep

    sweep = Sweep(make_config(tmp_path / "r", [{"seconds": [1]}], backend="slurm", **options))
    launcher = SlurmLauncher(tasks.ContractTask, sweep.options)
    events = tmp_path / "r" / ".gts" / "slurm" / "events"
    os.makedirs(events)
    monkeypatch.setattr(commands, "submit", lambda args, script: "7")
    monkeypatch.setattr(commands, "cancel", lambda names, signal_name=None, **kw: None)
    monkeypatch.setattr(commands, "states", lambda jobs: squeue)
    (spec,) = sweep
    os.makedirs(os.path.join(spec.work_dir, ".gts"), exist_ok=True)
    ended = threading.Event()
    attempt = Attempt(spec, Slot("cpu0", ()), RunPaths(spec.work_dir, None), "token0", 1)
    handle = launcher.start(attempt, ended.set, lambda node, pid, since=0.0: None)
    launcher.flush()
    (events / "token0.0.start").write_text(json.dumps({"node": "n1", "pid": 42, "job": "7_0", "incarnation": 0}))
    launcher._look()
    return launcher, handle, ended, events


def test_a_run_stopped_at_slurms_time_limit_is_recorded_timed_out(tmp_path, monkeypatch):
    from gpu_task_scheduler.engine.decide import ExitFacts, classify
    from gpu_task_scheduler.records.status import RunStatus

    squeue = {"7_0": commands.TaskState("RUNNING", "n1", "None")}
    launcher, handle, ended, events = _followed(tmp_path, monkeypatch, squeue)
    end = {
        "returncode": 0,
        "strays": [],
        "unstoppable": [],
        "signalled": True,
        "limit": "stopped at Slurm's time limit",
    }
    (events / "token0.0.end").write_text(json.dumps({**end, "incarnation": 0}))
    launcher._look()
    assert ended.wait(10)
    result = handle.reap()
    assert result.stopped == (RunStatus.TIMED_OUT, "stopped at Slurm's time limit")
    facts = ExitFacts(result.returncode, False, None, result.stopped, None, True, "")
    assert classify(facts).status is RunStatus.TIMED_OUT


@pytest.mark.parametrize("returncode", [1, 0])
@pytest.mark.parametrize(
    "state, lost",
    [("PREEMPTED", True), ("REQUEUED", True), ("NODE_FAIL", True), ("FAILED", False), (None, False)],
)
def test_an_end_with_no_signal_seen_is_checked_against_squeue_before_it_is_recorded(
    tmp_path, monkeypatch, state, lost, returncode
):
    """A run that ended while its supervisor saw no signal: Slurm may have taken it down (a requeue
    reaches the run before its supervisor). A failure may be of Slurm's kill, and a success of a run
    that saved on SIGTERM and exited 0. Its end is held until squeue says: Slurm's doing is a loss
    (the run runs again, a success it recorded set aside), anything else the run's own end."""
    squeue = {"7_0": commands.TaskState("RUNNING", "n1", "None")}
    launcher, handle, ended, events = _followed(tmp_path, monkeypatch, squeue)
    outcome = os.path.join(tmp_path, "r", "seconds-1,", ".gts", "outcome.json")
    if returncode == 0:
        with open(outcome, "w") as out:
            json.dump({"status": "succeeded", "token": "token0", "result": 1}, out)
    (events / "token0.0.end").write_text(
        json.dumps({"returncode": returncode, "strays": [], "unstoppable": [], "incarnation": 0})
    )
    launcher._read_events()
    assert not ended.is_set()  # held: squeue has not been asked since
    squeue.clear()
    if state is not None:
        squeue["7_0"] = commands.TaskState(state, "", "None")
    for _ in range(5):  # a task squeue no longer lists is given a few looks
        launcher._look()
    assert ended.wait(10)
    result = handle.reap()
    assert (result.lost is not None) is lost and (result.returncode == returncode) is (not lost)
    if returncode == 0:
        assert os.path.exists(outcome) is not lost and os.path.exists(outcome + ".cut-short") is lost


def test_a_given_up_attempt_ends_only_once_its_lease_is_over(tmp_path, monkeypatch):
    """A requeued task is given up; its run runs again only once its old attempt is known over:
    its lease released (or expired). Two attempts never overlap."""
    from gpu_task_scheduler.records.lease import LeaseHolder

    squeue = {"7_0": commands.TaskState("RUNNING", "n1", "None")}
    launcher, handle, ended, events = _followed(tmp_path, monkeypatch, squeue, lease_interval=0.5, grace_period=5)
    lease = LeaseHolder(handle_lease := str(tmp_path / "r" / "seconds-1," / ".gts" / "lease"), "token0")
    lease.renew()
    squeue["7_0"] = commands.TaskState("PENDING", "", "BeginTime")  # requeued
    launcher._look()
    for _ in range(6):  # the old attempt still renews its lease: it may still run
        lease.renew()
        assert not ended.wait(0.5), "given up while its lease was still renewed"
    lease.release()
    assert ended.wait(10)
    result = handle.reap()
    assert result.lost is not None and "its processes ended" in result.lost
    assert json.loads(open(handle_lease).read())["state"] == "released"


@slurm_only
def test_a_task_whose_supervisor_never_starts_is_given_up_after_start_timeout(slurm, in_tmp, no_leaked_processes):
    """A task Slurm runs whose supervisor never says it started (here its setup line hangs, as when
    slurmd loses a batch step) is given up after `start_timeout`: cancelled, recorded as lost with
    the reason, and nothing is left in Slurm's queue."""
    # `exec`: the hanging line is the batch step's one process. A `sleep` under the script's bash
    # outlived the cancel once on a machine loaded beyond the suite's own (a fresh-clone CI run:
    # "processes left running after the test"); likely because the test cluster's proctrack/linuxproc
    # finds a job's processes by parentage, and a sleep whose bash died of the SIGTERM first is no
    # one's child by then.
    path = write_sweep(in_tmp, 1, 0.1, setup=["exec sleep 600"], start_timeout=5)
    config = yaml.safe_load(path.read_text())
    config["scheduler_config"]["node_failure_retries"] = 0
    path.write_text(yaml.safe_dump(config))
    process = gts("run", path, "--plain")
    output = finish(process, timeout=90)
    assert process.returncode != 0 and "its supervisor never started" in output, output
    (row,) = ledger_rows(in_tmp / "results").values()
    assert row["status"] == "interrupted" and "never started" in row["cause"], row
    assert journal_lines(in_tmp / "journal") == []
    assert slurm.jobs() == []
