"""The Lightning example as ``bench/warm_start_bench.py`` runs it: it notes when the attempt is ready
to train (its imports done), in seconds since this script's first line, in the run's
``.gts/ready.jsonl``, then runs ``examples/integrations/lightning.py`` with the same arguments."""

import time

FIRST = time.time()

import json  # noqa: E402
import os  # noqa: E402
import runpy  # noqa: E402
import sys  # noqa: E402

import lightning  # noqa: E402, F401  (what the example imports: its cost is the start's)
import torch  # noqa: E402, F401

EXAMPLE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "integrations", "lightning.py"
)

if __name__ == "__main__":
    metrics = os.environ.get("GTS_METRICS_FILE")
    if metrics:
        with open(os.path.join(os.path.dirname(metrics), "ready.jsonl"), "a") as handle:
            handle.write(json.dumps({"ready": time.time() - FIRST}) + "\n")
    sys.argv[0] = EXAMPLE
    runpy.run_path(EXAMPLE, run_name="__main__")
