"""What the framework PBT scripts (tests/pbt_lightning.py, tests/pbt_trainer.py) share: their
arguments (``--lr LR --epochs N --out WORK_DIR``) and the journal of the rate each optimizer step
trains at (``WORK_DIR/rates.jsonl``: the step, the rate, the rate of the run's config, the attempt's
process and the step gts said it resumes from, ``GTS_RESUME_STEP``)."""

import argparse
import json
import os


def arguments():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--out", required=True)
    return parser.parse_args()


def journal(out, step, used, config):
    line = {"step": step, "lr": used, "config": config, "pid": os.getpid(), "resume": os.environ.get("GTS_RESUME_STEP")}
    with open(os.path.join(out, "rates.jsonl"), "a") as handle:
        handle.write(json.dumps(line) + "\n")
