"""Large sweeps: time to the first run of a 1,000,000-run sweep, and deciding 100,000 succeeded runs skippable.

python bench/scale_bench.py [--runs 1000000] [--done 100000] [--repeat 3] [--workdir DIR]

Each figure is measured in a fresh Python process (imports done before the
clock starts), as a user's script would call ``GPUTaskScheduler(...).start()``:

* first run: the seconds from ``start()`` until the first run's process has
  started (``on_run_start``) and until its command itself stamped the time;
  the sweep is stopped (SIGINT) when that run ends. Peak RSS of the scheduler process.
* skips: a result root whose N runs all succeeded (built here through the
  ledger and the runs' own files, as the scheduler leaves them); the seconds
  ``start()`` takes to decide that there is nothing to run.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from _common import grid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def config(root, runs, command, shell=False):
    a, b = grid(runs)
    return {
        "shell": shell,
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": root, "log_file": "log.txt", "prewarm": False},
        "global_config": {},
        "test_config": [{"a": a, "b": b}],
        "command": command,
    }


FIRST_RUN = r"""
import json, os, resource, signal, sys, time
sys.path.insert(0, sys.argv[1])
from gpu_task_scheduler.gpu_task_scheduler import GPUTaskScheduler
cfg = json.loads(sys.argv[2])
seen = {}
def started(spec, slot):
    seen.setdefault("start", time.time() - t0)
def ended(outcome):
    os.kill(os.getpid(), signal.SIGINT)
built = time.time()
scheduler = GPUTaskScheduler(cfg, on_run_start=started, on_run_end=ended, live_status=False)
t0 = time.time()
seen["built"] = t0 - built
summary = scheduler.start(reraise_signals=False)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"t0": t0, "started": seen.get("start"), "built": seen["built"], "rss": rss}))
"""

SKIPS = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from gpu_task_scheduler.gpu_task_scheduler import GPUTaskScheduler
scheduler = GPUTaskScheduler(json.loads(sys.argv[2]), live_status=False)
t0 = time.time()
summary = scheduler.start()
print(json.dumps({"seconds": time.time() - t0, "skipped": len(summary.skipped), "ran": len(summary.outcomes),
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

BUILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from gpu_task_scheduler.records.ledger import Ledger
from gpu_task_scheduler.records.paths import RootPaths, RunPaths, atomic_write_json
from gpu_task_scheduler.records.status import RunStatus
from gpu_task_scheduler.sweep.expand import Sweep
import os
import shutil
sweep = Sweep(json.loads(sys.argv[2]))
root = sweep.options.result_root_folder
with Ledger(RootPaths(root)) as ledger, ledger.batch():
    for spec in sweep.runs(lambda name, params, index: False):
        paths = RunPaths(spec.work_dir, sweep.options.log_file)
        os.makedirs(paths.meta)
        atomic_write_json(paths.config, spec.config, durable=False)
        open(paths.log, "w").close()
        ledger.mark_running(name=spec.name, run_index=spec.index, config_hash=spec.config_hash, slot="cpu0",
                            token="t", work_dir=spec.work_dir, params=spec.params)
        ledger.finish(spec.name, RunStatus.SUCCEEDED, exit_code=0)
        outcome = {"status": "succeeded", "token": "t", "config_hash": spec.config_hash, "finished_at": time.time()}
        atomic_write_json(paths.outcome, outcome, durable=False)
"""


def python(script, *args):
    result = subprocess.run([sys.executable, "-c", script, REPO, *args], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"failed:\n{result.stderr[-3000:]}")
    lines = result.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else None


def first_run(workdir, runs):
    stamp = os.path.join(workdir, "stamp")
    root = os.path.join(workdir, "first")
    shutil.rmtree(root, ignore_errors=True)
    command = f"date +%s.%N >> {stamp}"
    figures = python(FIRST_RUN, json.dumps(config(root, runs, command, shell=True)))
    with open(stamp) as handle:
        stamped = float(handle.read().split()[0]) - figures["t0"]
    os.remove(stamp)
    return figures["started"], stamped, figures["rss"], figures["built"]


def skips(workdir, done, repeat):
    root = os.path.join(workdir, f"done-{done}")
    cfg = json.dumps(config(root, done, "true"))
    if not os.path.exists(root):  # a --workdir of an earlier run has it
        python(BUILD, cfg)
    return [python(SKIPS, cfg) for _ in range(repeat)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--done", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", help="keep the roots here (building 100,000 succeeded runs takes minutes)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gts-scale-") as scratch:
        workdir = args.workdir or scratch
        os.makedirs(workdir, exist_ok=True)
        rows = [first_run(workdir, args.runs) for _ in range(args.repeat)]
        rows.sort()
        started, stamped, rss, built = rows[len(rows) // 2]
        print(
            f"{args.runs:,}-run sweep: first run started {started * 1000:.0f} ms after start(), "
            f"its command ran at {stamped * 1000:.0f} ms; scheduler peak RSS {max(r[2] for r in rows):.0f} MiB "
            f"(median of {args.repeat}; GPUTaskScheduler(config), which validates it, took {built * 1000:.0f} ms)"
        )
        runs = sorted(skips(workdir, args.done, args.repeat), key=lambda figures: figures["seconds"])
        assert all(f["ran"] == 0 and f["skipped"] == args.done for f in runs), runs
        print(
            f"{args.done:,} succeeded runs decided skippable in {runs[len(runs) // 2]['seconds']:.2f} s "
            f"(median of {args.repeat}; peak RSS {max(f['rss'] for f in runs):.0f} MiB)"
        )


if __name__ == "__main__":
    main()
