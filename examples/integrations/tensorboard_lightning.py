"""A Lightning script with no line of gts in it, stopped early from what it logs to TensorBoard.

    gts run examples/integrations/tensorboard_lightning.yaml

Lightning logs to TensorBoard by default (``default_root_dir/lightning_logs``) when TensorBoard is
installed; the config's ``metrics: {tensorboard: '{work_dir}/lightning_logs'}`` makes those event
files the runs' metrics, and stop-only ASHA stops the runs that fall behind. Run by hand, it is
the plain script it looks like.
"""

import argparse
import json
import os
import sys

if __name__ == "__main__":  # run as a script, this folder comes first on sys.path, where a file
    # of it (lightning.py) would stand in for the `lightning` package
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, lr, width):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    L.seed_everything(0, verbose=False)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.rand(4608, 4, generator=generator) * 4 - 2
    targets = torch.tanh(inputs @ torch.randn(4, 1, generator=generator))
    train = DataLoader(TensorDataset(inputs[:4096], targets[:4096]), batch_size=32)
    valid = DataLoader(TensorDataset(inputs[4096:], targets[4096:]), batch_size=512)
    trainer = L.Trainer(max_epochs=args.epochs, default_root_dir=args.out, enable_progress_bar=False)
    trainer.fit(Regressor(args.lr, args.width), train, valid)
    with open(os.path.join(args.out, "result.json"), "w") as handle:
        json.dump({"val_loss": trainer.callback_metrics["val_loss"].item()}, handle)


if __name__ == "__main__":
    main()
