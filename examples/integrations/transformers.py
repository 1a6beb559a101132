"""A Hugging Face Trainer script under promotion ASHA: one import, one callback, one resume argument.

    gts run examples/integrations/transformers.yaml          # 8 configurations, as a GPUTask
    python examples/integrations/transformers.py --lr 3e-3 --hidden 16 --out /tmp/x   # one, by hand

The model is a tiny BERT built from its config (nothing is downloaded). The lines that make it a
run of a sweep are marked ``# gts``. Outside a sweep they do nothing.
"""

import argparse
import json
import os
import sys

if __name__ == "__main__":  # run as a script, this folder comes first on sys.path, where this file
    # would stand in for the `transformers` package it is named after
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
from transformers.utils import logging as hf_logging

from gpu_task_scheduler import GPUTask
from gpu_task_scheduler.integrations.transformers import GTSCallback, resume_from  # gts


class Sequences(torch.utils.data.Dataset):
    """Sequences of 8 tokens; the label says whether the first is in the upper half of the vocabulary."""

    def __init__(self, count, seed):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 32, (count, 8), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": int(self.ids[index, 0] >= 16)}


def make_trainer(lr, hidden, epochs, out, callbacks=None, **arguments):
    """The tiny BERT and its Trainer; ``arguments``: more TrainingArguments (``lr_scheduler_type``, ...)."""
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=32, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=2, intermediate_size=2 * hidden
    )
    config.max_position_embeddings = 8
    args = TrainingArguments(
        output_dir=out,
        learning_rate=lr,
        num_train_epochs=epochs,
        per_device_train_batch_size=32,
        eval_strategy="epoch",
        save_strategy="epoch",
        save_total_limit=1,
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        **arguments,
    )
    return Trainer(
        model=BertForSequenceClassification(config),
        args=args,
        train_dataset=Sequences(256, seed=0),
        eval_dataset=Sequences(128, seed=1),
        callbacks=callbacks if callbacks is not None else [GTSCallback()],  # gts
    )


def train(lr, hidden, epochs, out):
    trainer = make_trainer(lr, hidden, epochs, out)
    trainer.train(resume_from_checkpoint=resume_from())  # gts: resume_from_checkpoint
    return {"eval_loss": trainer.evaluate()["eval_loss"], "epochs": round(trainer.state.epoch or 0)}


class TransformersTask(GPUTask):
    def main(self):
        return train(self.config["lr"], self.config["hidden"], self.config["epochs"], self.work_dir)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(os.path.join(args.out, "result.json"), "w") as handle:
        json.dump(train(args.lr, args.hidden, args.epochs, args.out), handle)
