"""A Slurm pool against job arrays, on the same Slurm: many short runs, run by each.

    python bench/slurm_pool_bench.py [--runs 1000] [--seconds 1] [--slots 8]

Starts a Slurm of two nodes of its own (``tests/slurm_cluster.py``: two slurmd on this machine,
8 CPUs declared each; needs root and slurm-wlm), then runs the same sweep twice: ``--runs``
commands of ``--seconds`` each (a shell that journals its start and end, then sleeps)

* through a pool: one allocation of 2 nodes, ``--slots`` runs at once a node;
* as job arrays, one task per run, ``max_parallel`` = the pool's slots (2 x ``--slots``).

It prints, for each: the wall time of ``gts run``, the Slurm jobs submitted per run, and for the
pool the share of its slot time that ran runs (the runs' time over the allocations' time times
their slots), the time from an allocation's start to its first run's, and the files a run leaves.
Both are checked to run every run exactly once. The ratio is the arrays' wall time over the pool's.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from slurm_cluster import SlurmCluster, why_not  # noqa: E402


def sweep(folder: str, runs: int, seconds: float, slurm: dict) -> str:
    journal = os.path.join(folder, "journal")
    line = f"echo s {{i}} $(date +%s.%N) >> {journal}; sleep {seconds}; echo e {{i}} $(date +%s.%N) >> {journal}"
    config = {
        "scheduler_config": {
            "gpu": ["cpu"],
            "result_root_folder": os.path.join(folder, "results"),
            "backend": "slurm",
            "slurm": {"poll_interval": 1.0, **slurm},
        },
        "command": ["sh", "-c", line],
        "test_config": [{"i": list(range(runs))}],
    }
    path = os.path.join(folder, "sweep.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(config, handle)
    return path


def spans(folder: str, runs: int) -> list[tuple[float, float]]:
    starts, ends = {}, {}
    with open(os.path.join(folder, "journal")) as handle:
        for line in handle:
            word, run, at = line.split()
            (starts if word == "s" else ends).setdefault(run, []).append(float(at))
    assert len(ends) == runs and all(len(at) == 1 for at in ends.values()), "a run ran twice, or not at all"
    return [(starts[run][-1], ends[run][0]) for run in ends]


def run(cluster: SlurmCluster, folder: str) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "run", os.path.join(folder, "sweep.yaml"), "--plain"],
        env=cluster.env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"the sweep in {folder} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return wall, done.stdout + done.stderr


def allocations(root: str) -> list[tuple[float, float]]:
    found = []
    for path in glob.glob(os.path.join(root, ".gts", "slurm", "pool", "jobs", "*.out")):
        started = ended = None
        with open(path) as handle:
            for line in handle:
                if line.startswith("gpu_task_scheduler: allocation"):
                    words = line.split()
                    if words[3] == "started":
                        started = float(words[4])
                    elif words[3] == "ended":
                        ended = float(words[4])
        if started is not None and ended is not None:
            found.append((started, ended))
    return found


def files_per_run(root: str, runs: int) -> float:
    count = sum(len(names) for _, _, names in os.walk(os.path.join(root)))
    return count / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--slots", type=int, default=8, help="runs at once on each of the 2 nodes")
    args = parser.parse_args()
    reason = why_not()
    if reason:
        sys.exit(reason)
    with tempfile.TemporaryDirectory(prefix="gts-pool-bench-") as base:
        cluster = SlurmCluster(os.path.join(base, "slurm"), 2)
        cluster.start()
        try:
            pool_folder, arrays_folder = os.path.join(base, "pool"), os.path.join(base, "arrays")
            os.makedirs(pool_folder)
            os.makedirs(arrays_folder)
            pool = {"pool": {"nodes": 2, "allocations": 1, "slots_per_node": args.slots, "idle_exit": 2}}
            sweep(pool_folder, args.runs, args.seconds, pool)
            sweep(arrays_folder, args.runs, args.seconds, {"max_parallel": 2 * args.slots})
            pool_wall, pool_log = run(cluster, pool_folder)
            pool_spans = spans(pool_folder, args.runs)
            root = os.path.join(pool_folder, "results")
            held = allocations(root)
            slot_time = sum((end - start) * 2 * args.slots for start, end in held)
            busy = sum(end - start for start, end in pool_spans) / slot_time
            first = min(start for start, _ in pool_spans) - min(start for start, _ in held)
            pool_jobs = len(held)
            arrays_wall, arrays_log = run(cluster, arrays_folder)
            arrays_spans = spans(arrays_folder, args.runs)
            # Each array task is a job to Slurm (MaxJobCount, the queue); the sbatch calls are fewer.
            submitted = [line.split("submitted ")[1] for line in arrays_log.splitlines() if "as job array" in line]
            arrays_jobs, arrays_calls = sum(int(words.split()[0]) for words in submitted), len(submitted)
            arrays_busy = sum(end - start for start, end in arrays_spans) / (2 * args.slots * arrays_wall)
            print(f"{args.runs} runs of {args.seconds:g}s, 2 nodes x {args.slots} slots, each run once in both")
            per_run, calls = (pool_jobs / args.runs, arrays_jobs / args.runs), (pool_jobs, arrays_calls)
            print(f"{'':>8} {'wall s':>8} {'jobs/run':>9} {'sbatch calls':>13} {'slot time busy':>15}")
            print(f"{'pool':>8} {pool_wall:8.1f} {per_run[0]:9.4f} {calls[0]:13d} {busy:14.1%}  (of its allocations)")
            print(
                f"{'arrays':>8} {arrays_wall:8.1f} {per_run[1]:9.4f} {calls[1]:13d} {arrays_busy:14.1%}  (of gts run)",
            )
            print(f"arrays' wall time / the pool's: {arrays_wall / pool_wall:.2f}")
            print(f"pool: first run started {first:.2f}s after its allocation started; {pool_jobs} allocation(s)")
            print(
                f"files a run leaves: pool {files_per_run(root, args.runs):.2f}, arrays "
                f"{files_per_run(os.path.join(arrays_folder, 'results'), args.runs):.2f} (ledger and logs included)"
            )
            print(f"ideal wall time (runs / slots x seconds): {args.runs / (2 * args.slots) * args.seconds:.1f}s")
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
