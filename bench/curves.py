"""The early-stopping benchmark's workload: 36 configurations with known learning curves.

A configuration is a learning rate and a width. The loss at step ``t`` is
``floor + (1 - floor) * exp(-rate * t)`` plus a little fixed noise: a high learning
rate learns fast (a high ``rate``) to a higher ``floor``, so the curves cross: at
step 1 the best runs have lr 0.1, at step 3 lr 0.03, and at step ``STEPS`` the best
is lr 0.03, width 512, with lr 0.01 close behind (within 5 %). Every tool runs the same curves and
counts the steps it executed in the same way (one line per step in a journal).
"""

import itertools
import math
import os
import random
import time

LRS = [0.3, 0.1, 0.03, 0.01, 0.003, 0.001]
WIDTHS = [32, 64, 128, 256, 512, 1024]
STEPS = 27
CONFIGS = list(itertools.product(LRS, WIDTHS))


def loss(lr, width, step):
    i, j = LRS.index(lr), WIDTHS.index(width)
    rate = 1.2 * 0.7**i * (1 + 0.05 * j)
    floor = 0.12 + 0.08 * abs(i - 2.5) ** 1.5 + 0.02 * abs(j - 3.5)
    noise = random.Random(f"{lr}/{width}/{step}").gauss(0, 0.004)
    return floor + (1.0 - floor) * math.exp(-rate * step) + noise


TRUE_BEST = min(loss(lr, width, STEPS) for lr, width in CONFIGS)


def order(seed):
    """The grid in the order of ``seed`` (0: as listed)."""
    configs = list(CONFIGS)
    if seed:
        random.Random(seed).shuffle(configs)
    return configs


def train(lr, width, journal, step_seconds, report, first=1):
    """One training run from step ``first`` (a resumed run's checkpoint holds the steps before it):
    a step takes ``step_seconds``; ``report(step, value)`` after each (it may raise to stop or pause
    the run). Returns the last loss."""
    value = None
    for step in range(first, STEPS + 1):
        time.sleep(step_seconds)
        value = loss(lr, width, step)
        fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{lr} {width} {step}\n".encode())
        finally:
            os.close(fd)
        report(step, value)
    return value


try:
    from gpu_task_scheduler import GPUTask
except ImportError:  # the peers' runs need none of it
    GPUTask = object  # type: ignore[misc,assignment]


class CurveTask(GPUTask):  # type: ignore[misc,valid-type]
    """The workload as a gts task."""

    def main(self):
        c = self._config
        # The checkpoint protocol: the step reported last is the step saved (a curve has no weights
        # to save); a resumed attempt goes on after it.
        first = 1 if self.resume_step is None else int(self.resume_step) + 1
        return {
            "loss": train(
                c["lr"], c["width"], c["journal"], c["step_seconds"], lambda s, v: self.report(s, loss=v), first
            )
        }
