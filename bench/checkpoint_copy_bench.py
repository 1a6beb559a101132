"""Population-based training's checkpoint copies (records/checkpoints.py) on each file system given:
a member's snapshot of a checkpoint of ``--size`` (random data, not compressible) and an exploit
putting that snapshot in place of another member's checkpoint, each timed, with the disk each took
(the file system's own count of used blocks, before and after). On a file system that shares a
copy's blocks (XFS made with reflink, Btrfs), a copy should take no disk and about no time; on
ext4 it is a full copy. Ratios are against the first folder given (measured in this invocation).

    python bench/checkpoint_copy_bench.py --size 1GiB /tmp/on-ext4 /mnt/on-xfs

Each folder must exist on the file system to measure; the script makes and removes ``gts-bench``
in it. An XFS image for it, where the machine allows (root, a loop device)::

    truncate -s 3G /tmp/xfs.img && mkfs.xfs -q /tmp/xfs.img && mount -o loop /tmp/xfs.img /mnt/xfs
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

from gpu_task_scheduler.gpu.devices import format_size, parse_memory
from gpu_task_scheduler.records import checkpoints
from gpu_task_scheduler.records.paths import RunPaths


def _used(folder: str) -> int:
    os.sync()
    info = os.statvfs(folder)
    return (info.f_blocks - info.f_bfree) * info.f_frsize


def _file_system(folder: str) -> str:
    """The type of the file system ``folder`` is on (the longest mount point above it)."""
    real, best, kind = os.path.realpath(folder), "", "?"
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            parts = line.split()
            point = parts[1].replace("\\040", " ")
            if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                best, kind = point, parts[2]
    return kind


def _member(base: str, name: str) -> RunPaths:
    work = os.path.join(base, name)
    os.makedirs(os.path.join(work, ".gts", "checkpoint"))
    return RunPaths(work, None)


def measure(folder: str, size: int) -> dict[str, float]:
    base = os.path.join(folder, "gts-bench")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    try:
        donor, copier = _member(base, "donor"), _member(base, "copier")
        with open(os.path.join(donor.checkpoint, "weights.pt"), "wb") as handle:
            left = size
            while left:
                chunk = os.urandom(min(left, 64 << 20))
                handle.write(chunk)
                left -= len(chunk)
        used = _used(folder)
        began = time.perf_counter()
        checkpoints.take_snapshot(donor, 8)
        snapshot_s = time.perf_counter() - began
        snapshot_disk = _used(folder) - used
        used = _used(folder)
        began = time.perf_counter()
        checkpoints.install(copier, donor, 8)
        exploit_s = time.perf_counter() - began
        exploit_disk = _used(folder) - used
        with (
            open(os.path.join(copier.checkpoint, "weights.pt"), "rb") as mine,
            open(os.path.join(donor.checkpoint, "weights.pt"), "rb") as theirs,
        ):
            assert mine.read(1 << 20) == theirs.read(1 << 20), "the copy differs from its source"
        return {
            "snapshot_s": snapshot_s,
            "snapshot_disk": snapshot_disk,
            "exploit_s": exploit_s,
            "exploit_disk": exploit_disk,
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="a folder on each file system to measure (the first: the baseline)")
    parser.add_argument("--size", default="1GiB", help="the checkpoint's size (default 1GiB)")
    args = parser.parse_args()
    size = parse_memory(args.size, "--size")
    results = [(folder, _file_system(folder), measure(folder, size)) for folder in args.folders]
    base = results[0][2]
    print(f"a checkpoint of {format_size(size)}: its snapshot, then an exploit putting it in place of another's")
    head = ("file system", "snapshot", "its disk", "exploit", "its disk", "time / first")
    print(f"{head[0]:<12} {head[1]:>10} {head[2]:>10} {head[3]:>10} {head[4]:>10} {head[5]:>13}")
    for _, kind, found in results:
        ratio = (found["snapshot_s"] + found["exploit_s"]) / (base["snapshot_s"] + base["exploit_s"])
        print(
            f"{kind:<12} {found['snapshot_s']:>9.3f}s {format_size(max(0, int(found['snapshot_disk']))):>10} "
            f"{found['exploit_s']:>9.3f}s {format_size(max(0, int(found['exploit_disk']))):>10} {ratio:>12.3f}x"
        )


if __name__ == "__main__":
    main()
