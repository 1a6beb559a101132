"""A task module for the warm-start tests: it says when it was imported, and by which process."""

import os
import time

from gpu_task_scheduler.gpu_task import GPUTask

IMPORTED_AT = time.time()
print(f"imported by {os.getpid()}", flush=True)


class WarmProbe(GPUTask):
    def main(self):
        started = time.time()
        print(f"main of {self._config['i']} in {os.getpid()}", flush=True)
        with open("/proc/self/environ", "rb") as handle:  # a fork shows its warm process's first environment
            forked = not any(line.startswith(b"GTS_RUN_TOKEN=") for line in handle.read().split(b"\0"))
        time.sleep(self._config.get("seconds", 0))
        return {
            "pid": os.getpid(),
            "waited": started - IMPORTED_AT,
            "gpus": os.environ["CUDA_VISIBLE_DEVICES"],
            "forked": forked,
            "seen": os.environ.get("GTS_TEST_RUN"),
        }


class WarmProbeWithEnv(WarmProbe):
    def required_env(self):
        return {"GTS_TEST_RUN": str(self._config["i"])}  # differs per run
