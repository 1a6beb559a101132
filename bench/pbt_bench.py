"""Population-based training against Ray Tune's PopulationBasedTraining, in the same invocation, on
a problem whose best schedule changes as it trains (warm up, then decay), and the grid run whole.

    python bench/pbt_bench.py [--repeats 3] [--slots 8] [--step-seconds 0.05] [--seed 0] [--tools grid,gts-pbt,ray-pbt]

The workload: 8 learning rates x 40 steps. Each step adds to a run's score a gain of at most 1,
the largest when its learning rate is the best one for that step, which rises tenfold over the
first 10 steps (a warm-up) and then falls a hundredfold by step 40: no fixed learning rate is
good for long. A step sleeps ``--step-seconds``, so a slot is busy as a GPU would be.

* grid: the 8 runs, each to step 40 at its learning rate (gts, no pbt);
* gts-pbt: ``pbt: {metric: score, mode: max, interval: 4, quantile: 0.25, perturb: {lr: [0.5, 2.0]},
  max_step: 40}``; each step saves a checkpoint (by a rename) and reports;
* ray-pbt: ``PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=4,
  quantile_fraction=0.25, resample_probability=0, perturbation_factors=(2.0, 0.5),
  hyperparam_mutations={"lr": tune.loguniform(1e-3, 10)})`` (with resampling off, Ray multiplies
  the value by one of the factors, as gts does), a checkpoint at every 4th step (as Ray's guide
  says) and at the end, ``max_concurrent_trials`` = slots.

gts-pbt's ``seed`` is ``--seed`` plus the repeat's number less one: each repeat draws other donors
and factors, as each of Ray Tune's does (with one seed, the repeats of a sweep whose members take
turns made the same decisions and printed one figure three times).

Printed per tool and repeat: the best member's score over the best fixed learning rate's (the
grid's best), the steps executed (a journal line per step) over the grid's, the exploits made,
and the wall time of the sweep (``ray.init`` not included); for gts, the steps a second start of
the same sweep executed (it must be 0) and the copies against PBT's copy rule
(``records/lineage.copy_faults``: each is printed). Ray Tune is used where it imports; otherwise it is
installed into ``bench/.peers/`` as the suite installs its peers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sqlite3
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from early_stop_bench import peer_path, run_one  # noqa: E402

from gpu_task_scheduler import GPUTask  # noqa: E402

LRS = [10 ** (-k * 2 / 7) for k in range(8)]  # 1 to 0.01
STEPS, INTERVAL = 40, 4
TOOLS = ("grid", "gts-pbt", "ray-pbt")
PBT = {
    "metric": "score",
    "mode": "max",
    "interval": INTERVAL,
    "quantile": 0.25,
    "perturb": {"lr": [0.5, 2.0]},
    "max_step": STEPS,
}


def best_lr(step: int) -> float:
    """0.03 at step 0, up to 0.3 at step 10, down to 0.003 at step 40."""
    if step <= 10:
        return 0.03 * 10 ** (step / 10)
    return 0.3 * 10 ** (-2 * (step - 10) / 30)


def gain(lr: float, step: int) -> float:
    distance = math.log10(lr / best_lr(step))
    return math.exp(-distance * distance / (2 * 0.3 * 0.3))


BEST_FIXED = max(sum(gain(lr, step) for step in range(1, STEPS + 1)) for lr in LRS)


def train(lr, first, score, journal, step_seconds, on_step):
    """Steps ``first``..STEPS at ``lr`` from ``score``; ``on_step(step, score)`` saves and reports."""
    for step in range(first, STEPS + 1):
        time.sleep(step_seconds)
        score += gain(lr, step)
        with open(journal, "a") as handle:  # one line per step executed, whoever runs it
            handle.write(f"{lr!r} {step}\n")
        on_step(step, score)
    return score


class ScheduleTask(GPUTask):
    """The workload as a gts run: saves its state by a rename, then reports (the checkpoint protocol)."""

    def main(self):
        saved = os.path.join(self.checkpoint_dir, "state.json")
        first, score = 1, 0.0
        if self.resume_step is not None:
            with open(saved) as handle:
                state = json.load(handle)
            first, score = state["step"] + 1, state["score"]

        def on_step(step, value):
            with open(saved + ".new", "w") as handle:
                json.dump({"step": step, "score": value}, handle)
            os.replace(saved + ".new", saved)
            self.report(step, score=value)

        c = self._config
        return {"score": train(c["lr"], first, score, c["journal"], c["step_seconds"], on_step)}


def run_gts(journal, slots, step_seconds, pbt, seed=0):
    from gpu_task_scheduler import GPUTaskScheduler

    root = os.path.join(os.path.dirname(journal), "root")
    config = {
        "scheduler_config": {"gpu": ["cpu"] * slots, "result_root_folder": root, "scheduler_log_file_path": None},
        "global_config": {"journal": journal, "step_seconds": step_seconds},
        "test_config": [{"lr": LRS}],
    }
    if pbt:
        config["pbt"] = {**PBT, "seed": seed}
    start = time.perf_counter()
    summary = GPUTaskScheduler(config, ScheduleTask, live_status=False).start()
    wall = time.perf_counter() - start
    assert summary.ok, summary.report()
    best = max(outcome.result["score"] for outcome in summary.succeeded)
    with open(journal) as handle:
        before = handle.read().count("\n")
    again = GPUTaskScheduler(config, ScheduleTask, live_status=False).start()
    with open(journal) as handle:
        rerun = handle.read().count("\n") - before
    assert again.ok and not again.outcomes, again.report()
    with sqlite3.connect(os.path.join(root, ".gts", "ledger.sqlite3")) as db:  # each copy made: a resumption
        exploits = db.execute("SELECT COUNT(*) FROM trial_events WHERE decision = 'exploit'").fetchone()[0]
    faults = []
    if pbt:  # every copy against the rule (records/lineage.copy_faults): the donor's current weights, no worse
        from gpu_task_scheduler.records.ledger import Ledger
        from gpu_task_scheduler.records.lineage import copy_faults
        from gpu_task_scheduler.records.paths import RootPaths

        ledger = Ledger.read_only(RootPaths(root))
        try:
            faults = copy_faults(
                ledger.trial_events(), interval=INTERVAL, value_of=lambda e: e.value, worse=lambda a, b: a < b
            )
        finally:
            ledger.close()
    return wall, best, {"exploits": exploits, "again": rerun, "faults": faults}


def run_ray(journal, slots, step_seconds):
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray
    from ray import tune

    ray.init(address="local", num_cpus=slots, num_gpus=0, include_dashboard=False, log_to_driver=False)

    def trainable(config):
        first, score, checkpoint = 1, 0.0, tune.get_checkpoint()
        if checkpoint is not None:  # a new trial, an exploit or a resumed one: from the checkpoint
            with checkpoint.as_directory() as folder, open(os.path.join(folder, "state.json")) as handle:
                state = json.load(handle)
            first, score = state["step"] + 1, state["score"]

        def report(step, value):
            if step % INTERVAL and step != STEPS:
                tune.report({"score": value})
                return
            with tempfile.TemporaryDirectory() as folder:
                with open(os.path.join(folder, "state.json"), "w") as handle:
                    json.dump({"step": step, "score": value}, handle)
                tune.report({"score": value}, checkpoint=tune.Checkpoint.from_directory(folder))

        train(config["lr"], first, score, journal, step_seconds, report)

    results, wall, exploits = ray_pbt_fit(
        trainable, ("score", "max"), LRS, (1e-3, 10.0), INTERVAL, STEPS, slots, os.path.dirname(journal)
    )
    best = max(result.metrics.get("score", 0.0) for result in results if result.metrics)
    ray.shutdown()
    return wall, best, {"errors": results.num_errors, "exploits": exploits}


def ray_pbt_fit(trainable, objective, lrs, lr_range, interval, steps, slots, folder):
    """Ray Tune's PopulationBasedTraining over the grid ``lrs`` as the benches set it up (the module's
    text): quantile 0.25, no resampling (so that Ray multiplies the value by 2 or 0.5, as gts does),
    ``slots`` trials at once, each stopped at ``steps``. ``objective``: ``(metric, mode)``. Returns
    Tune's results, the fit's wall time and the exploits made (Ray's own count, kept in its scheduler)."""
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    metric, mode = objective
    scheduler = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=interval,
        quantile_fraction=0.25,
        resample_probability=0.0,
        perturbation_factors=(2.0, 0.5),
        hyperparam_mutations={"lr": tune.loguniform(*lr_range)},
    )
    tuner = tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search(lrs)},
        tune_config=tune.TuneConfig(metric=metric, mode=mode, scheduler=scheduler, max_concurrent_trials=slots),
        run_config=tune.RunConfig(storage_path=folder, verbose=0, stop={"training_iteration": steps}),
    )
    start = time.perf_counter()
    results = tuner.fit()
    return results, time.perf_counter() - start, getattr(scheduler, "_num_perturbations", "-")


