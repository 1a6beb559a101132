"""A LightGBM script under promotion ASHA: one import, one callback, one resume argument.

    gts run examples/integrations/lightgbm.yaml          # 8 configurations, as a GPUTask
    python examples/integrations/lightgbm.py --learning-rate 0.1 --num-leaves 7 --out /tmp/x   # one, by hand

The lines that make it a run of a sweep are marked ``# gts``. Outside a sweep they do nothing.
"""

import argparse
import json
import os
import sys

if __name__ == "__main__":  # run as a script, this folder comes first on sys.path, where this file
    # would stand in for the `lightgbm` package it is named after
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import lightgbm as lgb
import numpy as np

from gpu_task_scheduler import GPUTask
from gpu_task_scheduler.integrations.lightgbm import GTSCallback, resume  # gts


def data(seed=0):
    rng = np.random.default_rng(seed)
    inputs = rng.uniform(-2, 2, size=(2000, 6))
    targets = np.sin(inputs[:, 0]) * inputs[:, 1] + inputs[:, 2] ** 2 + 0.1 * rng.normal(size=2000)
    train_set = lgb.Dataset(inputs[:1600], targets[:1600], free_raw_data=False)
    return train_set, lgb.Dataset(inputs[1600:], targets[1600:], reference=train_set, free_raw_data=False)


def train(learning_rate, num_leaves, rounds):
    train_set, valid_set = data()
    params = {"objective": "regression", "metric": "l2", "learning_rate": learning_rate, "num_leaves": num_leaves}
    params |= {"num_threads": 1, "seed": 0, "deterministic": True, "verbosity": -1}
    booster = lgb.train(
        params,
        train_set,
        valid_sets=[valid_set],
        valid_names=["valid"],
        callbacks=[GTSCallback()],  # gts
        **resume(num_boost_round=rounds),  # gts: instead of num_boost_round=rounds
    )
    predictions = booster.predict(valid_set.get_data(), num_iteration=booster.current_iteration())
    l2 = float(np.mean((predictions - valid_set.get_label()) ** 2))
    return {"valid-l2": l2, "rounds": booster.current_iteration()}


class LightGBMTask(GPUTask):
    def main(self):
        return train(self.config["learning_rate"], self.config["num_leaves"], self.config["rounds"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--learning-rate", type=float, required=True)
    parser.add_argument("--num-leaves", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(os.path.join(args.out, "result.json"), "w") as handle:
        json.dump(train(args.learning_rate, args.num_leaves, args.rounds), handle)
