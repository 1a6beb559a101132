"""Warm starts on real training code: the project's Lightning example (``examples/integrations/
lightning.py``, an MLP) as a ``command:``, swept by promotion ASHA with cold starts and warm ones,
beside the whole grid run as processes, in one invocation and several orders of the grid.

    python bench/warm_start_bench.py [--slots 2] [--orders 3]
        [--tools grid,cold,warm,warm-imports,ray-tune,optuna]

* grid: every configuration trained to the last epoch, each a fresh process (``prewarm: false``);
* cold: promotion ASHA (``min_step 3, max_step 12, reduction_factor 4``), every attempt a fresh
  Python that imports torch and Lightning (``prewarm: false``);
* warm: the same, every attempt forked from the sweep's warm process (``prewarm: true``, the
  default), which learns what to import from the first runs;
* warm-imports: the same, with ``prewarm: {imports: [torch, lightning]}``;
* ray-tune, optuna: the peers, each through its own ASHA and its own Lightning callback, in the same
  order of the grid (``bench/lightning_peers.py`` says how; skipped where not installed: ``pip
  install 'ray[tune]' optuna optuna-integration``).

Every process trains on one thread (``OMP_NUM_THREADS=1``, as Ray gives a trial of one CPU), so
that ``--slots`` runs share the cores alike in every tool.

Printed per tool and order: the sweep's wall time and its share of the grid's, the CPU seconds of
its processes (user + system, every child), the epochs trained over the grid's, the best final
``val_loss`` among the runs trained to the last epoch over the grid's best (1.000: the best kept),
and each attempt's time to ready (from the script's first line to its first line after importing
torch and Lightning, which ``bench/lightning_ready.py`` notes in the run's ``.gts/ready.jsonl``;
median and p95; a cold start's interpreter start, about 30 ms, and a fork, are not in it). The
machine is printed on top.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPT = os.path.join(HERE, "lightning_ready.py")  # examples/integrations/lightning.py, its ready time noted
LRS = [0.1, 0.03, 0.01, 0.003]
WIDTHS = [4, 8, 16, 32]
EPOCHS = 12
ASHA = {"method": "asha", "promotion": True, "metric": "val_loss", "mode": "min", "min_step": 3, "max_step": EPOCHS}
TOOLS = {
    "grid": (None, False),
    "cold": (ASHA, False),
    "warm": (ASHA, True),
    "warm-imports": (ASHA, {"imports": ["torch", "lightning"]}),
}


PEERS = {"ray-tune": "ray.tune", "optuna": "optuna_integration"}
PEER_SCRIPT = os.path.join(HERE, "lightning_peers.py")
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def measured(argv, folder, what):
    """Run ``argv`` in ``folder`` (every process on one thread); its wall time and the CPU seconds of
    its processes (user + system, every child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        argv, cwd=folder, env={**os.environ, **ONE_THREAD, "PYTHONPATH": REPO}, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed:\n{done.stderr[-3000:]}")
    return {"wall": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def peer(tool, order, slots, folder):
    """A peer's sweep (bench/lightning_peers.py), measured as gts's are."""
    out = os.path.join(folder, "peer.json")
    found = measured([sys.executable, PEER_SCRIPT, tool, str(order), str(slots), out], folder, tool)
    with open(out) as handle:
        told = json.load(handle)
    return {**found, "epochs": told["epochs"], "finals": told["finals"], "ready": []}


def one(tool, order, slots, folder):
    if tool in PEERS:
        return peer(tool, order, slots, folder)
    stopping, prewarm = TOOLS[tool]
    configs = [{"lr": lr, "width": width} for lr in LRS for width in WIDTHS]
    random.Random(order).shuffle(configs)
    root = os.path.join(folder, "root")
    config = {
        "scheduler_config": {"gpu": ["cpu"] * slots, "result_root_folder": root, "prewarm": prewarm},
        "command": [sys.executable, SCRIPT, "--lr", "{lr}", "--width", "{width}", "--epochs", str(EPOCHS)]
        + ["--out", "{work_dir}"],
        "test_config": [{"lr": [c["lr"]], "width": [c["width"]]} for c in configs],
    }
    if stopping is not None:
        config["early_stop"] = {**stopping, "reduction_factor": 4}
    path = os.path.join(folder, "sweep.json")
    with open(path, "w") as handle:
        json.dump(config, handle)
    found = measured([sys.executable, "-m", "gpu_task_scheduler", "run", path, "--plain"], folder, f"{tool}: gts run")
    return {**found, **_read(root)}


def _read(root):
    epochs, finals, ready = 0, {}, []
    db = sqlite3.connect(os.path.join(root, ".gts", "ledger.sqlite3"))
    rows = db.execute("SELECT name, work_dir FROM runs").fetchall()
    db.close()
    for name, work_dir in rows:
        meta = os.path.join(work_dir, ".gts")
        steps = []
        for folder in (meta, os.path.join(meta, "logs")):
            for entry in os.listdir(folder) if os.path.isdir(folder) else ():
                if entry.endswith("metrics.jsonl"):
                    with open(os.path.join(folder, entry)) as handle:
                        steps += [json.loads(line) for line in handle if line.strip()]
        epochs += len(steps)
        last = max(steps, key=lambda line: line["step"], default=None)
        if last is not None and last["step"] >= EPOCHS and "val_loss" in last:
            finals[name] = last["val_loss"]
        ready += _ready_times(work_dir)
    return {"epochs": epochs, "finals": finals, "ready": ready}


def _ready_times(work_dir):
    """Seconds from each attempt's first line to its first line after the imports (an attempt a line)."""
    found = []
    path = os.path.join(work_dir, ".gts", "ready.jsonl")
    if os.path.exists(path):
        with open(path) as handle:
            found = [json.loads(line)["ready"] for line in handle if line.strip()]
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--orders", type=int, default=3)
    parser.add_argument("--tools", default=",".join([*TOOLS, *PEERS]))
    args = parser.parse_args()
    tools = []
    for tool in args.tools.split(","):
        if tool in PEERS and importlib.util.find_spec(PEERS[tool].split(".")[0]) is None:
            print(f"{tool}: not installed here ({PEERS[tool]}), left out")
        elif tool in PEERS and PEERS[tool] == "ray.tune" and importlib.util.find_spec("ray.tune") is None:
            print(f"{tool}: not installed here (ray[tune]), left out")
        else:
            tools.append(tool)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPU(s), Python {platform.python_version()}")
    print(f"{len(LRS) * len(WIDTHS)} configurations x {EPOCHS} epochs, {args.slots} slots; {SCRIPT}")
    grid = {}
    print(
        f"{'tool':>13} {'order':>5} {'wall':>7} {'/grid':>6} {'cpu':>7} {'epochs':>7} {'best':>6} "
        f"{'ready p50':>9} {'p95':>6}"
    )
    for order in range(args.orders):
        for tool in tools:
            with tempfile.TemporaryDirectory() as folder:
                found = one(tool, order, args.slots, folder)
            if tool == "grid":
                grid = found
            share = found["wall"] / grid["wall"] if grid else float("nan")
            epochs = found["epochs"] / grid["epochs"] if grid else float("nan")
            best = min(found["finals"].values()) / min(grid["finals"].values()) if grid and found["finals"] else 0
            ready = sorted(found["ready"])
            p50 = statistics.median(ready) if ready else float("nan")
            p95 = ready[int(0.95 * (len(ready) - 1))] if ready else float("nan")
            print(
                f"{tool:>13} {order:>5} {found['wall']:6.1f}s {share:6.2f} {found['cpu']:6.1f}s {epochs:7.2f} "
                f"{best:6.3f} {p50:8.2f}s {p95:5.2f}s",
                flush=True,
            )


if __name__ == "__main__":
    main()
