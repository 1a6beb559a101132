"""Every operation on a run's checkpoint folders, in one guarded place: population-based
training's snapshots of a member's checkpoint, a donor's snapshot put in place of a member's
checkpoint, each whole or not at all, and what is swept away after.

* A *snapshot* (``<run>/.gts/snapshots/<step>``) is taken of a top member's checkpoint folder
  while the member waits in ``report()`` at an interval: it is copied to ``<step>.new`` and renamed.
  The ledger records the decision after the copy, so a recorded snapshot is always whole; a
  kill -9 during the copy leaves a ``.new`` folder that nothing reads and the next start clears. A
  copy that fails removes its ``.new`` folder and raises: the caller records no snapshot.
* An *exploit* puts a copy of the donor's snapshot in place of the member's checkpoint: copied to
  ``checkpoint.new``, then ``checkpoint`` is renamed to ``checkpoint.old``, ``checkpoint.new`` to
  ``checkpoint``, and ``checkpoint.old`` is removed. The ledger recorded the exploit before, and
  records the member's resumption (with its attempt) only after: a kill -9 at any moment leaves the
  exploit to be made again by the next start, from the snapshot it still keeps, and the member's
  checkpoint is the old one or the new one, never part of one.

A checkpoint folder is the user's data and hostile at once: the run that writes it (or anyone who
can write under the result root) may plant a symbolic link, a FIFO or a huge sparse file there, or
swap a folder on the way for a link while a copy waits. So:

* every folder is reached from the run folder one component at a time, each opened with
  ``O_NOFOLLOW | O_DIRECTORY``, and everything below is created, renamed and removed relative to
  those descriptors (``dir_fd``): a link planted anywhere on the way (``.gts``, ``snapshots``, the
  checkpoint folder itself) makes the operation refuse with :class:`~.paths.UnsafePathError`
  instead of reaching outside the root, however late it was planted;
* a checkpoint folder that is a link is refused, never copied (a link to ``~/.ssh`` or to ``/``
  would otherwise be copied into every member);
* inside a checkpoint, a symbolic link is copied as a link (its text), never followed: a framework's
  ``latest -> step-12`` keeps working, and nothing outside is read;
* a FIFO, a socket or a device inside a checkpoint is never opened (opening a FIFO blocks until a
  writer comes): it is left out of the copy, and the caller is told its name;
* a checkpoint that nests folders deeper than ``MAX_DEPTH`` (100) is not copied, and the copy says
  so (a copy holds two descriptors a level); removing one works at any depth (a loop, not a recursion);
* the report a run keeps beside its checkpoint until it is written (``reporting.PENDING_REPORT``:
  records/resume.py) is the run's own, of that moment: never copied into a snapshot or a member;
* a file's holes are copied as holes (``SEEK_DATA``/``SEEK_HOLE``): a sparse 512 MiB file that takes
  no disk space takes none in its copies either.

Copies are copies, not hard links: a hard link shares the file itself, and a run that saves its
checkpoint in place (``torch.save(state, path)`` truncates and rewrites the file) would then
rewrite the donor's snapshot and every member that copied it. ``os.copy_file_range`` lets a file
system that can (Btrfs, XFS, and NFS 4.2 servers) share the blocks until one side writes, so a copy
costs no space there either; elsewhere it is a plain copy in the kernel.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator

from ..finite import ascii_int
from ..recordclass import Record, field
from ..reporting import PENDING_REPORT
from .paths import RunPaths, UnsafePathError, step_name

logger = logging.getLogger("gpu_task_scheduler")

SNAPSHOTS = "snapshots"
# The ledger's meta key for the disk population-based training's checkpoints took at its last
# snapshot or end, and checkpoints.max_disk (JSON: bytes, max_disk, refused, at): gts status shows it
DISK_META = "checkpoint_disk"
CHECKPOINT = "checkpoint"
_CHUNK = 1 << 30
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


MAX_DEPTH = 100  # folders in folders a copy goes down: past it, the copy is refused (TooDeep), not half made


class TooDeep(OSError):
    """A checkpoint nests folders deeper than :data:`MAX_DEPTH`: it is not copied."""


class Cancelled(OSError):
    """A copy given up before it was whole (its half-made folder removed)."""


class Copied(Record, frozen=False):
    """What a copy made: its folder, and the entries it left out (not a file, a folder or a link)."""

    path: str
    skipped: list[str] = field(default_factory=list)


def snapshots_dir(paths: RunPaths) -> str:
    return os.path.join(paths.meta, SNAPSHOTS)


def snapshot_path(paths: RunPaths, step: float) -> str:
    return os.path.join(snapshots_dir(paths), step_name(step))


# --- reaching a folder without leaving the root --------------------------------------------------


def _open_dir(name: str, dir_fd: int | None, shown: str) -> int:
    """``name`` (relative to ``dir_fd``) opened as a folder, never through a symbolic link."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symbolic link" if _is_link(name, dir_fd) else "not a folder"
            raise UnsafePathError(
                error.errno, f"is {kind}; a checkpoint's folders are used only as real folders", shown
            ) from None
        raise


