"""The read side on a large result root: `gts status`, `status --json`, `results --sort --top`,
`results --average-over`, `logs --failed` on a root of 300,000 recorded runs, and `gts run
--dry-run` of a 10^6-run grid.

python bench/read_bench.py [--runs 300000] [--grid 1000000] [--repeat 3] [--workdir DIR]

The root is built through the ledger's own API, as the scheduler leaves it: every run recorded with
its swept values and a result ({"loss": ...}); one in a hundred failed, with a log in its folder
(the other runs' folders are not needed by these commands). Each command runs as `python -m
gpu_task_scheduler ...` in its own process, its output thrown away (as into a pipe); the figures
are the median wall time and the largest peak RSS (the child's ru_maxrss) over the repeats.
The target for each: under 2 s and 200 MB.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _common import grid, gts, measure

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

BUILD = r"""
import json, os, random, sys
sys.path.insert(0, sys.argv[1])
from gpu_task_scheduler.records.ledger import Ledger
from gpu_task_scheduler.records.paths import RootPaths, RunPaths
from gpu_task_scheduler.records.status import RunStatus
from gpu_task_scheduler.sweep.expand import Sweep
sweep = Sweep(json.loads(sys.argv[2]))
root = sweep.options.result_root_folder
rng = random.Random(0)
with Ledger(RootPaths(root)) as ledger, ledger.batch():
    ledger.set_meta("log_file", "log.txt")
    ledger.set_meta("sweep_runs", str(len(sweep)))
    for spec in sweep.runs(lambda name, params, index: False):
        ledger.mark_running(name=spec.name, run_index=spec.index, config_hash=spec.config_hash, slot="cpu0",
                            token="t", work_dir=spec.work_dir, params=spec.params)
        if spec.index % 100 == 7:
            paths = RunPaths(spec.work_dir, "log.txt")
            os.makedirs(paths.work_dir)
            with open(paths.log, "w") as handle:
                handle.writelines(f"step {i}: loss nan\n" for i in range(40))
            ledger.finish(spec.name, RunStatus.FAILED, exit_code=1, cause="the command failed with exit code 1")
        else:
            ledger.finish(spec.name, RunStatus.SUCCEEDED, exit_code=0, result=json.dumps({"loss": rng.random()}))
"""


def config(root, runs):
    a, b = grid(runs)
    return {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": root, "log_file": "log.txt"},
        "test_config": [{"a": a, "b": b}],
        "command": ["true", "{a}", "{b}"],
    }


def built_root(workdir, runs):
    """The root of ``runs`` recorded runs under ``workdir`` (built once: kept there for reuse)."""
    root = os.path.join(workdir, f"root-{runs}")
    if not os.path.exists(os.path.join(root, ".gts", "ledger.sqlite3")):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", BUILD, REPO, json.dumps(config(root, runs))], check=True)
        print(f"built a root of {runs:,} runs in {time.perf_counter() - started:.0f}s")
    return root


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300_000)
    parser.add_argument("--grid", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", help="keep the root here (building 300,000 runs takes a minute or two)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gts-read-") as scratch:
        workdir = os.path.abspath(args.workdir or scratch)
        root = built_root(workdir, args.runs)
        dry = os.path.join(workdir, "grid.json")
        with open(dry, "w") as handle:
            json.dump(config(os.path.join(workdir, "grid-root"), args.grid), handle)
        commands = [
            ("gts status", ["status", root]),
            ("gts status --json", ["status", root, "--json"]),
            ("gts results --sort loss --top 10", ["results", root, "--sort", "result.loss", "--top", "10"]),
            ("gts results --average-over b", ["results", root, "--average-over", "b"]),
            ("gts logs --failed", ["logs", root, "--failed"]),
            (f"gts run --dry-run ({args.grid:,}-run grid)", ["run", dry, "--dry-run"]),
        ]
        env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
        print(f"{'command':<44} {'seconds':>8} {'peak MB':>8}  (target: < 2 s, < 200 MB)")
        for label, argv in commands:
            figures = [measure([*gts(), *argv], cwd=workdir, env=env) for _ in range(args.repeat)]
            codes = {code for code, _, _ in figures}
            seconds = statistics.median(wall for _, wall, _ in figures)
            peak = max(rss for _, _, rss in figures)
            mark = "" if codes <= {0, 1} else f"  exit {sorted(codes)}"
            print(f"{label:<44} {seconds:8.2f} {peak:8.0f}{mark}", flush=True)


if __name__ == "__main__":
    main()
