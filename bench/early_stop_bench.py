"""GPU-hours to the best configuration: a grid run whole, with gts's ASHA (stopping and pausing),
gts's Hyperband, Ray Tune's ASHA and HyperBand and Optuna's successive halving, on the same
learning curves and slots, in the same invocation, in several orders of the grid.

    python bench/early_stop_bench.py [--seeds 1] [--slots 4] [--step-seconds 0.05] [--tools a,b]

The workload is ``curves.py``: 36 configurations of 27 steps whose curves cross (fast
learners look best early; the best configuration learns slower). A step sleeps
``--step-seconds``, so a slot is busy as a GPU would be, and the machine's cores are not
what is measured. Each tool runs the grid in the same orders, with ``--slots`` runs at once:
``ascending`` (learning rates from the smallest, as grids are written), ``descending`` (as
curves.py lists them) and ``shuffled-N`` (by seeds 1..``--seeds``).

* gts: the grid (a) as a plain sweep, (b) with
  ``early_stop: {method: asha, metric: loss, mode: min, min_step: 1, max_step: 27, reduction_factor: 3}``,
  (c) the same with ``promotion: true`` (runs pause at rungs and resume from their checkpoints),
  (d) with ``method: hyperband`` and the same keys;
* Ray Tune: ``ASHAScheduler`` with the same rungs (grace_period 1, max_t 27, reduction_factor 3),
  and ``HyperBandScheduler`` (max_t 27, reduction_factor 3; its trials save a checkpoint at each
  report and resume from it), ``max_concurrent_trials`` = slots;
* Optuna: ``SuccessiveHalvingPruner`` (min_resource 1, reduction_factor 3), the grid enqueued in
  the same order, ``n_jobs`` = slots threads.

Ray Tune and Optuna are used where they import; otherwise they are installed into
``bench/.peers/`` as the suite installs its peers.

Printed per tool and order: steps executed (all tools count them the same way: a journal line
per step) and their share of the grid's, steps executed twice (a resumed run that did not go on
from its checkpoint), wall time of the sweep (a tool's own start-up, e.g. ``ray.init``, not
included), the best final loss among the runs that reached step 27 over the true best, and for
gts the steps a second ``start()`` of the same sweep executed (it must be 0). Which runs ASHA
stops depends on the order in which runs reach a rung, so the steps of one order differ from
tool to tool by chance (how fast each starts its runs).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import curves  # noqa: E402
from _common import grid_order  # noqa: E402

TOOLS = ("grid", "gts-asha", "gts-promotion", "gts-hyperband", "ray-asha", "ray-hyperband", "optuna-sha")
ASHA = {"method": "asha", "metric": "loss", "mode": "min", "min_step": 1, "max_step": curves.STEPS}
ASHA["reduction_factor"] = 3
EARLY_STOP = {
    "grid": None,
    "gts-asha": ASHA,
    "gts-promotion": {**ASHA, "promotion": True},
    "gts-hyperband": {**ASHA, "method": "hyperband"},
}


def run_gts(order, journal, slots, step_seconds, early_stop):
    from gpu_task_scheduler import GPUTaskScheduler

    root = os.path.join(os.path.dirname(journal), "root")
    config = {
        "scheduler_config": {"gpu": ["cpu"] * slots, "result_root_folder": root, "scheduler_log_file_path": None},
        "global_config": {"journal": journal, "step_seconds": step_seconds},
        "test_config": [{"lr": [lr], "width": [width]} for lr, width in order],
    }
    if early_stop is not None:
        config["early_stop"] = early_stop
    start = time.perf_counter()
    summary = GPUTaskScheduler(config, curves.CurveTask, live_status=False).start()
    wall = time.perf_counter() - start
    assert summary.ok, summary.report()
    with open(journal) as handle:
        before = handle.read()
    again = GPUTaskScheduler(config, curves.CurveTask, live_status=False).start()  # executes nothing
    with open(journal) as handle:
        rerun = handle.read()[len(before) :].count("\n")
    assert again.ok and not again.outcomes, again.report()
    return wall, {"pruned": len(summary.pruned), "paused": len(summary.paused), "again": rerun}


def run_ray(order, journal, slots, step_seconds, hyperband=False):
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, HyperBandScheduler

    ray.init(address="local", num_cpus=slots, num_gpus=0, include_dashboard=False, log_to_driver=False)

    def trainable(config):
        lr, width = config["cfg"]
        if not hyperband:
            curves.train(lr, width, journal, step_seconds, lambda step, value: tune.report({"loss": value}))
            return
        first, checkpoint = 1, tune.get_checkpoint()  # HyperBand pauses trials: they resume from a checkpoint
        if checkpoint is not None:
            with checkpoint.as_directory() as folder, open(os.path.join(folder, "step")) as handle:
                first = int(handle.read()) + 1

        def report(step, value):
            with tempfile.TemporaryDirectory() as folder:
                with open(os.path.join(folder, "step"), "w") as handle:
                    handle.write(str(step))
                tune.report({"loss": value}, checkpoint=tune.Checkpoint.from_directory(folder))

        curves.train(lr, width, journal, step_seconds, report, first)

    if hyperband:
        scheduler = HyperBandScheduler(time_attr="training_iteration", max_t=curves.STEPS, reduction_factor=3)
    else:
        scheduler = ASHAScheduler(
            time_attr="training_iteration", max_t=curves.STEPS, grace_period=1, reduction_factor=3
        )
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


def one(tool, order_name, slots, step_seconds, folder):
    """Run one tool on one order of the grid; its figures as JSON."""
    journal = os.path.join(folder, "journal")
    # shuffled as bench/pausing_sim.py shuffles: the grid as curves.py lists it, by the seed
    shuffled = order_name.startswith("shuffled-")
    order = curves.order(int(order_name.rsplit("-", 1)[1])) if shuffled else grid_order(curves.CONFIGS, order_name)
    if tool in EARLY_STOP:
        wall, extra = run_gts(order, journal, slots, step_seconds, EARLY_STOP[tool])
    elif tool in ("ray-asha", "ray-hyperband"):
        wall, extra = run_ray(order, journal, slots, step_seconds, hyperband=tool == "ray-hyperband")
    else:
        wall, extra = run_optuna(order, journal, slots, step_seconds)
    with open(journal) as handle:
        lines = [tuple(line.split()) for line in handle]
    finished = {(float(lr), int(width)) for lr, width, step in lines if int(step) == curves.STEPS}
    best = min(curves.loss(lr, width, curves.STEPS) for lr, width in finished)
    twice = len(lines) - len(set(lines))
    return {"steps": len(lines), "twice": twice, "wall": wall, "best": best, "finished": len(finished), **extra}


PEERS = {
    "ray-asha": ("ray[tune]", "ray.tune"),
    "ray-hyperband": ("ray[tune]", "ray.tune"),
    "optuna-sha": ("optuna", "optuna"),
}


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


def run_one(argv, folder, env, timeout):
    """One tool on one order in a process group of its own; None when it did not end within
    ``timeout`` seconds (the group, a peer's workers and servers included, is then killed)."""
    child = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=folder, env=env, start_new_session=True
    )
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return None
    return subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=1, help="shuffled orders, besides ascending and descending")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"some of {', '.join(TOOLS)}")
    parser.add_argument("--row-timeout", type=float, default=600, help="seconds one tool may take on one order")
    parser.add_argument("--one", nargs=3, metavar=("TOOL", "ORDER", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        tool, order_name, folder = args.one
        print(json.dumps(one(tool, order_name, args.slots, args.step_seconds, folder)))
        return
    total = len(curves.CONFIGS) * curves.STEPS
    print(
        f"{len(curves.CONFIGS)} configurations x {curves.STEPS} steps ({total} steps), {args.slots} slots, "
        f"{args.step_seconds}s a step; true best final loss {curves.TRUE_BEST:.4f}"
    )
    orders = ["ascending", "descending", *(f"shuffled-{seed}" for seed in range(1, args.seeds + 1))]
    head = f"{'tool':<14} {'order':<11} {'steps':>6} {'share':>6} {'twice':>6} {'wall s':>7} {'best/true':>10}"
    print(f"\n{head} {'again':>6}")
    for tool in args.tools.split(","):
        path = peer_path(tool)
        if path is None:
            print(f"{tool}: skipped (it does not install here)")
            continue
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH")) if p)}
        for order_name in orders:
            with tempfile.TemporaryDirectory(prefix="gts-es-") as folder:
                argv = [sys.executable, __file__, "--slots", str(args.slots), "--step-seconds", str(args.step_seconds)]
                done = run_one([*argv, "--one", tool, order_name, folder], folder, env, args.row_timeout)
                if done is None:
                    with open(os.path.join(folder, "journal")) as handle:
                        steps = sum(1 for _ in handle)
                    print(f"{tool:<14} {order_name:<11} did not end within {args.row_timeout:g}s ({steps} steps run)")
                    continue
            if done.returncode != 0:
                print(f"{tool} {order_name}: failed\n{done.stderr[-3000:]}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            again = str(r["again"]) if "again" in r else "-"
            print(
                f"{tool:<14} {order_name:<11} {r['steps']:>6} {r['steps'] / total:>6.0%} {r['twice']:>6} "
                f"{r['wall']:>7.1f} {r['best'] / curves.TRUE_BEST:>10.3f} {again:>6}",
                flush=True,
            )


if __name__ == "__main__":
    main()
