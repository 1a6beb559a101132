"""The Ray backend beyond the launcher contract: the cluster's GPUs as slots, packing, where runs
ran, Ctrl-C, and a two-machine cluster that loses a machine in the middle of a sweep.

The in-process tests share one Ray instance of 4 declared GPUs (conftest.ray_instance); the
others start their own Ray in a child process, as `gts run` would, and check that nothing of it
is left behind (conftest.no_leaked_processes).
"""

import json
import os
import re
import signal
import sys

import gts_test_tasks as tasks
import pytest
from conftest import RAY_GPUS, wait_until
from helpers import ledger_rows, make_config
from test_process_control import finish, launch, started

from gpu_task_scheduler import GPUTaskScheduler
from gpu_task_scheduler.backends import supervisor
from gpu_task_scheduler.cli.commands.run import _run_config
from gpu_task_scheduler.cli.main import build_parser, main
from gpu_task_scheduler.errors import ConfigError
from gpu_task_scheduler.sweep.expand import Sweep

pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("clusters")
NODE = re.compile(r"^\d+\.\d+\.\d+\.\d+/[0-9a-f]{8}$")
HERE = os.path.dirname(os.path.abspath(__file__))


def ray_config(root, test_config, **options):
    scheduler = {"gpu": "all", "result_root_folder": str(root), "backend": "ray", **options}
    return {"scheduler_config": scheduler, "test_config": test_config}


