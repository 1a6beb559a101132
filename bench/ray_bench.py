"""The Ray backend against the local one: per-run overhead on the same short runs, and what a
Ray instance of our own costs to start and stop.

python bench/ray_bench.py [--runs 200] [--slots 2] [--repeat 3]

Each measurement is a fresh Python process. For the Ray backend, Ray is started before the clock
(``ray.init``, timed on its own) and the sweep uses that connection, so the per-run figure is the
backend's own cost: a Ray task per run, its report back, the stop channel. Runs are a command
(``true``: no Python in the run) and a ``GPUTask`` whose ``main()`` works for no time
(``probe_task.ProbeTask``); slots are
CPU slots, so the same machine runs both backends. Prints medians and the ratio Ray / local.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

SCRIPT = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[3])
config, backend = json.loads(sys.argv[1]), sys.argv[2]
import probe_task
from gpu_task_scheduler import GPUTaskScheduler
figures = {}
if backend == "ray":
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import ray
    start = time.perf_counter()
    ray.init(address="local", num_cpus=os.cpu_count(), num_gpus=0, include_dashboard=False, log_to_driver=False)
    figures["ray_start"] = time.perf_counter() - start
task = None if "command" in config else probe_task.ProbeTask
scheduler = GPUTaskScheduler(config, task, live_status=False)
start = time.perf_counter()
summary = scheduler.start()
figures["sweep"] = time.perf_counter() - start
assert summary.ok and summary.succeeded_count == len(scheduler.sweep), summary.report()
if backend == "ray":
    start = time.perf_counter()
    ray.shutdown()
    figures["ray_stop"] = time.perf_counter() - start
print(json.dumps(figures))
"""


def measure(kind, backend, runs, slots, workdir):
    root = tempfile.mkdtemp(dir=workdir)
    config = {
        "scheduler_config": {
            "gpu": ["cpu"] * slots,
            "result_root_folder": root,
            "scheduler_log_file_path": None,
            "backend": backend,
        },
        "global_config": {"seconds": 0, "log": os.path.join(root, "probe.log")},
        "test_config": [{"job": list(range(runs))}],
    }
    if kind == "command":
        config["command"] = ["true"]
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(config), backend, HERE],
        capture_output=True,
        text=True,
        check=True,
        cwd=workdir,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    try:
        import ray  # noqa: F401
    except ImportError:
        sys.exit("the Ray backend needs Ray: pip install 'gts-sweep[ray]'")
    print(f"{args.runs} short runs on {args.slots} CPU slots, median of {args.repeat}; machine: {os.cpu_count()} cores")
    starts, stops = [], []
    with tempfile.TemporaryDirectory() as workdir:
        for kind in ("command", "python"):
            per_run = {}
            for backend in ("local", "ray"):
                results = [measure(kind, backend, args.runs, args.slots, workdir) for _ in range(args.repeat)]
                per_run[backend] = statistics.median(r["sweep"] for r in results) / args.runs
                starts += [r["ray_start"] for r in results if "ray_start" in r]
                stops += [r["ray_stop"] for r in results if "ray_stop" in r]
            print(
                f"{kind:8} runs: local {per_run['local'] * 1000:6.1f} ms/run, ray {per_run['ray'] * 1000:6.1f} ms/run, "
                f"ray / local = {per_run['ray'] / per_run['local']:.2f}x"
            )
    print(
        "a Ray instance of our own (ray.init / ray.shutdown on this machine): "
        f"start {statistics.median(starts):.2f} s, stop {statistics.median(stops):.2f} s (median of {len(starts)})"
    )


if __name__ == "__main__":
    main()
