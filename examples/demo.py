"""Run the demo sweep on CPU slots and print a table of the results.

python examples/demo.py                 # uses configs/demo.yaml
python examples/demo.py my_config.yaml
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from demo_task import QuadraticTask  # noqa: E402

from gpu_task_scheduler import GPUTaskScheduler  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONFIG = os.path.join(HERE, os.pardir, "configs", "demo.yaml")


def main() -> int:
    config = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_CONFIG
    summary = GPUTaskScheduler(config=config, gpu_task_class=QuadraticTask).start()
    print()
    print(f"{'run folder':<40} {'status':<10} loss")
    for outcome in summary.outcomes.values():
        loss = (outcome.result or {}).get("loss")
        print(f"{outcome.work_dir:<40} {outcome.status.value:<10} {'' if loss is None else f'{loss:.3g}'}")
    for name in summary.skipped:
        print(f"{name:<40} skipped (succeeded before)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
