"""A Keras 3 script under population-based training, with a cosine LR schedule over the whole fit
(a ``LearningRateSchedule``, the script's own object: built from its config's rate, never restored),
as a user's would be:

    python pbt_keras.py --lr LR --epochs N --out WORK_DIR

The project's Keras example's model and data and ``GTSCallback``. At each optimizer step it journals
the rate the optimizer trains at (tests/pbt_rates.py)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
from pbt_rates import arguments, journal  # noqa: E402

from examples.integrations.keras import data  # noqa: E402
from gpu_task_scheduler.integrations.keras import GTSCallback  # noqa: E402

STEPS_PER_EPOCH = 8  # 256 samples in batches of 32 (the example's data)


class Rates(keras.callbacks.Callback):
    def __init__(self, out, lr):
        super().__init__()
        self.out, self.lr = out, lr

    def on_train_batch_begin(self, batch, logs=None):
        optimizer = self.model.optimizer
        step = int(keras.ops.convert_to_numpy(optimizer.iterations))
        journal(self.out, step, float(keras.ops.convert_to_numpy(optimizer.learning_rate)), self.lr)


def main():
    args = arguments()
    import torch

    torch.set_num_threads(1)
    keras.utils.set_random_seed(0)
    schedule = keras.optimizers.schedules.CosineDecay(args.lr, decay_steps=args.epochs * STEPS_PER_EPOCH)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=schedule, momentum=0.9), loss="mse")
    (x, y), valid = data()
    model.fit(
        x,
        y,
        batch_size=32,
        epochs=args.epochs,
        shuffle=False,
        validation_data=valid,
        verbose=0,
        callbacks=[GTSCallback(), Rates(args.out, args.lr)],
    )


if __name__ == "__main__":
    main()