def one(tool, slots, step_seconds, folder, seed=0):
    journal = os.path.join(folder, "journal")
    open(journal, "w").close()
    if tool == "ray-pbt":
        wall, best, extra = run_ray(journal, slots, step_seconds)
    else:
        wall, best, extra = run_gts(journal, slots, step_seconds, pbt=tool == "gts-pbt", seed=seed)
    with open(journal) as handle:
        steps = sum(1 for _ in handle)
    return {"wall": wall, "best": best, "steps": steps, **extra}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"some of {', '.join(TOOLS)}")
    parser.add_argument("--row-timeout", type=float, default=600)
    parser.add_argument(
        "--seed", type=int, default=0, help="gts-pbt's seed (the first repeat's; each next one's is one more)"
    )
    parser.add_argument("--one", nargs=2, metavar=("TOOL", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.slots, args.step_seconds, args.one[1], args.seed)))
        return
    total = len(LRS) * STEPS
    print(
        f"{len(LRS)} learning rates x {STEPS} steps ({total} steps), {args.slots} slots, {args.step_seconds}s a step; "
        f"best fixed learning rate's score {BEST_FIXED:.2f}"
    )
    head = f"{'tool':<8} {'repeat':>6} {'best/fixed':>10} {'steps':>6} {'share':>6} {'exploits':>8} {'wall s':>7}"
    print(f"\n{head} {'again':>6} {'faults':>6}")
    for tool in args.tools.split(","):
        path = peer_path("ray-asha") if tool == "ray-pbt" else ""
        if path is None:
            print(f"{tool}: skipped (it does not install here)")
            continue
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, HERE, os.environ.get("PYTHONPATH")) if p)}
        for repeat in range(1, (1 if tool == "grid" else args.repeats) + 1):
            with tempfile.TemporaryDirectory(prefix="gts-pbt-") as folder:
                argv = [sys.executable, __file__, "--slots", str(args.slots), "--step-seconds", str(args.step_seconds)]
                argv += ["--seed", str(args.seed + repeat - 1)]  # each repeat draws other choices, as Ray's does
                done = run_one([*argv, "--one", tool, folder], folder, env, args.row_timeout)
            if done is None:
                print(f"{tool:<8} {repeat:>6} did not end within {args.row_timeout:g}s")
                continue
            if done.returncode != 0:
                print(f"{tool} {repeat}: failed\n{done.stderr[-3000:]}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(
                f"{tool:<8} {repeat:>6} {r['best'] / BEST_FIXED:>10.3f} {r['steps']:>6} {r['steps'] / total:>6.0%} "
                f"{r.get('exploits', '-')!s:>8} {r['wall']:>7.1f} {r.get('again', '-')!s:>6} "
                f"{len(r['faults']) if 'faults' in r else '-'!s:>6}",
                flush=True,
            )
            for fault in r.get("faults", []):
                print(f"         a copy against the rule: {fault}")


if __name__ == "__main__":
    main()
