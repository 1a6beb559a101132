"""A pool run that logs to TensorBoard and nothing else: ``python tb_command.py RUN STEPS SECONDS JOURNAL``.

Like ``stepping_command.py`` (it journals its start, each step, its end), but it reports nothing to
gts: each step is one scalar ``loss`` in an event file of its own attempt under ``$GTS_RUN_DIR/tb``
(as a ``SummaryWriter`` writes them: TFRecords, flushed as written), which the sweep's
``metrics: {tensorboard: ...}`` reads. It goes on from ``GTS_RESUME_STEP``."""

import os
import sys
import time


def record(step, loss):
    from tensorboard.compat.proto import event_pb2, summary_pb2

    from gpu_task_scheduler.records.tensorboard import masked_crc32c

    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="loss", simple_value=loss)])
    body = event_pb2.Event(wall_time=time.time(), step=step, summary=summary).SerializeToString()
    header = len(body).to_bytes(8, "little")
    return header + masked_crc32c(header).to_bytes(4, "little") + body + masked_crc32c(body).to_bytes(4, "little")


def main(run, steps, seconds, journal):
    node = os.environ.get("SLURMD_NODENAME", "?")
    resumed = int(float(os.environ.get("GTS_RESUME_STEP") or 0))
    folder = os.path.join(os.environ["GTS_RUN_DIR"], "tb")
    os.makedirs(folder, exist_ok=True)
    with open(journal, "a") as handle:
        handle.write(f"start {run} {resumed} {time.time()} - {node}\n")
    path = os.path.join(folder, f"events.out.tfevents.{time.time():.6f}.{os.getpid()}")
    with open(path, "ab") as events:
        for step in range(resumed + 1, int(steps) + 1):
            time.sleep(float(seconds))
            events.write(record(step, 1.0 / step))
            events.flush()
            with open(journal, "a") as handle:
                handle.write(f"step {run} {step} {node}\n")
    with open(journal, "a") as handle:
        handle.write(f"end {run} {time.time()} {node}\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
