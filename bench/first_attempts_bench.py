"""The first attempts of a sweep: 12 runs that import torch and Lightning, then work 0.3 s of CPU,
on 2 slots, started cold and warm in one invocation (the ``warm-starts`` workload).

    python bench/first_attempts_bench.py [--runs 12] [--slots 2] [--repeat 3]

* cold: every run a fresh Python (``prewarm: false``);
* warm: the default: the warm process imports what the script imports (read from its source) from
  the first run on, and what the runs are seen to import;
* warm-imports: the same, with ``prewarm: {imports: [torch, lightning]}`` named in the config.

Printed per tool (the median of ``--repeat`` sweeps, taken in turn): the sweep's wall time, its
share of the cold sweep's, each run's cost beyond its 0.3 s of work (the slots' time over the
runs, less the work), and each run's time from its start (as the ledger records it) to its first
line after the imports (median and p95). The machine is printed on top.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORK = 0.3
SCRIPT = f"""
import json, os, sys, time
import lightning
import torch

ready = time.time()
until = time.process_time() + {WORK}
while time.process_time() < until:  # the run's own work: 0.3 s of CPU
    pass
with open(os.path.join(sys.argv[2], "ready.json"), "w") as handle:
    json.dump({{"ready": ready}}, handle)
"""
TOOLS = {"cold": False, "warm": True, "warm-imports": {"imports": ["torch", "lightning"]}}
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def sweep(tool: str, runs: int, slots: int, folder: str, script: str) -> dict[str, float | list[float]]:
    root = os.path.join(folder, tool)
    config = {
        "scheduler_config": {"gpu": ["cpu"] * slots, "result_root_folder": root, "prewarm": TOOLS[tool]},
        "command": [sys.executable, script, "{i}", "{work_dir}"],
        "test_config": [{"i": list(range(runs))}],
    }
    path = os.path.join(folder, f"{tool}.json")
    with open(path, "w") as handle:
        json.dump(config, handle)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "run", path, "--plain"],
        cwd=folder,
        env={**os.environ, **ONE_THREAD, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{tool} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    db = sqlite3.connect(os.path.join(root, ".gts", "ledger.sqlite3"))
    rows = db.execute("SELECT work_dir, started_at FROM runs").fetchall()
    db.close()
    ready = []
    for work_dir, started in rows:
        with open(os.path.join(work_dir, "ready.json")) as handle:
            ready.append(json.load(handle)["ready"] - started)
    return {"wall": wall, "ready": ready}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.platform()}")
    found: dict[str, list[dict]] = {tool: [] for tool in TOOLS}
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "work.py"), "w") as handle:
            handle.write(SCRIPT)
        for repeat in range(args.repeat):
            for tool in TOOLS:
                os.makedirs(os.path.join(folder, str(repeat)), exist_ok=True)
                there = os.path.join(folder, str(repeat))
                found[tool].append(sweep(tool, args.runs, args.slots, there, os.path.join(folder, "work.py")))
    cold = statistics.median(one["wall"] for one in found["cold"])
    print(f"{args.runs} runs importing torch and Lightning, then {WORK} s of work, on {args.slots} slots")
    print(f"{'tool':<14} {'wall':>8} {'/ cold':>7} {'beyond work':>12} {'ready p50':>10} {'ready p95':>10}")
    for tool, sweeps in found.items():
        wall = statistics.median(one["wall"] for one in sweeps)
        ready = sorted(r for one in sweeps for r in one["ready"])
        p95 = ready[min(len(ready) - 1, int(0.95 * len(ready)))]
        beyond = wall * args.slots / args.runs - WORK
        print(
            f"{tool:<14} {wall:7.1f}s {wall / cold:7.2f} {beyond:11.2f}s {statistics.median(ready):9.2f}s {p95:9.2f}s"
        )


if __name__ == "__main__":
    main()
