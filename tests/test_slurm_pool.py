"""Slurm pools (``slurm: {pool: {...}}``) against a real Slurm of two nodes (conftest.slurm_pool:
two slurmd on this machine, gts0 and gts1), and the pool's pure parts.

Each run here is ``stepping_command.py``: it journals its start (and the step it went on from),
each step after reporting it, and its end, with its node. What must hold after every fault: each
run ends exactly once, no step is trained twice after it was reported, every run succeeded, and
nothing is left in Slurm's queue or the pool's folders.

The fault battery runs one seed per fault in the suite; ``GTS_POOL_SEEDS=5`` runs five."""

import contextlib
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml
from conftest import wait_until
from helpers import journal_lines, ledger_rows
from test_process_control import finish
from test_slurm import gts

from gpu_task_scheduler.backends.slurm.pool import PoolLauncher
from gpu_task_scheduler.backends.slurm.poolfiles import PoolFiles, job_of
from gpu_task_scheduler.errors import ConfigError
from gpu_task_scheduler.sweep.options import parse_scheduler_config

HERE = os.path.dirname(os.path.abspath(__file__))
pool_only = pytest.mark.xdist_group("clusters")
SEEDS = range(int(os.environ.get("GTS_POOL_SEEDS", "1")))


def write_sweep(folder, runs, steps, seconds, *, pool=None, **scheduler):
    config = {
        "scheduler_config": {
            "gpu": ["cpu"],
            "result_root_folder": str(folder / "results"),
            "backend": "slurm",
            "grace_period": 2,
            "lease_interval": 0.5,
            "node_failure_retries": 0,  # a lost run fails: the faults below must hand runs back or adopt them
            "max_retries": 0,
            "slurm": {
                "poll_interval": 0.5,
                "start_timeout": 30,  # an allocation whose batch step slurmd lost is replaced in time
                "pool": {"nodes": 2, "slots_per_node": 2, "idle_exit": 2, **(pool or {})},
            },
            **scheduler,
        },
        "command": [
            sys.executable,
            os.path.join(HERE, "stepping_command.py"),
            "{i}",
            str(steps),
            str(seconds),
            str(folder / "journal"),
        ],
        "test_config": [{"i": list(range(runs))}],
    }
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def journal(folder):
    """Per run: its starts (the step each went on from), its steps in order, its ends, its nodes."""
    runs = {}
    for line in journal_lines(folder / "journal"):
        word, run, *rest = line.split()
        entry = runs.setdefault(run, {"starts": [], "steps": [], "ends": 0, "nodes": set(), "spans": []})
        if word == "start":
            entry["starts"].append(int(rest[0]))
            entry["spans"].append([float(rest[1]), None, rest[2], rest[-1]])  # start, end, GPUs, node
        elif word == "step":
            entry["steps"].append(int(rest[0]))
        else:
            entry["ends"] += 1
            entry["spans"][-1][1] = float(rest[0])
        entry["nodes"].add(rest[-1])
    return runs


def check_exactly_once(folder, runs, steps):
    """Every run ended once, having trained each step at most once, its last one last; the ledger
    says succeeded; nothing of the pool is left behind."""
    found = journal(folder)
    assert sorted(found) == sorted(map(str, range(runs))), found
    for run, entry in found.items():
        assert entry["ends"] == 1, (run, entry)
        assert entry["steps"] == sorted(set(entry["steps"])) and entry["steps"][-1] == steps, (run, entry)
    rows = ledger_rows(folder / "results")
    assert {row["status"] for row in rows.values()} == {"succeeded"}, {n: r["status"] for n, r in rows.items()}
    files = PoolFiles(str(folder / "results"))
    assert os.listdir(files.queue) == [] and os.listdir(files.events) == [], "pool files left behind"
    assert all(os.listdir(files.claimed(agent)) == [] for agent in os.listdir(files.agents))
    return found, rows


def allocations(cluster, state="RUNNING"):
    return cluster.run("squeue", "-h", "-t", state, "-o", "%i").stdout.split()


def steps_reported(folder, least):
    return sum(len(entry["steps"]) >= least for entry in journal(folder).values())


# --- the pool's pure parts ------------------------------------------------------------------


def _options(pool, **slurm):
    return parse_scheduler_config(
        {"gpu": ["cpu"], "result_root_folder": "/tmp/r", "backend": "slurm", "slurm": {"pool": pool, **slurm}}
    )


def test_each_allocation_asks_for_its_nodes_its_gpus_and_the_warning_before_its_time_limit():
    launcher = PoolLauncher(
        type("T", (), {}), _options({"nodes": 3, "allocations": 2, "time": "4:00:00", "gpus_per_node": 4})
    )
    args = launcher.job_args()
    assert "--nodes=3" in args and "--no-kill" in args and "--gres=gpu:4" in args and "--time=4:00:00" in args
    assert "--signal=B:USR1@60" in args  # the grace period and a margin, at least Slurm's minute
    assert launcher.pool_slots() == 4 * 3 * 2  # one run per GPU unless max_runs_per_gpu packs more
    no_time = PoolLauncher(type("T", (), {}), _options({"nodes": 1, "slots_per_node": 5}, partition="cpu")).job_args()
    assert "--partition=cpu" in no_time and not any(arg.startswith(("--signal", "--time", "--gres")) for arg in no_time)


def _shape(pool, node_gpus=None, gpu=("cpu",), **slurm):
    """The allocation's shape and sbatch arguments, on a partition of 2 nodes of 8 CPUs and
    ``node_gpus`` GPUs (None: sinfo is not here to say); whether sinfo was asked."""
    from gpu_task_scheduler.backends.slurm.commands import Partition
    from gpu_task_scheduler.backends.slurm.shape import allocation_args, pool_shape

    options = parse_scheduler_config(
        {
            "gpu": "all" if list(gpu) == ["all"] else list(gpu),
            "result_root_folder": "/tmp/r",
            "backend": "slurm",
            "slurm": {"pool": pool, **slurm},
        }
    )
    asked = []

    def partition():
        asked.append(True)
        return None if node_gpus is None else Partition(nodes=2, cpus=8, gpus=node_gpus)

    shape = pool_shape(options, partition)
    return shape, allocation_args(options, shape), bool(asked)


WHOLE = ["--cpus-per-task=8", "--mem=0"]  # every CPU and all the memory of a node of 8 CPUs


