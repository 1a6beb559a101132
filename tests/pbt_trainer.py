"""A Hugging Face ``Trainer`` script under population-based training, with the ``Trainer``'s own LR
schedule (linear decay over the whole fit, its default), as a user's would be:

    python pbt_trainer.py --lr LR --epochs N --out WORK_DIR

The project's ``Trainer`` example (a tiny BERT, nothing downloaded), ``GTSCallback`` and
``resume_from()``. At each optimizer step it journals the rate the optimizer trains at next to the
rate of its config, its process and the step gts said it resumes from, to ``WORK_DIR/rates.jsonl``
(tests/pbt_lightning.py says why)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from pbt_rates import arguments, journal  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from examples.integrations.transformers import make_trainer  # noqa: E402
from gpu_task_scheduler.integrations.transformers import GTSCallback, resume_from  # noqa: E402


class Rates(TrainerCallback):
    def __init__(self, out, lr):
        self.out, self.lr = out, lr

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        journal(self.out, state.global_step, optimizer.param_groups[0]["lr"], self.lr)


def main():
    args = arguments()
    import torch

    torch.set_num_threads(1)
    rates = Rates(args.out, args.lr)
    trainer = make_trainer(args.lr, 16, args.epochs, args.out, callbacks=[GTSCallback(), rates])
    trainer.train(resume_from_checkpoint=resume_from())


if __name__ == "__main__":
    main()
