"""Slurm's commands, as the driver calls them: ``sbatch``, ``squeue``, ``scancel``, ``scontrol``.

Slurm's own command-line tools, not a client library: they are on every
login node, speak to any Slurm version the site runs, and need nothing
installed. (submitit, which Hydra's launcher uses, submits one pickled
function per job and polls ``sacct``; this backend needs job arrays over
ready-made run folders, and ``sacct`` only works where the site keeps an
accounting database, so it reads ``squeue`` and its runs' own files.) Every
call is an argument list, never a shell line, with a time limit; what Slurm
says on failure is part of the error.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence

from ...errors import GTSError
from ...finite import ascii_int
from ...recordclass import Record

CALL_TIMEOUT = 60.0  # seconds one call of a Slurm command may take (slurmctld can be slow, never forever)
# A task whose state is one of these may still start or is running: it is not over.
LIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING"})
COMMANDS = ("sbatch", "squeue", "scancel", "scontrol")


class TaskState(Record):
    state: str  # squeue's %T: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, NODE_FAIL, ...
    node: str
    reason: str

    @property
    def live(self) -> bool:
        return self.state in LIVE


def missing_commands() -> list[str]:
    return [name for name in COMMANDS if shutil.which(name) is None]


def call(argv: Sequence[str], *, what: str) -> str:
    """Run a Slurm command; its standard output, or GTSError with what it said."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=CALL_TIMEOUT, check=False, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError as error:
        raise GTSError(f"{what}: {argv[0]} not found (backend slurm needs Slurm's commands on PATH)") from error
    except subprocess.TimeoutExpired as error:
        raise GTSError(f"{what}: {argv[0]} did not answer within {CALL_TIMEOUT:g}s") from error
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise GTSError(f"{what}: {said}")
    return done.stdout


def submissions_in_flight(job_names: Iterable[str]) -> list[int]:
    """The ``sbatch`` processes on this machine still submitting an array with one of these names:
    a scheduler killed while sbatch ran leaves it running, and its array may appear in Slurm's
    queue only after the next start has looked for it there."""
    wanted = {f"--job-name={name}".encode() for name in job_names}
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if ascii_int(entry) is None:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"sbatch" and wanted.intersection(argv):
            found.append(int(entry))
    return found


def submit(args: Sequence[str], script: str) -> str:
    """Submit a batch script; the job's id."""
    out = call(["sbatch", "--parsable", *args, script], what="sbatch refused the sweep's runs")
    job = out.strip().splitlines()[-1].split(";")[0] if out.strip() else ""
    if ascii_int(job) is None:
        raise GTSError(f"sbatch answered {out.strip()!r}, not a job id")
    return job


def test_submission(args: Sequence[str]) -> None:
    """Whether Slurm would take a job with these arguments (``sbatch --test-only``: nothing is queued)."""
    call(["sbatch", "--test-only", *args, "--wrap=true"], what="Slurm would not take the sweep's runs")


def states(jobs: Iterable[str]) -> dict[str, TaskState]:
    """The state of every task of these jobs that slurmctld still knows, by ``JOB_INDEX``."""
    jobs = sorted(set(jobs), key=int)
    if not jobs:
        return {}
    try:
        out = call(["squeue", "-h", "-r", "-t", "all", "-j", ",".join(jobs), "-o", "%i|%T|%N|%r"], what="squeue")
    except GTSError as error:
        if "Invalid job id" in str(error):  # none of them is known any more
            return {}
        raise
    return parse_states(out)


def states_by_name(names: Iterable[str]) -> dict[str, dict[str, TaskState]]:
    """The tasks of the jobs with these names (each sweep's array has a name of its own), by name."""
    names = sorted(set(names))
    if not names:
        return {}
    out = call(["squeue", "-h", "-r", "-t", "all", f"--name={','.join(names)}", "-o", "%i|%T|%N|%r|%j"], what="squeue")
    found: dict[str, dict[str, TaskState]] = {}
    for line in out.splitlines():
        head, _, name = line.strip().rpartition("|")
        for task, state in parse_states(head).items():
            found.setdefault(name, {})[task] = state
    return found


