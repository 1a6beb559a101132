"""A task module that imports in the scheduler but fails to import in a run's process."""

import sys

from gpu_task_scheduler import GPUTask

if "gpu_task_scheduler.backends.local.runner" in sys.modules:
    raise ImportError("No module named 'cuda_only_dependency'")


class BrokenImportTask(GPUTask):
    def main(self):
        return "unreachable"
