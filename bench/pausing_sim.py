"""What pausing buys over stopping, before any process runs: the methods' own decisions on the
early-stopping benchmark's curves (``curves.py``: 36 configurations x 27 steps, curves that
cross), on simulated slots, in three orders of the grid.

    python bench/pausing_sim.py [--slots 4] [--min-step 1] [--seeds 3]

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
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import curves  # noqa: E402

from gpu_task_scheduler.tuning.stopping import Asha  # noqa: E402
from gpu_task_scheduler.tuning.trials import CONTINUE, AsyncHyperband, Hyperband, PromotionAsha  # noqa: E402


def orders(seeds):
    ascending = sorted(curves.CONFIGS, key=lambda c: (c[0], c[1]))
    yield "ascending", [ascending]
    yield "descending", [list(reversed(ascending))]
    yield "shuffled", [curves.order(seed) for seed in range(1, seeds + 1)]


def name(config):
    return f"lr-{config[0]},width-{config[1]}"


def simulate_stop(order, slots, min_step):
    """Today's rule: judged at each rung against the values recorded there before; stopped or kept."""
    rule = Asha("loss", "min", min_step, curves.STEPS, 3.0)
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
            value = curves.loss(*config, step)
            rung = rule.rung_for(step, reached[run])
            if rung is not None:
                others = list(table.get(rung, {}).values())
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


def simulate_pausing(method, order, slots):
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
            value = curves.loss(*configs[run], at[run])
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
    args = parser.parse_args()
    total = len(curves.CONFIGS) * curves.STEPS
    print(
        f"{len(curves.CONFIGS)} configurations x {curves.STEPS} steps ({total}), {args.slots} slots, rungs from "
        f"step {args.min_step:g} (reduction factor 3); true best final loss {curves.TRUE_BEST:.4f}"
    )
    print(f"{'method':<16} {'order':<11} {'steps':>7} {'share':>6} {'best/true':>9}")
    kinds = {"promotion-asha": PromotionAsha, "async-hyperband": AsyncHyperband, "hyperband": Hyperband}
    for method in ("stop-asha", *kinds):
        for label, grids in orders(args.seeds):
            shares, ratios = [], []
            for grid in grids:
                if method == "stop-asha":
                    steps, finished = simulate_stop(grid, args.slots, args.min_step)
                else:
                    steps, finished = simulate_pausing(
                        kinds[method](min_step=args.min_step, max_step=curves.STEPS, reduction_factor=3),
                        grid,
                        args.slots,
                    )
                shares.append(steps / total)
                best = min(curves.loss(lr, width, curves.STEPS) for lr, width in finished)
                ratios.append(best / curves.TRUE_BEST)
            print(
                f"{method:<16} {label:<11} {statistics.mean(shares) * total:7.0f} {statistics.mean(shares):6.0%} "
                f"{max(ratios):9.3f}"
            )


if __name__ == "__main__":
    main()
