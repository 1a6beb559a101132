"""What a real PyTorch sweep costs, as gts records it, against what the GPU itself says.

Runs ``configs/pytorch.yaml`` (4 runs, two packed at a time on GPU 0) and prints:

* the runs' recorded GPU-seconds against the GPU's busy time (the union of the runs' intervals);
* the runs' recorded energy against NVML's energy counter read around the whole ``gts run``
  (which also counts the GPU's idle draw before the first run and between and after runs);
* ``gts results --gpu-hours-to`` for the median loss;
* then the same sweep in a new root with ``budget: {gpu_hours: B}``, B a third of what the
  first sweep spent: how many runs it started, and by how much it overshot the budget.

Needs a GPU that NVML sees, PyTorch with CUDA, and this repository's root as the current folder.

    python bench/gpu_cost.py [--steps 4000] [--root /tmp/gpu_cost]
"""

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def energy_mj():
    import pynvml

    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()


def sweep(root, steps, *extra):
    argv = [
        sys.executable,
        "-m",
        "gpu_task_scheduler",
        "run",
        os.path.join(REPO, "configs", "pytorch.yaml"),
        "--gpus",
        "0",
        "--plain",
        f"scheduler_config.result_root_folder={root}",
        "scheduler_config.max_runs_per_gpu=2",
        "scheduler_config.gpu_poll_interval=0.5",
        f"steps={steps}",
        *extra,
    ]
    began, before = time.time(), energy_mj()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    after, ended = energy_mj(), time.time()
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"gts run exited {done.returncode}")
    return done, (after - before) / 1000.0, ended - began


def ledger(root):
    db = sqlite3.connect(os.path.join(root, ".gts", "ledger.sqlite3"))
    try:
        return db.execute(
            "SELECT name, status, started_at, ended_at, gpu_seconds, energy, result FROM runs ORDER BY run_index"
        ).fetchall()
    finally:
        db.close()


def busy_time(rows):
    intervals = sorted((row[2], row[3]) for row in rows if row[2] is not None and row[3] is not None)
    busy, (start, end) = 0.0, intervals[0]
    for begin, finish in intervals[1:]:
        if begin > end:
            busy, start = busy + end - start, begin
        end = max(end, finish)
    return busy + end - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--root", default="/tmp/gpu_cost")
    args = parser.parse_args()
    shutil.rmtree(args.root, ignore_errors=True)
    first = os.path.join(args.root, "grid")
    _, drawn, wall = sweep(first, args.steps)
    rows = ledger(first)
    seconds = sum(row[4] or 0 for row in rows)
    joules = sum(row[5] or 0 for row in rows)
    busy = busy_time(rows)
    print(f"grid: {len(rows)} runs, two at a time on GPU 0, gts run took {wall:.1f} s")
    for name, status, started, ended, gpu_seconds, energy, _ in rows:
        print(
            f"  {name:28s} {status:9s} {ended - started:6.2f} s wall, {gpu_seconds:6.2f} GPU-s, "
            f"{energy if energy is None else round(energy, 1)} J"
        )
    print(f"  recorded GPU-seconds {seconds:.2f} / GPU busy time {busy:.2f} s = {seconds / busy:.3f}")
    print(
        f"  recorded energy {joules:.1f} J / NVML's counter over the whole gts run {drawn:.1f} J = "
        f"{joules / drawn:.3f} (the counter also counts {wall - busy:.1f} s with no run: start-up and exit)"
    )
    if seconds:
        print(f"  average draw while busy: {joules / seconds:.1f} W per GPU-second")
    losses = sorted(json.loads(row[6])["loss"] for row in rows if row[6])
    median = statistics.median(losses)
    told = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "results", first, "--gpu-hours-to", f"loss<={median:.6g}"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    print(f"  gts results --gpu-hours-to 'loss<={median:.6g}': {(told.stdout or told.stderr).strip()}")
    budget = seconds / 3 / 3600
    second = os.path.join(args.root, "budget")
    done, _, wall = sweep(second, args.steps, f"scheduler_config.budget={{gpu_hours: {budget!r}}}")
    rows = ledger(second)
    spent = sum(row[4] or 0 for row in rows)
    summary = [line for line in done.stderr.splitlines() if "Sweep summary" in line]
    print(
        f"budget {budget * 3600:.2f} GPU-s (a third of the grid's): {len(rows)} run(s) started, "
        f"{spent:.2f} GPU-s spent ({spent / (budget * 3600):.2f}x the budget), gts run took {wall:.1f} s"
    )
    print(f"  {summary[-1].split('INFO ')[-1] if summary else done.stderr[-300:]}")


if __name__ == "__main__":
    main()
