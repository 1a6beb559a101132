"""A task module that imports PyTorch at module level, as training scripts do: the real-GPU
pre-warming test (``test_real_gpu.py``) times runs started warm against fresh ones."""

import os
import time

IMPORT_BEGAN = time.time()  # before torch: a pre-warmed runner imports it while the run before works

import torch  # noqa: E402

from gpu_task_scheduler import GPUTask  # noqa: E402

IMPORTED_AT = time.time()


class ShortTorchTask(GPUTask):
    """Allocates ``alloc_gib`` GiB on its GPU, frees it, and says when main() started and ended."""

    def main(self):
        started = time.time()
        block = torch.ones(int(self._config["alloc_gib"] * 2**30), dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        total = int(block[:1024].sum().item())
        del block
        torch.cuda.empty_cache()
        return {
            "pid": os.getpid(),
            "import_began": IMPORT_BEGAN,
            "imported_at": IMPORTED_AT,
            "started": started,
            "ended": time.time(),
            "sum": total,
        }