def jobs_named(name: str) -> dict[str, TaskState]:
    """The jobs (not arrays) with this name that slurmctld still knows, by job id, with the nodes
    each runs on (``%N``, compressed: ``gn[0-1]``)."""
    out = call(["squeue", "-h", "-t", "all", f"--name={name}", "-o", "%i|%T|%N|%r"], what="squeue")
    found = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and ascii_int(parts[0]) is not None:
            found[parts[0]] = TaskState(parts[1], parts[2], parts[3])
    return found


def hostnames(nodes: str) -> list[str]:
    """``gn[0-1]`` as ``["gn0", "gn1"]`` (``scontrol show hostnames``)."""
    if not nodes or nodes in ("(null)", "n/a"):
        return []
    return call(["scontrol", "show", "hostnames", nodes], what="scontrol show hostnames").split()


def parse_states(out: str) -> dict[str, TaskState]:
    found = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and "_" in parts[0]:
            found[parts[0]] = TaskState(parts[1], parts[2], parts[3])
    return found


def task_list(job: str, indexes: Iterable[int]) -> str:
    """``JOB_[0-3,7]``: tasks of one array as scancel and scontrol take them."""
    ranges: list[list[int]] = []
    for index in sorted(set(indexes)):
        if ranges and ranges[-1][1] == index - 1:
            ranges[-1][1] = index
        else:
            ranges.append([index, index])
    return f"{job}_[{','.join(str(a) if a == b else f'{a}-{b}' for a, b in ranges)}]"


def cancel(tasks: Sequence[str], signal_name: str | None = None, *, supervisor_only: bool = False) -> None:
    """Cancel tasks (``JOB_[...]``); with a signal, only send it: to every process of the job, the
    batch script's too (``--full``), or to the batch script alone (the supervisor: ``--batch``)."""
    if not tasks:
        return
    scope = "--batch" if supervisor_only else "--full"
    argv = ["scancel", *([f"--signal={signal_name}", scope] if signal_name else []), *tasks]
    call(argv, what="scancel")


def set_throttle(job: str, throttle: int) -> None:
    """Set an array's %N. scontrol reports each task it could not update: once some tasks of the
    array have ended (or one was requeued, and split off), it fails for them while the array's
    throttle is set; only other complaints are errors."""
    try:
        call(["scontrol", "update", f"JobId={job}", f"ArrayTaskThrottle={throttle}"], what="scontrol update")
    except GTSError as error:
        said = str(error).removeprefix("scontrol update: ").splitlines()
        if not all("No error" in line or "already finished" in line for line in said):
            raise


def hold(job: str, held: bool) -> None:
    call(["scontrol", "hold" if held else "release", job], what=f"scontrol {'hold' if held else 'release'}")


def show_config() -> dict[str, str]:
    """``scontrol show config``, as ``{"MaxArraySize": "1001", ...}``."""
    out = call(["scontrol", "show", "config"], what="scontrol show config")
    return {match[1]: match[2].strip() for match in re.finditer(r"^(\w+)\s*=\s*(.*)$", out, re.MULTILINE)}


def max_array_size(config: Mapping[str, str]) -> int:
    """Slurm's MaxArraySize: an array's task indexes are below it."""
    value = config.get("MaxArraySize", "")
    number = ascii_int(value)
    return number if number is not None else 1001


_DEFAULT_MEMORY = ("DefMemPerCPU", "DefMemPerNode", "DefMemPerGPU")


def memory_problem(config: Mapping[str, str], *, mem: str | None, extra: Sequence[str]) -> str | None:
    """Why runs would each hold a whole node, or None.

    On a cluster that counts memory (``SelectTypeParameters=CR_Core_Memory`` and the like) with no
    default (no ``DefMemPerCPU``, ``DefMemPerNode`` or ``DefMemPerGPU``), a job that asks for no
    memory is given the node's whole memory: one run at a time on a node of 4 GPUs, and nothing
    says why. Said before anything is submitted, with what to write."""
    if mem is not None or any(argument.lstrip().startswith("--mem") for argument in extra):
        return None
    if "MEMORY" not in config.get("SelectTypeParameters", "").upper():
        return None
    for key in _DEFAULT_MEMORY:
        value = config.get(key, "").upper()
        if value and value not in ("UNLIMITED", "0", "(NULL)", "NONE"):
            return None
    return (
        f"this Slurm cluster counts memory (SelectTypeParameters={config['SelectTypeParameters']}) and gives a job "
        "that asks for none no default (DefMemPerCPU, DefMemPerNode and DefMemPerGPU are unset): each run is given "
        "a whole node's memory and runs alone on its node, whatever GPUs are free there. Say what a run needs with "
        "scheduler_config: {slurm: {mem: 16G}} (or slurm.mem=16G on gts run's command line)"
    )


