"""A Lightning script under population-based training, with an LR schedule that runs over the whole
fit (cosine, per optimizer step), as a user's would:

    python pbt_lightning.py --lr LR --epochs N --out WORK_DIR

The project's Lightning example's model and data, ``GTSCallback`` and ``resume_from()``. At each
optimizer step it journals the rate the optimizer trains at, next to the rate of its config, to
``WORK_DIR/rates.jsonl``: a member that copied another's checkpoint must train at its own rate times
the schedule's factor at that step, not at the rate of the checkpoint it restored. Each line names
the attempt's process and the step gts said it resumes from (``GTS_RESUME_STEP``)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from pbt_rates import arguments, journal  # noqa: E402

from examples.integrations.lightning import Regressor, loaders  # noqa: E402
from gpu_task_scheduler.integrations.lightning import GTSCallback, resume_from  # noqa: E402

STEPS_PER_EPOCH = 8  # 256 samples in batches of 32 (the example's loaders)


class Scheduled(Regressor):
    def __init__(self, lr, width, total_steps):
        super().__init__(lr, width)
        self.total_steps = total_steps

    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": cosine, "interval": "step"}}


class Rates(L.Callback):
    def __init__(self, out, lr):
        self.out, self.lr = out, lr

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        journal(self.out, trainer.global_step, trainer.optimizers[0].param_groups[0]["lr"], self.lr)


def main():
    args = arguments()
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[GTSCallback(), Rates(args.out, args.lr)],
    )
    model = Scheduled(args.lr, 8, args.epochs * STEPS_PER_EPOCH)
    trainer.fit(model, *loaders(), ckpt_path=resume_from())


if __name__ == "__main__":
    main()
