"""The peers of ``bench/warm_start_bench.py``: the same 16 configurations of the project's Lightning
example (``examples/integrations/lightning.py``), stopped early by each tool's own ASHA through
its own Lightning callback, 2 at a time, in one order of the grid:

    python bench/lightning_peers.py ray-tune ORDER SLOTS OUT.json
    python bench/lightning_peers.py optuna ORDER SLOTS OUT.json

* ``ray-tune``: Ray Tune's ``ASHAScheduler`` (``grace_period 3``, ``max_t 12``,
  ``reduction_factor 4``; it stops trials, it does not pause them), ``TuneReportCheckpointCallback``
  (checkpoints off), a local Ray of ``SLOTS`` CPUs, one CPU a trial: each trial runs in one of Ray's
  worker processes, which Ray keeps and reuses (their imports are paid once per worker);
* ``optuna``: a ``GridSampler`` (the order's seed), the ``SuccessiveHalvingPruner``
  (``min_resource 3``, ``reduction_factor 4``), ``PyTorchLightningPruningCallback``
  (``optuna-integration``), ``n_jobs=SLOTS``: trials are threads of this one process.

Writes ``{"wall", "epochs", "finals"}`` to OUT.json: the wall time from before the tool's first
import to its end, the epochs trained (every validation a trial reported), and the final
``val_loss`` of each configuration trained to the last epoch (by ``lr,width``)."""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time

START = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
LRS = [0.1, 0.03, 0.01, 0.003]
WIDTHS = [4, 8, 16, 32]
EPOCHS = 12


def _configs(order: int) -> list[dict]:
    configs = [{"lr": lr, "width": width} for lr in LRS for width in WIDTHS]
    random.Random(order).shuffle(configs)  # the order warm_start_bench.py gives gts
    return configs


def _trainer(callback):
    import lightning as L

    return L.Trainer(
        max_epochs=EPOCHS,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[callback],
    )


def ray_tune(order: int, slots: int) -> dict:
    import ray
    from ray import tune
    from ray.tune.integration.pytorch_lightning import TuneReportCheckpointCallback
    from ray.tune.schedulers import ASHAScheduler

    def trainable(config):
        import lightning as L

        from examples.integrations.lightning import Regressor, loaders

        L.seed_everything(0, verbose=False)
        callback = TuneReportCheckpointCallback(metrics={"val_loss": "val_loss"}, save_checkpoints=False)
        _trainer(callback).fit(Regressor(config["cfg"]["lr"], config["cfg"]["width"]), *loaders())

    ray.init(num_cpus=slots, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as storage:
            tuner = tune.Tuner(
                tune.with_resources(trainable, {"cpu": 1}),
                param_space={"cfg": tune.grid_search(_configs(order))},
                tune_config=tune.TuneConfig(
                    metric="val_loss",
                    mode="min",
                    scheduler=ASHAScheduler(max_t=EPOCHS, grace_period=3, reduction_factor=4),
                    max_concurrent_trials=slots,
                ),
                run_config=tune.RunConfig(storage_path=storage, verbose=0),
            )
            results = tuner.fit()
            epochs, finals = 0, {}
            for result in results:
                trained = int(result.metrics.get("training_iteration", 0))
                epochs += trained
                if trained >= EPOCHS:
                    cfg = result.config["cfg"]
                    finals[f"{cfg['lr']},{cfg['width']}"] = result.metrics["val_loss"]
    finally:
        ray.shutdown()
    return {"epochs": epochs, "finals": finals}


def optuna_study(order: int, slots: int) -> dict:
    import lightning as L
    import optuna
    from optuna_integration import PyTorchLightningPruningCallback

    from examples.integrations.lightning import Regressor, loaders

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def objective(trial):
        lr, width = trial.suggest_categorical("lr", LRS), trial.suggest_categorical("width", WIDTHS)
        L.seed_everything(0, verbose=False)
        trainer = _trainer(PyTorchLightningPruningCallback(trial, monitor="val_loss"))
        trainer.fit(Regressor(lr, width), *loaders())
        return trainer.callback_metrics["val_loss"].item()

    study = optuna.create_study(
        direction="minimize",
        sampler=optuna.samplers.GridSampler({"lr": LRS, "width": WIDTHS}, seed=order),
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=3, reduction_factor=4),
    )
    study.optimize(objective, n_trials=len(LRS) * len(WIDTHS), n_jobs=slots)
    epochs, finals = 0, {}
    for trial in study.trials:
        epochs += len(trial.intermediate_values)
        if trial.state == optuna.trial.TrialState.COMPLETE and len(trial.intermediate_values) >= EPOCHS:
            finals[f"{trial.params['lr']},{trial.params['width']}"] = trial.value
    return {"epochs": epochs, "finals": finals}


def main() -> None:
    tool, order, slots, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    import torch

    torch.set_num_threads(1)  # as the gts runs train (one thread each: 2 at a time on 2 cores)
    found = (ray_tune if tool == "ray-tune" else optuna_study)(order, slots)
    found["wall"] = time.perf_counter() - START
    with open(out, "w") as handle:
        json.dump(found, handle)


if __name__ == "__main__":
    main()
