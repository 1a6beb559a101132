"""A real PyTorch sweep under ``gts run --serve``, watched as a person would, killed and resumed.

    python bench/served_sweep_check.py [--runs 12] [--steps 400] [--cpu]

Twelve small regressions (lr x hidden), four at a time on GPU 0, each reporting its loss every
step (one of them 200,000 extra steps of it, as a chatty run would), with ASHA on the loss. Six
pollers ask the served view for the overview and the curves of every run, as open pages do. The
scheduler is killed with SIGKILL once runs have finished, then started again to the end.

Prints: each start's wall time; the slowest and the median answer of the view and the most
points a curve came with; whether the view ended with the killed scheduler; each run's starts
and ends as the runs journal them (each run must end exactly once); how the runs ended. Needs
PyTorch (``--cpu``: the same without a GPU, for a dry run of the script).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

TASK = """
import json, os, time
from gpu_task_scheduler import GPUTask, Pruned

class Regression(GPUTask):
    def main(self):
        c = self._config
        journal = os.path.join(c["journal"], self._work_dir.rstrip("/").split("/")[-1].replace(",", "_"))
        with open(journal, "a") as handle:
            handle.write("start\\n")
        try:
            import torch
        except ImportError:  # --cpu without PyTorch: the script's own dry run
            return self.stand_in(c, journal)
        device = "cpu" if c["cpu"] else "cuda"
        g = torch.Generator().manual_seed(0)
        x = torch.randn(8192, 64, generator=g)
        y = x @ torch.randn(64, 1, generator=g)
        x, y = x.to(device), y.to(device)
        model = torch.nn.Sequential(torch.nn.Linear(64, c["hidden"]), torch.nn.ReLU(), torch.nn.Linear(c["hidden"], 1))
        model = model.to(device)
        opt = torch.optim.SGD(model.parameters(), lr=c["lr"])
        if c["chatty"]:  # a run that writes a long curve at once
            with open(os.environ["GTS_METRICS_FILE"], "a") as metrics:
                metrics.write("".join(f'{{"step": {s / 1000}, "loss": 1.0}}\\n' for s in range(200_000)))
        try:
            for step in range(1, c["steps"] + 1):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                self.report(200 + step, loss=loss.item())
        except Pruned:
            pass
        with open(journal, "a") as handle:
            handle.write("end\\n")
        return {"loss": loss.item()}

    def stand_in(self, c, journal):
        loss = 1.0
        try:
            for step in range(1, c["steps"] + 1):
                time.sleep(0.005)
                loss = 0.1 + 0.9 * (1 - c["lr"]) ** step
                self.report(200 + step, loss=loss)
        except Pruned:
            pass
        with open(journal, "a") as handle:
            handle.write("end\\n")
        return {"loss": loss}
