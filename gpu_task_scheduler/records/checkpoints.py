"""Population-based training's checkpoint copies: snapshots of a member's checkpoint folder, and a
donor's snapshot put in place of a member's checkpoint, each whole or not at all.

* A *snapshot* (``<run>/.gts/snapshots/<step>``) is taken of a top member's checkpoint folder
  while the member waits in ``report()`` at an interval: it is copied to ``<step>.new`` and renamed.
  The ledger records the decision after the copy, so a recorded snapshot is always whole; a
  kill -9 during the copy leaves a ``.new`` folder that nothing reads and the next one clears.
* An *exploit* puts a copy of the donor's snapshot in place of the member's checkpoint: copied to
  ``checkpoint.new``, then ``checkpoint`` is renamed to ``checkpoint.old``, ``checkpoint.new`` to
  ``checkpoint``, and ``checkpoint.old`` is removed. The ledger recorded the exploit before, and
  records the member's resumption (with its attempt) only after: a kill -9 at any moment leaves the
  exploit to be made again by the next start, from the snapshot it still keeps, and the member's
  checkpoint is the old one or the new one, never part of one.

Copies are copies, not hard links: a hard link shares the file itself, and a run that saves its
checkpoint in place (``torch.save(state, path)`` truncates and rewrites the file) would then
rewrite the donor's snapshot and every member that copied it. ``os.copy_file_range`` lets a file
system that can (Btrfs, XFS, and NFS 4.2 servers) share the blocks until one side writes, so a copy
costs no space there either; elsewhere it is a plain copy in the kernel.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from .paths import RunPaths, step_name

SNAPSHOTS = "snapshots"
_CHUNK = 1 << 30


def snapshots_dir(paths: RunPaths) -> str:
    return os.path.join(paths.meta, SNAPSHOTS)


def snapshot_path(paths: RunPaths, step: float) -> str:
    return os.path.join(snapshots_dir(paths), step_name(step))


def _copy_file(source: str, target: str) -> str:
    """Copy one file in the kernel (sharing blocks where the file system can), keeping its mode."""
    try:
        with open(source, "rb") as src, open(target, "wb") as dst:
            while os.copy_file_range(src.fileno(), dst.fileno(), _CHUNK):
                pass
    except OSError:  # not offered here (another file system, an old kernel): a plain copy
        shutil.copyfile(source, target)
    shutil.copymode(source, target)
    return target


def _remove(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def _copy_tree(source: str, target: str) -> None:
    _remove(target)
    if os.path.isdir(source):
        shutil.copytree(source, target, symlinks=True, copy_function=_copy_file)
    else:  # a member that never saved anything: an empty checkpoint
        os.makedirs(target)


def take_snapshot(paths: RunPaths, step: float) -> str:
    """Copy ``paths``' checkpoint folder to its snapshot of ``step`` (whole, or not at all)."""
    target = snapshot_path(paths, step)
    os.makedirs(snapshots_dir(paths), exist_ok=True)
    _copy_tree(paths.checkpoint, target + ".new")
    _remove(target)
    os.rename(target + ".new", target)
    return target


def install(paths: RunPaths, snapshot: str) -> None:
    """Put a copy of ``snapshot`` in place of ``paths``' checkpoint folder (see the module's text).
    Made again from the start after a kill -9 at any point of it."""
    checkpoint = paths.checkpoint
    new, old = checkpoint + ".new", checkpoint + ".old"
    _copy_tree(snapshot, new)
    if os.path.lexists(checkpoint):
        _remove(old)
        os.rename(checkpoint, old)
    os.rename(new, checkpoint)
    _remove(old)


def collect(paths: RunPaths, keep: set[float]) -> None:
    """Remove ``paths``' snapshots but those of the steps in ``keep`` (and any left half-copied)."""
    folder = snapshots_dir(paths)
    names = {step_name(step) for step in keep}
    with contextlib.suppress(FileNotFoundError):
        for entry in os.listdir(folder):
            if entry not in names:
                _remove(os.path.join(folder, entry))
