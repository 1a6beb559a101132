"""Searching through gts against Optuna's own loop: the best value found, and what a run costs.

    python bench/search_bench.py [--seeds 5] [--slots 4]

Two test functions: Branin (2 dimensions, minimum 0.397887) and Hartmann-6 (6 dimensions,
minimum -3.32237). For each, 40 and 100 runs, random and TPE sampling, each run in ``--slots``
at once:

* gts: a sweep with ``search: {sampler: random | tpe, n_runs: N, seed: S, ...}`` whose task
  computes the function (one process per run, as every gts run);
* Optuna: ``study.optimize(objective, n_trials=N, n_jobs=slots)`` with ``RandomSampler(seed=S)``
  or ``TPESampler(seed=S, constant_liar=True)``: the same samplers, in threads of one process.

Printed: the median over the seeds of the best value found, and the wall time per sweep; gts's
cost per run beyond Optuna's (its process, its records) is the difference over N. Optuna is
used where it imports, else installed into ``bench/.peers/`` as the suite installs its peers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SPACES = {
    "branin": {"x1": {"uniform": [-5, 10]}, "x2": {"uniform": [0, 15]}},
    "hartmann6": {f"x{i}": {"uniform": [0, 1]} for i in range(1, 7)},
}
OPTIMA = {"branin": 0.397887, "hartmann6": -3.32237}

_A = [[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]]
_P = [
    [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
    [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
    [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
    [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
]
_ALPHA = [1.0, 1.2, 3.0, 3.2]


def value(function, x):
    if function == "branin":
        x1, x2 = x["x1"], x["x2"]
        b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
        return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10
    xs = [x[f"x{i}"] for i in range(1, 7)]
    return -sum(
        alpha * math.exp(-sum(a * (xi - p) ** 2 for a, xi, p in zip(row, xs, prow, strict=True)))
        for alpha, row, prow in zip(_ALPHA, _A, _P, strict=True)
    )


try:
    from gpu_task_scheduler import GPUTask
except ImportError:
    GPUTask = object  # type: ignore[misc,assignment]


class FunctionTask(GPUTask):  # type: ignore[misc,valid-type]
    def main(self):
        return {"value": value(self._config["function"], self._config)}


def run_gts(function, sampler, n_runs, seed, slots, folder):
    from gpu_task_scheduler import GPUTaskScheduler

    config = {
        "scheduler_config": {
            "gpu": ["cpu"] * slots,
            "result_root_folder": os.path.join(folder, "root"),
            "scheduler_log_file_path": None,
        },
        "global_config": {"function": function},
        "test_config": [SPACES[function]],
        "search": {"sampler": sampler, "n_runs": n_runs, "seed": seed, "metric": "value", "mode": "min"},
    }
    start = time.perf_counter()
    summary = GPUTaskScheduler(config, FunctionTask, live_status=False).start()
    wall = time.perf_counter() - start
    assert len(summary.succeeded) == n_runs, summary.report()
    return min(o.result["value"] for o in summary.succeeded), wall


def run_optuna(function, sampler, n_runs, seed, slots):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    chosen = (
        optuna.samplers.TPESampler(seed=seed, constant_liar=True)
        if sampler == "tpe"
        else optuna.samplers.RandomSampler(seed=seed)
    )
    study = optuna.create_study(sampler=chosen)
    space = SPACES[function]

    def objective(trial):
        x = {key: trial.suggest_float(key, *bounds["uniform"]) for key, bounds in space.items()}
        return value(function, x)

    start = time.perf_counter()
    study.optimize(objective, n_trials=n_runs, n_jobs=slots)
    return study.best_value, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--runs", type=int, nargs="+", default=[40, 100])
    parser.add_argument("--functions", nargs="+", choices=sorted(SPACES), default=list(SPACES))
    parser.add_argument("--one", nargs=5, help=argparse.SUPPRESS)  # tool function sampler runs seed
    args = parser.parse_args()
    if args.one:
        tool, function, sampler, runs, seed = args.one
        with tempfile.TemporaryDirectory(prefix="gts-search-") as folder:
            if tool == "gts":
                best, wall = run_gts(function, sampler, int(runs), int(seed), args.slots, folder)
            else:
                best, wall = run_optuna(function, sampler, int(runs), int(seed), args.slots)
        print(json.dumps({"best": best, "wall": wall}))
        return
    env = dict(os.environ)
    try:
        import optuna  # noqa: F401
    except ImportError:
        from suite import pip_peer

        path = pip_peer("optuna", "optuna")
        if path is None:
            sys.exit("Optuna does not install here")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH")) if p)
    print(f"{args.seeds} seeds, {args.slots} slots; medians of the best value found, and of the wall time")
    print(
        f"{'function':<10} {'runs':>5} {'sampler':<7} {'gts best':>9} {'optuna best':>12} {'gts s':>7} {'optuna s':>9}"
    )
    for function in args.functions:
        for runs in args.runs:
            for sampler in ("random", "tpe"):
                found = {"gts": [], "optuna": []}
                walls = {"gts": [], "optuna": []}
                for seed in range(args.seeds):
                    for tool in ("gts", "optuna"):
                        argv = [sys.executable, __file__, "--slots", str(args.slots), "--one", tool, function]
                        done = subprocess.run(
                            [*argv, sampler, str(runs), str(seed)], capture_output=True, text=True, env=env
                        )
                        if done.returncode != 0:
                            sys.exit(f"{tool} {function} {sampler} seed {seed} failed:\n{done.stderr[-2000:]}")
                        figures = json.loads(done.stdout.strip().splitlines()[-1])
                        found[tool].append(figures["best"])
                        walls[tool].append(figures["wall"])
                gts_wall, optuna_wall = statistics.median(walls["gts"]), statistics.median(walls["optuna"])
                print(
                    f"{function:<10} {runs:>5} {sampler:<7} {statistics.median(found['gts']):>9.4f} "
                    f"{statistics.median(found['optuna']):>12.4f} {gts_wall:>7.2f} {optuna_wall:>9.2f}"
                    f"   (gts: {1000 * (gts_wall - optuna_wall) / runs:.0f} ms a run more; optimum {OPTIMA[function]})"
                )


if __name__ == "__main__":
    main()
