"""What pausing buys over stopping, before any process runs: the methods' own decisions on the
early-stopping benchmark's curves (``curves.py``: 36 configurations x 27 steps, curves that
cross), on simulated slots, in three orders of the grid.

    python bench/pausing_sim.py [--slots 4] [--min-step 1] [--seeds 3] [--objectives]

The slots advance one step a tick (a run's step costs the same on every slot); a run that pauses
gives up its slot, and one that is resumed goes on from its checkpoint (the simulation never runs
a step twice, as the checkpoint protocol promises). Compared, on the same curves and orders:

* ``stop-asha``: gts's ``early_stop: asha`` as it is today (``tuning/stopping.py``): a run is
  judged at a rung against the runs that reached it before, and stopped or kept;
* ``promotion-asha``: ``tuning/trials.py``'s PromotionAsha (the paper's ASHA);
* ``async-hyperband``: ``tuning/trials.py``'s AsyncHyperband (brackets of it);
* ``hyperband``: ``tuning/trials.py``'s Hyperband (brackets of synchronous successive halving).

The orders: ``ascending`` (learning rates from the smallest, the way grids are written),
``descending`` (as curves.py lists them), and ``shuffled`` (by seeds 1..N). Printed per method and
order: the steps run, as a share of the grid's 972, and the best final loss among the runs that
reached step 27 over the true best (1.000: the best configuration was kept). This measures the
methods' decisions only; bench/early_stop_bench.py measures tools running processes.

``--objectives``: the same curves judged by two objectives, the loss and a latency that grows with
the width (``width / 32`` ms: a wider model is slower, and better up to width 512), by each method's
several-objectives variant (stopping: MO-ASHA; the pausing methods: ranked by Pareto front, then
crowding distance). Printed instead of the best loss: the hypervolume of the final points of the
runs that reached step 27 over that of every configuration's (1.000: the whole front was kept), and
how many of the true front's configurations reached step 27. No peer judges several objectives by
pausing or stopping runs (Ray Tune's schedulers and Optuna's pruners take one metric): the grid,
run whole, is the baseline.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import curves  # noqa: E402
from multi_objective_bench import hypervolume  # noqa: E402

from gpu_task_scheduler.results import front  # noqa: E402
from gpu_task_scheduler.tuning.stopping import Asha  # noqa: E402
from gpu_task_scheduler.tuning.trials import CONTINUE, AsyncHyperband, Hyperband, PromotionAsha  # noqa: E402


def orders(seeds):
    ascending = sorted(curves.CONFIGS, key=lambda c: (c[0], c[1]))
    yield "ascending", [ascending]
    yield "descending", [list(reversed(ascending))]
    yield "shuffled", [curves.order(seed) for seed in range(1, seeds + 1)]


TWO = (("loss", "min"), ("latency", "min"))


def name(config):
    return f"lr-{config[0]},width-{config[1]}"


def point(config, step, several):
    """The run's value at ``step``: its loss, or (``several``) its loss and latency."""
    value = curves.loss(*config, step)
    return (value, config[1] / 32) if several else value


def simulate_stop(order, slots, min_step, several=False):
    """Today's rule: judged at each rung against the values recorded there before; stopped or kept."""
    rule = Asha("loss", "min", min_step, curves.STEPS, objectives=TWO if several else (), reduction_factor=3.0)
    table, reached = {}, {}
    queue, running, steps, finished = list(order), {}, 0, set()
    while queue or running:
        while len(running) < slots and queue:
            config = queue.pop(0)
            running[name(config)] = [config, 0]
            reached[name(config)] = {}
        for run in list(running):
            config, step = running[run]
            step += 1
            steps += 1
            running[run][1] = step
            value = point(config, step, several)
            rung = rule.rung_for(step, reached[run])
            if rung is not None:
                others = list(table.get(rung, {}).values())
                if several:
                    verdict = rule.judge_several(rung, step, value, others)
                else:
                    verdict = rule.judge(rung, step, value, others)
                table.setdefault(rung, {})[run] = value
                reached[run][rung] = value
                if verdict.stop:
                    del running[run]
                    continue
            if step >= curves.STEPS:
                finished.add(tuple(config))
                del running[run]
    return steps, finished