def test_the_slots_are_the_clusters_gpus_and_no_cpu_share_caps_them(ray_instance, in_tmp, capsys):
    """4 runs at the same time on a Ray instance of 2 CPUs: each asks for a GPU and no CPU."""
    root = in_tmp / "r"
    config = ray_config(root, [{"i": list(range(RAY_GPUS)), "expect": [RAY_GPUS]}])
    summary = GPUTaskScheduler(config, tasks.RendezvousTask).start()
    assert summary.ok and len(summary.succeeded) == RAY_GPUS
    assert sorted(o.result["slot"] for o in summary.succeeded) == [str(i) for i in range(RAY_GPUS)]
    rows = ledger_rows(root).values()
    assert all(NODE.match(row["node"]) and row["pid"] > 0 for row in rows)
    assert sorted(row["slot"] for row in rows) == [f"gpu{i}" for i in range(RAY_GPUS)]
    # Each run asked Ray for one GPU: it cost its duration in GPU-seconds (gpu/usage.py), counted from
    # when Ray placed it (the ledger's start is when it was handed to Ray).
    assert all(0 < row["gpu_seconds"] <= row["ended_at"] - row["started_at"] for row in rows), rows
    assert main(["status", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("  spent: ") and "GPU-hours" in lines[1]
    header, first = lines[2:4]
    assert header.split()[:4] == ["name", "status", "slot", "node"] and NODE.match(first.split()[3])


def test_max_runs_per_gpu_asks_ray_for_a_share_of_a_gpu(ray_instance, in_tmp):
    root = in_tmp / "r"
    config = ray_config(root, [{"i": list(range(2 * RAY_GPUS)), "expect": [2 * RAY_GPUS]}], max_runs_per_gpu=2)
    summary = GPUTaskScheduler(config, tasks.RendezvousTask).start()
    assert summary.ok
    gpus = sorted(o.result["slot"] for o in summary.succeeded)
    assert gpus == sorted(str(i) for i in range(RAY_GPUS) for _ in range(2))  # two runs on each GPU


def test_a_command_sweep_runs_on_ray_with_the_gpus_ray_gave_at_normal_priority(ray_instance, in_tmp):
    """Ray starts its workers at niceness 15; a run must not inherit that (it would wait behind
    every other process of a busy machine)."""
    root = in_tmp / "r"
    config = ray_config(root, [{"i": [0, 1]}])
    config["command"] = ["sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES" > "$0/gpus"; nice > "$0/nice"', "{work_dir}"]
    assert GPUTaskScheduler(config).start().ok
    assert {(root / name / "nice").read_text().strip() for name in ("i-0,", "i-1,")} == {str(os.nice(0))}
    # One GPU of Ray's each (the two runs need not overlap, so they may get the same one; distinct
    # GPUs for runs at the same time: test_the_slots_are_the_clusters_gpus_...).
    for name in ("i-0,", "i-1,"):
        assert (root / name / "gpus").read_text().strip() in {str(i) for i in range(RAY_GPUS)}


@pytest.mark.parametrize("prewarm", [{"imports": ["decimal"]}, False], ids=["warm", "cold"])
def test_a_python_run_on_ray_is_forked_from_its_workers_warm_process(ray_instance, in_tmp, prewarm):
    """A Ray worker keeps a warm process for the sweep's Python runs (prewarm, as locally and in a
    Slurm pool's agents): a run finds what it imported already there, runs as ``__main__`` with its
    own arguments, and is the worker's child, as a cold start is. ``prewarm: false``: cold."""
    root, said = in_tmp / "r", in_tmp / "said"
    config = ray_config(root, [{"i": [0, 1, 2]}], prewarm=prewarm)
    config["command"] = [sys.executable, os.path.join(HERE, "share_command.py"), "{i}", str(said), "1"]
    assert GPUTaskScheduler(config).start().ok
    seen = {name[: -len(".json")]: json.loads((said / name).read_text()) for name in os.listdir(said)}
    assert sorted(seen) == ["0", "1", "2"], seen
    assert all(entry["argv"][0] == name and entry["main"] == "__main__" for name, entry in seen.items()), seen
    assert all(entry["preloaded"] is bool(prewarm) for entry in seen.values()), seen
    if prewarm:  # forked from the warm process, then made the worker's child (Ray names it "ray::TASK")
        assert all(entry["parent"].startswith("ray::") for entry in seen.values()), seen


def test_the_gpus_placeholder_is_refused_with_ray(tmp_path):
    config = ray_config(tmp_path / "r", [{"i": [0]}])
    config["command"] = "train --gpus {gpus}"
    with pytest.raises(ConfigError, match=r"uses \{gpus\}, which the Ray backend cannot fill in"):
        Sweep(config)


def test_a_machine_that_does_not_see_the_run_folder_says_so(tmp_path):
    run = {"config_file": str(tmp_path / "r" / "x" / ".gts" / "config.json"), "work_dir": "/shared/r/x", "cwd": "/"}
    problem = supervisor.cannot_run(run, "10.0.0.7/0123abcd")
    assert problem.startswith("10.0.0.7/0123abcd does not see the run folder /shared/r/x")
    (tmp_path / "r" / "x" / ".gts").mkdir(parents=True)
    (tmp_path / "r" / "x" / ".gts" / "config.json").write_text("{}")
    assert supervisor.cannot_run({**run, "cwd": str(tmp_path / "gone")}, "n") == (
        f"n has no directory {tmp_path / 'gone'}, where the sweep was started (runs start there): start the "
        "sweep from a directory every machine sees, at the same path"
    )
    assert supervisor.cannot_run({**run, "cwd": str(tmp_path)}, "n") is None


def test_gts_run_address_means_the_ray_backend(in_tmp, capsys):
    (in_tmp / "sweep.json").write_text(json.dumps({**make_config(in_tmp / "r", [{"i": [0]}]), "command": "true"}))
    assert main(["run", "sweep.json", "--address", "10.0.0.1:6379", "--dry-run"]) == 0
    capsys.readouterr()
    args = build_parser().parse_args(["run", "sweep.json", "--address", "auto"])
    args.overrides = []
    scheduler = _run_config(args)["scheduler_config"]
    assert (scheduler["backend"], scheduler["ray_address"]) == ("ray", "auto")


# --- a Ray of its own, in a child process ----------------------------------------------------------


def test_ctrl_c_stops_the_runs_on_ray_and_our_ray_instance(in_tmp, no_leaked_processes):
    root = in_tmp / "r"
    config = make_config(root, [{"a": [1, 2]}], slots=("cpu", "cpu"), grace_period=5, backend="ray")
    config["global_config"] = {"journal": str(in_tmp / "journal")}
    scheduler = launch(config, "BlockTask")
    wait_until(lambda: started(root, "a-1,", "a-2,"), timeout=60, message="both runs to start on Ray")
    scheduler.send_signal(signal.SIGINT)
    output = finish(scheduler, timeout=60)
    assert scheduler.returncode == -signal.SIGINT, output
    assert "started a Ray instance on this machine" in output
    rows = ledger_rows(root)
    assert {row["status"] for row in rows.values()} == {"interrupted"}
    assert all(row["cause"] == "interrupted by SIGINT" and NODE.match(row["node"]) for row in rows.values())
    # no_leaked_processes: the runs' processes and every process of our Ray instance are gone


def test_a_driver_killed_at_random_moments_runs_every_run_to_its_end_once(in_tmp, no_leaked_processes):
    """The kill battery on Ray: `gts run` (with a Ray instance of its own) is SIGKILLed at random
    moments; each next start waits for the leases its killed predecessor's attempts held before it
    settles and reruns them. Every run ends exactly once, no two attempts of a run overlap (each
    attempt looks for its predecessor's shell), and the last start exits 0.
    GTS_KILL_SEED picks the moments (the battery: ten seeds in a row)."""
    import random
    import subprocess
    import sys

    rng = random.Random(int(os.environ.get("GTS_KILL_SEED", "20261126")))
    journal = in_tmp / "journal"
    line = (
        f"f={in_tmp}/pid.{{i}}; if [ -f $f ] && kill -0 $(cat $f) 2>/dev/null; then echo overlap {{i}} >> {journal}; "
        f"fi; echo $$ > $f; echo start {{i}} >> {journal}; sleep 1.5 && echo end {{i}} >> {journal}"
    )
    config = make_config(
        in_tmp / "results", [{"i": list(range(12))}], slots=("cpu",) * 4, backend="ray", grace_period=1
    )
    config["scheduler_config"]["lease_interval"] = 0.5
    config["command"] = ["sh", "-c", line]
    path = in_tmp / "sweep.json"
    path.write_text(json.dumps(config))
    argv = [sys.executable, "-m", "gpu_task_scheduler", "run", str(path), "--plain"]
    kills = 0
    for _ in range(5):
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            process.wait(timeout=rng.uniform(2.0, 9.0))  # a start takes Ray's own few seconds
        except subprocess.TimeoutExpired:
            process.kill()
            kills += 1
        finish(process, timeout=60)
    last = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = finish(last, timeout=180)
    assert last.returncode == 0, output
    assert kills >= 3, f"only {kills} of 5 starts were killed"
    words = [line.split() for line in (in_tmp / "journal").read_text().splitlines()]
    assert not [w for w in words if w[0] == "overlap"], words
    for i in range(12):
        assert words.count(["end", str(i)]) == 1, words
    assert {row["status"] for row in ledger_rows(in_tmp / "results").values()} == {"succeeded"}
