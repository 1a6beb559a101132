"""Population-based training with fewer slots than members, before any process runs:
``tuning/pbt.py``'s own decisions driven by a loop that gives slots out as the engine does
(``Pbt.next``: an exploit first, then a member that has not begun, then the one waiting at the
earliest step), on ``bench/pbt_bench.py``'s problem (the best learning rate rises tenfold over the
first 10 steps, then falls a hundredfold by step 40).

    python bench/pbt_slots_sim.py [--seeds 20] [--slots 2,8] [--pace random|equal|staggered] [--restart 0]

``--problem example``: ``examples/pbt_schedule.py``'s problem instead (``configs/pbt.yaml``).
``--pace``: how the running members move: ``random`` (one drawn at random takes each next step:
members at random speeds), ``equal`` (each takes a step in turn, in an order drawn each round) or
``staggered`` (as equal, with a third of the members starting up to 24 steps late); with the last
two, ``--restart K`` makes every resumed member (a copy, or its turn) sit out K steps, as a process
that starts again does.

Printed per number of slots: the median over seeds (each a seed of PBT's choices and an order of
the running members' steps) of the best member's score over the best fixed learning rate's, the
exploits made, how many judgements found no donor (the copy rule refused every top member's
snapshot), and the copy audit's faults (``records/lineage.copy_faults``, which must be 0).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

from pbt_bench import INTERVAL, LRS, PBT, STEPS, gain  # noqa: E402 (the bench's problem and PBT config)

from gpu_task_scheduler.records.ledger.trials import TrialEvent  # noqa: E402
from gpu_task_scheduler.records.lineage import copy_faults  # noqa: E402
from gpu_task_scheduler.tuning.pbt import EXPLOIT, SNAPSHOTS, Pbt, parse_pbt  # noqa: E402


def example_gain(lr: float, step: int) -> float:
    """examples/pbt_schedule.py's (configs/pbt.yaml's sweep): the best rate falls 10**1.5-fold."""
    distance = math.log10(lr / 10 ** (-1.5 * step / STEPS))
    return math.exp(-distance * distance / (2 * 0.25 * 0.25))


EXAMPLE_LRS = [1.0, 0.61, 0.37, 0.23, 0.14, 0.085, 0.052, 0.032]
PROBLEMS = {
    "bench": (LRS, gain),
    "example": (EXAMPLE_LRS, example_gain),
}


def simulate(slots: int, seed: int, problem: str = "bench", pace: str = "random", restart: int = 0) -> dict[str, float]:
    lrs, gain = PROBLEMS[problem]
    best_fixed = max(sum(gain(lr, step) for step in range(1, STEPS + 1)) for lr in lrs)
    members = {f"m{i}": {"lr": lr, "step": 0, "score": 0.0} for i, lr in enumerate(lrs)}
    pbt = Pbt(parse_pbt({**PBT, "seed": seed}), population=len(members), slots=slots)
    snapshots: dict[tuple[str, float], float] = {}
    events: list[TrialEvent] = []
    waiting = list(members)  # not begun, in the grid's order
    running: set[str] = set()
    order = random.Random(seed)
    exploits = refused = 0

    late: dict[str, int] = {}  # rounds a member sits out before its next step (paces "equal", "staggered")

    def start_next() -> bool:
        nonlocal waiting
        chosen = pbt.next(more_new=bool(waiting))
        if chosen.kind == "new" and waiting:
            name, waiting = waiting[0], waiting[1:]
            pbt.began(name, 0, {"lr": members[name]["lr"]})
            events.append(TrialEvent("began", None, name, None, None, None, None, None, {"values": {}}))
            if not waiting:
                pbt.close()
        elif chosen.kind == "resume" and chosen.run is not None:
            name = chosen.run
            exploit = pbt.exploit_of(name)
            if exploit is not None:
                members[name].update(exploit.values, step=exploit.step, score=snapshots[exploit.donor, exploit.step])
            pbt.resumed(name)
            late[name] = late.get(name, 0) + restart  # a new attempt: its process starts again
            events.append(TrialEvent("resumed", None, name, None, None, None, None, None))
        else:
            return False
        running.add(name)
        return True

    while len(running) < slots and start_next():
        pass
    queue: list[str] = []  # paces "equal" and "staggered": this round's order, each running member once
    # "staggered": a third of the members start late, by up to 24 steps of the others (a loaded
    # machine whose processes do not all get going at once)
    late.update({n: order.randint(1, 24) if pace == "staggered" and order.random() < 1 / 3 else 0 for n in members})
    while running:
        if pace == "random":
            name = order.choice(sorted(running))
        else:
            queue = [n for n in queue if n in running] or order.sample(sorted(running), len(running))
            name = queue.pop(0)
            if late[name]:
                late[name] -= 1
                continue
        member = members[name]
        member["step"] += 1
        member["score"] += gain(member["lr"], member["step"])
        if member["step"] >= STEPS:
            running.discard(name)
            pbt.ended(name)
        else:
            rung = pbt.rung_reached(name, member["step"])
            if rung is not None:
                decision = pbt.report(name, rung, member["score"], member["step"])
                detail = None
                if decision == EXPLOIT:
                    exploit = pbt.exploit_of(name)
                    assert exploit is not None
                    detail = {"donor": exploit.donor, "step": exploit.step}
                    exploits += 1
                elif pbt.members[name].last_value is not None and _bottom(pbt, name):
                    refused += 1
                if decision in SNAPSHOTS:
                    snapshots[name, member["step"]] = member["score"]
                events.append(
                    TrialEvent("rung", None, name, None, rung, member["step"], member["score"], decision, detail)
                )
                if decision in (EXPLOIT, "yield", "snapshot+yield"):
                    running.discard(name)
        while len(running) < slots and start_next():
            pass
    faults = copy_faults(
        events,
        interval=INTERVAL,
        value_of=lambda e: e.value,
        worse=lambda a, b: a < b,
    )
    best = max(m["score"] for m in members.values())
    return {"ratio": best / best_fixed, "exploits": exploits, "refused": refused, "faults": len(faults)}


def _bottom(pbt: Pbt, name: str) -> bool:
    """Whether ``name`` was in the bottom quantile where it was just ranked (and copied no one)."""
    level = pbt._level(pbt.members[name].judged_at)
    if level is None or name not in pbt._at.get(level, {}):
        return False
    bottom, _ = pbt._quantiles(pbt._at[level])
    return name in bottom


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--slots", default="2,8")
    parser.add_argument("--problem", choices=sorted(PROBLEMS), default="bench")
    parser.add_argument("--pace", choices=("random", "equal", "staggered"), default="random")
    parser.add_argument(
        "--restart", type=int, default=0, help="paces equal and staggered: the steps a resumed member's restart costs"
    )
    args = parser.parse_args()
    print(f"8 members x {STEPS} steps, interval {INTERVAL}, quantile 0.25, lr x0.5/x2; median of {args.seeds} seeds")
    print(f"{'slots':>5} {'best/fixed':>10} {'min':>6} {'<1.15x':>7} {'exploits':>8} {'no donor':>8} {'faults':>6}")
    for slots in (int(s) for s in args.slots.split(",")):
        found = [simulate(slots, seed, args.problem, args.pace, args.restart) for seed in range(args.seeds)]
        ratios = [f["ratio"] for f in found]
        print(
            f"{slots:>5} {statistics.median(ratios):10.3f} {min(ratios):6.3f} "
            f"{sum(r < 1.15 for r in ratios) / len(ratios):7.0%} "
            f"{statistics.median(f['exploits'] for f in found):8.1f} "
            f"{statistics.median(f['refused'] for f in found):8.1f} {max(f['faults'] for f in found):6d}"
        )


if __name__ == "__main__":
    main()
