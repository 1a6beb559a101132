"""The Python job of the benchmark suite: a GPUTask whose main() works for ``seconds`` and
appends when it started and ended, and where, to ``log`` (as probe.sh does for commands)."""

import os
import time

from gpu_task_scheduler.gpu_task import GPUTask


class ProbeTask(GPUTask):
    def main(self):
        start = time.time()
        time.sleep(self._config["seconds"])
        line = f"{self._config['job']} {start} {time.time()} {os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}\n"
        with open(self._config["log"], "a") as log:
            log.write(line)
