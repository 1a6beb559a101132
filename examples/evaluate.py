"""A stand-in evaluation script for the stages example (no dependencies).

    python examples/evaluate.py --model runs/train.lr-0.1,layers-2, --split test --out runs/x

Reads the train run's <model>/result.json and writes <out>/result.json, which `gts results` reads.
"""

import argparse
import json
import os


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="the folder of the train run to evaluate")
    parser.add_argument("--split", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(os.path.join(args.model, "result.json")) as handle:
        trained = json.load(handle)
    accuracy = round(1.0 - trained["loss"] * (1.1 if args.split == "test" else 1.0), 6)
    print(f"{args.split} accuracy of {args.model}: {accuracy}", flush=True)
    with open(os.path.join(args.out, "result.json"), "w") as handle:
        json.dump({"accuracy": accuracy}, handle)


if __name__ == "__main__":
    main()
