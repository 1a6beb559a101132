"""How long ``gts importance`` takes on a large root, against Optuna reading the same runs from its own storage.

A root of N runs (default 10,000) of 20 parameters (17 ranges, some on a log scale, an integer and
two categories) with a planted dominant parameter is written to a gts ledger and, the same trials,
to an Optuna study in SQLite (what optuna-dashboard reads). Then, each in a fresh process:

* ``gts importance ROOT --metric loss --min`` (PED-ANOVA on the ledger's rows);
* Optuna: load the study from SQLite and rank it with ``PedAnovaImportanceEvaluator``;
* ``gts importance --evaluator fanova`` on the first ``--fanova-runs`` runs (default 1,000).

It prints each one's wall time, their ratio, and the first three parameters each ranks.

    python bench/importance_bench.py [--runs 10000] [--fanova-runs 1000] [--folder /tmp/importance_bench]
"""

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

PARAMS = 20
OPTUNA_CODE = """
import sys, optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name="bench", storage="sqlite:///" + sys.argv[1])
found = optuna.importance.get_param_importances(study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
print(" ".join(list(found)[:3]))
"""


def runs(count, seed=0):
    rng = random.Random(seed)
    made = []
    for _ in range(count):
        params = {f"p{i:02d}": rng.uniform(0, 1) for i in range(15)}
        params["lr"] = 10 ** rng.uniform(-5, 0)
        params["wd"] = 10 ** rng.uniform(-6, -2)
        params["layers"] = rng.randint(1, 12)
        params["optimizer"] = rng.choice(["sgd", "adam", "rmsprop"])
        params["activation"] = rng.choice(["relu", "gelu"])
        loss = 4 * (math.log10(params["lr"]) + 2.5) ** 2 + params["p03"] + 0.3 * (params["optimizer"] == "sgd")
        made.append((params, loss + rng.gauss(0, 0.05)))
    return made


def write_ledger(root, planted):
    from gpu_task_scheduler.records.ledger import Ledger
    from gpu_task_scheduler.records.paths import RootPaths
    from gpu_task_scheduler.records.status import RunStatus

    with Ledger(RootPaths(root)) as ledger, ledger.batch():
        for index, (params, loss) in enumerate(planted):
            name = f"r{index}"
            ledger.mark_running(
                name=name,
                run_index=index,
                config_hash="h",
                slot="cpu0",
                token="t",
                work_dir=os.path.join(root, name),
                params=json.dumps(params),
            )
            ledger.finish(name, RunStatus.SUCCEEDED, result=json.dumps({"loss": loss}))


def write_study(path, planted):
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spaces = {f"p{i:02d}": FloatDistribution(0, 1) for i in range(15)}
    spaces.update(
        lr=FloatDistribution(1e-5, 1, log=True),
        wd=FloatDistribution(1e-6, 1e-2, log=True),
        layers=IntDistribution(1, 12),
        optimizer=CategoricalDistribution(["sgd", "adam", "rmsprop"]),
        activation=CategoricalDistribution(["relu", "gelu"]),
    )
    study = optuna.create_study(study_name="bench", storage="sqlite:///" + path, direction="minimize")
    study.add_trials([optuna.trial.create_trial(params=p, distributions=spaces, value=v) for p, v in planted])


def timed(argv):
    began = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed: {done.stderr[-2000:]}")
    return wall, done.stdout


def top3(table):
    return " ".join(line.split()[0] for line in table.splitlines()[1:4])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--fanova-runs", type=int, default=1_000)
    parser.add_argument("--folder", default="/tmp/importance_bench")
    args = parser.parse_args()
    shutil.rmtree(args.folder, ignore_errors=True)
    os.makedirs(args.folder)
    planted = runs(args.runs)
    root, small = os.path.join(args.folder, "root"), os.path.join(args.folder, "small")
    began = time.perf_counter()
    write_ledger(root, planted)
    write_ledger(small, planted[: args.fanova_runs])
    study = os.path.join(args.folder, "optuna.sqlite3")
    write_study(study, planted)
    wrote = time.perf_counter() - began
    print(f"{args.runs} runs x {PARAMS} parameters written to a ledger and an Optuna study in {wrote:.0f} s")
    gts = [sys.executable, "-m", "gpu_task_scheduler", "importance"]
    ours, table = timed([*gts, root, "--metric", "loss", "--min"])
    theirs, ranked = timed([sys.executable, "-c", OPTUNA_CODE, study])
    print(f"gts importance (PED-ANOVA, from the ledger): {ours:6.2f} s  first: {top3(table)}")
    print(f"Optuna (PED-ANOVA, from its SQLite study):   {theirs:6.2f} s  first: {ranked.strip()}")
    print(f"ratio gts / Optuna: {ours / theirs:.2f}")
    fanova, table = timed([*gts, small, "--metric", "loss", "--min", "--evaluator", "fanova"])
    print(f"gts importance --evaluator fanova on {args.fanova_runs} runs: {fanova:6.2f} s  first: {top3(table)}")


if __name__ == "__main__":
    main()
