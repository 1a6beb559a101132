"""The README's seed picture and table, taken of a real sweep: `python docs/seeds_picture.py`.

It trains scikit-learn's digits with a small MLP (`bench/digits.py`) at three learning rates x five
seeds (the initial weights and the batches' order), 27 epochs each, on two CPU slots, into
results/seeds; then writes what `gts plot results/seeds --curves loss --by lr --over seed` draws
to docs/seed_curves.png and prints `gts results results/seeds --average-over seed` as Markdown and
LaTeX. scikit-learn is installed into bench/.peers/ when it does not import here.
"""

import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(REPO, "bench"), REPO]


def main() -> int:
    from digits_pbt import sklearn_path

    path = sklearn_path()
    if path:
        sys.path.insert(0, path)
    import digits

    from gpu_task_scheduler import GPUTaskScheduler

    os.chdir(REPO)
    root = os.path.join("results", "seeds")
    shutil.rmtree(root, ignore_errors=True)
    config = {
        "scheduler_config": {"gpu": ["cpu", "cpu"], "result_root_folder": root},
        "global_config": {"width": 64, "passes": 1},
        "test_config": [{"lr": [0.3, 0.1, 0.03], "seed": [0, 1, 2, 3, 4]}],
    }
    if not GPUTaskScheduler(config, digits.DigitsTask).start().ok:
        return 1
    gts = [sys.executable, "-m", "gpu_task_scheduler"]
    subprocess.run(
        [*gts, "plot", root, "--curves", "loss", "--by", "lr", "--over", "seed", "-o", "docs/seed_curves.png"],
        check=True,
    )
    for kind in ("markdown", "latex"):
        subprocess.run([*gts, "results", root, "--average-over", "seed", "--format", kind], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