def simulate_pausing(method, order, slots, several=False):
    """A pausing method: a run at a rung continues or gives up its slot; free slots ask next()."""
    configs = {name(config): config for config in order}
    fresh = list(order)
    at: dict[str, int] = {}  # run -> the steps it has run (its checkpoint)
    running: set[str] = set()
    steps, finished = 0, set()
    while True:
        while len(running) < slots:
            decided = method.next(more_new=bool(fresh))
            if decided.kind == "resume":
                method.resumed(decided.run)
                running.add(decided.run)
            elif decided.kind == "new":
                config = fresh.pop(0)
                method.began(name(config), decided.bracket)
                at[name(config)] = 0
                running.add(name(config))
            else:
                break
        if not running:
            return steps, finished
        for run in sorted(running, key=lambda r: order.index(configs[r])):
            at[run] += 1
            steps += 1
            value = point(configs[run], at[run], several)
            rung = method.rung_reached(run, at[run])
            if rung is not None and method.report(run, rung, value) != CONTINUE:
                running.discard(run)
                continue
            if at[run] >= curves.STEPS:
                finished.add(tuple(configs[run]))
                method.ended(run)
                running.discard(run)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--min-step", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, default=3, help="shuffled orders")
    parser.add_argument("--objectives", action="store_true", help="judge by loss and latency (Pareto rank)")
    args = parser.parse_args()
    several = args.objectives
    total = len(curves.CONFIGS) * curves.STEPS
    print(
        f"{len(curves.CONFIGS)} configurations x {curves.STEPS} steps ({total}), {args.slots} slots, rungs from "
        f"step {args.min_step:g} (reduction factor 3); true best final loss {curves.TRUE_BEST:.4f}"
    )
    finals = {config: point(config, curves.STEPS, True) for config in curves.CONFIGS}
    reference = (max(p[0] for p in finals.values()) * 1.1, max(p[1] for p in finals.values()) * 1.1)
    points = list(finals.values())
    true_front = {curves.CONFIGS[i] for i in front(points)}
    whole = hypervolume(points, reference)
    if several:
        print(
            f"two objectives: loss and latency (width / 32); the true front holds {len(true_front)} configurations, "
            f"hypervolume {whole:.4f} (reference point {reference[0]:.3f}, {reference[1]:.1f}); each method "
            "judging by the loss alone, then by both"
        )
        print(f"{'method':<16} {'judged by':<9} {'order':<11} {'steps':>7} {'share':>6} {'hv/true':>8} {'front':>6}")
    else:
        print(f"{'method':<16} {'order':<11} {'steps':>7} {'share':>6} {'best/true':>9}")
    kinds = {"promotion-asha": PromotionAsha, "async-hyperband": AsyncHyperband, "hyperband": Hyperband}
    for method in ("stop-asha", *kinds):
        for judged in (False, True) if several else (False,):
            for label, grids in orders(args.seeds):
                shares, ratios, kept = [], [], []
                for grid in grids:
                    if method == "stop-asha":
                        steps, finished = simulate_stop(grid, args.slots, args.min_step, judged)
                    else:
                        made = kinds[method](
                            min_step=args.min_step,
                            max_step=curves.STEPS,
                            reduction_factor=3,
                            objectives=TWO if judged else (),
                        )
                        steps, finished = simulate_pausing(made, grid, args.slots, judged)
                    shares.append(steps / total)
                    if several:
                        ratios.append(hypervolume([finals[c] for c in finished], reference) / whole)
                        kept.append(len(true_front & finished))
                    else:
                        best = min(curves.loss(lr, width, curves.STEPS) for lr, width in finished)
                        ratios.append(best / curves.TRUE_BEST)
                shown = f"{statistics.mean(shares) * total:7.0f} {statistics.mean(shares):6.0%}"
                if several:  # the worst order's hypervolume and front kept
                    by = "both" if judged else "loss"
                    print(
                        f"{method:<16} {by:<9} {label:<11} {shown} {min(ratios):8.3f} {min(kept):>4}/{len(true_front)}"
                    )
                else:
                    print(f"{method:<16} {label:<11} {shown} {max(ratios):9.3f}")


if __name__ == "__main__":
    main()