def _is_link(name: str, dir_fd: int | None) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def _walk(paths: RunPaths, *names: str, create: bool = False) -> Iterator[int]:
    """A descriptor of ``<run>/.gts/<names...>``, each component opened with ``O_NOFOLLOW``
    (``create``: the missing ones made)."""
    fds = [_open_dir(paths.work_dir, None, paths.work_dir)]
    try:
        shown = paths.work_dir
        for name in (os.path.basename(paths.meta), *names):
            shown = os.path.join(shown, name)
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fds[-1])
            fds.append(_open_dir(name, fds[-1], shown))
        yield fds[-1]
    finally:
        for fd in reversed(fds):
            os.close(fd)


# --- copying, removing ---------------------------------------------------------------------------


def _copy_data(src: int, dst: int, size: int) -> None:
    """The data of ``src`` into ``dst``, its holes left holes (``dst`` is sized to ``size`` after)."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(src, offset, os.SEEK_DATA)
        except OSError as error:
            if error.errno == errno.ENXIO:  # no data past offset: the rest is a hole
                break
            if error.errno != errno.EINVAL:
                raise
            start = offset  # SEEK_DATA not offered: all of it is data
            end = size
        else:
            end = os.lseek(src, start, os.SEEK_HOLE)
        _copy_range(src, dst, start, min(end, size) - start)
        offset = end
    os.ftruncate(dst, size)


def _copy_range(src: int, dst: int, start: int, count: int) -> None:
    done = 0
    while done < count:
        try:
            moved = os.copy_file_range(src, dst, min(_CHUNK, count - done), start + done, start + done)
        except OSError as error:
            if error.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            moved = _copy_by_reads(src, dst, start + done, count - done)
        if moved == 0:  # the file shrank while it was copied
            return
        done += moved


def _copy_by_reads(src: int, dst: int, start: int, count: int) -> int:
    """A plain copy (another file system, an old kernel): what ``copy_file_range`` would do."""
    done = 0
    while done < count:
        data = os.pread(src, min(1 << 20, count - done), start + done)
        if not data:
            break
        written = 0
        while written < len(data):
            written += os.pwrite(dst, data[written:], start + done + written)
        done += len(data)
    return done


def _copy_file(name: str, src_dir: int, dst_dir: int, shown: str, skipped: list[str]) -> None:
    try:
        src = os.open(name, _READ_FLAGS, dir_fd=src_dir)
    except OSError as error:
        if error.errno == errno.ELOOP:  # swapped for a link since it was listed: left out
            skipped.append(shown)
            return
        raise
    try:
        info = os.fstat(src)
        if not stat.S_ISREG(info.st_mode):  # a FIFO or a device swapped in since it was listed
            skipped.append(shown)
            return
        os.set_blocking(src, True)
        dst = os.open(name, _WRITE_FLAGS, 0o600, dir_fd=dst_dir)
        try:
            _copy_data(src, dst, info.st_size)
            os.fchmod(dst, stat.S_IMODE(info.st_mode))
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _copy_tree(
    src_dir: int,
    dst_dir: int,
    shown: str,
    skipped: list[str],
    cancelled: Callable[[], bool] | None = None,
    depth: int = 0,
) -> None:
    """The entries of the folder ``src_dir`` into the (empty) folder ``dst_dir``; :class:`TooDeep`
    for folders nested deeper than :data:`MAX_DEPTH` (each level holds two descriptors)."""
    if depth > MAX_DEPTH:
        raise TooDeep(errno.EMLINK, f"nested deeper than {MAX_DEPTH} folders, not copied", shown)
    with os.scandir(src_dir) as entries:
        listed = [(entry.name, entry.stat(follow_symlinks=False).st_mode) for entry in entries]
    for name, mode in sorted(listed):
        if depth == 0 and name == PENDING_REPORT:  # the run's own, of the moment (a report it writes)
            continue
        if cancelled is not None and cancelled():
            raise Cancelled(errno.ECANCELED, "the copy was given up", shown)
        where = os.path.join(shown, name)
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(name, dir_fd=src_dir), name, dir_fd=dst_dir)
        elif stat.S_ISREG(mode):
            _copy_file(name, src_dir, dst_dir, where, skipped)
        elif stat.S_ISDIR(mode):
            inner = _open_dir(name, src_dir, where)
            try:
                os.mkdir(name, stat.S_IMODE(os.fstat(inner).st_mode) | 0o700, dir_fd=dst_dir)
                made = _open_dir(name, dst_dir, where)
                try:
                    _copy_tree(inner, made, where, skipped, cancelled, depth + 1)
                finally:
                    os.close(made)
            finally:
                os.close(inner)
        else:  # a FIFO, a socket, a device: never opened
            skipped.append(where)


def _remove(name: str, dir_fd: int) -> None:
    """Remove ``name`` in ``dir_fd`` (a folder with all it holds), following no link. A loop, not
    a recursion: a folder nested 990 deep (a run may write one) is removed like any other."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    inner = _open_dir(name, dir_fd, name)
    opened = [(dir_fd, name, inner, _names(inner))]  # the folders on the way down, each with what is left in it
    try:
        while opened:
            parent, folder, fd, left = opened[-1]
            if not left:
                opened.pop()
                os.close(fd)
                os.rmdir(folder, dir_fd=parent)
                continue
            entry = left.pop()
            try:
                mode = os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(mode):
                below = _open_dir(entry, fd, entry)
                opened.append((fd, entry, below, _names(below)))
            else:
                os.unlink(entry, dir_fd=fd)
    finally:
        for _, _, fd, _ in opened:
            os.close(fd)


