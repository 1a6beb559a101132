"""A stand-in training run whose best learning rate decays as it trains, for population-based
training (no dependencies but gts).

    python examples/pbt_schedule.py --lr 0.1 --steps 40 --out runs/x

Each step adds to the score a gain of at most 1, the largest when the learning rate is the best
one for that step, which falls from 1 at step 0 to 0.032 at step 40 (tenfold every 27 steps): no
one learning rate is good for the whole run, and a run that lowers its learning rate as it goes
(population-based training's members do, by copying better ones and halving or doubling theirs)
scores about twice what the best fixed one does.

It keeps the checkpoint protocol: each step it saves its state in ``$GTS_CHECKPOINT_DIR`` by a
rename (a kill leaves the old state or the new one), then reports that step (its score, and its
learning rate: ``gts plot --curves lr`` draws each member's schedule); given
``$GTS_RESUME_STEP`` it loads that state, which must be of that step (a population-based training
member resumes from a copy of another member's checkpoint: a half-copied or mismatched one is an
error here, never a silent restart) or of the one after it (it was stopped between its save and
its report: that report is made now), and goes on. Run by hand, ``report()`` does nothing.
"""

import argparse
import json
import math
import os
import signal
import sys
import time

from gpu_task_scheduler import report

DECADES, WIDTH = 1.5, 0.25  # the best learning rate falls 10**1.5-fold over 40 steps; the gain's width


def best_lr(step: float, steps: float = 40) -> float:
    return 10 ** (-DECADES * step / steps)


def gain(lr: float, step: int) -> float:
    """What step ``step`` adds to the score at learning rate ``lr``: 1 at the best, less away from it."""
    distance = math.log10(lr / best_lr(step))
    return math.exp(-distance * distance / (2 * WIDTH * WIDTH))


def fixed_score(lr: float, steps: int = 40) -> float:
    """The score of ``steps`` steps at one learning rate."""
    return sum(gain(lr, step) for step in range(1, steps + 1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seconds", type=float, default=0.0, help="how long a step takes")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    folder = os.environ.get("GTS_CHECKPOINT_DIR") or args.out
    os.makedirs(folder, exist_ok=True)
    state = os.path.join(folder, "state.json")
    done, score = 0, 0.0
    resume = os.environ.get("GTS_RESUME_STEP")
    if resume:
        with open(state) as handle:
            saved = json.load(handle)
        if saved["step"] == float(resume) + 1:  # saved, then stopped before its report: reported now
            report(saved["step"], score=saved["score"], lr=args.lr)
        elif saved["step"] != float(resume):
            sys.exit(f"the checkpoint is of step {saved['step']}, not of step {resume} it resumes from")
        done, score = int(saved["step"]), saved["score"]
        print(f"resumes after step {done} with lr {args.lr:g}", flush=True)
    for step in range(done + 1, args.steps + 1):
        time.sleep(args.seconds)
        score += gain(args.lr, step)
        with open(state + ".new", "w") as handle:
            json.dump({"step": step, "score": score, "lr": args.lr}, handle)
        os.replace(state + ".new", state)  # saved first, then reported: the protocol
        report(step, score=score, lr=args.lr)  # the lr too: gts plot --curves lr draws the schedule
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "result.json"), "w") as handle:
        json.dump({"score": score, "lr": args.lr}, handle)


if __name__ == "__main__":
    main()
