"""Many short trials: a TPE search over LightGBM (40 trials of about 1 to 2 s each on one thread),
through gts, Optuna's own loop (threads of one process) and Ray Tune (its Optuna searcher), each
``--slots`` at once, in one invocation, one fresh process per tool.

    python bench/short_trials_bench.py [--trials 40] [--slots 2] [--seeds 1] [--tools optuna,gts,ray-tune]

Every trial trains ``lightgbm.train`` on one thread (``num_threads: 1``) on the same synthetic
regression data (20,000 rows of 20 features, drawn from a fixed seed) for 400 rounds, with
``learning_rate``, ``num_leaves``, ``min_data_in_leaf`` and ``feature_fraction`` drawn by TPE, and
is judged by its final validation l2. Printed per tool and seed: the wall time, its ratio to
Optuna's in the same invocation, the best l2 found, and the trials' own training time (summed, so
that what each tool adds shows as wall × slots − training). The issue's target: gts within 1.2×
Optuna's wall. The machine is printed on top.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
ROUNDS = 400
SPACE = {
    "learning_rate": {"loguniform": [0.01, 0.3]},
    "num_leaves": {"int": [4, 64]},
    "min_data_in_leaf": {"int": [5, 100]},
    "feature_fraction": {"uniform": [0.5, 1.0]},
}
TOOLS = ("optuna", "gts", "ray-tune")  # Optuna first: the others are measured against it


def train(params: dict) -> tuple[float, float]:
    """One trial: its final validation l2 and the seconds it trained."""
    import lightgbm
    import numpy

    began = time.perf_counter()
    rng = numpy.random.default_rng(0)
    x = rng.normal(size=(20000, 20))
    y = 2 * x[:, 0] + numpy.sin(3 * x[:, 1]) + x[:, 2] * x[:, 3] + rng.normal(scale=0.3, size=20000)
    data = lightgbm.Dataset(x[:15000], y[:15000])
    valid = lightgbm.Dataset(x[15000:], y[15000:], reference=data)
    evals: dict = {}
    chosen = {key: params[key] for key in SPACE}
    lightgbm.train(
        {"objective": "regression", "num_threads": 1, "verbose": -1, "seed": 0, **chosen},
        data,
        ROUNDS,
        valid_sets=[valid],
        callbacks=[lightgbm.record_evaluation(evals)],
    )
    return float(evals["valid_0"]["l2"][-1]), time.perf_counter() - began


try:
    from gpu_task_scheduler import GPUTask
except ImportError:
    GPUTask = object  # type: ignore[misc,assignment]


class LightGBMTrial(GPUTask):  # type: ignore[misc,valid-type]
    def main(self):
        l2, seconds = train(self._config)
        return {"l2": l2, "seconds": seconds}


def run_gts(trials: int, slots: int, seed: int, folder: str) -> dict:
    from gpu_task_scheduler import GPUTaskScheduler

    config = {
        "scheduler_config": {
            "gpu": ["cpu"] * slots,
            "result_root_folder": os.path.join(folder, "root"),
            "scheduler_log_file_path": None,
        },
        "test_config": [SPACE],
        "search": {"sampler": "tpe", "n_runs": trials, "seed": seed, "metric": "l2", "mode": "min"},
    }
    began = time.perf_counter()
    summary = GPUTaskScheduler(config, LightGBMTrial, live_status=False).start()
    wall = time.perf_counter() - began
    assert len(summary.succeeded) == trials, summary.report()
    results = [outcome.result for outcome in summary.succeeded]
    return {"wall": wall, "best": min(r["l2"] for r in results), "trained": sum(r["seconds"] for r in results)}


def _draw(trial) -> dict:
    return {
        "learning_rate": trial.suggest_float("learning_rate", 0.01, 0.3, log=True),
        "num_leaves": trial.suggest_int("num_leaves", 4, 64),
        "min_data_in_leaf": trial.suggest_int("min_data_in_leaf", 5, 100),
        "feature_fraction": trial.suggest_float("feature_fraction", 0.5, 1.0),
    }


def run_optuna(trials: int, slots: int, seed: int) -> dict:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed, constant_liar=True))
    trained = []

    def objective(trial):
        l2, seconds = train(_draw(trial))
        trained.append(seconds)
        return l2

    began = time.perf_counter()
    study.optimize(objective, n_trials=trials, n_jobs=slots)
    return {"wall": time.perf_counter() - began, "best": study.best_value, "trained": sum(trained)}


def run_ray(trials: int, slots: int, seed: int, folder: str) -> dict:
    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    space = {
        "learning_rate": tune.loguniform(0.01, 0.3),
        "num_leaves": tune.randint(4, 65),
        "min_data_in_leaf": tune.randint(5, 101),
        "feature_fraction": tune.uniform(0.5, 1.0),
    }

    def trainable(config):
        l2, seconds = train(config)
        return {"l2": l2, "seconds": seconds}

    ray.init(num_cpus=slots, include_dashboard=False, log_to_driver=False)
    began = time.perf_counter()
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(
            search_alg=OptunaSearch(metric="l2", mode="min", seed=seed),
            num_samples=trials,
            max_concurrent_trials=slots,
        ),
        run_config=tune.RunConfig(storage_path=folder, verbose=0),
    )
    grid = tuner.fit()
    wall = time.perf_counter() - began
    frame = grid.get_dataframe()
    ray.shutdown()
    return {"wall": wall, "best": float(frame["l2"].min()), "trained": float(frame["seconds"].sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument(
        "--kept-imports",
        action="store_true",
        help="let gts use what earlier sweeps of this script imported (kept on the machine); by default "
        "each invocation starts with none kept, as a script's first sweep on a machine",
    )
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # tool seed
    args = parser.parse_args()
    if args.one:
        tool, seed = args.one[0], int(args.one[1])
        with tempfile.TemporaryDirectory(prefix="gts-short-") as folder:
            if tool == "gts":
                found = run_gts(args.trials, args.slots, seed, folder)
            elif tool == "optuna":
                found = run_optuna(args.trials, args.slots, seed)
            else:
                found = run_ray(args.trials, args.slots, seed, folder)
        print(json.dumps(found))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    kept = None if args.kept_imports else tempfile.TemporaryDirectory(prefix="gts-cache-")
    if kept is not None:
        env["GTS_CACHE_DIR"] = kept.name
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPU(s), Python {platform.python_version()}")
    print(f"{args.trials} TPE trials of LightGBM ({ROUNDS} rounds, one thread), {args.slots} at once")
    print(f"{'tool':>9} {'seed':>4} {'wall':>7} {'/optuna':>8} {'best l2':>8} {'trained':>8} {'added/trial':>11}")
    for seed in range(args.seeds):
        walls = {}
        for tool in args.tools.split(","):
            argv = [sys.executable, __file__, "--trials", str(args.trials), "--slots", str(args.slots)]
            done = subprocess.run([*argv, "--one", tool, str(seed)], capture_output=True, text=True, env=env)
            if done.returncode != 0:
                sys.exit(f"{tool} seed {seed} failed:\n{done.stderr[-3000:]}")
            found = json.loads(done.stdout.strip().splitlines()[-1])
            walls[tool] = found["wall"]
            ratio = found["wall"] / walls["optuna"] if "optuna" in walls else float("nan")
            added = (found["wall"] * args.slots - found["trained"]) / args.trials
            print(
                f"{tool:>9} {seed:>4} {found['wall']:6.1f}s {ratio:8.2f} {found['best']:8.4f} "
                f"{found['trained']:7.1f}s {added:10.2f}s",
                flush=True,
            )


if __name__ == "__main__":
    main()