@pytest.mark.parametrize(
    ("pool", "gpu", "node_gpus", "slurm", "held", "runs", "sinfo"),
    [
        # R3: an allocation asked for 1 CPU and ran 8 runs. Whole nodes by default: every CPU, all memory.
        ({"slots_per_node": 8}, ["cpu"], 0, {}, WHOLE, 8, True),
        ({"slots_per_node": 8}, ["cpu"], 0, {"mem": "16G"}, WHOLE, 8, True),
        (
            {"slots_per_node": 8},
            ["cpu"],
            None,
            {},
            ["--cpus-per-task=<each node's CPUs, from sinfo at the start>"],
            8,
            True,
        ),
        # Shared nodes: the CPUs and memory of the slots it fills.
        ({"slots_per_node": 8, "exclusive": False}, ["cpu"], None, {}, ["--cpus-per-task=8"], 8, False),
        (
            {"slots_per_node": 4, "exclusive": False},
            ["cpu"],
            None,
            {"cpus_per_run": 3, "mem": "16G"},
            ["--cpus-per-task=12", "--mem=64G"],
            4,
            True,  # cpus_per_run: checked against the nodes' CPUs
        ),
        (
            {"gpus_per_node": 2, "exclusive": False},
            ["all"],
            None,
            {"cpus_per_run": 4, "mem": "20000"},
            ["--cpus-per-task=8", "--mem=40000", "--gres=gpu:2"],
            2,
            True,
        ),
        # gpu: all on whole nodes: the GPUs each node of the partition has as GRES (sinfo), not none.
        ({}, ["all"], 4, {}, [*WHOLE, "--gres=gpu:4"], 4, True),
        ({}, ["all"], 4, {"gpus_per_run": 2}, [*WHOLE, "--gres=gpu:4"], 2, True),
        ({}, ["all"], None, {}, ["--gres=gpu:<each node's GPUs, from sinfo at the start>"], None, True),
        ({"gpus_per_node": 8, "exclusive": False}, ["all"], 4, {}, ["--gres=gpu:8"], 8, False),  # said: not asked
    ],
)
def test_an_allocation_holds_what_its_runs_use(pool, gpu, node_gpus, slurm, held, runs, sinfo):
    shape, args, asked = _shape(pool, node_gpus, gpu, **slurm)
    assert set(held) <= set(args), args
    assert shape.runs_per_node == runs and asked == sinfo
    assert ("--mem=0" in args) == pool.get("exclusive", True)
    assert "--exclusive" not in args  # Slurm 22.05 never again gives a shrunk exclusive job's nodes to one (shape.py)
    assert (
        sum(arg.startswith("--cpus-per-task") for arg in args) == 1
        and sum(arg.startswith("--mem") for arg in args) <= 1
    )


@pytest.mark.parametrize(
    ("pool", "node_gpus", "slurm", "words"),
    [
        ({}, 0, {}, "the default partition has none as GRES"),
        ({}, 0, {"partition": "cpu"}, "partition cpu has none as GRES"),
        ({"exclusive": False}, 4, {}, "a GPU sweep on shared nodes"),
        ({"gpus_per_node": 1}, None, {"gpus_per_run": 2}, "each run takes 2 GPU"),
        ({"exclusive": "yes"}, None, {}, "true \\(whole nodes\\) or false"),
        ({}, 4, {"cpus_per_run": 9}, "the partition's nodes have 8 CPUs"),
        ({"gpus_per_node": 4, "exclusive": False}, 4, {"cpus_per_run": 3}, "4 run\\(s\\) a node x cpus_per_run 3"),
    ],
)
def test_a_gpu_sweep_never_falls_back_to_cpu_slots_in_silence(pool, node_gpus, slurm, words):
    with pytest.raises(ConfigError, match=words):
        _shape(pool, node_gpus, ["all"], **slurm)


def test_an_agent_uses_the_gpus_slurm_gave_its_job_and_shares_out_its_cpus(monkeypatch, capsys, tmp_path):
    from gpu_task_scheduler.backends.slurm import agent

    options = parse_scheduler_config({"gpu": "all", "result_root_folder": str(tmp_path)})
    settings = {"gpus_per_node": 4, "gpus_per_run": 2}
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(agent.NoGPUs, match="does not run on CPU slots instead"):
        agent._node_options(options, settings)
    monkeypatch.setenv("SLURM_JOB_GPUS", "4,5,6,7")  # NVML may see 8: only the job's are used
    slots = agent._node_options(options, settings).slots
    assert [slot.gpu_ids for slot in slots] == [("4", "5"), ("6", "7")]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the job's own word wins
    run = agent._with_share({"env": {"MKL_NUM_THREADS": "1"}}, (0, 1))
    assert run["env"] == {"MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "2"}


@pytest.mark.parametrize(
    ("environ", "gpus"),
    [
        ({"CUDA_VISIBLE_DEVICES": "NoDevFiles", "SLURM_JOB_GPUS": "2,3"}, ("2", "3")),  # a GRES without device files
        ({"CUDA_VISIBLE_DEVICES": "-1"}, None),  # CUDA's word for no device: no GPU id
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, ("0", "1")),
    ],
)
def test_an_agent_takes_no_word_for_a_gpu_id(monkeypatch, tmp_path, environ, gpus):
    from gpu_task_scheduler.backends.slurm import agent

    options = parse_scheduler_config({"gpu": "all", "result_root_folder": str(tmp_path)})
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    if gpus is None:
        with pytest.raises(agent.NoGPUs):
            agent._node_options(options, {"gpus_per_node": 2, "gpus_per_run": 2})
    else:
        (slot,) = agent._node_options(options, {"gpus_per_node": 2, "gpus_per_run": 2}).slots
        assert slot.gpu_ids == gpus


def test_an_agents_thread_is_not_left_bound_to_the_cpus_of_the_run_it_started(tmp_path, no_leaked_processes):
    """A run inherits the CPUs of the thread that starts it: the thread is bound to them for that
    moment, and its own again afterwards (or the agent's next work runs on one run's CPUs)."""
    from gpu_task_scheduler.backends.supervisor import start_run

    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        pytest.skip("needs two CPUs")
    one = min(mine)
    out = tmp_path / "affinity"
    run = {
        "argv": [sys.executable, "-c", f"import os; open({str(out)!r}, 'w').write(str(sorted(os.sched_getaffinity(0))))"],  # noqa: E501
        "env": {}, "python": sys.executable, "reports_outcome": False, "grace_period": 1.0, "cwd": str(tmp_path),
        "log": str(tmp_path / "log"), "token": "t" * 24, "work_dir": str(tmp_path),
    }  # fmt: skip
    handle, ended = start_run(run, "", (one,))
    assert os.sched_getaffinity(0) == mine
    assert ended.wait(30)
    assert out.read_text() == str([one])
    handle.child.reap()
    if handle.keeper is not None:
        handle.keeper.close()


def test_a_partitions_cpus_per_node_are_its_smallest_nodes(tmp_path, monkeypatch):
    """sinfo lists each node (%N %c %G): a pool shaped to the largest node's CPUs would ask the
    smaller ones for more than they have."""
    from gpu_task_scheduler.backends.slurm.commands import partition

    sinfo = tmp_path / "sinfo"
    sinfo.write_text("#!/bin/sh\nprintf 'big 64 gpu:8\\nsmall 16 gpu:4\\nmid 32 (null)\\n'\n")
    sinfo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    found = partition(None)
    assert (found.nodes, found.cpus, found.gpus) == (3, 16, 4)


class _Handle:
    """What the driver's requests touch of an attempt's handle."""

    def __init__(self, token):
        import threading

        self.token, self.ended, self.over = token, None, threading.Event()
        self.fencing, self.node, self.on_placed = False, None, None

    def has_exited(self):
        return self.ended is not None

    def on_exit(self):
        pass


