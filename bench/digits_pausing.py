"""Pausing on a real workload: scikit-learn's digits with a small MLP (``digits.py``), its grid of
24 configurations x 27 steps run whole, with gts's stopping ASHA, promotion ASHA and Hyperband,
in three orders of the grid, in one invocation.

    python bench/digits_pausing.py [--slots 2] [--passes 10] [--tools grid,gts-asha,gts-promotion,gts-hyperband]

The ``-two`` tools (``gts-promotion-two``, ``gts-hyperband-two``) judge by two objectives, the
validation loss and the model's size (its weights: ``digits.size``), and every tool's row then
gives the hypervolume of the final (loss, size) points of the runs trained to the last epoch over
the grid's (reference point: the loss of a uniform guess among the 10 digits, ln 10, and 1.1x the
largest model; 1.000: nothing of the trade-off lost).

Every run trains for real (``partial_fit``, one epoch a step) on this machine's CPUs, and a paused
run resumes from its pickled model. Printed per tool and order: the steps trained and their share
of the grid's, steps trained twice (a resumed run that did not go on from its checkpoint), the
sweep's wall time, and the best final validation loss among the runs trained to the last epoch,
over the grid's best (1.000: the best configuration was kept). scikit-learn is installed into
``bench/.peers/`` when it does not import here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import digits  # noqa: E402
from _common import grid_order  # noqa: E402
from multi_objective_bench import hypervolume  # noqa: E402

ASHA = {"method": "asha", "metric": "loss", "mode": "min", "min_step": 1, "max_step": digits.EPOCHS}
TWO = {"method": "asha", "objectives": {"loss": "min", "params": "min"}, "min_step": 1, "max_step": digits.EPOCHS}
TOOLS = {
    "grid": None,
    "gts-asha": ASHA,
    "gts-promotion": {**ASHA, "promotion": True},
    "gts-hyperband": {**ASHA, "method": "hyperband"},
    "gts-promotion-two": {**TWO, "promotion": True},
    "gts-hyperband-two": {**TWO, "method": "hyperband"},
}


def one(tool, order_name, slots, passes, folder):
    from gpu_task_scheduler import GPUTaskScheduler

    journal = os.path.join(folder, "journal")
    config = {
        "scheduler_config": {
            "gpu": ["cpu"] * slots,
            "result_root_folder": os.path.join(folder, "root"),
            "scheduler_log_file_path": None,
        },
        "global_config": {"journal": journal, "passes": passes},
        "test_config": [{"lr": [lr], "width": [width]} for lr, width in grid_order(digits.CONFIGS, order_name)],
    }
    if TOOLS[tool] is not None:
        config["early_stop"] = {**TOOLS[tool], "reduction_factor": 3}
    start = time.perf_counter()
    summary = GPUTaskScheduler(config, digits.DigitsTask, live_status=False).start()
    wall = time.perf_counter() - start
    assert summary.ok, summary.report()
    with open(journal) as handle:
        lines = [line.split() for line in handle]
    again = GPUTaskScheduler(config, digits.DigitsTask, live_status=False).start()
    assert again.ok and not again.outcomes, again.report()
    epochs = [(lr, width, int(epoch)) for lr, width, epoch, _ in lines]
    final = {(lr, width): float(loss) for lr, width, epoch, loss in lines if int(epoch) == digits.EPOCHS}
    return {
        "epochs": len(epochs),
        "twice": len(epochs) - len(set(epochs)),
        "wall": wall,
        "best": min(final.values()),
        "finals": {f"{lr}/{width}": value for (lr, width), value in final.items()},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--passes", type=int, default=10, help="epochs a step (an epoch takes some 30 ms)")
    parser.add_argument("--one", nargs=3, metavar=("TOOL", "ORDER", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(*args.one[:2], args.slots, args.passes, args.one[2])))
        return
    env = dict(os.environ)
    try:
        import sklearn  # noqa: F401
    except ImportError:
        from suite import pip_peer

        path = pip_peer("scikit-learn", "sklearn")
        if path is None:
            sys.exit("scikit-learn does not install here")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH")) if p)
    total = len(digits.CONFIGS) * digits.EPOCHS
    print(
        f"digits: {len(digits.CONFIGS)} configurations x {digits.EPOCHS} steps of {args.passes} epochs ({total} "
        f"steps), {args.slots} slots"
    )
    head = f"{'tool':<17} {'order':<11} {'steps':>6} {'share':>6} {'twice':>6} {'wall s':>7} {'best':>8}"
    print(f"{head} {'/ grid':>7} {'hv/grid':>7}")
    grid_best, grid_points = None, None
    for tool in args.tools.split(","):
        for order_name in ("ascending", "descending", "shuffled-1"):
            with tempfile.TemporaryDirectory(prefix="gts-digits-") as folder:
                done = subprocess.run(
                    [sys.executable, __file__, "--slots", str(args.slots), "--passes", str(args.passes)]
                    + ["--one", tool, order_name, folder],
                    capture_output=True,
                    text=True,
                    cwd=folder,
                    env=env,
                )
            if done.returncode != 0:
                print(f"{tool} {order_name}: failed\n{done.stderr[-3000:]}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            points = [(loss, digits.size(int(key.split("/")[1]))) for key, loss in r["finals"].items()]
            if tool == "grid":
                grid_best = r["best"] if grid_best is None else min(grid_best, r["best"])
                grid_points = points if grid_points is None else grid_points
            ratio = f"{r['best'] / grid_best:.3f}" if grid_best else "-"
            volume = "-"
            if grid_points:
                reference = (math.log(10), 1.1 * max(p[1] for p in grid_points))  # no worse than a guess
                volume = f"{hypervolume(points, reference) / hypervolume(grid_points, reference):.3f}"
            print(
                f"{tool:<17} {order_name:<11} {r['epochs']:>6} {r['epochs'] / total:>6.0%} {r['twice']:>6} "
                f"{r['wall']:>7.1f} {r['best']:>8.4f} {ratio:>7} {volume:>7}",
                flush=True,
            )


if __name__ == "__main__":
    main()
