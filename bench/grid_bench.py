"""`gts grid` on a 1,000,000-command grid: time and peak memory, against simple_hypersearch.

python bench/grid_bench.py            # pip install simple-gpu-scheduler for the peer
"""

import sys

from _common import gts, measure, peer

VALUES = [str(i) for i in range(100)]
PATTERN = "python train.py --a {a} --b {b} --c {c}"
ARGS = ["-p", "a", *VALUES, "-p", "b", *VALUES, "-p", "c", *VALUES]


def main() -> None:
    hypersearch = peer("simple_hypersearch")
    print("1,000,000 commands (100 x 100 x 100), written to /dev/null")
    print(f"{'tool':<22}{'mode':<16}{'seconds':>9}{'peak MiB':>10}")
    for mode in ("grid", "shuffled_grid"):
        rows = [("gts grid", gts() + ["grid", PATTERN, *ARGS, "--sampling-mode", mode, "--seed", "0"])]
        if hypersearch:
            rows.append(("simple_hypersearch", [hypersearch, PATTERN, *ARGS, "--sampling-mode", mode, "--seed", "0"]))
        figures = {}
        for name, argv in rows:
            code, wall, rss = measure(argv)
            assert code == 0, f"{name} failed"
            figures[name] = (wall, rss)
            print(f"{name:<22}{mode:<16}{wall:>9.2f}{rss:>10.1f}")
        if len(figures) == 2:
            (gw, gm), (pw, pm) = figures["gts grid"], figures["simple_hypersearch"]
            print(f"{'ratio gts/peer':<22}{mode:<16}{gw / pw:>9.2f}{gm / pm:>10.2f}")
    if not hypersearch:
        print("(simple_hypersearch not found: pip install simple-gpu-scheduler to compare)", file=sys.stderr)


if __name__ == "__main__":
    main()
