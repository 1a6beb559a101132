"""Hypervolume reached by gts's samplers on two-objective problems at equal budget.

For each problem and sampler (gts's random, Optuna's multi-objective TPE and NSGA-II, as a
``search: {objectives: ...}`` configures them), seeds 0 to 4: ask the search's Searcher for
``--budget`` trials one after another and tell it both objectives, exactly as the engine does
(the Searcher and its study in a result root's ``.gts/``; no run process, so that 2 x 3 x 5
searches take seconds, not an hour). Prints each sampler's median hypervolume of the front it
found (larger is better), against the same reference point for every sampler.

* ZDT1 (Zitzler, Deb and Thiele, 2000) in 6 dimensions: f1 = x1, f2 = g (1 - sqrt(x1 / g)),
  g = 1 + 9 mean(x2..x6); reference point (1.1, 11).
* A model-size trade-off of our own: error against latency over width (log int), depth (int),
  learning rate (log) and an optimizer choice; reference point (1.5, 100).

    python bench/multi_objective_bench.py [--budget 60] [--seeds 5]
"""

import argparse
import math
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpu_task_scheduler.results import front  # noqa: E402
from gpu_task_scheduler.tuning.search import open_searcher, parse_search  # noqa: E402
from gpu_task_scheduler.tuning.space import parse_space  # noqa: E402


def zdt1(values):
    x = [values[f"x{i}"] for i in range(6)]
    g = 1 + 9 * sum(x[1:]) / 5
    return x[0], g * (1 - math.sqrt(x[0] / g))


def model_size(values):
    size = values["width"] * values["depth"]
    lr_penalty = 0.3 * (math.log10(values["lr"]) + 2.5) ** 2 / 4
    error = 0.05 + 0.6 / (1 + size / 300) + lr_penalty + (0.05 if values["optimizer"] == "sgd" else 0.0)
    return error, size / 100 + 2 * values["depth"]


PROBLEMS = {
    "ZDT1 (6-d)": (zdt1, {f"x{i}": {"uniform": [0, 1]} for i in range(6)}, (1.1, 11.0)),
    "model size (ours)": (
        model_size,
        {
            "width": {"int": [16, 1024], "log": True},
            "depth": {"int": [1, 8]},
            "lr": {"loguniform": [1e-4, 1e-1]},
            "optimizer": ["adam", "sgd"],
        },
        (1.5, 100.0),
    ),
}


def hypervolume(points, reference):
    """The area the front of ``points`` (both minimized) dominates, up to ``reference``."""
    kept = [p for p in points if p[0] < reference[0] and p[1] < reference[1]]
    area, last = 0.0, reference[1]
    for index in front(kept):
        x, y = kept[index]
        if y < last:
            area += (reference[0] - x) * (last - y)
            last = y
    return area


def search(problem, sampler, seed, budget, folder):
    function, space, _ = PROBLEMS[problem]
    config = parse_search(
        {"sampler": sampler, "n_runs": budget, "seed": seed, "objectives": {"f1": "min", "f2": "min"}}
    )
    searcher = open_searcher(config, parse_space(space), folder)
    points = []
    for number in range(budget):
        trial = searcher.ask()
        searcher.name(trial.number, f"trial-{number}")
        values = list(function(trial.values))
        searcher.tell(trial.number, values)
        points.append(values)
    return points


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    samplers = ["random", "tpe", "nsga2"]
    print(f"median hypervolume over seeds 0..{args.seeds - 1}, {args.budget} trials each (larger is better)")
    print(f"{'problem':<20}" + "".join(f"{sampler:>12}" for sampler in samplers))
    for problem, (_, _, reference) in PROBLEMS.items():
        medians = []
        for sampler in samplers:
            volumes = []
            for seed in range(args.seeds):
                with tempfile.TemporaryDirectory() as folder:
                    volumes.append(hypervolume(search(problem, sampler, seed, args.budget, folder), reference))
            medians.append(statistics.median(volumes))
        print(f"{problem:<20}" + "".join(f"{median:12.4f}" for median in medians))


if __name__ == "__main__":
    main()
