"""A Slurm pool against job arrays, on the same Slurm: many short runs, run by each.

    python bench/slurm_pool_bench.py [--runs 1000] [--seconds 1] [--slots 8] [--imports torch]

Starts a Slurm of two nodes of its own (``tests/slurm_cluster.py``: two slurmd on this machine,
8 CPUs declared each; needs root and slurm-wlm), then runs the same sweep twice: ``--runs``
commands of ``--seconds`` each (a shell that journals its start and end, then sleeps)

* through a pool: one allocation of 2 nodes, ``--slots`` runs at once a node;
* as job arrays, one task per run, ``max_parallel`` = the pool's slots (2 x ``--slots``).

It prints, for each: the wall time of ``gts run``, the Slurm jobs submitted per run, and for the
pool the share of its slot time that ran runs (the runs' time over the allocations' time times
their slots), the time from an allocation's start to its first run's, and the files a run leaves.
Both are checked to run every run exactly once. The ratio is the arrays' wall time over the pool's.

With ``--imports MODULE[,MODULE]`` each run is a Python script that imports them first (a training
script's start: ``torch``, ``lightning``), and the pool runs twice: with warm starts (each agent
forks the runs from a warm process of its node, the default) and with ``prewarm: false``. Each
run's start time (from the script's first line to its line after the imports) is printed too:
its median and 95th percentile.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from slurm_cluster import SlurmCluster, why_not  # noqa: E402

# A run of --imports: it journals its first line, its line after the imports, and its end.
PYTHON_RUN = """import sys, time
first = time.time()
import importlib, os
for name in sys.argv[4].split(","):
    importlib.import_module(name)
ready = time.time()
time.sleep(float(sys.argv[3]))
with open(sys.argv[2], "a") as handle:
    handle.write(f"s {sys.argv[1]} {first}\\nr {sys.argv[1]} {ready}\\ne {sys.argv[1]} {time.time()}\\n")
"""


def sweep(folder: str, runs: int, seconds: float, slurm: dict, imports: str = "", **scheduler: object) -> str:
    journal = os.path.join(folder, "journal")
    if imports:
        script = os.path.join(folder, "run.py")
        with open(script, "w") as handle:
            handle.write(PYTHON_RUN)
        command = [sys.executable, script, "{i}", journal, str(seconds), imports]
    else:
        line = f"echo s {{i}} $(date +%s.%N) >> {journal}; sleep {seconds}; echo e {{i}} $(date +%s.%N) >> {journal}"
        command = ["sh", "-c", line]
    config = {
        "scheduler_config": {
            "gpu": ["cpu"],
            "result_root_folder": os.path.join(folder, "results"),
            "backend": "slurm",
            "slurm": {"poll_interval": 1.0, **slurm},
            **scheduler,
        },
        "command": command,
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
            if word in "se":
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


def start_times(folder: str) -> tuple[float, float, float, float]:
    """The runs' times from their attempt's start (the ledger's: when its process started on its
    node) to their line after the imports, and from their first line to it: medians and 95th
    percentiles."""
    first, ready = {}, {}
    with open(os.path.join(folder, "journal")) as handle:
        for line in handle:
            word, run, at = line.split()
            if word in "sr":
                (first if word == "s" else ready)[run] = float(at)
    db = sqlite3.connect(os.path.join(folder, "results", ".gts", "ledger.sqlite3"))
    try:
        started = {str(json.loads(params)["i"]): at for params, at in db.execute("SELECT params, started_at FROM runs")}
    finally:
        db.close()

    def spread(times: list[float]) -> tuple[float, float]:
        times = sorted(times)
        return statistics.median(times), times[min(len(times) - 1, int(0.95 * len(times)))]

    return (*spread([ready[run] - started[run] for run in ready]), *spread([ready[run] - first[run] for run in ready]))


def files_per_run(root: str, runs: int) -> float:
    count = sum(len(names) for _, _, names in os.walk(os.path.join(root)))
    return count / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--slots", type=int, default=8, help="runs at once on each of the 2 nodes")
    parser.add_argument("--imports", default="", help="runs are Python scripts importing these (comma-separated)")
    args = parser.parse_args()
    reason = why_not()
    if reason:
        sys.exit(reason)
    with tempfile.TemporaryDirectory(prefix="gts-pool-bench-") as base:
        cluster = SlurmCluster(os.path.join(base, "slurm"), 2)
        cluster.start()
        try:
            pool = {"pool": {"nodes": 2, "allocations": 1, "slots_per_node": args.slots, "idle_exit": 2}}
            cases = [("pool", pool, {}), ("arrays", {"max_parallel": 2 * args.slots}, {})]
            if args.imports:  # the pool's runs warm (the default) and cold
                cases.insert(1, ("pool cold", pool, {"prewarm": False}))
            measured = {}
            for name, slurm, scheduler in cases:
                folder = os.path.join(base, name.replace(" ", "-"))
                os.makedirs(folder)
                sweep(folder, args.runs, args.seconds, slurm, args.imports, **scheduler)
                wall, log = run(cluster, folder)
                measured[name] = (folder, wall, log, spans(folder, args.runs))
            pool_folder, pool_wall, _, pool_spans = measured["pool"]
            arrays_folder, arrays_wall, arrays_log, arrays_spans = measured["arrays"]
            root = os.path.join(pool_folder, "results")
            held = allocations(root)
            slot_time = sum((end - start) * 2 * args.slots for start, end in held)
            busy = sum(end - start for start, end in pool_spans) / slot_time
            first = min(start for start, _ in pool_spans) - min(start for start, _ in held)
            pool_jobs = len(held)
            # Each array task is a job to Slurm (MaxJobCount, the queue); the sbatch calls are fewer.
            submitted = [line.split("submitted ")[1] for line in arrays_log.splitlines() if "as job array" in line]
            arrays_jobs, arrays_calls = sum(int(words.split()[0]) for words in submitted), len(submitted)
            arrays_busy = sum(end - start for start, end in arrays_spans) / (2 * args.slots * arrays_wall)
            what = f"Python runs importing {args.imports}, then" if args.imports else "runs of"
            print(f"{args.runs} {what} {args.seconds:g}s, 2 nodes x {args.slots} slots, each run once in every case")
            per_run, calls = (pool_jobs / args.runs, arrays_jobs / args.runs), (pool_jobs, arrays_calls)
            print(f"{'':>9} {'wall s':>8} {'jobs/run':>9} {'sbatch calls':>13} {'slot time busy':>15}")
            print(f"{'pool':>9} {pool_wall:8.1f} {per_run[0]:9.4f} {calls[0]:13d} {busy:14.1%}  (of its allocations)")
            if "pool cold" in measured:
                print(f"{'pool cold':>9} {measured['pool cold'][1]:8.1f}  (prewarm: false)")
            print(
                f"{'arrays':>9} {arrays_wall:8.1f} {per_run[1]:9.4f} {calls[1]:13d} {arrays_busy:14.1%}  (of gts run)",
            )
            print(f"arrays' wall time / the pool's: {arrays_wall / pool_wall:.2f}")
            if args.imports:
                print(f"the pool cold's wall time / warm: {measured['pool cold'][1] / pool_wall:.2f}")
                print("a run's start: from its attempt's start / from its first line, to its imports' end (p50, p95)")
                for name, (folder, *_) in measured.items():
                    start50, start95, line50, line95 = start_times(folder)
                    print(f"{name:>9}  {start50:6.2f} s {start95:6.2f} s  /  {line50:6.2f} s {line95:6.2f} s")
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