def test_a_kill_asked_while_the_stop_is_written_is_sent_too(tmp_path, monkeypatch):
    """Two Ctrl-C within a millisecond: the second (KILL) comes while the driver writes the first's
    word (TERM) for the agent that holds the run. It was lost (a flag set after the write), and a
    run that traps SIGTERM ran out its grace period; now the next round writes the kill."""
    from gpu_task_scheduler.backends.slurm import pool as pool_module
    from gpu_task_scheduler.backends.slurm.pool import _Attempt

    launcher = PoolLauncher(type("T", (), {}), _options({"nodes": 1}, poll_interval=0.5))
    launcher._files = PoolFiles(str(tmp_path))
    os.makedirs(launcher._files.events)
    os.makedirs(launcher._files.queue)
    task = _Attempt(_Handle("t0"), {"name": "a,"}, entry="000000001.t0.json")  # claimed: not in the queue
    launcher._attempts["t0"] = task
    real, written = pool_module.atomic_write, []

    def write(path, data, **kwargs):
        written.append(os.path.basename(path))
        real(path, data, **kwargs)
        if len(written) == 1:
            launcher.request("t0", "KILL")  # the second signal, in the window

    monkeypatch.setattr(pool_module, "atomic_write", write)
    launcher.request("t0", "TERM")
    launcher._send_requests()
    launcher._send_requests()
    assert written == ["t0.stop", "t0.kill"]
    launcher._send_requests()
    assert written == ["t0.stop", "t0.kill"]  # each word once


def test_of_two_attempts_of_one_run_an_earlier_start_left_the_newer_is_followed_and_the_older_given_up(
    tmp_path, monkeypatch
):
    """An earlier start left two attempts of run a, (one queued, one claimed by a live agent): a run
    has one attempt to follow. The older (its entry's number) is withdrawn from the queue, told
    abandoned and its lease waited for before anything runs; the newer is followed. And an adopted
    attempt the engine does not follow (its ledger knows another) is given up, and over, before the
    new one is queued: it was dropped, and an agent ran it beside the new one (a fresh-clone CI run:
    a run that trained its steps twice at once after the driver was SIGKILLed and started again)."""
    from gpu_task_scheduler.backends.slurm import commands
    from gpu_task_scheduler.backends.slurm import pool as pool_module
    from gpu_task_scheduler.backends.slurm.commands import TaskState

    launcher = PoolLauncher(type("T", (), {}), _options({"nodes": 1}))
    files = launcher._files = PoolFiles(str(tmp_path))
    files.make()
    monkeypatch.setattr(commands, "jobs_named", lambda name: {"7": TaskState(state="RUNNING", node="gts0", reason="")})
    waited = []
    monkeypatch.setattr(pool_module, "wait_all_over", lambda stale, terms: waited.append(sorted(stale)))

    def entry(seq, token, where):
        name = f"{seq:09d}.{token}.json"
        run = {"name": "a,", "token": token, "lease": str(tmp_path / f"{token}.lease")}
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, name), "w") as handle:
            json.dump(run, handle)
        return name

    older = entry(1, "t1", files.claimed("7.0.gts0.a1b2"))  # claimed by the agent of allocation 7, which runs
    newer = entry(2, "t2", files.queue)
    launcher._adopt()
    assert launcher.live_attempt("a,") == "t2"
    assert os.path.exists(files.event("t1", "abandoned")) and waited == [[(str(tmp_path / "t1.lease"), "t1")]]
    assert os.path.exists(os.path.join(files.queue, newer)) and not os.path.exists(files.event("t2", "abandoned"))
    assert os.path.exists(os.path.join(files.claimed("7.0.gts0.a1b2"), older))  # its agent's: the word stops it

    class Started(Exception):
        pass

    def prepared(attempt):
        raise Started  # the new attempt is prepared only once the adopted one is given up and over

    monkeypatch.setattr(launcher, "_prepared", prepared)
    attempt = types.SimpleNamespace(spec=types.SimpleNamespace(name="a,"), token="t3")
    with pytest.raises(Started):
        launcher.start(attempt, lambda: None)
    assert not os.path.exists(os.path.join(files.queue, newer)) and os.path.exists(files.event("t2", "abandoned"))
    assert waited[-1] == [(str(tmp_path / "t2.lease"), "t2")]


def test_the_abandoned_word_for_a_claim_of_an_allocation_taken_for_gone_outlives_the_events_cleanup(
    tmp_path, monkeypatch
):
    """A claim whose allocation squeue does not list as running is given up: told abandoned, its
    lease waited for, then the run runs again. The word was written, then deleted at once with the
    events of attempts no one follows: an agent that was in fact alive (squeue slow to list it, a
    node lost under --no-kill) took the lease after the wait and, with no word, ran the attempt
    beside the run's next one."""
    from gpu_task_scheduler.backends.slurm import commands
    from gpu_task_scheduler.backends.slurm import pool as pool_module

    launcher = PoolLauncher(type("T", (), {}), _options({"nodes": 1}))
    files = launcher._files = PoolFiles(str(tmp_path))
    files.make()
    monkeypatch.setattr(commands, "jobs_named", lambda name: {})  # allocation 7 not listed
    monkeypatch.setattr(pool_module, "wait_all_over", lambda stale, terms: None)
    claimed = files.claimed("7.0.gts0.a1b2")
    os.makedirs(claimed)
    with open(os.path.join(claimed, "000000001.t1.json"), "w") as handle:
        json.dump({"name": "a,", "token": "t1", "lease": str(tmp_path / "t1.lease")}, handle)
    with open(files.event("t9", "end"), "w") as handle:  # an end of an attempt no one follows: swept
        handle.write("{}")
    launcher._adopt()
    assert os.path.exists(files.event("t1", "abandoned")) and not os.path.exists(files.event("t9", "end"))
    assert launcher.live_attempt("a,") is None


@pytest.mark.parametrize(
    ("state", "succeeded"),
    [("RUNNING", True), ("CANCELLED", False), ("PENDING", False), ("COMPLETING", False), (None, False)],
)
def test_a_success_that_came_with_slurms_end_of_its_allocation_is_set_aside_and_runs_again(tmp_path, state, succeeded):
    """A cancel, a requeue or a preemption of an allocation signals every process of it, the run's
    now and then before its agent's: a run that saved on SIGTERM and exited 0 then ends with a
    success its agent saw no signal before. It is held until a squeue asked after its end was read
    says whether the allocation still runs: if not, the success is of a run cut short, set aside,
    and the run runs again (lost). One asked before its end was read may say RUNNING of an
    allocation Slurm already took down: it decides nothing."""
    import time

    from gpu_task_scheduler.backends.slurm.commands import TaskState
    from gpu_task_scheduler.backends.slurm.pool import _Attempt
    from gpu_task_scheduler.records.paths import RunPaths

    launcher = PoolLauncher(type("T", (), {}), _options({"nodes": 1}, poll_interval=0.5))
    launcher._files = PoolFiles(str(tmp_path / "pool"))
    os.makedirs(launcher._files.events)
    paths = RunPaths(str(tmp_path / "run"), None)
    os.makedirs(paths.meta)
    with open(paths.outcome, "w") as handle:
        json.dump({"status": "succeeded", "token": "t0", "result": 1}, handle)
    task = _Attempt(_Handle("t0"), {"name": "a,", "work_dir": str(tmp_path / "run"), "log": None}, entry="e")
    task.placed, task.job = True, "5"
    task.handle.node = "node1 (pool job 5)"  # as its start record said
    launcher._attempts["t0"] = task
    with open(launcher._files.event("t0", "0.end"), "w") as handle:
        json.dump({"returncode": 0, "strays": [], "unstoppable": [], "node": "node1"}, handle)
    before = time.monotonic()
    launcher._read_events()
    assert task.held is not None and not task.handle.has_exited()  # held, not taken at once
    states = {} if state is None else {"5": TaskState(state, "node1", "None")}
    launcher._failed_or_handed_back(task, {"5": TaskState("RUNNING", "node1", "None")}, before)
    assert not task.handle.has_exited()  # an answer asked before its end was read decides nothing
    launcher._failed_or_handed_back(task, states, time.monotonic())
    assert task.handle.has_exited()
    assert (task.handle.ended.lost is None) == succeeded
    assert os.path.exists(paths.outcome) == succeeded
    assert os.path.exists(paths.outcome + ".cut-short") == (not succeeded)


