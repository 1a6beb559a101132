"""Tasks for the real-GPU tests (``test_real_gpu.py``): they use PyTorch on whatever GPU they are given."""

import os
import time

from gpu_task_scheduler import GPUTask


class TorchTask(GPUTask):
    """Allocates ``alloc_gib`` GiB on its GPU, waits until ``together`` runs hold theirs (or 60 s), ends.

    It returns what CUDA showed it, so a test can compare it with what the scheduler meant to give it.
    """

    def main(self):
        import torch

        block = torch.ones(int(self._config["alloc_gib"] * 2**30), dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        marks = self._config["marks"]
        open(os.path.join(marks, os.path.basename(self._work_dir)), "w").close()
        together = self._config.get("together", 1)
        deadline = time.monotonic() + 60
        while len(os.listdir(marks)) < together and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = len(os.listdir(marks))
        time.sleep(self._config.get("hold", 1.0))  # a few polls of the scheduler see the memory held
        properties = torch.cuda.get_device_properties(0)
        return {
            "visible": os.environ["CUDA_VISIBLE_DEVICES"],
            "devices": torch.cuda.device_count(),
            "uuid": "GPU-" + str(properties.uuid),
            "name": properties.name,
            "held_together": seen,
            "sum": int(block[:1024].sum().item()),
        }


class OutOfMemoryTask(GPUTask):
    """Asks for far more memory than any GPU has: PyTorch raises its out-of-memory error at once."""

    def main(self):
        import torch

        torch.empty(int(self._config["alloc_gib"] * 2**30), dtype=torch.uint8, device="cuda")
        return "unreachable"