def _names(folder: int) -> list[str]:
    with os.scandir(folder) as entries:
        return [entry.name for entry in entries]


def _copy_into(
    src_dir: int | None, dst_parent: int, name: str, shown: str, cancelled: Callable[[], bool] | None = None
) -> list[str]:
    """A copy of the folder ``src_dir`` (None: an empty one) made as ``name`` in ``dst_parent``
    (anything there before is removed first; on a failure, the half-made copy too)."""
    _remove(name, dst_parent)
    os.mkdir(name, 0o700, dir_fd=dst_parent)
    skipped: list[str] = []
    try:
        if src_dir is not None:
            made = _open_dir(name, dst_parent, shown)
            try:
                _copy_tree(src_dir, made, shown, skipped, cancelled)
                os.fchmod(made, stat.S_IMODE(os.fstat(src_dir).st_mode) | 0o700)
            finally:
                os.close(made)
    except BaseException:
        with contextlib.suppress(OSError):
            _remove(name, dst_parent)
        raise
    return skipped


@contextlib.contextmanager
def _checkpoint_of(paths: RunPaths, *names: str) -> Iterator[int | None]:
    """A descriptor of the folder ``<run>/.gts/<names>`` (None when it is missing: a member that
    never saved anything has an empty checkpoint). A link anywhere on the way is refused."""
    *parents, last = names
    with contextlib.ExitStack() as stack:
        try:
            parent = stack.enter_context(_walk(paths, *parents))
            fd = _open_dir(last, parent, os.path.join(paths.meta, *names))
        except FileNotFoundError:
            yield None
            return
        stack.callback(os.close, fd)
        yield fd


# --- the operations ------------------------------------------------------------------------------


