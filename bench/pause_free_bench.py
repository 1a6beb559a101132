"""What a pause costs its slot, for each framework's callback and for a command through ``report()``:
the project's examples under promotion ASHA (``examples/integrations/*.yaml``, as they are, in a
root of their own), one after another in one invocation, and a plain Python command whose steps
take no time (what is left is ours).

    python bench/pause_free_bench.py [--only lightning,keras] [--slots 2]

Read from the sweep's own records, per attempt that ended paused (every attempt of a run but its
last, and the last of a run left paused):

* report to free: from the attempt's last report (its metrics line's ``@time``, written as the run
  reports) to its end (the ledger's span of it: the slot is free then). It holds the run's wait for
  the verdict, the verdict, the framework's and the interpreter's end, and the scheduler's reading
  of that end;
* free to next: from an attempt's end to the next attempt's start on that slot (another run, or a
  promoted one).

The issue's target: report to free at most 0.3 s beyond what the run's own save takes (the
examples save at each report, before it). Printed per workload: attempts, median and p95 of each.
The machine is printed on top.
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

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EXAMPLES = ("lightning", "transformers", "keras", "xgboost", "lightgbm")
PLAIN = """
import os, sys
from gpu_task_scheduler import report
folder, start = os.environ["GTS_CHECKPOINT_DIR"], int(os.environ.get("GTS_RESUME_STEP") or 0)
for step in range(start + 1, 28):
    with open(os.path.join(folder, "step.new"), "w") as handle:
        handle.write(str(step))
    os.replace(os.path.join(folder, "step.new"), os.path.join(folder, "step"))
    report(step, loss=float(sys.argv[1]) / step)
"""


def _config(name: str, folder: str, slots: int) -> str:
    """The workload's config, its root in ``folder``, on ``slots`` CPU slots."""
    if name == "command":
        with open(os.path.join(folder, "plain.py"), "w") as handle:
            handle.write(PLAIN)
        config = {
            "command": [sys.executable, os.path.join(folder, "plain.py"), "{lr}"],
            "test_config": [{"lr": [0.5, 1, 2, 3, 4, 5, 6, 7]}],
            "early_stop": {"method": "asha", "promotion": True, "metric": "loss", "mode": "min"}
            | {"min_step": 3, "max_step": 27, "reduction_factor": 3},
        }
    else:
        with open(os.path.join(REPO, "examples", "integrations", f"{name}.yaml")) as handle:
            config = yaml.safe_load(handle)
    config["scheduler_config"] = {
        **config.get("scheduler_config", {}),
        "gpu": ["cpu"] * slots,
        "result_root_folder": os.path.join(folder, "root"),
    }
    path = os.path.join(folder, "sweep.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(config, handle)
    return path


def _reports(work_dir: str) -> list[float]:
    """Every report's time of the run, over all its attempts."""
    meta, found = os.path.join(work_dir, ".gts"), []
    for folder in (meta, os.path.join(meta, "logs")):
        for entry in os.listdir(folder) if os.path.isdir(folder) else ():
            if entry.endswith("metrics.jsonl"):
                with open(os.path.join(folder, entry)) as handle:
                    found += [json.loads(line).get("@time") for line in handle if line.strip()]
    return sorted(found for found in found if isinstance(found, (int, float)))


def measure(name: str, slots: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as folder:
        path = _config(name, folder, slots)
        began = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "gpu_task_scheduler", "run", path, "--plain"],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": REPO},
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - began
        if done.returncode != 0:
            raise SystemExit(f"{name}: gts run failed:\n{done.stderr[-3000:]}")
        db = sqlite3.connect(os.path.join(folder, "root", ".gts", "ledger.sqlite3"))
        rows = db.execute("SELECT status, work_dir, spans FROM runs").fetchall()
        db.close()
        to_free, by_slot = [], {}
        for status, work_dir, spans in rows:
            spans = json.loads(spans or "[]")
            reports = _reports(work_dir)
            for index, (slot, start, end) in enumerate(spans):
                by_slot.setdefault(slot, []).append((start, end))
                if index == len(spans) - 1 and status != "paused":
                    continue  # its last attempt ran to its end
                within = [at for at in reports if start <= at <= end + 0.01]  # @time is to the millisecond
                if within:
                    to_free.append(max(0.0, end - within[-1]))
        to_next = []
        for spans in by_slot.values():
            spans.sort()
            to_next += [max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:], strict=False)]
    return {"wall": wall, "to_free": sorted(to_free), "to_next": sorted(to_next)}


def _p(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    return statistics.median(values) if share == 0.5 else values[int(share * (len(values) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(("command", *EXAMPLES)), help="the workloads, comma-separated")
    parser.add_argument("--slots", type=int, default=2)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPU(s), Python {platform.python_version()}")
    head = ("workload", "wall", "paused", "report to free p50", "p95", "free to next p50", "p95")
    print(f"{head[0]:>12} {head[1]:>7} {head[2]:>6} {head[3]:>18} {head[4]:>6} {head[5]:>16} {head[6]:>6}")
    for name in args.only.split(","):
        found = measure(name, args.slots)
        free, after = found["to_free"], found["to_next"]
        assert isinstance(free, list) and isinstance(after, list)
        print(
            f"{name:>12} {found['wall']:6.1f}s {len(free):>6} {_p(free, 0.5):17.3f}s {_p(free, 0.95):5.2f}s "
            f"{_p(after, 0.5):15.3f}s {_p(after, 0.95):5.2f}s",
            flush=True,
        )


if __name__ == "__main__":
    main()