def _returns_at_once(call):
    """call()'s value, or a failure if it blocks (a plain open() of a FIFO does, for good)."""
    import threading

    result = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "it blocked"
    return result[0]


def _release(fifo):
    """A reader blocked on the FIFO (a failing run of these tests) gets its writer, and goes."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def test_what_lies_where_the_driver_reads_the_pools_size_never_blocks_it(tmp_path, caplog):
    """S1: a FIFO at .gts/slurm/pool/allocations hung the driver for good (a plain open()): runs
    ended unheard and no signal stopped it. The size file is read regular-only, never through a
    link; what cannot be read is said once, and the config's size holds."""
    launcher = PoolLauncher(type("T", (), {}), _options({"nodes": 1, "allocations": 3}))
    files = launcher._files = PoolFiles(str(tmp_path))
    files.make()
    launcher._most = 4  # the partition's nodes over the allocation's (open() asks sinfo)
    os.mkfifo(files.target)
    try:
        assert _returns_at_once(launcher._target) == 3
    finally:
        _release(files.target)
    assert _returns_at_once(launcher._target) == 3
    assert caplog.text.count("is not a regular file") == 1 and files.target in caplog.text, caplog.text
    os.unlink(files.target)
    (tmp_path / "two").write_text("2\n")
    os.symlink(tmp_path / "two", files.target)
    assert launcher._target() == 3 and "is a symbolic link" in caplog.text
    os.unlink(files.target)
    for text, size in (("2\n", 2), ("5\n", 3), ("0\n", 3), ("4", 4)):
        (tmp_path / "asked").write_text(text)
        os.replace(tmp_path / "asked", files.target)
        assert launcher._target() == size, text
    assert "'5' is no number of allocations from 1 to 4" in caplog.text


def test_an_agent_refuses_options_that_are_no_regular_file_at_once(tmp_path, capsys):
    from gpu_task_scheduler.backends.slurm import agent

    files = PoolFiles(str(tmp_path))
    files.make()
    (tmp_path / ".gts" / "slurm" / "pool" / "pool.json").write_text("{}")
    os.mkfifo(files.options)
    try:
        assert _returns_at_once(lambda: agent.main([str(tmp_path)])) == 2
    finally:
        _release(files.options)
    assert "cannot read the pool's options" in capsys.readouterr().err


@pytest.mark.parametrize("words", [("TERM", "KILL"), ("KILL",)])
def test_a_stop_or_a_kill_that_comes_while_an_agent_starts_the_run_keeps_it_from_starting(
    tmp_path, monkeypatch, no_leaked_processes, words
):
    """Two Ctrl-C (or gts stop --now) while an agent has claimed an attempt and is starting it: the
    agent is held between its claim and the run's start (an event), the driver's words are sent
    there. The agent's loop relayed words only after the run had started (up to 10 s later), so a
    run that traps SIGTERM started, and ran until the kill came. Now the words reach the attempt
    while it starts: the run never starts, and the driver records the end it asked for."""
    import threading

    import gts_test_tasks as tasks
    from helpers import make_config

    from gpu_task_scheduler.backends.slurm import agent as agent_module
    from gpu_task_scheduler.engine.launcher import Attempt
    from gpu_task_scheduler.gpu.devices import Slot
    from gpu_task_scheduler.records.paths import RunPaths
    from gpu_task_scheduler.sweep.expand import Sweep

    config = make_config(tmp_path / "r", [{"seconds": [30], "trap_term": [True]}], backend="slurm", grace_period=60)
    config["scheduler_config"]["slurm"] = {"pool": {"nodes": 1, "slots_per_node": 1}}
    sweep = Sweep(config)
    options, spec = sweep.options, next(iter(sweep))
    os.makedirs(options.result_root_folder)
    launcher = PoolLauncher(tasks.ContractTask, options)
    files = launcher._files
    files.make()
    heard = threading.Event()
    token = "a" * 32
    handle = launcher.start(
        Attempt(spec, Slot("pool0", ()), RunPaths(spec.work_dir, options.log_file), token, 1), heard.set
    )
    launcher.flush()
    settings = {"lease_every": options.lease_interval, "idle_exit": 30, "gpus_per_node": 0, "slots_per_node": 1}
    agent = agent_module.Agent(files, settings, options)
    held, release = threading.Event(), threading.Event()
    real = agent_module.supervise

    def holding(*args, **kwargs):  # between the claim and the run's start
        held.set()
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(agent_module, "supervise", holding)
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    try:
        assert held.wait(30), "the agent never claimed the attempt"
        for word in words:
            launcher.request(token, word)
            launcher._send_requests()
        wait_until(lambda: agent.running[token].killed.is_set(), timeout=5, message="the kill to reach the attempt")
    finally:
        release.set()
    wait_until(lambda: (launcher._read_events(), heard.is_set())[1], timeout=10, message="the driver to hear the end")
    assert handle.reap().returncode == -9
    assert not os.path.exists(os.path.join(spec.work_dir, "ready")), "the run started"
    agent.draining.set()
    loop.join(10)
    assert not loop.is_alive()


@pytest.mark.parametrize(
    ("pool", "words"),
    [
        ({"nodes": 0}, "'nodes'] must be an integer >= 1"),
        ({"nodes": 2, "allocation": 1}, "unknown key 'allocation'"),
        ({"time": "forever"}, "a Slurm time"),
        ({"gpus_per_node": -1}, "an integer >= 0"),
        ({"idle_exit": True}, "seconds between 0 and 86400"),
        ("two nodes", "must be a dict"),
    ],
)
def test_a_pool_key_that_slurm_would_not_take_is_refused_before_anything_is_submitted(pool, words):
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        _options(pool)


