"""A task that needs nothing but the standard library: gradient descent on a
noisy quadratic, standing in for a training run."""

import json
import math
import os
import random

from gpu_task_scheduler import GPUTask


class QuadraticTask(GPUTask):
    def main(self):
        config = self.config
        rng = random.Random(config["seed"])
        x, velocity = 5.0, 0.0
        for step in range(config["steps"]):
            gradient = 2 * x + rng.gauss(0, 0.1)
            velocity = config["momentum"] * velocity - config["lr"] * gradient
            x += velocity
            if not math.isfinite(x) or abs(x) > 1e6:
                raise FloatingPointError(f"diverged at step {step} (x={x:.3g})")
            if step % 100 == 0:
                print(f"step {step}: loss {x * x:.6f}")
        loss = x * x
        with open(os.path.join(self.work_dir, "metrics.json"), "w") as handle:
            json.dump({"loss": loss}, handle)
        return {"loss": loss}