def partition_nodes(partition: str | None) -> list[str]:
    """The host names of the partition's nodes (NodeHostname: several nodes may share one; the default
    partition's without one)."""
    argv = ["sinfo", "-h", "-N", "-o", "%n"] + (["-p", partition] if partition else [])
    if shutil.which("sinfo") is None:
        return []
    return sorted(set(call(argv, what="sinfo").split()))


class Partition(Record):
    """What a partition's nodes have, from one ``sinfo`` (by node name: several may share a host)."""

    nodes: int
    cpus: int  # CPUs of the node that has the fewest
    gpus: int  # GRES GPUs of the GPU node that has the fewest; 0: no node has any


def partition(name: str | None) -> Partition | None:
    """The partition's nodes (the default partition's for None); None when Slurm's sinfo is not
    here to say."""
    if shutil.which("sinfo") is None:
        return None
    argv = ["sinfo", "-h", "-N", "-o", "%N %c %G"] + (["-p", name] if name else [])
    nodes: dict[str, tuple[int, int]] = {}
    for line in call(argv, what="sinfo").splitlines():
        fields = line.split(None, 2)
        if len(fields) >= 2:
            nodes[fields[0]] = (ascii_int(fields[1]) or 0, gres_gpus(fields[2] if len(fields) > 2 else ""))
    cpus = [count for count, _ in nodes.values() if count]
    gpus = [count for _, count in nodes.values() if count]
    return Partition(nodes=len(nodes), cpus=min(cpus, default=0), gpus=min(gpus, default=0))


def gres_gpus(gres: str) -> int:
    """The GPUs in a node's GRES as sinfo's %G prints it, kinds comma-separated.

    >>> gres_gpus("gpu:4"), gres_gpus("gpu:a100:4(S:0-1),gpu:v100:2(S:0)"), gres_gpus("(null)")
    (4, 6, 0)
    >>> gres_gpus("gpu:h100:8(S:0-1),shard:2")
    8
    """
    count = 0
    for kind in re.split(r",(?![^(]*\))", gres.strip()):  # commas outside parentheses
        fields = kind.split("(", 1)[0].split(":")
        if fields[0] == "gpu" and len(fields) >= 2:
            count += ascii_int(fields[-1]) or 0
    return count


# File systems whose files only this machine sees: a result root there cannot serve other nodes.
LOCAL_FILE_SYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "overlay", "f2fs", "vfat", "exfat", "zfs", "devtmpfs"}
)


def file_system_of(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the file system ``path`` is on (from the mount table), or None when unknown."""
    path = os.path.realpath(path)
    best, kind = "", None
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount = fields[4].encode().decode("unicode_escape")
        inside = path == mount or path.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, right.split()[0]
    return kind


def shared_root_problem(root: str, fs_type: str | None, nodes: Sequence[str], host: str) -> str | None:
    """Why the result root cannot serve the partition's nodes (it is on a file system only this
    machine sees, and other machines run the jobs), or None."""
    others = [node for node in nodes if node.split(".")[0] != host.split(".")[0]]
    if fs_type in LOCAL_FILE_SYSTEMS and others:
        shown = ", ".join(others[:5]) + (" ..." if len(others) > 5 else "")
        return (
            f"the result root {root} is on a {fs_type} file system, which only this machine sees, and the "
            f"runs would run on other nodes ({shown}): put it on a file system every node sees at the same "
            "path (your home or project space: NFS, Lustre, GPFS, BeeGFS)"
        )
    return None