def test_a_dry_run_says_how_many_jobs_a_start_submits_and_what_each_asks_for(in_tmp):
    def dry_run(path):
        argv = [sys.executable, "-m", "gpu_task_scheduler", "run", path, "--dry-run"]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    pool = write_sweep(in_tmp, 5, 1, 0.1, pool={"time": "1:00:00", "allocations": 2})
    said = dry_run(pool)
    assert "slurm pool: 2 allocation job(s) of 2 whole node(s) for the 5 run(s), up to 8 at once" in said, said
    assert "each run on an even share of its node's CPUs" in said, said
    assert "--nodes=2 --ntasks-per-node=1 --no-kill --cpus-per-task=" in said and " --mem=0 --time=1:00:00" in said
    config = yaml.safe_load(pool.read_text())
    del config["scheduler_config"]["slurm"]["pool"]
    pool.write_text(yaml.safe_dump(config))
    said = dry_run(pool)
    assert "slurm: 5 job array task(s) in at least 1 array(s)" in said and "one per run" in said, said


# --- on the real Slurm ---------------------------------------------------------------------


@pool_only
def test_a_pool_runs_every_run_once_on_both_nodes_with_one_job(slurm_pool, in_tmp, no_leaked_processes):
    """16 runs through one allocation of 2 nodes, 2 slots each: every run once, on both nodes, at
    most 4 at once, one sbatch for the whole sweep; `gts status` shows the pool while it runs."""
    path = write_sweep(in_tmp, 16, 2, 0.2)
    process = gts("run", path, "--plain")
    wait_until(lambda: steps_reported(in_tmp, 1) >= 2, timeout=60, message="runs to start")
    status = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "status", str(in_tmp / "results")],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    output = finish(process, timeout=120)
    assert process.returncode == 0, output
    found, _ = check_exactly_once(in_tmp, 16, 2)
    assert set().union(*(entry["nodes"] for entry in found.values())) == {"gts0", "gts1"}
    assert output.count("Slurm pool: submitted allocation") == 1, output
    assert "pool: 1 allocation" in status and "gts0" in status and "gts1" in status, status
    from gpu_task_scheduler.web.data import overview  # the page and the report show what status shows

    assert overview(str(in_tmp / "results"))["pool"] == ["pool: over; 1 allocation(s) submitted by its last start"]
    assert slurm_pool.jobs() == []
    assert os.listdir(PoolFiles(str(in_tmp / "results")).agents) == []  # the allocation ended: its agents' folders went


@pool_only
def test_the_time_limit_warning_hands_running_runs_back_and_they_go_on_from_their_last_step(
    slurm_pool, in_tmp, no_leaked_processes
):
    """Slurm's warning before the time limit (--signal=B:USR1, sent here by scancel --batch): the
    agents start nothing more and stop their runs; each goes on from its last reported step in a
    second allocation. No run fails, none is counted as a retry (max_retries and
    node_failure_retries are 0)."""
    path = write_sweep(in_tmp, 4, 8, 0.3, pool={"slots_per_node": 2})
    process = gts("run", path, "--plain")
    wait_until(lambda: steps_reported(in_tmp, 2) == 4, timeout=60, message="every run to report 2 steps")
    (job,) = allocations(slurm_pool)
    slurm_pool.run("scancel", "--signal=USR1", "--batch", job)
    output = finish(process, timeout=120)
    assert process.returncode == 0, output
    found, rows = check_exactly_once(in_tmp, 4, 8)
    assert output.count("Slurm pool: submitted allocation") == 2, output
    for run, entry in found.items():
        first, second = entry["starts"]  # handed back once, gone on from its last reported step
        assert first == 0 and second >= 2 and entry["steps"][0] == 1, (run, entry)
        assert rows[f"i-{run},"]["attempts"] == 2


@pool_only
def test_a_node_left_with_nothing_to_run_is_given_back_while_the_other_works(slurm_pool, in_tmp, no_leaked_processes):
    """One run, two nodes, idle_exit 1 s: the agent with nothing to run ends, and its node leaves the
    allocation (scontrol update NodeList=) while the run goes on on the other; the node that runs
    the batch script goes with the job."""
    path = write_sweep(in_tmp, 1, 12, 0.5, pool={"slots_per_node": 1, "idle_exit": 1})
    process = gts("run", path, "--plain")
    wait_until(lambda: steps_reported(in_tmp, 1), timeout=60, message="the run to report")
    (node,) = journal(in_tmp)["0"]["nodes"]
    (job,) = allocations(slurm_pool)
    nodes = lambda: slurm_pool.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()  # noqa: E731
    if node == "gts0":  # the batch script's node: gts1 is given back
        wait_until(lambda: nodes() == "gts0", timeout=30, message="gts1 to leave the allocation")
    else:
        assert nodes() == "gts[0-1]"
    output = finish(process, timeout=120)
    assert process.returncode == 0, output
    check_exactly_once(in_tmp, 1, 12)


@pool_only
def test_gts_pool_grows_the_pool_of_a_running_sweep(slurm_pool, in_tmp, no_leaked_processes):
    """One allocation of one node; `gts pool ROOT --allocations 2` from another shell: a second
    allocation is submitted at once, and the runs spread over both."""
    path = write_sweep(in_tmp, 12, 4, 0.3, pool={"nodes": 1, "slots_per_node": 2})
    process = gts("run", path, "--plain")
    wait_until(lambda: steps_reported(in_tmp, 1) >= 1, timeout=60, message="a run to report")
    too_many = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "pool", str(in_tmp / "results"), "--allocations", "99999"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert too_many.returncode == 1 and "the pool can use 1 to 2 allocation(s)" in too_many.stderr, too_many.stderr
    asked = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "pool", str(in_tmp / "results"), "--allocations", "2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert asked.returncode == 0 and "to keep 2 allocation(s)" in asked.stdout, asked.stdout + asked.stderr
    output = finish(process, timeout=120)
    assert process.returncode == 0, output
    found, _ = check_exactly_once(in_tmp, 12, 4)
    assert output.count("Slurm pool: submitted allocation") == 2, output
    assert len(set(re.findall(r"\(pool job (\d+)\)", output))) == 2, output  # runs ran in both
    nodes = {}  # each allocation holds its node whole: the two never share one
    for node, job in re.findall(r"runs on (\S+) cpu\d+ \(pool job (\d+)\)", output):
        nodes.setdefault(job, set()).add(node)
    assert len(nodes) == 2 and not set.intersection(*nodes.values()), nodes


