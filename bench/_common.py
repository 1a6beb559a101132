"""Helpers for the benchmark scripts: run a command, report wall time and peak memory."""

import os
import shutil
import subprocess
import sys


def measure(argv, *, stdin=None, stdout=subprocess.DEVNULL, cwd=None, env=None):
    """Wall seconds and peak resident memory (MiB) of one child process run to completion.

    ru_maxrss of RUSAGE_CHILDREN is the largest of all children waited for so
    far, so each measurement runs in a fresh helper process.
    """
    code = (
        "import resource, subprocess, sys, time; start = time.perf_counter(); "
        "p = subprocess.run(sys.argv[1:], stdin=sys.stdin, stdout=sys.stdout, stderr=subprocess.DEVNULL); "
        "wall = time.perf_counter() - start; "
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024; "
        "print(f'{p.returncode} {wall} {rss}', file=sys.stderr)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *argv],
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
        text=True,
    )
    returncode, wall, rss = result.stderr.strip().splitlines()[-1].split()
    return int(returncode), float(wall), float(rss)


def peer(name):
    """A peer tool on PATH, or next to this Python (e.g. installed in the same venv)."""
    found = shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))
    return found


def gts():
    return [sys.executable, "-m", "gpu_task_scheduler"]


def grid(runs):
    """Two value lists whose product is ``runs`` (a square-ish grid, as sweeps are)."""
    a = 1
    for candidate in range(int(runs**0.5), 0, -1):
        if runs % candidate == 0:
            a = candidate
            break
    return list(range(a)), list(range(runs // a))


ORDERS_HELP = "ascending (by the first value, as grids are written), descending, shuffled-N (seed N)"


def grid_order(configs, name):
    """``configs`` (tuples) in the order ``name`` says: ``ascending``, ``descending`` or ``shuffled-N``."""
    import random

    ordered = sorted(configs)
    if name == "ascending":
        return ordered
    if name == "descending":
        return list(reversed(ordered))
    random.Random(int(name.rsplit("-", 1)[1])).shuffle(ordered)
    return ordered