def take_snapshot(paths: RunPaths, step: float, *, cancelled: Callable[[], bool] | None = None) -> Copied:
    """Copy ``paths``' checkpoint folder to its snapshot of ``step`` (whole, or not at all: on an
    error nothing is left of it and the error is raised). ``cancelled``: asked between files, and
    before the copy is put in place; true: the copy stops (:class:`Cancelled`), leaving nothing."""
    name = step_name(step)
    target = snapshot_path(paths, step)
    with _checkpoint_of(paths, CHECKPOINT) as source, _walk(paths, SNAPSHOTS, create=True) as folder:
        skipped = _copy_into(source, folder, name + ".new", target, cancelled)
        try:
            if cancelled is not None and cancelled():
                raise Cancelled(errno.ECANCELED, "the copy was given up", target)
            _remove(name, folder)
            os.rename(name + ".new", name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                _remove(name + ".new", folder)
            raise
    return Copied(target, skipped)


def install(paths: RunPaths, donor: RunPaths, step: float) -> Copied:
    """Put a copy of ``donor``'s snapshot of ``step`` in place of ``paths``' checkpoint folder (see
    the module's text). Made again from the start after a kill -9 at any point of it.
    FileNotFoundError: the snapshot is gone."""
    with _checkpoint_of(donor, SNAPSHOTS, step_name(step)) as source:
        if source is None:
            raise FileNotFoundError(errno.ENOENT, "no such snapshot", snapshot_path(donor, step))
        with _walk(paths) as meta:
            skipped = _copy_into(source, meta, CHECKPOINT + ".new", paths.checkpoint)
            new, old = CHECKPOINT + ".new", CHECKPOINT + ".old"
            try:
                os.stat(CHECKPOINT, dir_fd=meta, follow_symlinks=False)
            except FileNotFoundError:
                pass
            else:
                _remove(old, meta)
                os.rename(CHECKPOINT, old, src_dir_fd=meta, dst_dir_fd=meta)
            os.rename(new, CHECKPOINT, src_dir_fd=meta, dst_dir_fd=meta)
            _remove(old, meta)
    return Copied(paths.checkpoint, skipped)


def collect(paths: RunPaths, keep: set[float]) -> None:
    """Remove ``paths``' snapshots but those of the steps in ``keep`` (and any left half-copied)."""
    names = {step_name(step) for step in keep}
    try:
        with _walk(paths, SNAPSHOTS) as folder:
            with os.scandir(folder) as entries:
                listed = [entry.name for entry in entries]
            for entry in listed:
                if entry not in names:
                    _remove(entry, folder)
    except FileNotFoundError:
        return


def disk_use(paths: RunPaths, *, snapshots: bool = True, seen: set[tuple[int, int, int]] | None = None) -> int:
    """Bytes ``paths``' checkpoint folder (and, with ``snapshots``, its snapshots) takes on disk:
    each file's allocated blocks (holes take none), nothing reached through a link, and what is
    shared counted once (``seen``: what was counted already, shared between calls): a file linked
    twice, and, where the file system says which blocks a copy shares with its source (Linux's
    FIEMAP: XFS, Btrfs), those blocks. Read while runs write: a file gone meanwhile counts nothing."""
    seen = set() if seen is None else seen
    tops = [paths.checkpoint] + ([snapshots_dir(paths)] if snapshots else [])
    total = 0
    for top in tops:
        try:
            if not stat.S_ISDIR(os.lstat(top).st_mode):
                continue  # missing, or a link: copies refuse it, and it is not counted
        except OSError:
            continue
        for folder, _, files in os.walk(top, followlinks=False):
            for name in files:
                total += _file_disk_use(os.path.join(folder, name), seen)
    return total


def disk_use_of(members: Iterable[RunPaths]) -> int:
    """:func:`disk_use` of several runs' checkpoints and snapshots, what they share counted once."""
    seen: set[tuple[int, int, int]] = set()
    return sum(disk_use(paths, seen=seen) for paths in members)


_FIEMAP = 0xC020660B  # FS_IOC_FIEMAP: a file's extents (linux/fiemap.h, linux/fs.h)
_FIEMAP_HEAD, _FIEMAP_EXTENT = "=QQIIII", "=QQQQQIIII"  # struct fiemap, struct fiemap_extent
_EXTENTS_ASKED = 128
_EXTENT_LAST, _EXTENT_UNKNOWN, _EXTENT_SHARED = 0x1, 0x2, 0x2000


def _file_disk_use(path: str, seen: set[tuple[int, int, int]]) -> int:
    try:
        info = os.lstat(path)
    except OSError:
        return 0
    if not stat.S_ISREG(info.st_mode) or (0, info.st_dev, info.st_ino) in seen:
        return 0
    seen.add((0, info.st_dev, info.st_ino))
    blocks = getattr(info, "st_blocks", None)  # not on Windows: the file's size
    whole = info.st_size if blocks is None else blocks * 512
    extents = _extents(path) if whole else None
    if extents is None:  # no extent map here (another system, tmpfs): its blocks, shared or not
        return whole
    total = 0
    for physical, length, flags in extents:
        if flags & _EXTENT_SHARED and not flags & _EXTENT_UNKNOWN:
            if (1, info.st_dev, physical) in seen:
                continue  # a block a copy shares, counted with the file it was counted with first
            seen.add((1, info.st_dev, physical))
        total += length
    return total


def _extents(path: str) -> list[tuple[int, int, int]] | None:
    """``path``'s extents as ``(physical, length, flags)``, or None where the file system gives none."""
    if not sys.platform.startswith("linux"):
        return None
    import fcntl
    import struct

    head, extent = struct.calcsize(_FIEMAP_HEAD), struct.calcsize(_FIEMAP_EXTENT)
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return None
    found: list[tuple[int, int, int]] = []
    start = 0
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for a FIFO since it was listed
            return None
        while True:
            asked = bytearray(struct.pack(_FIEMAP_HEAD, start, (1 << 64) - 1 - start, 0, 0, _EXTENTS_ASKED, 0))
            asked += bytes(extent * _EXTENTS_ASKED)
            try:
                fcntl.ioctl(fd, _FIEMAP, asked)
            except OSError:
                return None if not found else found
            mapped = struct.unpack_from(_FIEMAP_HEAD, asked)[3]
            last = False
            for index in range(mapped):
                logical, physical, length, _, _, flags, *_ = struct.unpack_from(
                    _FIEMAP_EXTENT, asked, head + index * extent
                )
                found.append((physical, length, flags))
                start = logical + length
                last = bool(flags & _EXTENT_LAST)
            if last or mapped == 0:
                return found
    finally:
        os.close(fd)


def clear_unfinished(paths: RunPaths) -> None:
    """Remove what a kill -9 left of ``paths``' snapshots being copied (``<step>.new``: nothing reads
    them, and a member whose next snapshot is not taken would keep them): at a start, when no copy runs."""
    try:
        with _walk(paths, SNAPSHOTS) as folder:
            with os.scandir(folder) as entries:
                unfinished = [entry.name for entry in entries if entry.name.endswith(".new")]
            for name in unfinished:
                _remove(name, folder)
    except FileNotFoundError:
        return


def set_aside(paths: RunPaths, attempt: int, keep: int) -> None:
    """Set the checkpoint folder aside as ``.gts/logs/attempt-<attempt>-checkpoint`` (an attempt
    that starts afresh finds it empty), and remove all but the ``keep`` newest set aside before."""
    with _walk(paths) as meta:
        with contextlib.suppress(FileExistsError):
            os.mkdir(os.path.basename(paths.old_logs), 0o755, dir_fd=meta)
        logs = _open_dir(os.path.basename(paths.old_logs), meta, paths.old_logs)
        try:
            name = os.path.basename(paths.old_checkpoint(attempt))
            _remove(name, logs)
            os.rename(CHECKPOINT, name, src_dir_fd=meta, dst_dir_fd=logs)
            _keep_newest(paths, logs, keep)
        finally:
            os.close(logs)


def clean_set_aside(paths: RunPaths, keep: int = 0) -> list[str]:
    """Remove the run's checkpoints set aside by fresh attempts, but the ``keep`` newest: the names removed."""
    try:
        with _walk(paths, os.path.basename(paths.old_logs)) as logs:
            return _keep_newest(paths, logs, keep)
    except FileNotFoundError:
        return []


def _keep_newest(paths: RunPaths, logs: int, keep: int) -> list[str]:
    """Remove all but the ``keep`` newest (by attempt) checkpoints set aside in the folder ``logs``
    (named as ``paths.old_checkpoint`` names them): the names removed."""
    prefix, _, suffix = os.path.basename(paths.old_checkpoint(0)).partition("0")
    found, odd = [], []
    with os.scandir(logs) as entries:
        for entry in entries:
            if not (entry.name.startswith(prefix) and entry.name.endswith(suffix)):
                continue
            attempt = ascii_int(entry.name[len(prefix) : len(entry.name) - len(suffix)])
            if attempt is None:
                odd.append(entry.name)
            else:
                found.append((attempt, entry.name))
    if odd:  # not one of ours (ours are attempt-N-checkpoint, N in ASCII digits): left alone
        logger.warning(
            "%s: %s left alone: not a checkpoint set aside by gts", paths.old_logs, ", ".join(sorted(odd)[:3])
        )
    removed = [name for _, name in sorted(found, reverse=True)[keep:]]
    for name in removed:
        _remove(name, logs)
    return removed
