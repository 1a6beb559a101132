"""A Lightning script under promotion ASHA: one import, one callback, one resume argument.

    gts run examples/integrations/lightning.yaml          # 8 configurations, as a GPUTask
    python examples/integrations/lightning.py --lr 0.03 --width 32 --out /tmp/x   # one, by hand

The lines that make it a run of a sweep are marked ``# gts``. Outside a sweep they do nothing.
"""

import argparse
import json
import os
import sys

if __name__ == "__main__":  # run as a script, this folder comes first on sys.path, where this file
    # would stand in for the `lightning` package it is named after
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpu_task_scheduler import GPUTask
from gpu_task_scheduler.integrations.lightning import GTSCallback, resume_from  # gts


def loaders(seed=0):
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.rand(320, 4, generator=generator) * 4 - 2
    targets = torch.tanh(inputs @ torch.randn(4, 1, generator=generator))
    train = TensorDataset(inputs[:256], targets[:256])
    valid = TensorDataset(inputs[256:], targets[256:])
    return DataLoader(train, batch_size=32), DataLoader(valid, batch_size=64)


class Regressor(L.LightningModule):
    def __init__(self, lr, width):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = torch.nn.functional.mse_loss(self.net(inputs), targets)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        inputs, targets = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(inputs), targets), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def train(lr, width, epochs, devices=1, accelerator="cpu"):
    L.seed_everything(0, verbose=False)
    model = Regressor(lr, width)
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator=accelerator,
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[GTSCallback()],  # gts
    )
    train_loader, valid_loader = loaders()
    trainer.fit(model, train_loader, valid_loader, ckpt_path=resume_from())  # gts: ckpt_path
    return {"val_loss": trainer.callback_metrics["val_loss"].item(), "epochs": trainer.current_epoch}


class LightningTask(GPUTask):
    def main(self):
        config = self.config
        return train(config["lr"], config["width"], config["epochs"], accelerator=config.get("accelerator", "cpu"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = train(args.lr, args.width, args.epochs, args.devices)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        with open(os.path.join(args.out, "result.json"), "w") as handle:
            json.dump(result, handle)
