"""A pool run that logs to TensorBoard and nothing else: ``python tb_command.py RUN STEPS SECONDS JOURNAL``.

``stepping_command.py`` (it journals its start, each step, its end), but it reports nothing to
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
    import stepping_command

    folder = os.path.join(os.environ["GTS_RUN_DIR"], "tb")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"events.out.tfevents.{time.time():.6f}.{os.getpid()}")
    with open(path, "ab") as events:

        def report(step, loss):
            events.write(record(step, loss))
            events.flush()

        stepping_command.main(run, steps, seconds, journal, report=report)


if __name__ == "__main__":
    main(*sys.argv[1:])
