"""The web view on a large result root: how long `gts serve` takes to answer what its page asks.

python bench/web_bench.py [--runs 100000] [--repeat 3] [--workdir DIR]

The root is built as bench/read_bench.py builds it (every run recorded with its swept values and
a result {"loss": ...}; one in a hundred failed). A server of `gts serve` runs in this process;
each request is timed from the client's side (median of the repeats): the page itself, the
overview it polls, the first page of runs, the runs sorted by a result and by a parameter, a
page deep in the sorted order, the slots' timeline and the parallel coordinates. The issue's
targets, for 100,000 runs: the first page under 2 s, sorting by a metric under 1 s.
"""

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

from read_bench import REPO, built_root

sys.path.insert(0, REPO)

from gpu_task_scheduler.web.server import make_server  # noqa: E402

REQUESTS = [
    ("the page", "/"),
    ("overview (polled each second)", "/api/overview?root=0"),
    ("first page of runs", "/api/runs?root=0&limit=50"),
    ("runs sorted by a result (loss)", "/api/runs?root=0&sort=loss&limit=50"),
    ("runs sorted by a parameter (a)", "/api/runs?root=0&sort=a&desc=1&limit=50"),
    ("a page half-way down the sort", "/api/runs?root=0&sort=loss&offset={half}&limit=50"),
    ("slots' timeline (2,000 runs)", "/api/timeline?root=0"),
    ("parallel coordinates (5,000 best)", "/api/parcoords?root=0&metric=loss"),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", help="keep the root here (shared with read_bench.py's --workdir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gts-web-") as scratch:
        workdir = os.path.abspath(args.workdir or scratch)
        root = built_root(workdir, args.runs)
        server, _ = make_server([root], port=0, no_token=True)  # this machine's own benchmark: no token
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{server.server_address[1]}"
        print(f"{'request':<40} {'seconds':>8} {'KB':>8}  ({args.runs:,} runs; median of {args.repeat})")
        try:
            for label, path in REQUESTS:
                times, size = [], 0
                for repeat in range(args.repeat):
                    # A parameter of its own each time: the server keeps an answer a while (CACHE_SECONDS),
                    # and this measures computing one.
                    url = base + path.format(half=args.runs // 2)
                    if "/api/" in url:
                        url += ("&" if "?" in url else "?") + f"bench={repeat}"
                    started = time.perf_counter()
                    with urllib.request.urlopen(url, timeout=120) as answer:
                        size = len(answer.read())
                    times.append(time.perf_counter() - started)
                print(f"{label:<40} {statistics.median(times):8.3f} {size / 1024:8.0f}", flush=True)
        finally:
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    main()
