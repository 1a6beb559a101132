"""A pool run that says what it was given: ``python share_command.py RUN FOLDER TOGETHER``.

It writes ``FOLDER/RUN.json`` (its CPUs, its CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS, its node, its
parent's command line, and whether ``decimal``, which nothing here imports, was imported before its first line: a
warm start's) and then
waits, up to 60 s, until TOGETHER runs have written theirs, so that what runs at once is seen at once."""

import sys

PRELOADED = "decimal" in sys.modules  # first: what the warm process it was forked from had imported

import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402


def _command_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def main():
    run, folder, together = sys.argv[1], sys.argv[2], int(sys.argv[3])
    said = {
        "cpus": sorted(os.sched_getaffinity(0)),
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "node": os.environ.get("SLURMD_NODENAME"),
        "parent": _command_of(os.getppid()),
        "preloaded": PRELOADED,
        "argv": sys.argv[1:],
        "main": __name__,
    }
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f".{run}.tmp"), "w") as handle:
        json.dump(said, handle)
    os.replace(os.path.join(folder, f".{run}.tmp"), os.path.join(folder, f"{run}.json"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if sum(name.endswith(".json") for name in os.listdir(folder)) >= together:
            break
        time.sleep(0.05)  # other processes' files, on a file system: nothing to wait on but a look


if __name__ == "__main__":
    main()
