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
from gpu_task_scheduler import GPUTaskScheduler  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONFIG = os.path.join(HERE, os.pardir, "configs", "demo.yaml")


# The demo config's run that diverges on purpose, to show how a failed run is reported.
MEANT_TO_FAIL = "lr-1.2,momentum-0.0,"


def main() -> int:
    """0 when every run succeeded, or (the demo config) when the one that fails on purpose is the
    only failure, which is said; else 1, as ``gts run`` exits."""
    config = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_CONFIG
    summary = GPUTaskScheduler(config=config, gpu_task_class=QuadraticTask).start()
    print()
    print(f"{'run folder':<40} {'status':<10} loss")
    for outcome in summary.outcomes.values():
        loss = (outcome.result or {}).get("loss")
        print(f"{outcome.work_dir:<40} {outcome.status.value:<10} {'' if loss is None else f'{loss:.3g}'}")
    for name in summary.skipped:
        print(f"{name:<40} skipped (succeeded before)")
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
