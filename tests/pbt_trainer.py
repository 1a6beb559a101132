"""A Hugging Face ``Trainer`` script under population-based training, with the ``Trainer``'s own LR
schedule (linear decay over the whole fit, its default), as a user's would be:

    python pbt_trainer.py --lr LR --epochs N --out WORK_DIR

The project's ``Trainer`` example (a tiny BERT, nothing downloaded), ``GTSCallback`` and
``resume_from()``. At each optimizer step it journals the rate the optimizer trains at next to the
rate of its config, its process and the step gts said it resumes from, to ``WORK_DIR/rates.jsonl``
(tests/pbt_lightning.py says why)."""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from transformers import TrainerCallback  # noqa: E402

from examples.integrations.transformers import make_trainer  # noqa: E402
from gpu_task_scheduler.integrations.transformers import GTSCallback, resume_from  # noqa: E402


class Rates(TrainerCallback):
    def __init__(self, path, lr):
        self.path, self.lr = path, lr

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        line = {
            "step": state.global_step,
            "lr": optimizer.param_groups[0]["lr"],
            "config": self.lr,
            "pid": os.getpid(),
            "resume": os.environ.get("GTS_RESUME_STEP"),
        }
        with open(self.path, "a") as handle:
            handle.write(json.dumps(line) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    rates = Rates(os.path.join(args.out, "rates.jsonl"), args.lr)
    trainer = make_trainer(args.lr, 16, args.epochs, args.out, callbacks=[GTSCallback(), rates])
    trainer.train(resume_from_checkpoint=resume_from())


if __name__ == "__main__":
    main()