def test_a_run_waiting_for_a_machine_counts_as_queued_and_its_clock_starts_on_its_node(tmp_path, capsys):
    """R4: gts status counted runs still in a pool's queue as running (6 running on 4 slots, in
    slots with no node, their duration ticking), and every duration held the wait in the queue.
    An attempt a cluster launcher takes is recorded queued (its node '') until it is placed: it
    counts as queued, its wait is shown apart, and its duration and slot time start on its node."""
    from gpu_task_scheduler.cli.main import main as gts_main
    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.ledger.lock import SweepLock
    from gpu_task_scheduler.records.paths import RootPaths
    from gpu_task_scheduler.records.status import RunStatus
    from gpu_task_scheduler.reports.status import status

    root = str(tmp_path / "results")
    clock = [1000.0]
    with SweepLock(RootPaths(root)), Ledger(RootPaths(root)) as ledger:  # a scheduler holds the root
        ledger._clock = lambda: clock[0]
        for index in range(3):
            ledger.mark_running(
                name=f"i-{index},", run_index=index, config_hash="h", slot=f"pool{index}", token="t",
                work_dir=f"i-{index},", queued=True,
            )  # fmt: skip
        clock[0] = 1030.0
        ledger.set_node("i-0,", "gts0", 4242, since=10.0)  # started there 10 s ago, after 20 s in the queue
        ledger.commit()
        report = status(root)
        runs = {run["name"]: run for run in report["runs"]}
        assert report["counts"]["running"] == 1 and report["counts"]["queued"] == 2, report["counts"]
        assert runs["i-0,"]["status"] == "running" and runs["i-0,"]["node"] == "gts0"
        assert runs["i-1,"]["status"] == "queued" and runs["i-1,"]["node"] is None
        assert runs["i-1,"]["duration"] is None and runs["i-1,"]["queued_for"] > 0
        assert 0 < runs["i-0,"]["duration"] < runs["i-1,"]["queued_for"]  # its clock started on gts0
        assert gts_main(["status", root]) == 0
        out = capsys.readouterr().out
        assert "1 running, 2 queued" in out and "in queue" in out, out
        clock[0] = 1040.0
        ledger.finish("i-0,", RunStatus.SUCCEEDED, exit_code=0, ended_at=1040.0)
        ledger.commit()
        (row,) = [run for run in status(root)["runs"] if run["name"] == "i-0,"]
        assert row["duration"] == pytest.approx(20.0)  # 10 s before the look, 10 s after: not the 20 s queued


def _share_sweep(folder, runs, together, gpu, pool, scheduler=None, **slurm):
    config = {
        "scheduler_config": {
            **(scheduler or {}),
            "gpu": gpu,
            "result_root_folder": str(folder / "results"),
            "backend": "slurm",
            "grace_period": 2,
            "lease_interval": 0.5,
            "slurm": {"poll_interval": 0.5, "pool": {"idle_exit": 2, **pool}, **slurm},
        },
        "command": [sys.executable, os.path.join(HERE, "share_command.py"), "{i}", str(folder / "said"), str(together)],
        "test_config": [{"i": list(range(runs))}],
    }
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _said(folder):
    names = [name for name in os.listdir(folder / "said") if name.endswith(".json")]
    return {name[: -len(".json")]: json.loads((folder / "said" / name).read_text()) for name in names}


@pool_only
def test_the_test_slurm_confines_a_job_to_the_cpus_it_was_given(slurm_pool):
    """The stand-in enforces what a real cluster does (task/affinity): a job of 1 CPU runs on one
    core, so an allocation that asked for too few CPUs would crowd its runs there and the test
    below would see it. A job of 2 CPUs runs on two."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU here: no binding can be seen")
    show = "import os; print(sorted(os.sched_getaffinity(0)))"
    one = slurm_pool.run("srun", "-N1", "-n1", "-c1", sys.executable, "-c", show).stdout
    two = slurm_pool.run("srun", "-N1", "-n1", "-c2", sys.executable, "-c", show).stdout
    assert len(json.loads(one)) == 1, one
    assert len(json.loads(two)) == 2, two


@pool_only
def test_an_allocation_holds_its_whole_node_and_each_run_has_cpus_of_its_own(slurm_pool, in_tmp, no_leaked_processes):
    """R3: an allocation asked Slurm for 1 CPU and ran 8 runs there, all on one core where Slurm
    binds tasks. Now it holds its node whole (every CPU, all memory), and its
    agent gives each run CPUs of its own (cpus_per_run), with OMP_NUM_THREADS to match."""
    cpus = sorted(os.sched_getaffinity(0))
    per_run = 1
    runs = min(4, len(cpus))
    path = _share_sweep(in_tmp, runs, runs, ["cpu"], {"nodes": 1, "slots_per_node": runs}, cpus_per_run=per_run)
    process = gts("run", path, "--plain")
    (job,) = wait_until(lambda: allocations(slurm_pool), timeout=60, message="the allocation")
    shown = slurm_pool.run("scontrol", "show", "job", job).stdout
    output = finish(process, timeout=120)
    assert process.returncode == 0, output
    assert "NumCPUs=8 " in shown and "MinMemoryNode=0 " in shown, shown  # every CPU (the test Slurm's 8), all memory
    said = _said(in_tmp)
    assert len(said) == runs, said
    shares = [tuple(entry["cpus"]) for entry in said.values()]
    assert all(len(share) == per_run for share in shares) and len(set(shares)) == runs, said  # none shared
    assert {entry["threads"] for entry in said.values()} == {str(per_run)}, said


@pool_only
@pytest.mark.parametrize("prewarm", [{"imports": ["decimal"]}, False], ids=["warm", "cold"])
def test_a_pools_python_runs_fork_from_a_warm_process_of_their_node_on_cpus_of_their_own(
    slurm_pool, in_tmp, no_leaked_processes, prewarm
):
    """An agent forks each Python run from a warm process of its node (prewarm, as a local sweep
    does): the run finds what the warm process imported already there, runs as ``__main__`` with its
    own arguments, is the agent's child, and is bound to its own CPUs with OMP_NUM_THREADS to
    match, as a cold start is. ``prewarm: false``: every run starts a fresh Python."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU here: no share of its own can be seen")
    # Runs 0 and 1 at once (each waits for the other's word), run 2 after one of them ended: its
    # start comes after a run's thread in the agent is gone, which must not take the warm process.
    path = _share_sweep(in_tmp, 3, 2, ["cpu"], {"nodes": 1, "slots_per_node": 2}, {"prewarm": prewarm}, cpus_per_run=1)
    process = gts("run", path, "--plain")
    output = finish(process, timeout=120)
    assert process.returncode == 0, output
    said = _said(in_tmp)
    assert sorted(said) == ["0", "1", "2"], said
    assert all(entry["argv"][0] == name and entry["main"] == "__main__" for name, entry in said.items()), said
    assert all(len(entry["cpus"]) == 1 for entry in said.values()), said
    assert said["0"]["cpus"] != said["1"]["cpus"], said  # at once: none shared
    assert {entry["threads"] for entry in said.values()} == {"1"}, said
    files = PoolFiles(str(in_tmp / "results"))
    outputs = "".join(open(os.path.join(files.jobs, name)).read() for name in os.listdir(files.jobs))
    if prewarm:
        assert all(entry["preloaded"] for entry in said.values()), said
        assert all("backends.slurm.agent" in entry["parent"] for entry in said.values()), said  # the agent's child
        assert "warm starts: a warm process imported 1 module(s)" in outputs, outputs
        assert "starts cold" not in outputs, outputs
    else:
        assert not any(entry["preloaded"] for entry in said.values()), said
        assert "warm process" not in outputs, outputs


@pool_only
def test_a_gpu_all_pool_runs_on_the_gpus_slurm_gives_it_one_per_gpu(slurm_pool, in_tmp, no_leaked_processes):
    """gpu: all without gpus_per_node asked Slurm for no GPU and ran the sweep two at a time on CPU
    slots, while --dry-run promised 8 at once. Now the allocation asks for each node's GRES GPUs
    (sinfo: 4 on the test Slurm's nodes) and its agent runs one run on each, as --dry-run says."""
    path = _share_sweep(in_tmp, 4, 4, "all", {"nodes": 1})
    dry = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "run", str(path), "--dry-run"], capture_output=True, text=True
    )
    assert "up to 4 at once" in dry.stdout and "--gres=gpu:4" in dry.stdout, dry.stdout + dry.stderr
    process = gts("run", path, "--plain")
    output = finish(process, timeout=120)
    assert process.returncode == 0, output
    said = _said(in_tmp)
    assert sorted(entry["gpus"] for entry in said.values()) == ["0", "1", "2", "3"], said  # at once: each waited


