"""The one guarded module every checkpoint copy goes through (records/checkpoints.py), against what
a hostile run or user plants: links out of the root on the way and inside a checkpoint, a
checkpoint folder that is a link, FIFOs and sockets, sparse files, and checkpoints that fresh
attempts set aside without bound."""

import os
import socket
import stat
import threading

import pytest

from gpu_task_scheduler.records import checkpoints
from gpu_task_scheduler.records.paths import RunPaths, UnsafePathError, read_step


def _member(root, name, files=None):
    """A run folder under ``root`` whose checkpoint holds ``files`` (name -> bytes)."""
    paths = RunPaths(str(root / name), None)
    os.makedirs(paths.checkpoint)
    for file, data in (files or {}).items():
        with open(os.path.join(paths.checkpoint, file), "wb") as handle:
            handle.write(data)
    return paths


def _outside(tmp_path):
    """A folder outside the result root holding a file that must stay as it is."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious")
    return outside


def _untouched(outside):
    return sorted(os.listdir(outside)) == ["keep.txt"] and (outside / "keep.txt").read_text() == "precious"


def test_a_snapshots_folder_linked_out_of_the_root_is_refused_and_nothing_outside_changes(tmp_path):
    root, outside = tmp_path / "root", _outside(tmp_path)
    paths = _member(root, "m0", {"model.pt": b"weights"})
    os.symlink(outside, paths.meta + "/snapshots")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        checkpoints.take_snapshot(paths, 4)
    with pytest.raises(UnsafePathError):
        checkpoints.collect(paths, set())  # nothing is removed through it either
    assert _untouched(outside)


def test_a_members_records_folder_swapped_for_a_link_before_its_exploit_is_refused(tmp_path):
    root, outside = tmp_path / "root", _outside(tmp_path)
    (outside / "checkpoint").mkdir()
    (outside / "checkpoint" / "theirs").write_text("not ours")
    donor = _member(root, "donor", {"model.pt": b"good"})
    checkpoints.take_snapshot(donor, 4)
    member = _member(root, "member", {"model.pt": b"bad"})
    os.rename(member.meta, member.meta + "-moved")
    os.symlink(outside, member.meta)  # swapped while its exploit waits
    with pytest.raises(UnsafePathError, match="symbolic link"):
        checkpoints.install(member, donor, 4)
    assert (outside / "checkpoint" / "theirs").read_text() == "not ours"
    assert sorted(os.listdir(outside)) == ["checkpoint", "keep.txt"]


def test_an_exploit_puts_the_donors_snapshot_in_place_whole(tmp_path):
    root = tmp_path / "root"
    donor = _member(root, "donor", {"model.pt": b"good", "opt.pt": b"state"})
    os.makedirs(donor.checkpoint + "/sub")
    open(donor.checkpoint + "/sub/deep.bin", "wb").write(b"deep")
    os.chmod(donor.checkpoint + "/opt.pt", 0o640)
    checkpoints.take_snapshot(donor, 4)
    open(donor.checkpoint + "/model.pt", "wb").write(b"later")  # the donor trains on: the snapshot stays
    member = _member(root, "member", {"model.pt": b"bad", "stale.pt": b"x"})
    copied = checkpoints.install(member, donor, 4)
    assert copied.skipped == []
    assert sorted(os.listdir(member.checkpoint)) == ["model.pt", "opt.pt", "sub"]
    assert open(member.checkpoint + "/model.pt", "rb").read() == b"good"
    assert open(member.checkpoint + "/sub/deep.bin", "rb").read() == b"deep"
    assert stat.S_IMODE(os.stat(member.checkpoint + "/opt.pt").st_mode) == 0o640
    assert sorted(os.listdir(member.meta)) == ["checkpoint"]  # no .new, no .old left
    with pytest.raises(FileNotFoundError):
        checkpoints.install(member, donor, 8)  # no such snapshot


def test_a_checkpoint_folder_that_is_a_link_is_never_copied(tmp_path):
    root = tmp_path / "root"
    secrets = tmp_path / "home" / ".ssh"
    secrets.mkdir(parents=True)
    (secrets / "id_rsa").write_text("PRIVATE KEY")
    paths = RunPaths(str(root / "m0"), None)
    os.makedirs(paths.meta)
    os.symlink(secrets, paths.checkpoint)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        checkpoints.take_snapshot(paths, 4)
    assert not os.path.exists(checkpoints.snapshot_path(paths, 4))
    assert not os.path.exists(paths.meta + "/snapshots")  # refused before anything was made


def test_links_inside_a_checkpoint_are_copied_as_links_never_followed(tmp_path):
    root = tmp_path / "root"
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY")
    paths = _member(root, "m0", {"step-12.pt": b"w"})
    os.symlink("step-12.pt", paths.checkpoint + "/latest")  # a framework's own link: still works
    os.symlink(secret, paths.checkpoint + "/key")
    os.symlink("/", paths.checkpoint + "/everything")
    copied = checkpoints.take_snapshot(paths, 4)
    snapshot = copied.path
    assert os.readlink(snapshot + "/latest") == "step-12.pt" and open(snapshot + "/latest", "rb").read() == b"w"
    assert os.readlink(snapshot + "/key") == str(secret) and os.readlink(snapshot + "/everything") == "/"
    assert sorted(os.listdir(snapshot)) == ["everything", "key", "latest", "step-12.pt"]
    assert all(os.path.islink(f"{snapshot}/{name}") for name in ("everything", "key", "latest"))


def _within(seconds, action):
    """``action()``'s result, failing (not hanging) if it takes longer than ``seconds``."""
    found = {}
    thread = threading.Thread(target=lambda: found.setdefault("value", action()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked (opened a FIFO?)"
    return found["value"]


def test_a_fifo_or_a_socket_in_a_checkpoint_is_left_out_never_opened(tmp_path):
    root = tmp_path / "root"
    paths = _member(root, "m0", {"model.pt": b"w"})
    os.mkfifo(paths.checkpoint + "/pipe")
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(paths.checkpoint + "/sock")
        copied = _within(10, lambda: checkpoints.take_snapshot(paths, 4))
    finally:
        listener.close()
    assert sorted(os.path.basename(name) for name in copied.skipped) == ["pipe", "sock"]
    assert os.listdir(copied.path) == ["model.pt"]
    # and a FIFO where the step an attempt resumes from is read: never opened, no step
    marker = tmp_path / "resumed-from"
    os.mkfifo(marker)
    assert _within(10, lambda: read_step(str(marker))) is None


@pytest.mark.parametrize(
    "text, step", [("12", 12.0), ("2.5", 2.5), ("nan", None), ("inf", None), ("-3", None), ("x", None), ("", None)]
)
def test_the_step_an_attempt_resumed_from_is_a_finite_step_or_none(tmp_path, text, step):
    marker = tmp_path / "resumed-from"
    marker.write_text(text)
    assert read_step(str(marker)) == step


def test_a_sparse_file_is_copied_with_its_holes(tmp_path):
    root = tmp_path / "root"
    paths = _member(root, "m0")
    size = 512 << 20
    with open(paths.checkpoint + "/sparse.bin", "wb") as handle:
        handle.seek(100 << 20)
        handle.write(b"data in the middle")
        handle.truncate(size)
    if os.stat(paths.checkpoint + "/sparse.bin").st_blocks * 512 > (1 << 20):
        pytest.skip("this file system stores no holes")
    copied = checkpoints.take_snapshot(paths, 4)
    member = _member(root, "m1")
    checkpoints.install(member, paths, 4)
    for copy in (copied.path + "/sparse.bin", member.checkpoint + "/sparse.bin"):
        info = os.stat(copy)
        assert info.st_size == size and info.st_blocks * 512 < (1 << 20)  # not 512 MiB written
        with open(copy, "rb") as handle:
            handle.seek(100 << 20)
            assert handle.read(18) == b"data in the middle"
            handle.seek(0)
            assert handle.read(4096) == bytes(4096)


def test_a_failed_snapshot_leaves_nothing_half_made(tmp_path, monkeypatch):
    root = tmp_path / "root"
    paths = _member(root, "m0", {"a.pt": b"1", "b.pt": b"2"})
    real = checkpoints._copy_file
    calls = []

    def failing(name, *args):
        calls.append(name)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(name, *args)

    monkeypatch.setattr(checkpoints, "_copy_file", failing)
    with pytest.raises(OSError, match="No space"):
        checkpoints.take_snapshot(paths, 4)
    assert os.listdir(paths.meta + "/snapshots") == []


def test_checkpoints_set_aside_by_fresh_attempts_are_kept_for_the_newest_few_and_cleaned(tmp_path):
    root = tmp_path / "root"
    paths = _member(root, "m0")
    for attempt in range(1, 6):
        open(paths.checkpoint + "/model.pt", "wb").write(b"attempt %d" % attempt)
        checkpoints.set_aside(paths, attempt, keep=2)
        os.mkdir(paths.checkpoint)
    assert sorted(os.listdir(paths.old_logs)) == ["attempt-4-checkpoint", "attempt-5-checkpoint"]
    assert open(paths.old_checkpoint(5) + "/model.pt", "rb").read() == b"attempt 5"
    os.symlink(tmp_path, paths.old_logs + "/attempt-1-checkpoint")  # a planted link is removed, not followed
    assert sorted(checkpoints.clean_set_aside(paths)) == [
        "attempt-1-checkpoint",
        "attempt-4-checkpoint",
        "attempt-5-checkpoint",
    ]
    assert os.listdir(paths.old_logs) == [] and os.path.isdir(tmp_path / "root")


def test_a_copy_given_up_stops_between_files_and_leaves_nothing(tmp_path):
    paths = _member(tmp_path / "root", "m0", {f"part-{k}.pt": b"w" * 100 for k in range(5)})
    asked = []

    def cancelled():
        asked.append(1)
        return len(asked) > 2  # given up after two files

    with pytest.raises(checkpoints.Cancelled):
        checkpoints.take_snapshot(paths, 4, cancelled=cancelled)
    assert os.listdir(paths.meta + "/snapshots") == []


def test_a_checkpoint_nested_990_folders_deep_is_refused_with_a_reason_and_removed_whole(tmp_path):
    """Copying it would hold two descriptors a level and recurse past Python's limit (a
    RecursionError made every snapshot of it 'unsaved' with no word why): it is refused, saying so,
    leaving nothing; and removing such a folder (an old checkpoint, a set-aside one) works at any depth."""
    member = _member(tmp_path / "root", "m,", {"weights.pt": b"w"})
    deep = member.checkpoint
    for _ in range(990):  # os.makedirs recurses once a level
        deep = os.path.join(deep, "d")
        os.mkdir(deep)
    with open(os.path.join(deep, "leaf"), "w") as handle:
        handle.write("x")
    with pytest.raises(checkpoints.TooDeep, match="nested deeper than 100 folders"):
        checkpoints.take_snapshot(member, 4)
    assert not os.path.exists(os.path.join(member.meta, "snapshots", "4.new"))
    assert os.listdir(os.path.join(member.meta, "snapshots")) == []
    checkpoints.set_aside(member, 1, keep=0)  # a fresh attempt: the old checkpoint set aside, none kept
    assert not os.path.exists(member.old_checkpoint(1)) and not os.path.exists(member.checkpoint)
    shallow = _member(tmp_path / "root", "n,", {"weights.pt": b"w"})
    os.makedirs(os.path.join(shallow.checkpoint, *["d"] * checkpoints.MAX_DEPTH))
    checkpoints.take_snapshot(shallow, 4)  # as deep as a copy goes: copied
    assert os.path.isdir(os.path.join(shallow.meta, "snapshots", "4", *["d"] * checkpoints.MAX_DEPTH))


def test_a_snapshot_given_up_after_its_last_file_before_it_is_put_in_place_leaves_nothing(tmp_path):
    """``cancelled`` is asked once a file (two files here, so twice) and once more before the
    rename: given up at that last moment, the whole copy is gone and no snapshot is in place; an
    earlier snapshot of the same step stays as it was."""
    paths = _member(tmp_path / "root", "m0", {"a.pt": b"1", "b.pt": b"2"})
    checkpoints.take_snapshot(paths, 8)  # an earlier one, which a given-up copy must not touch
    asked = []

    def cancelled():
        asked.append(True)
        return len(asked) == 3  # not between files: only before the copy is put in place

    with pytest.raises(checkpoints.Cancelled):
        checkpoints.take_snapshot(paths, 4, cancelled=cancelled)
    assert len(asked) == 3
    assert sorted(os.listdir(os.path.join(paths.meta, "snapshots"))) == ["8"]
    with pytest.raises(checkpoints.Cancelled):  # given up again over the snapshot of 8 being taken anew
        checkpoints.take_snapshot(paths, 8, cancelled=lambda: True)
    assert sorted(os.listdir(os.path.join(paths.meta, "snapshots", "8"))) == ["a.pt", "b.pt"]


@pytest.fixture
def file_system_of(tmp_path):
    """A folder on a file system of the type asked for, of its own (a sparse 300 MiB image on a loop
    device: nothing else writes there, so its count of used blocks is this test's), unmounted after;
    skipped, saying why, where this machine cannot make one (root, a loop device and mkfs.TYPE:
    .ci/run installs xfsprogs)."""
    import shutil
    import subprocess

    mounted = []

    def make(kind):
        if os.geteuid() != 0 or shutil.which(f"mkfs.{kind}") is None or not os.path.exists("/dev/loop-control"):
            pytest.skip(f"a {kind} image needs root, a loop device and mkfs.{kind} here")
        image, folder = tmp_path / f"{kind}.img", tmp_path / kind
        folder.mkdir()
        with open(image, "wb") as handle:
            handle.truncate(300 << 20)
        made = subprocess.run([f"mkfs.{kind}", "-q", str(image)], capture_output=True, text=True, check=False)
        if made.returncode != 0:
            pytest.skip(f"a {kind} image could not be made here ({made.stderr.strip()[:200]})")
        mount = subprocess.run(["mount", "-o", "loop", str(image), str(folder)], capture_output=True, text=True)
        if mount.returncode != 0:
            pytest.skip(f"a {kind} image could not be mounted here ({mount.stderr.strip()[:200]})")
        mounted.append(folder)
        return folder

    try:
        yield make
    finally:
        for folder in mounted:
            subprocess.run(["umount", str(folder)], check=True)


def _used(folder):
    os.sync()
    info = os.statvfs(folder)
    return (info.f_blocks - info.f_bfree) * info.f_frsize


@pytest.mark.parametrize("kind, shares", [("xfs", True), ("ext4", False)])
def test_a_copy_shares_its_blocks_where_the_file_system_clones_and_is_a_full_copy_where_it_does_not(
    file_system_of, kind, shares
):
    """copy_file_range lets XFS (and Btrfs) share a copy's blocks with its source: a snapshot of a
    64 MiB checkpoint, and an exploit putting it in place of another member's, take no disk there,
    and the disk counted for them (disk_use, FIEMAP's shared extents) is the checkpoint's once; on
    ext4 each is a full copy, counted in full. Either way the copy holds the donor's bytes."""
    folder = file_system_of(kind)
    data = os.urandom(64 << 20)
    donor, copier = _member(folder, "donor", {"weights.pt": data}), _member(folder, "copier")
    used = _used(folder)
    checkpoints.take_snapshot(donor, 8)
    snapshot = _used(folder) - used
    used = _used(folder)
    checkpoints.install(copier, donor, 8)
    exploit = _used(folder) - used
    with open(os.path.join(copier.checkpoint, "weights.pt"), "rb") as handle:
        assert handle.read() == data
    # What checkpoints: {max_disk} counts: the donor's checkpoint and snapshot, and the copier's, each
    # block once (three copies of 64 MiB where nothing is shared, one where all is)
    counted = checkpoints.disk_use_of([donor, copier])
    if shares:
        assert snapshot < (1 << 20) and exploit < (1 << 20), (snapshot, exploit)
        assert 64 << 20 <= counted < 65 << 20, counted
    else:
        assert snapshot >= (64 << 20) and exploit >= (64 << 20), (snapshot, exploit)
        assert 3 * 64 << 20 <= counted < 3 * 65 << 20, counted