"""


def fetch(url: str) -> tuple[float, dict]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body = json.loads(response.read())
    return time.perf_counter() - started, body


def poll(base: str, token: str, stop: threading.Event, timings: list[float], points: list[int]) -> None:
    def at(path: str, **query: str) -> str:
        return f"{base}{path}?{urllib.parse.urlencode({**query, 'token': token})}"

    while not stop.is_set():
        try:
            took, _ = fetch(at("/api/overview", root="0"))
            timings.append(took)
            took, page = fetch(at("/api/runs", root="0", limit="50"))
            names = "\n".join(run["name"] for run in page["runs"])
            took, curves = fetch(at("/api/curves", root="0", metric="loss", names=names))
            timings.append(took)
            points.extend(len(run["steps"]) for run in curves["runs"])
        except (OSError, ValueError):
            pass  # the sweep is between starts, or its root not yet made
        stop.wait(0.2)


def start(folder: str, args: argparse.Namespace, kill_after_ends: int | None) -> dict:
    argv = [sys.executable, "-m", "gpu_task_scheduler", "run", "sweep.json", "--plain", "--serve", "0"]
    env = {**os.environ, "PYTHONPATH": folder + os.pathsep + os.environ.get("PYTHONPATH", "")}
    began = time.monotonic()
    process = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    url = process.stderr.readline().split("watching at ", 1)[1].strip()
    base, token = url.split("?token=")
    server = [pid for pid in _children(process.pid) if b"web.server" in _cmdline(pid)]
    stop, timings, points = threading.Event(), [], []
    pollers = [threading.Thread(target=poll, args=(base.rstrip("/"), token, stop, timings, points)) for _ in range(6)]
    for thread in pollers:
        thread.start()
    killed = False
    while process.poll() is None:
        if kill_after_ends is not None and _ends(folder) >= kill_after_ends:
            process.send_signal(signal.SIGKILL)
            killed = True
            break
        time.sleep(0.1)
    process.wait()
    deadline = time.monotonic() + 10
    while server and _alive(server[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for thread in pollers:
        thread.join()
    process.stderr.close()
    return {
        "wall_s": round(time.monotonic() - began, 1),
        "killed": killed,
        "view_process": server,
        "view_ended": not server or not _alive(server[0]),
        "answers": len(timings),
        "slowest_answer_s": round(max(timings, default=0), 3),
        "median_answer_s": round(statistics.median(timings), 4) if timings else None,
        "most_points_in_a_curve": max(points, default=0),
    }


def _children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            found += [int(child) for child in handle.read().split()]
    return found


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _ends(folder: str) -> int:
    journal = os.path.join(folder, "journal")
    return sum(open(os.path.join(journal, f)).read().count("end") for f in os.listdir(journal))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="gts-served-")
    os.makedirs(os.path.join(folder, "journal"))
    with open(os.path.join(folder, "served_task.py"), "w") as handle:
        handle.write(TASK)
    lrs = [0.3, 0.1, 0.03, 0.01, 0.003, 0.001][: max(1, args.runs // 2)]
    config = {
        "scheduler_config": {
            "gpu": ["cpu"] * 4 if args.cpu else ["0"],
            "max_runs_per_gpu": 1 if args.cpu else 4,
            "result_root_folder": "results",
        },
        "task": "served_task:Regression",
        "global_config": {"steps": args.steps, "cpu": args.cpu, "journal": os.path.join(folder, "journal")},
        "test_config": [{"lr": lrs, "hidden": [64, 256]}, {"lr": [0.05], "hidden": [32], "chatty": [True]}],
        "early_stop": {"method": "asha", "metric": "loss", "mode": "min", "min_step": 250, "max_step": 600},
    }
    config["global_config"]["chatty"] = False
    with open(os.path.join(folder, "sweep.json"), "w") as handle:
        json.dump(config, handle)
    first = start(folder, args, kill_after_ends=3)
    print("first start (killed):", json.dumps(first))
    second = start(folder, args, kill_after_ends=None)
    print("second start:", json.dumps(second))
    journal = os.path.join(folder, "journal")
    counts = {f: open(os.path.join(journal, f)).read().split() for f in sorted(os.listdir(journal))}
    db = sqlite3.connect(os.path.join(folder, "results", ".gts", "ledger.sqlite3"))
    print("ended:", dict(db.execute("SELECT status, COUNT(*) FROM runs GROUP BY status").fetchall()))
    failed = {name.replace(",", "_") for (name,) in db.execute("SELECT name FROM runs WHERE status = 'failed'")}
    # A run that ended (succeeded or pruned) journals its end once; a failed one (a diverging
    # learning rate: report() refuses a NaN) journals none, and runs again at each start.
    twice = [f for f, lines in counts.items() if lines.count("end") != (0 if f in failed else 1)]
    print("runs whose end was not journaled exactly once (none if no run ran twice):", twice or "none")
    print("starts per run:", {f: lines.count("start") for f, lines in counts.items()})
    for name, attempts, cause in db.execute("SELECT name, attempts, cause FROM runs WHERE status = 'failed'"):
        print(f"failed: {name} ({attempts} attempts): {(cause or '')[:120]}")


if __name__ == "__main__":
    main()
