"""Population-based training judged by two objectives against one, before any process runs:
``tuning/pbt.py``'s own decisions driven by a loop, on a stand-in problem with a trade-off.

    python bench/pbt_objectives_sim.py [--seeds 20]

A member has a learning rate and a width. Each step adds to its score ``examples/pbt_schedule.py``'s
gain (largest at a learning rate that falls tenfold every 27 steps) times ``log2(width / 4) / 8``
(a wider model learns more a step: nothing at width 4, half at 64, all from 1024 on); its cost is
its width over 64 (the latency of the model it ends with). The population is 8 members, learning
rates 1.0 to 0.032 across widths 64, 128, 256 and 512, trained 40 steps on 8 slots; members that
copy another halve or double its learning rate and its width. Compared at the same steps:

* ``grid``: the 8 members trained as they are;
* ``pbt (score)``: PBT judging by the score alone (``pbt: {metric: score, mode: max}``);
* ``pbt (score, cost)``: PBT judging by both (``objectives: {score: max, cost: min}``).

Printed: the median over seeds (each a seed of PBT's choices and an order of the members' reports)
of the hypervolume of the final population's (score, cost) points (larger is better) with the
reference point at a cost of 1.1x the grid's costliest member, and at 20 (a width of 1280); the
median best score; and the median number of distinct costs at the end (how much of the trade-off
the population still covers). No peer ranks a population by several objectives
(Ray Tune's PopulationBasedTraining takes one metric).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "examples")]

from multi_objective_bench import hypervolume  # noqa: E402
from pbt_schedule import gain  # noqa: E402

from gpu_task_scheduler.tuning.pbt import EXPLOIT, SNAPSHOTS, Pbt, parse_pbt  # noqa: E402

STEPS = 40
LRS = [1.0, 0.61, 0.37, 0.23, 0.14, 0.085, 0.052, 0.032]
WIDTHS = [64, 128, 256, 512]
# (-score, cost): no score, and a cost of 1.1x the grid's costliest member (width 512), or of a
# width of 1280 (which members that double their width may pass): the figure depends on it.
REFERENCES = ((0.0, 8.8), (0.0, 20.0))


def step_gain(lr: float, width: int, step: int) -> float:
    """The schedule's gain times what the width lets a step learn: 0 at width 4 and below, 1/2 at
    64, 1 from 1024 on."""
    return gain(lr, step) * min(1.0, max(0.0, math.log2(width / 4) / 8))


def simulate(objectives: bool | None, seed: int) -> list[tuple[float, float]]:
    """The final (score, cost) of each member: ``objectives`` None trains the grid as it is."""
    members = {
        f"m{i}": {"lr": lr, "width": WIDTHS[i % len(WIDTHS)], "step": 0, "score": 0.0} for i, lr in enumerate(LRS)
    }
    pbt = None
    if objectives is not None:
        keys = {"interval": 4, "max_step": STEPS, "quantile": 0.25, "seed": seed}
        keys |= {"perturb": {"lr": [0.5, 2.0], "width": [0.5, 2]}}
        judged = {"objectives": {"score": "max", "cost": "min"}} if objectives else {"metric": "score", "mode": "max"}
        pbt = Pbt(parse_pbt(keys | judged), population=len(members), slots=len(members))
        for name, member in members.items():
            pbt.began(name, 0, {"lr": member["lr"], "width": member["width"]})
    snapshots: dict[str, dict[float, float]] = {name: {} for name in members}
    order = random.Random(seed)
    running = set(members)
    while running:
        for name in order.sample(sorted(running), len(running)):  # the members' reports in a drawn order
            member = members[name]
            member["step"] += 1
            member["score"] += step_gain(member["lr"], member["width"], member["step"])
            if member["step"] >= STEPS:
                running.discard(name)
                if pbt is not None:
                    pbt.ended(name)
                continue
            rung = None if pbt is None else pbt.rung_reached(name, member["step"])
            if pbt is None or rung is None:
                continue
            value = (member["score"], member["width"] / 64) if objectives else member["score"]
            decision = pbt.report(name, rung, value, member["step"])
            if decision in SNAPSHOTS:
                snapshots[name][member["step"]] = member["score"]
            elif decision == EXPLOIT:
                exploit = pbt.exploit_of(name)
                assert exploit is not None
                pbt.resumed(name)  # it resumes at once from a copy of the donor's snapshot
                member.update(exploit.values, step=exploit.step, score=snapshots[exploit.donor][exploit.step])
    return [(m["score"], m["width"] / 64) for m in members.values()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    print(
        f"8 members x {STEPS} steps, interval 4, quantile 0.25; median of {args.seeds} seeds "
        "(hypervolume of (score, cost) up to a cost of 8.8 and of 20; larger is better)"
    )
    print(f"{'method':<18} {'hv to 8.8':>9} {'hv to 20':>9} {'best score':>10} {'costs left':>10}")
    for label, objectives in (("grid", None), ("pbt (score)", False), ("pbt (score, cost)", True)):
        volumes: list[list[float]] = [[] for _ in REFERENCES]
        bests, spreads = [], []
        for seed in range(args.seeds):
            final = simulate(objectives, seed)
            for reference, found in zip(REFERENCES, volumes, strict=True):
                found.append(hypervolume([(-score, cost) for score, cost in final], reference))
            bests.append(max(score for score, _ in final))
            spreads.append(len({cost for _, cost in final}))
        shown = " ".join(f"{statistics.median(found):9.1f}" for found in volumes)
        print(f"{label:<18} {shown} {statistics.median(bests):10.2f} {statistics.median(spreads):10.1f}")


if __name__ == "__main__":
    main()