@pool_only
@pytest.mark.parametrize("need", ["declared", "learned"])
def test_small_runs_share_a_gpu_of_a_pool_node_by_memory(slurm_pool, in_tmp, no_leaked_processes, monkeypatch, need):
    """A node of 1 GPU of 8 GiB (the fake NVML), runs of 2 GiB, max_runs_per_gpu 4, the 512 MiB
    margin: three runs share the GPU at once, as on a local machine, never four. Declared
    (gpu_memory), or learned: the first run has the GPU to itself until its peak is measured. Each
    run's peak reaches the ledger."""
    import fake_nvml

    table = in_tmp / "nvml.json"
    fake_nvml.write_state(str(table), [{"name": "Fake GPU", "total": 8 * fake_nvml.GiB}])
    monkeypatch.setenv(fake_nvml.ENV, str(table))
    monkeypatch.setenv("GPU_BYTES", str(2 * fake_nvml.GiB))
    declared = {"gpu_memory": "2GiB"} if need == "declared" else {}
    path = write_sweep(in_tmp, 7, 3, 0.3, pool={"nodes": 1, "gpus_per_node": 1}, max_runs_per_gpu=4, **declared)
    process = gts("run", path, "--plain")
    output = finish(process, timeout=120)
    assert process.returncode == 0, output
    found, rows = check_exactly_once(in_tmp, 7, 3)
    # What each used at most, measured by its agent on its node, is in the ledger as a local run's is.
    assert {row["gpu_memory_peak"] for row in rows.values()} == {2 * fake_nvml.GiB}, rows
    spans = [span for entry in found.values() for span in entry["spans"]]
    assert {span[2] for span in spans} == {"0"}  # the one GPU Slurm gave the job
    moments = sorted([(start, 1) for start, _, _, _ in spans] + [(end, -1) for _, end, _, _ in spans])
    at_once = max(sum(change for _, change in moments[: index + 1]) for index in range(len(moments)))
    assert at_once == 3, spans
    if need == "learned":
        first, second = sorted(spans)[:2]
        assert second[0] >= first[1], spans  # alone until what it used was known


@pool_only
def test_a_pools_runs_are_read_from_their_tensorboard_files_through_a_driver_kill(
    slurm_pool, in_tmp, no_leaked_processes
):
    """metrics: {tensorboard: ...} in a pool: the driver reads the runs' event files on the shared
    file system as they are written on the nodes (the runs report nothing to gts). The driver is
    SIGKILLed in the middle and started again: it follows the runs still on the nodes, and every
    run's metrics hold each step once, its last one last."""
    path = write_sweep(in_tmp, 4, 6, 0.3, node_failure_retries=2)
    config = yaml.safe_load(path.read_text())
    config["command"][1] = os.path.join(HERE, "tb_command.py")
    config["metrics"] = {"tensorboard": "{work_dir}/tb"}
    path.write_text(yaml.safe_dump(config))
    process = gts("run", path, "--plain")
    results = in_tmp / "results"
    fed = lambda: sum(1 for name in os.listdir(results) if os.path.isfile(results / name / ".gts" / "metrics.jsonl"))  # noqa: E731
    wait_until(lambda: steps_reported(in_tmp, 2) >= 1 and fed() >= 1, timeout=60, message="a run's scalars fed")
    process.kill()
    outputs = [finish(process)]
    process = gts("run", path, "--plain")
    outputs.append(finish(process, timeout=120))
    assert process.returncode == 0, "\n".join(outputs)
    check_exactly_once(in_tmp, 4, 6)
    for name, row in ledger_rows(results).items():
        assert json.loads(row["metrics"])["loss"]["step"] == 6, (name, row["metrics"])
        steps = [
            json.loads(line)["step"] for line in (results / name / ".gts" / "metrics.jsonl").read_text().splitlines()
        ]
        assert steps == sorted(set(steps)) and steps[-1] == 6, (name, steps)


def _pausing_sweep(folder, method):
    """The PBT example's stand-in training (examples/pbt_schedule.py: it saves each step and exits
    with an error when its checkpoint is not of the step it resumes from), 4 configurations of 16
    steps in a pool of 2 nodes x 2 slots, under PBT or promotion ASHA."""
    judged = {"metric": "score", "mode": "max"}
    config = yaml.safe_load(write_sweep(folder, 0, 0, 0, node_failure_retries=2).read_text())
    script = os.path.join(os.path.dirname(HERE), "examples", "pbt_schedule.py")
    config["command"] = [sys.executable, script, "--lr", "{lr}", "--steps", "16", "--seconds", "0.1"]
    config["command"] += ["--out", "{work_dir}"]
    config["test_config"] = [{"lr": [1.0, 0.37, 0.14, 0.052]}]
    if method == "pbt":
        config["pbt"] = {**judged, "interval": 4, "quantile": 0.25, "perturb": {"lr": [0.5, 2.0]}, "max_step": 16}
    else:
        asha = {"method": "asha", "promotion": True, "min_step": 4, "max_step": 16, "reduction_factor": 2}
        config["early_stop"] = {**judged, **asha}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


PAUSING = ("exploit", "yield", "snapshot+yield", "pause")  # decisions that pause a run (PBT's, ASHA's)


def _trial_events(root):
    if not (root / ".gts" / "ledger.sqlite3").exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{root / '.gts' / 'ledger.sqlite3'}?mode=ro", uri=True)) as db:
        return db.execute("SELECT name, kind, rung, decision FROM trial_events ORDER BY seq").fetchall()


