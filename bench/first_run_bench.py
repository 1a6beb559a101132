"""Time to the first run: from launching the command to the first job's start, as the job saw it.

    python bench/first_run_bench.py [--repeat 5] [--before REV]

``gts queue`` (10 lines), ``gts run`` (a 10-run and a 1,000,000-run command sweep) and, for
scale, the waitpid floor of ``bench/suite.py`` (10 lines) and ``python -c pass``: what starting
any Python program costs on this machine. Each job is ``bench/probe.sh``; the large sweep is
stopped (SIGINT) once its first job has started. gts runs from this checkout, compiled to
bytecode as an installed package is.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from suite import CHECKOUT, FLOOR, PROBE, gts_tree


def first_start(argv: list[str], feed: bytes, log: str, folder: str, env: dict[str, str], stop: bool) -> float:
    launched = time.time()
    process = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=folder, env=env
    )
    assert process.stdin is not None
    process.stdin.write(feed)
    process.stdin.close()
    while not (os.path.exists(log) and os.path.getsize(log)):
        if process.poll() is not None:
            raise RuntimeError(f"{argv[:4]} ended ({process.returncode}) before its first job started")
        time.sleep(0.001)  # the job's own log line is the event; nothing to wait on but the file
    with open(log) as handle:
        first = min(float(line.split()[1]) for line in handle if line.strip()) - launched
    if stop:
        process.send_signal(signal.SIGINT)
    process.wait()
    return first


def measure(tool: str, runs: int, env: dict[str, str]) -> float:
    with tempfile.TemporaryDirectory() as folder:
        log = os.path.join(folder, "jobs.log")
        lines = "".join(f"{PROBE} {log} {index} 0\n" for index in range(runs)).encode()
        gts = [sys.executable, "-m", "gpu_task_scheduler"]
        if tool == "gts run":
            a, b = (runs, 1) if runs < 1000 else (1000, runs // 1000)
            config = {
                "scheduler_config": {
                    "gpu": ["0", "1", "2", "3"],
                    "result_root_folder": os.path.join(folder, "r"),
                    "scheduler_log_file_path": None,
                    "log_file": None,
                },
                "test_config": [{"a": list(range(a)), "b": list(range(b))}],
                "command": [PROBE, log, "{a}", "0"],
            }
            with open(os.path.join(folder, "sweep.json"), "w") as handle:
                json.dump(config, handle)
            argv, feed = gts + ["run", "sweep.json", "--plain"], b""
        elif tool == "gts queue":
            argv, feed = gts + ["queue", "--gpus", "0", "1", "2", "3", "--log-dir", "q"], lines
        elif tool == "waitpid floor":
            argv, feed = [sys.executable, "-c", FLOOR, "0,1,2,3"], lines
        else:
            raise ValueError(tool)
        return first_start(argv, feed, log, folder, env, stop=runs > 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="launches per case (the median is shown)")
    parser.add_argument(
        "--before", metavar="REV", help="also measure gts as it was at this git revision (or in this folder)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gts-first-run-trees-") as trees_dir:
        trees = {"": gts_tree(None, trees_dir)}
        if args.before:
            trees[f" @{args.before}"] = gts_tree(args.before, trees_dir)
        envs = {}
        for label, tree in trees.items():
            envs[label] = dict(os.environ)
            envs[label]["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")]))
        started = []
        for _ in range(args.repeat):
            began = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            started.append(time.perf_counter() - began)
        print(f"{os.cpu_count()} CPU cores, Python {sys.version.split()[0]}, medians of {args.repeat}, {CHECKOUT}")
        print(f"  python -c pass                  {statistics.median(started) * 1000:6.0f} ms")
        for tool, runs in (("waitpid floor", 10), ("gts queue", 10), ("gts run", 10), ("gts run", 1_000_000)):
            labels = [""] if tool == "waitpid floor" else list(envs)
            firsts: dict[str, list[float]] = {label: [] for label in labels}
            for _ in range(args.repeat):  # the trees take turns, so that a slower moment hits both
                for label in labels:
                    firsts[label].append(measure(tool, runs, envs[label]))
            for label in labels:
                name = f"{tool}{label}, {runs:,} runs"
                print(f"  {name:<30}  {statistics.median(firsts[label]) * 1000:6.0f} ms to the first run's start")


if __name__ == "__main__":
    main()
