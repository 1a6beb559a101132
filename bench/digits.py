"""The pausing benchmark's real workload: scikit-learn's digits (1,797 8x8 images, bundled with
scikit-learn: no download) classified by a small MLP trained one epoch a step with
``partial_fit``, which checkpoints as the protocol asks (the model pickled, then the step reported).

A configuration is a learning rate and a hidden width (``MLPClassifier(solver="sgd",
momentum=0.9)``); a step is ``passes`` epochs (an epoch takes some 30 ms: a step must cost more
than starting a process, as a GPU's does); the metric is the validation log-loss after each step. High learning rates
learn fastest and then stall or diverge, low ones learn slowly: the curves cross, as real ones do.
"""

import itertools
import os
import pickle

LRS = [0.3, 0.1, 0.03, 0.01, 0.003, 0.001]
WIDTHS = [16, 32, 64, 128]
EPOCHS = 27
CONFIGS = list(itertools.product(LRS, WIDTHS))

_data = None


def size(width):
    """The MLP's weights and biases: 64 inputs, ``width`` hidden units, 10 outputs."""
    return 64 * width + width + width * 10 + 10


def data():
    """(x_train, y_train, x_val, y_val), scaled to [0, 1], split 75/25 with a fixed seed."""
    global _data
    if _data is None:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        x_train, x_val, y_train, y_val = train_test_split(
            digits.data / 16.0, digits.target, test_size=0.25, random_state=0, stratify=digits.target
        )
        _data = (x_train, y_train, x_val, y_val)
    return _data


def train(lr, width, model, save, report, journal=None, passes=1, seed=0):
    """Train ``model`` (None: a new one; else one a checkpoint held) from the step after its last
    to EPOCHS, a step being ``passes`` epochs over the training data; after each, ``save(model)``
    then ``report(step, loss)``. ``seed``: the initial weights' and the batches' order. Returns
    the last loss."""
    import numpy as np
    from sklearn.metrics import log_loss
    from sklearn.neural_network import MLPClassifier

    x_train, y_train, x_val, y_val = data()
    if model is None:
        model = MLPClassifier(
            hidden_layer_sizes=(width,),
            solver="sgd",
            learning_rate_init=lr,
            momentum=0.9,
            batch_size=64,
            random_state=seed,
        )
        model.gts_epoch = 0
    start = model.gts_epoch + 1
    loss = None
    for epoch in range(start, EPOCHS + 1):
        for one in range(passes):
            order = np.random.RandomState(seed * 1_000_000 + epoch * 1000 + one).permutation(len(x_train))
            model.partial_fit(x_train[order], y_train[order], classes=np.arange(10))
        loss = float(log_loss(y_val, model.predict_proba(x_val), labels=np.arange(10)))
        model.gts_epoch = epoch
        if journal:
            with open(journal, "a") as handle:
                handle.write(f"{lr} {width} {epoch} {loss!r}\n")
        save(model)
        report(epoch, min(loss, 50.0))  # a diverged model's loss is capped, not infinite
    return loss


try:
    from gpu_task_scheduler import GPUTask
except ImportError:  # the peers' runs need none of it
    GPUTask = object  # type: ignore[misc,assignment]


class DigitsTask(GPUTask):  # type: ignore[misc,valid-type]
    """The workload as a gts task, resuming from its checkpoint (the model pickled each epoch)."""

    def main(self):
        c = self._config
        path = os.path.join(self.checkpoint_dir, "model.pkl")
        model = None
        if self.resume_step is not None:  # the model of the epoch it reported last
            with open(path, "rb") as handle:
                model = pickle.load(handle)

        def save(model):
            with open(path + ".new", "wb") as handle:
                pickle.dump(model, handle)
            os.replace(path + ".new", path)

        # the model's size too, a second objective (bench/digits_pausing.py's *-two tools)
        report = lambda e, v: self.report(e, loss=v, params=size(c["width"]))  # noqa: E731
        loss = train(c["lr"], c["width"], model, save, report, c.get("journal"), c.get("passes", 1), c.get("seed", 0))
        return {"loss": loss}