@pool_only
@pytest.mark.parametrize("method", ["pbt", "promotion-asha"])
def test_pbt_and_promotion_asha_in_a_pool_go_on_through_a_driver_kill(slurm_pool, in_tmp, no_leaked_processes, method):
    """Runs that pause and resume (a PBT exploit, an ASHA promotion) as new attempts in a pool: the
    driver is SIGKILLed once it decided a pause, before it told the run (tests/pbt_kill_driver.py),
    and started again. Every exploit decided
    is made once, no copy breaks PBT's rule or is left half-made, a promoted run goes on from the
    step it paused at (none trained twice), and the script found the checkpoint of the step it
    resumed from at every start (it fails otherwise)."""
    from test_pbt_sweep import copy_faults_of

    from gpu_task_scheduler.records.metrics import attempt_files, read_all
    from gpu_task_scheduler.records.paths import RunPaths

    path = _pausing_sweep(in_tmp, method)
    root = in_tmp / "results"
    note = in_tmp / "killed.json"  # the driver dies once a pause is committed, before the run is told
    driver = [sys.executable, os.path.join(HERE, "pbt_kill_driver.py"), "pausing", str(note), "run", str(path)]
    process = subprocess.Popen([*driver, "--plain"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    outputs = [finish(process, timeout=120)]
    assert process.returncode == -signal.SIGKILL, outputs[0]
    held = json.loads(note.read_text())["name"]
    process = gts("run", path, "--plain")
    outputs.append(finish(process, timeout=240))
    assert process.returncode == 0, "\n".join(outputs)
    rows = ledger_rows(root)
    steps = {name: [] for name in rows}
    for name in rows:
        for file in attempt_files(RunPaths(str(root / name), None)):
            steps[name] += [step for step, _ in read_all(file, keep_points=True).points or []]
    paused = {}  # each resume follows one decision that paused the run
    for name, kind, rung, decision in _trial_events(root):
        if decision in PAUSING:
            assert name not in paused, f"{name}: {decision} at {rung} before it resumed"
            paused[name] = decision
        elif kind == "resumed":
            assert paused.pop(name, None) is not None, f"{name} resumed without a decision"
    if method == "pbt":
        assert not paused, f"exploits never made: {paused}"
        assert {row["status"] for row in rows.values()} == {"succeeded"}, rows
        assert all(found[-1] == 16 for found in steps.values()), steps
        assert copy_faults_of(root) == []
    else:
        assert all(found == sorted(set(found)) for found in steps.values()), steps  # no step twice
        for name, row in rows.items():  # the asynchronous promotions' count depends on the order of reports
            assert (row["status"], steps[name][-1]) in {("paused", 4), ("paused", 8), ("succeeded", 16)}, (rows, steps)
        assert 16 in [found[-1] for found in steps.values()], steps
    for name in rows:
        meta = root / name / ".gts"
        assert not (meta / "checkpoint.new").exists() and not (meta / "checkpoint.old").exists(), name
    # An attempt the restarted driver followed went on from the step recorded at its start, not from
    # where it was at the restart: taken for the latter, it "reported again" every earlier step, and
    # its report at an interval was taken for a late one, left unjudged while it waited for its word.
    said = (root / "scheduler.log").read_text()
    assert "but reported step" not in said
    # The pause decided before the kill, which the run was never told (it waited at its report for
    # its word, on its node): carried out on it by the next start, which followed it.
    assert f"{held} pauses: " in said and "(decided before the scheduler restarted)" in said, said
    assert slurm_pool.jobs() == []


FAULTS = ["scancel", "requeue", "node-down", "agent-sigkill", "driver-sigkill"]


@pool_only
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fault", FAULTS)
def test_every_run_ends_once_through_a_fault_at_a_random_moment(slurm_pool, in_tmp, no_leaked_processes, fault, seed):
    """8 runs of 6 steps through one allocation of 2 nodes; at a random moment (after 1 to 4 steps of
    the first runs): the whole allocation cancelled, requeued, a node set DOWN, an agent SIGKILLed,
    or the driver SIGKILLed and `gts run` started again. Lost runs run again (node_failure_retries
    2), and every run still ends exactly once, none trains a reported step twice."""
    rng = random.Random(f"{fault}-{seed}")
    path = write_sweep(in_tmp, 8, 6, 0.25, node_failure_retries=2)
    process = gts("run", path, "--plain")
    moment = rng.randint(1, 4)
    wait_until(lambda: steps_reported(in_tmp, moment) >= 1, timeout=60, message=f"a run at step {moment}")
    (job,) = wait_until(lambda: allocations(slurm_pool), timeout=30, message="the allocation")
    files = PoolFiles(str(in_tmp / "results"))
    outputs = []
    try:
        if fault == "scancel":
            slurm_pool.run("scancel", job)
        elif fault == "requeue":
            slurm_pool.run("scontrol", "requeue", job)
        elif fault == "node-down":
            slurm_pool.set_node(rng.choice(["gts0", "gts1"]), "DOWN")
        elif fault == "agent-sigkill":
            agents = [agent for agent in os.listdir(files.agents) if job_of(agent) == job]
            beat = json.loads(open(files.beat(rng.choice(sorted(agents)))).read())
            os.kill(beat["pid"], signal.SIGKILL)
        else:
            process.kill()
            outputs.append(finish(process))
            process = gts("run", path, "--plain")
        outputs.append(finish(process, timeout=180))
    finally:
        for node in ("gts0", "gts1"):
            state = slurm_pool.run("sinfo", "-h", "-n", node, "-o", "%T", check=False).stdout.strip()
            if "down" in state or "drain" in state:
                slurm_pool.set_node(node, "RESUME")
    assert process.returncode == 0, "\n".join(outputs)
    check_exactly_once(in_tmp, 8, 6)
    assert slurm_pool.jobs() == []


@pool_only
def test_a_detached_pool_runs_on_and_a_later_start_follows_it(slurm_pool, in_tmp, no_leaked_processes):
    """`gts run --detach`: the driver returns once the runs are queued and an allocation asked for;
    the agents run through the queue; `gts run` again follows what still runs and records every run
    once."""
    path = write_sweep(in_tmp, 6, 4, 0.25)
    process = gts("run", path, "--plain", "--detach")
    first = finish(process, timeout=60)
    assert process.returncode == 0 and "Slurm pool: submitted allocation" in first, first
    wait_until(lambda: steps_reported(in_tmp, 1) >= 1, timeout=60, message="a run to report")
    again = gts("run", path, "--plain")
    output = finish(again, timeout=120)
    assert again.returncode == 0, first + output
    check_exactly_once(in_tmp, 6, 4)
    assert slurm_pool.jobs() == []


def test_a_detached_pools_queued_runs_are_counted_queued_not_running(in_tmp):
    """A detached pool (no scheduler on the root): the ledger records its runs as they were when
    queued, so gts status counted every one of them running (2 slots showed 6 running). What the
    pool's files say waits in its queue is counted queued; what its agents claimed, running."""
    import sqlite3
    import time

    from gpu_task_scheduler.backends import live
    from gpu_task_scheduler.backends.slurm.poolfiles import PoolFiles, entry_name
    from gpu_task_scheduler.reports.status import status

    root = in_tmp / "r"
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": str(root)},
        "test_config": [{"i": list(range(6))}],
        "command": ["true"],
    }
    from gpu_task_scheduler import GPUTaskScheduler

    assert GPUTaskScheduler(config).start().ok
    with sqlite3.connect(root / ".gts" / "ledger.sqlite3") as db:
        db.execute("UPDATE runs SET status = 'running', node = 'node1 cpu0 (pool job 7)'")
    files = PoolFiles(str(root))
    for folder in (files.queue, files.claimed("node1.7"), files.events):
        os.makedirs(folder, exist_ok=True)
    for seq in range(4):
        (Path(files.queue) / entry_name(seq, f"t{seq}")).write_text("{}")
    for seq in range(4, 6):
        (Path(files.claimed("node1.7")) / entry_name(seq, f"t{seq}")).write_text("{}")
    Path(files.beat("node1.7")).write_text(json.dumps({"at": time.time()}))
    live._answers.clear()
    assert live.left_on_cluster(str(root)) == live.Left(queued=4, running=2)
    counts = status(str(root))["counts"]
    assert counts["queued"] == 4 and counts["running"] == 2 and counts["stale"] == 0
