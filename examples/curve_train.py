"""A stand-in training script that reports its loss each epoch (no dependencies but gts).

    python examples/curve_train.py --lr 0.03 --width 512 --out runs/x

A high learning rate learns fast to a higher loss, so the curves of a sweep
cross. It keeps the checkpoint protocol: each epoch it saves its state in
`$GTS_CHECKPOINT_DIR` (by a rename: a kill leaves the old state or the new),
then reports that epoch; given `$GTS_RESUME_STEP` (a run paused by
`early_stop: {method: hyperband}` and promoted, or interrupted), it loads that
state and goes on with the next epoch. The scheduler stops a `command:` run
with SIGTERM (when `early_stop` stops or pauses it, or when the sweep is
stopped): the script then saves `checkpoint.json` in its folder and ends. (In a
`GPUTask`, `report()` raises `Pruned` or `Paused` instead, caught the same
way.) Run by hand, `report()` does nothing and the script trains to the end.
"""

import argparse
import json
import math
import os
import signal
import time

from gpu_task_scheduler import Pruned, report


def loss_at(lr: float, width: int, epoch: int) -> float:
    speed = math.log(0.3 / lr) / math.log(10**0.5)  # 0 for lr 0.3, 1 for 0.1, 2 for 0.03, ...
    rate = 1.2 * 0.7**speed * (1 + 0.05 * math.log2(width / 128))
    floor = 0.12 + 0.08 * abs(speed - 2.5) ** 1.5 + 0.02 * abs(math.log2(width / 512))
    return floor + (1.0 - floor) * math.exp(-rate * epoch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=27)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    def stopped_by_the_scheduler(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stopped_by_the_scheduler)
    state = os.path.join(os.environ.get("GTS_CHECKPOINT_DIR") or args.out, "state.json")
    done, loss = 0, 1.0
    resume = os.environ.get("GTS_RESUME_STEP")
    if resume:  # the state saved last: of the epoch it reported last, or of the one after it
        with open(state) as handle:
            saved = json.load(handle)
        done, loss = saved["epoch"], saved["loss"]
        print(f"resumes after epoch {done}", flush=True)
    epoch = done
    try:
        if resume and done > float(resume):  # killed between that save and its report: reported now
            report(done, loss=loss)
        for epoch in range(done + 1, args.epochs + 1):
            time.sleep(0.02)  # an epoch of training
            loss = loss_at(args.lr, args.width, epoch)
            with open(state + ".new", "w") as handle:
                json.dump({"epoch": epoch, "loss": loss}, handle)
            os.replace(state + ".new", state)  # saved first,
            report(epoch, loss=loss)  # then reported
    except (Pruned, SystemExit):
        with open(os.path.join(args.out, "checkpoint.json"), "w") as handle:
            json.dump({"epoch": epoch, "loss": loss}, handle)
        print(f"stopped at epoch {epoch}; saved checkpoint.json", flush=True)
        raise
    with open(os.path.join(args.out, "result.json"), "w") as handle:
        json.dump({"loss": round(loss, 6)}, handle)


if __name__ == "__main__":
    main()
