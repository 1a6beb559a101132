"""Population-based training on a real workload: scikit-learn's digits with a small MLP
(``digits.py``), 8 learning rates x 27 epochs, run as a grid and with gts's ``pbt``, in one
invocation; and once more with a Ctrl-C a third of the way in, then the same command again.

    python bench/digits_pbt.py [--slots 2] [--passes 3] [--repeats 3] [--seed 0] [--ctrl-c-after 20]
                               [--tools grid,gts-pbt,ray-pbt]

Every run trains for real (``partial_fit``, ``passes`` epochs a step) on this machine's CPUs. With
``pbt: {metric: loss, mode: min, interval: 3, quantile: 0.25, perturb: {lr: [0.5, 2.0]},
max_step: 27}``, a member that copies another loads that member's pickled model and goes on with
the explored learning rate (set on the model's SGD optimizer). SGD with momentum learns fastest at
a high learning rate early and reaches a lower loss at a low one late: the best learning rate
falls as it trains. Printed: the best final validation loss over the grid's best (below 1: PBT's
member beat every fixed learning rate), the epochs trained over the grid's, the copies made, the
copies against PBT's copy rule (a snapshot of a lineage its donor dropped, or one recorded worse
than the copier's own loss there: records/lineage.copy_faults; each is printed), the wall time,
and the schedule the winner trained with. scikit-learn is installed into
``bench/.peers/`` when it does not import here.

``ray-pbt``: Ray Tune's ``PopulationBasedTraining`` on the same members, in the same invocation
(``--tools``): ``perturbation_interval=3``, ``quantile_fraction=0.25``, ``resample_probability=0``,
``perturbation_factors=(2.0, 0.5)``, ``hyperparam_mutations={"lr": tune.loguniform(1e-4, 1)}``
(with resampling off, Ray multiplies the value by one of the factors, as gts does), the model
pickled into a checkpoint at every third epoch (as Ray's guide says) and at the end, and
``max_concurrent_trials`` = slots. Its copies are Ray's own count; it keeps no ledger to audit.
gts's PBT ``seed`` is ``--seed`` plus the repeat's number less one (each repeat draws other donors
and factors, as Ray Tune's do); the Ctrl-C pass's two commands share theirs.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import digits  # noqa: E402
from early_stop_bench import peer_path  # noqa: E402
from pbt_bench import ray_pbt_fit  # noqa: E402

LRS = [0.5, 0.3, 0.2, 0.1, 0.05, 0.03, 0.02, 0.01]
WIDTH = 64
TOOLS = ("grid", "gts-pbt", "gts-pbt+ctrl-c", "ray-pbt")
PBT = {
    "metric": "loss",
    "mode": "min",
    "interval": 3,
    "quantile": 0.25,
    "perturb": {"lr": [0.5, 2.0]},
    "max_step": digits.EPOCHS,
}


class DigitsPbtTask(digits.GPUTask):  # type: ignore[misc,valid-type]
    """digits.DigitsTask whose learning rate may change between attempts (a PBT member's copy)."""

    def main(self):
        c = self._config
        path = os.path.join(self.checkpoint_dir, "model.pkl")
        model = None
        if self.resume_step is not None:  # its own model, or the one of the member it copied
            with open(path, "rb") as handle:
                model = pickle.load(handle)
            model.learning_rate_init = c["lr"]
            if hasattr(model, "_optimizer"):  # scikit-learn keeps the rate in its optimizer once it trained
                model._optimizer.learning_rate = c["lr"]

        def save(model):
            with open(path + ".new", "wb") as handle:
                pickle.dump(model, handle)
            os.replace(path + ".new", path)

        report = lambda e, v: self.report(e, loss=v)  # noqa: E731
        loss = digits.train(c["lr"], WIDTH, model, save, report, c["journal"], c.get("passes", 1))
        return {"loss": loss, "lr": c["lr"]}


def one(tool, slots, passes, folder, seed=0):
    if tool == "ray-pbt":
        return one_ray(slots, passes, folder)
    from gpu_task_scheduler import GPUTaskScheduler

    journal = os.path.join(folder, "journal")
    root = os.path.join(folder, "root")
    config = {
        "scheduler_config": {"gpu": ["cpu"] * slots, "result_root_folder": root, "scheduler_log_file_path": None},
        "global_config": {"journal": journal, "passes": passes},
        "test_config": [{"lr": LRS}],
    }
    if tool == "gts-pbt":
        config["pbt"] = {**PBT, "seed": seed}
    start = time.perf_counter()
    summary = GPUTaskScheduler(config, DigitsPbtTask, live_status=False).start()
    wall = time.perf_counter() - start
    assert summary.ok, summary.report()
    with sqlite3.connect(os.path.join(root, ".gts", "ledger.sqlite3")) as db:  # this start's and earlier ones'
        results = [json.loads(text) for (text,) in db.execute("SELECT result FROM runs WHERE status = 'succeeded'")]
    best_loss = min(result["loss"] for result in results)
    with open(journal) as handle:
        epochs = sum(1 for _ in handle)
    copies, faults, schedule = 0, [], ""
    if tool == "gts-pbt":
        from gpu_task_scheduler.records.ledger import Ledger
        from gpu_task_scheduler.records.lineage import copy_faults
        from gpu_task_scheduler.records.paths import RootPaths

        with sqlite3.connect(os.path.join(root, ".gts", "ledger.sqlite3")) as db:
            copies = db.execute("SELECT COUNT(*) FROM trial_events WHERE decision = 'exploit'").fetchone()[0]
        ledger = Ledger.read_only(RootPaths(root))
        try:  # every copy against the rule: the donor's current weights, no worse than the copier's own
            faults = copy_faults(
                ledger.trial_events(), interval=PBT["interval"], value_of=lambda e: e.value, worse=lambda a, b: a > b
            )
        finally:
            ledger.close()
        shown = subprocess.run(
            [sys.executable, "-m", "gpu_task_scheduler", "results", root, "--best", "loss", "--min", "--schedule"],
            capture_output=True,
            text=True,
        )
        schedule = shown.stdout.split("(population-based training):\n")[-1].strip()
    return {
        "loss": best_loss,
        "epochs": epochs,
        "copies": copies,
        "faults": faults,
        "wall": wall,
        "schedule": schedule,
    }


def one_ray(slots, passes, folder):
    """The same members under Ray Tune's PBT (see the module's text)."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray
    from ray import tune

    journal = os.path.join(folder, "journal")
    open(journal, "w").close()
    ray.init(address="local", num_cpus=slots, num_gpus=0, include_dashboard=False, log_to_driver=False)

    def trainable(config):
        model, checkpoint = None, tune.get_checkpoint()
        if checkpoint is not None:  # an exploit (the donor's model) or a trial resumed: from its model
            with checkpoint.as_directory() as saved, open(os.path.join(saved, "model.pkl"), "rb") as handle:
                model = pickle.load(handle)
            model.learning_rate_init = config["lr"]
            if hasattr(model, "_optimizer"):
                model._optimizer.learning_rate = config["lr"]
        latest = {}

        def save(model):
            latest["model"] = model

        def report(epoch, value):
            if epoch % PBT["interval"] and epoch != digits.EPOCHS:
                tune.report({"loss": value})
                return
            with tempfile.TemporaryDirectory() as saved:
                with open(os.path.join(saved, "model.pkl"), "wb") as handle:
                    pickle.dump(latest["model"], handle)
                tune.report({"loss": value}, checkpoint=tune.Checkpoint.from_directory(saved))

        digits.train(config["lr"], WIDTH, model, save, report, journal, passes)

    results, wall, copies = ray_pbt_fit(
        trainable, ("loss", "min"), LRS, (1e-4, 1.0), PBT["interval"], digits.EPOCHS, slots, folder
    )
    losses = [r.metrics["loss"] for r in results if r.metrics and "loss" in r.metrics]
    ray.shutdown()
    with open(journal) as handle:
        epochs = sum(1 for _ in handle)
    return {"loss": min(losses), "epochs": epochs, "copies": copies, "faults": [], "wall": wall, "schedule": ""}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ctrl-c-after", type=float, default=20.0, help="seconds before the Ctrl-C pass's Ctrl-C")
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"some of {', '.join(TOOLS)}")
    parser.add_argument(
        "--seed", type=int, default=0, help="gts-pbt's seed (the first repeat's; each next one's is one more)"
    )
    parser.add_argument("--one", nargs=2, metavar=("TOOL", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.slots, args.passes, args.one[1], args.seed)))
        return
    path = sklearn_path()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, HERE, os.environ.get("PYTHONPATH")) if p)}
    total = len(LRS) * digits.EPOCHS
    print(f"{len(LRS)} learning rates x {digits.EPOCHS} epochs ({total}), width {WIDTH}, {args.slots} slots")
    head = f"{'tool':<14} {'repeat':>6} {'loss':>7} {'/ grid':>7} {'epochs':>7} {'share':>6} {'copies':>6}"
    print(f"\n{head} {'faults':>6} {'wall s':>7}")
    grid_loss = None
    for tool in args.tools.split(","):
        ray_path = peer_path("ray-asha") if tool == "ray-pbt" else ""
        if ray_path is None:
            print(f"{tool}: skipped (it does not install here)")
            continue
        env["PYTHONPATH"] = os.pathsep.join(p for p in (path, ray_path, HERE, os.environ.get("PYTHONPATH")) if p)
        for repeat in range(1, (1 if tool == "grid" else args.repeats) + 1):
            with tempfile.TemporaryDirectory(prefix="gts-digits-pbt-") as folder:
                argv = [sys.executable, __file__, "--slots", str(args.slots), "--passes", str(args.passes)]
                argv += ["--seed", str(args.seed + repeat - 1)]  # each repeat draws other choices, as Ray's does
                if tool.endswith("+ctrl-c"):  # Ctrl-C a third of the way in, then the same command again
                    first = subprocess.Popen(
                        [*argv, "--one", "gts-pbt", folder],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    try:
                        first.wait(timeout=args.ctrl_c_after)
                    except subprocess.TimeoutExpired:
                        first.send_signal(signal.SIGINT)
                        first.wait()
                done = subprocess.run(
                    [*argv, "--one", tool.removesuffix("+ctrl-c"), folder], capture_output=True, text=True, env=env
                )
            if done.returncode != 0:
                print(f"{tool} {repeat}: failed\n{done.stderr[-3000:]}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            grid_loss = r["loss"] if tool == "grid" else grid_loss
            ratio = r["loss"] / grid_loss if grid_loss else float("nan")
            print(
                f"{tool:<14} {repeat:>6} {r['loss']:>7.4f} {ratio:>7.3f} {r['epochs']:>7} {r['epochs'] / total:>6.0%} "
                f"{r['copies']:>6} {len(r['faults']):>6} {r['wall']:>7.1f}",
                flush=True,
            )
            for fault in r["faults"]:
                print(f"         a copy against the rule: {fault}")
            if r["schedule"]:
                print("         " + r["schedule"].replace("\n", "\n         "))


def sklearn_path():
    """'' when scikit-learn imports here; else where the suite installs it (bench/.peers/)."""
    try:
        __import__("sklearn")
        return ""
    except ImportError:
        from suite import pip_peer

        return pip_peer("scikit-learn", "sklearn") or ""


if __name__ == "__main__":
    main()
