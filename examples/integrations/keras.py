"""A Keras 3 script under promotion ASHA: one import, one callback (it also resumes the model).

    gts run examples/integrations/keras.yaml          # 8 configurations, as a GPUTask
    python examples/integrations/keras.py --lr 0.03 --width 8 --out /tmp/x   # one, by hand

The lines that make it a run of a sweep are marked ``# gts``. Outside a sweep they do nothing.
"""

import argparse
import json
import os
import sys

if __name__ == "__main__":  # run as a script, this folder comes first on sys.path, where this file
    # would stand in for the `keras` package it is named after
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
os.environ.setdefault("KERAS_BACKEND", "torch")  # a machine with PyTorch and no TensorFlow

import keras
import numpy as np

from gpu_task_scheduler import GPUTask
from gpu_task_scheduler.integrations.keras import GTSCallback  # gts


def data(seed=0):
    rng = np.random.default_rng(seed)
    inputs = rng.uniform(-2, 2, size=(320, 4)).astype("float32")
    targets = np.tanh(inputs @ rng.normal(size=(4, 1))).astype("float32")
    return (inputs[:256], targets[:256]), (inputs[256:], targets[256:])


def train(lr, width, epochs, callbacks=None):
    """``lr``: a number or a ``keras.optimizers.schedules.LearningRateSchedule``."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(width, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=lr, momentum=0.9), loss="mse")
    (x, y), valid = data()
    history = model.fit(
        x,
        y,
        batch_size=32,
        epochs=epochs,
        shuffle=False,
        validation_data=valid,
        verbose=0,
        callbacks=callbacks if callbacks is not None else [GTSCallback()],  # gts
    )
    return {"val_loss": float(history.history["val_loss"][-1]), "epochs": len(history.history["val_loss"])}


class KerasTask(GPUTask):
    def main(self):
        return train(self.config["lr"], self.config["width"], self.config["epochs"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(os.path.join(args.out, "result.json"), "w") as handle:
        json.dump(train(args.lr, args.width, args.epochs), handle)
