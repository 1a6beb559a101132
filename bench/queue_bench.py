"""`gts queue` throughput: 200 `true` commands on 4 GPU ids, against simple_gpu_scheduler.

python bench/queue_bench.py           # pip install simple-gpu-scheduler for the peer
"""

import os
import sys
import tempfile

from _common import gts, measure, peer

JOBS = 200
GPUS = ["0", "1", "2", "3"]


def main() -> None:
    commands = "true\n" * JOBS
    scheduler = peer("simple_gpu_scheduler")
    rows = [("gts queue", gts() + ["queue", "--gpus", *GPUS, "--log-dir", "q"])]
    if scheduler:
        rows.append(("simple_gpu_scheduler", [scheduler, "--gpus", *GPUS]))
    print(f"{JOBS} `true` commands on {len(GPUS)} GPU ids, {os.cpu_count()} CPU cores")
    print(f"{'tool':<22}{'seconds':>9}{'jobs/s':>9}")
    rates = {}
    for name, argv in rows:
        with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryFile("w+") as feed:
            feed.write(commands)
            feed.seek(0)
            code, wall, _ = measure(argv, stdin=feed, cwd=folder)
        assert code == 0, f"{name} failed"
        rates[name] = JOBS / wall
        print(f"{name:<22}{wall:>9.2f}{rates[name]:>9.1f}")
    if len(rates) == 2:
        print(f"{'ratio gts/peer':<22}{'':>9}{rates['gts queue'] / rates['simple_gpu_scheduler']:>9.2f}")
    else:
        print("(simple_gpu_scheduler not found: pip install simple-gpu-scheduler to compare)", file=sys.stderr)


if __name__ == "__main__":
    main()
