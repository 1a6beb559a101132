"""GPU-hours to the best configuration: a grid run whole, with gts's ASHA, Ray Tune's ASHA and
Optuna's successive halving, on the same learning curves and slots, in the same invocation.

    python bench/early_stop_bench.py [--seeds 3] [--slots 4] [--step-seconds 0.05]

The workload is ``curves.py``: 36 configurations of 27 steps whose curves cross (fast
learners look best early; the best configuration learns slower). A step sleeps
``--step-seconds``, so a slot is busy as a GPU would be, and the machine's cores are not
what is measured. Each tool runs the grid in the same order (shuffled by each seed), with
``--slots`` runs at once:

* gts: the grid (a) as a plain sweep and (b) with
  ``early_stop: {method: asha, metric: loss, mode: min, min_step: 1, max_step: 27, reduction_factor: 3}``;
* Ray Tune: ``ASHAScheduler`` with the same rungs (grace_period 1, max_t 27, reduction_factor 3),
  ``max_concurrent_trials`` = slots;
* Optuna: ``SuccessiveHalvingPruner`` (min_resource 1, reduction_factor 3), the grid enqueued in
  the same order, ``n_jobs`` = slots threads.

Ray Tune and Optuna are used where they import; otherwise they are installed into
``bench/.peers/`` as the suite installs its peers.

Printed per tool: steps executed (all tools count them the same way: a journal line per step),
wall time of the sweep (a tool's own start-up, e.g. ``ray.init``, not included), the best
final loss among the runs that reached step 27, and its ratio to the true best. Medians (and
the mean of the steps) over the seeds, the worst best value of any seed; ratios against the
full grid and against Ray Tune, from the same invocation. Which runs ASHA stops depends on the
order in which runs reach a rung, so the steps of one order differ from tool to tool by
chance (how fast each starts its runs): compare means over several seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import curves  # noqa: E402

TOOLS = ("grid", "gts-asha", "ray-asha", "optuna-sha")
ASHA = {"method": "asha", "metric": "loss", "mode": "min", "min_step": 1, "max_step": curves.STEPS}


def run_gts(order, journal, slots, step_seconds, asha):
    from gpu_task_scheduler import GPUTaskScheduler

    root = os.path.join(os.path.dirname(journal), "root")
    config = {
        "scheduler_config": {"gpu": ["cpu"] * slots, "result_root_folder": root, "scheduler_log_file_path": None},
        "global_config": {"journal": journal, "step_seconds": step_seconds},
        "test_config": [{"lr": [lr], "width": [width]} for lr, width in order],
    }
    if asha:
        config["early_stop"] = {**ASHA, "reduction_factor": 3}
    start = time.perf_counter()
    summary = GPUTaskScheduler(config, curves.CurveTask, live_status=False).start()
    wall = time.perf_counter() - start
    assert summary.ok, summary.report()
    return wall, {"pruned": len(summary.pruned)}


def run_ray(order, journal, slots, step_seconds):
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    ray.init(address="local", num_cpus=slots, num_gpus=0, include_dashboard=False, log_to_driver=False)

    def trainable(config):
        lr, width = config["cfg"]
        curves.train(lr, width, journal, step_seconds, lambda step, value: tune.report({"loss": value}))

    scheduler = ASHAScheduler(time_attr="training_iteration", max_t=curves.STEPS, grace_period=1, reduction_factor=3)
    tuner = tune.Tuner(
        trainable,
        param_space={"cfg": tune.grid_search([list(c) for c in order])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler, max_concurrent_trials=slots),
        run_config=tune.RunConfig(storage_path=os.path.dirname(journal), verbose=0),
    )
    start = time.perf_counter()
    results = tuner.fit()
    wall = time.perf_counter() - start
    errors = results.num_errors
    ray.shutdown()
    return wall, {"errors": errors}


def run_optuna(order, journal, slots, step_seconds):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    study = optuna.create_study(direction="minimize", pruner=pruner)
    for lr, width in order:
        study.enqueue_trial({"lr": lr, "width": width})

    def objective(trial):
        lr = trial.suggest_categorical("lr", curves.LRS)
        width = trial.suggest_categorical("width", curves.WIDTHS)

        def report(step, value):
            trial.report(value, step)
            if trial.should_prune():
                raise optuna.TrialPruned()

        return curves.train(lr, width, journal, step_seconds, report)

    start = time.perf_counter()
    study.optimize(objective, n_trials=len(order), n_jobs=slots)
    return time.perf_counter() - start, {}


def one(tool, seed, slots, step_seconds, folder):
    """Run one tool on one order of the grid; its figures as JSON."""
    journal = os.path.join(folder, "journal")
    order = curves.order(seed)
    if tool in ("grid", "gts-asha"):
        wall, extra = run_gts(order, journal, slots, step_seconds, asha=tool == "gts-asha")
    elif tool == "ray-asha":
        wall, extra = run_ray(order, journal, slots, step_seconds)
    else:
        wall, extra = run_optuna(order, journal, slots, step_seconds)
    with open(journal) as handle:
        lines = [line.split() for line in handle]
    finished = {(float(lr), int(width)) for lr, width, step in lines if int(step) == curves.STEPS}
    best = min(curves.loss(lr, width, curves.STEPS) for lr, width in finished)
    return {"steps": len(lines), "wall": wall, "best": best, "finished": len(finished), **extra}


PEERS = {"ray-asha": ("ray[tune]", "ray.tune"), "optuna-sha": ("optuna", "optuna")}


def peer_path(tool):
    """'' when the tool imports here; else the folder it was installed into (bench/.peers/, as the
    suite installs its peers); None when it cannot be had."""
    if tool not in PEERS:
        return ""
    package, module = PEERS[tool]
    try:
        __import__(module)
        return ""
    except ImportError:
        from suite import pip_peer

        return pip_peer(package, module)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="orders of the grid (seed 0: as listed)")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--one", nargs=3, metavar=("TOOL", "SEED", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        tool, seed, folder = args.one
        print(json.dumps(one(tool, int(seed), args.slots, args.step_seconds, folder)))
        return
    total = len(curves.CONFIGS) * curves.STEPS
    print(
        f"{len(curves.CONFIGS)} configurations x {curves.STEPS} steps ({total} steps), {args.slots} slots, "
        f"{args.step_seconds}s a step; true best final loss {curves.TRUE_BEST:.4f}"
    )
    figures = {}
    for tool in TOOLS:
        path = peer_path(tool)
        if path is None:
            print(f"{tool}: skipped (it does not install here)")
            continue
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH")) if p)}
        runs = []
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory(prefix="gts-es-") as folder:
                argv = [sys.executable, __file__, "--slots", str(args.slots), "--step-seconds", str(args.step_seconds)]
                done = subprocess.run(
                    [*argv, "--one", tool, str(seed), folder], capture_output=True, text=True, cwd=folder, env=env
                )
                if done.returncode != 0:
                    print(f"{tool} seed {seed}: failed\n{done.stderr[-3000:]}")
                    break
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        if not runs:
            continue
        figures[tool] = {
            "steps": statistics.median(r["steps"] for r in runs),
            "mean_steps": statistics.mean(r["steps"] for r in runs),
            "wall": statistics.median(r["wall"] for r in runs),
            "best": max(r["best"] for r in runs),  # the worst of the seeds
            "runs": runs,
        }
    print(
        f"\n{'tool':<12} {'steps':>7} {'mean':>7} {'of grid':>8} {'wall s':>8} {'of grid':>8} {'worst best':>11} "
        f"{'/ true':>7}"
    )
    grid = figures.get("grid")
    for tool, f in figures.items():
        steps_ratio = f"{f['steps'] / grid['steps']:.2f}" if grid else "-"
        wall_ratio = f"{f['wall'] / grid['wall']:.2f}" if grid else "-"
        print(
            f"{tool:<12} {f['steps']:>7.0f} {f['mean_steps']:>7.0f} {steps_ratio:>8} {f['wall']:>8.1f} {wall_ratio:>8} "
            f"{f['best']:>11.4f} {f['best'] / curves.TRUE_BEST:>7.3f}"
        )
    ours, ray = figures.get("gts-asha"), figures.get("ray-asha")
    if ours and ray:
        print(
            f"\ngts ASHA / Ray Tune ASHA: steps {ours['steps'] / ray['steps']:.2f} (mean "
            f"{ours['mean_steps'] / ray['mean_steps']:.2f}), "
            f"wall {ours['wall'] / ray['wall']:.2f}, worst best found {ours['best'] / ray['best']:.3f} "
            "(below 1: ours is lower, better)"
        )
    for tool, f in figures.items():
        per_seed = ", ".join(f"{r['steps']} steps/{r['wall']:.1f}s/{r['best']:.4f}" for r in f["runs"])
        print(f"  {tool} per seed: {per_seed}")


if __name__ == "__main__":
    main()
