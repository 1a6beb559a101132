"""An XGBoost script under promotion ASHA: one import, one callback, one resume argument.

    gts run examples/integrations/xgboost.yaml          # 8 configurations, as a GPUTask
    python examples/integrations/xgboost.py --eta 0.1 --max-depth 3 --out /tmp/x   # one, by hand

The lines that make it a run of a sweep are marked ``# gts``. Outside a sweep they do nothing.
"""

import argparse
import json
import os
import sys

if __name__ == "__main__":  # run as a script, this folder comes first on sys.path, where this file
    # would stand in for the `xgboost` package it is named after
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import numpy as np
import xgboost as xgb

from gpu_task_scheduler import GPUTask
from gpu_task_scheduler.integrations.xgboost import GTSCallback, resume  # gts


def data(seed=0):
    rng = np.random.default_rng(seed)
    inputs = rng.uniform(-2, 2, size=(2000, 6))
    targets = np.sin(inputs[:, 0]) * inputs[:, 1] + inputs[:, 2] ** 2 + 0.1 * rng.normal(size=2000)
    return xgb.DMatrix(inputs[:1600], targets[:1600]), xgb.DMatrix(inputs[1600:], targets[1600:])


def train(eta, max_depth, rounds):
    train_set, valid_set = data()
    params = {"eta": eta, "max_depth": max_depth, "objective": "reg:squarederror", "nthread": 1, "seed": 0}
    booster = xgb.train(
        params,
        train_set,
        evals=[(valid_set, "valid")],
        verbose_eval=False,
        callbacks=[GTSCallback()],  # gts
        **resume(num_boost_round=rounds),  # gts: instead of num_boost_round=rounds
    )
    rmse = float(booster.eval(valid_set, "valid").split(":")[1])
    return {"valid-rmse": rmse, "rounds": booster.num_boosted_rounds()}


class XGBoostTask(GPUTask):
    def main(self):
        return train(self.config["eta"], self.config["max_depth"], self.config["rounds"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--eta", type=float, required=True)
    parser.add_argument("--max-depth", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(os.path.join(args.out, "result.json"), "w") as handle:
        json.dump(train(args.eta, args.max_depth, args.rounds), handle)
