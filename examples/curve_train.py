"""A stand-in training script that reports its loss each epoch (no dependencies but gts).

    python examples/curve_train.py --lr 0.03 --width 512 --out runs/x

A high learning rate learns fast to a higher loss, so the curves of a sweep
cross. The scheduler stops a `command:` run with SIGTERM (when `early_stop`
stops it early, or when the sweep is stopped): the script then saves a
checkpoint and ends. (In a `GPUTask`, `report()` raises `Pruned` instead,
caught the same way.) Run by hand, `report()` does nothing and the script
trains to the end.
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
    epoch, loss = 0, 1.0
    try:
        for epoch in range(1, args.epochs + 1):
            time.sleep(0.02)  # an epoch of training
            loss = loss_at(args.lr, args.width, epoch)
            report(epoch, loss=loss)
    except (Pruned, SystemExit):
        with open(os.path.join(args.out, "checkpoint.json"), "w") as handle:
            json.dump({"epoch": epoch, "loss": loss}, handle)
        print(f"stopped at epoch {epoch}; saved checkpoint.json", flush=True)
        raise
    with open(os.path.join(args.out, "result.json"), "w") as handle:
        json.dump({"loss": round(loss, 6)}, handle)


if __name__ == "__main__":
    main()
