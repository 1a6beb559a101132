"""A stand-in training script for shell-command sweeps (no dependencies).

    python examples/train.py --lr 0.01 --layers 4 --out runs/x

Prints its progress and writes <out>/result.json, which `gts results` reads.
"""

import argparse
import json
import math
import os


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    loss = 1.0
    for epoch in range(5):
        loss *= math.exp(-args.lr * args.layers)
        print(f"epoch {epoch}: loss {loss:.4f}", flush=True)
    with open(os.path.join(args.out, "result.json"), "w") as handle:
        json.dump({"loss": round(loss, 6), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}, handle)


if __name__ == "__main__":
    main()
