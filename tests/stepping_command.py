"""A run of the pool tests as a command: ``python stepping_command.py RUN STEPS SECONDS JOURNAL``.

It goes on from ``GTS_RESUME_STEP`` (the checkpoint protocol: the last step it reported), trains
each step for SECONDS, reports it, then appends ``step RUN N NODE`` to the journal; after its last
step, ``end RUN TIME NODE``. The journal is what must happen exactly once: each run's end, each
step after the one it went on from. With ``GPU_BYTES`` in its environment it first holds that
much memory of its first GPU in the fake NVML (``fake_nvml.allocate``), as a CUDA run would."""

import os
import sys
import time

from gpu_task_scheduler import reporting


def main(run, steps, seconds, journal, report=None):
    """``report(step, loss)``: how each step is told (to gts by default; tb_command.py: TensorBoard)."""
    report = report or (lambda step, loss: reporting.report(step, loss=loss))
    node = os.environ.get("SLURMD_NODENAME", "?")
    resumed = int(float(os.environ.get("GTS_RESUME_STEP") or 0))
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if os.environ.get("GPU_BYTES"):
        import fake_nvml

        fake_nvml.allocate(gpus.split(",")[0], int(os.environ["GPU_BYTES"]))
    with open(journal, "a") as handle:
        handle.write(f"start {run} {resumed} {time.time()} {gpus or '-'} {node}\n")
    for step in range(resumed + 1, int(steps) + 1):
        time.sleep(float(seconds))
        report(step, 1.0 / step)
        with open(journal, "a") as handle:
            handle.write(f"step {run} {step} {node}\n")
    with open(journal, "a") as handle:
        handle.write(f"end {run} {time.time()} {node}\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
