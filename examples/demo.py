"""Run the demo sweep on CPU slots and print a table of the results.

python examples/demo.py                 # uses configs/demo.yaml
python examples/demo.py my_config.yaml
"""

import os
import sys

# The repository's root, so that the task is examples.demo_task:QuadraticTask here as in
# configs/demo.yaml: the two runs of one sweep agree on what their runs run.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.demo_task import QuadraticTask  # noqa: E402
from gpu_task_scheduler import GPUTaskScheduler, results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONFIG = os.path.join(HERE, os.pardir, "configs", "demo.yaml")


# The demo config's run that diverges on purpose, to show how a failed run is reported.
MEANT_TO_FAIL = "lr-1.2,momentum-0.0,"


def main() -> int:
    """0 when every run succeeded, or (the demo config) when the one that fails on purpose is the
    only failure, which is said; else 1, as ``gts run`` exits."""
    config = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_CONFIG
    scheduler = GPUTaskScheduler(config=config, gpu_task_class=QuadraticTask)
    summary = scheduler.start()
    root = scheduler.sweep.options.result_root_folder
    # Every run of the result root, as its ledger records it: those that ran now and those skipped
    # because they succeeded before (with the result they had then).
    print()
    print(f"{'run folder':<40} {'status':<10} {'loss':<8} this start")
    for row in results.rows(root):
        loss = row.get("result.loss")
        now = "ran" if row["name"] in summary.outcomes else "skipped (succeeded before)"
        shown = "" if loss is None else f"{loss:.3g}"
        print(f"{os.path.join(root, row['name']):<40} {row['status']:<10} {shown:<8} {now}")
    failed = {outcome.name for outcome in summary.failed}
    if config == DEFAULT_CONFIG and failed == {MEANT_TO_FAIL}:
        print(
            f"\n{MEANT_TO_FAIL} failed on purpose (lr 1.2 diverges), to show how a failure is reported; "
            "every other run succeeded, so the demo exits 0"
        )
        return 0
    return summary.exit_code


if __name__ == "__main__":
    sys.exit(main())
