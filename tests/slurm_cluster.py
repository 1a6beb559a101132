"""A Slurm cluster of the tests' own: munged, slurmctld and one slurmd per node on this machine,
each node with four GPUs declared as GRES on dummy character devices (Slurm then sets
CUDA_VISIBLE_DEVICES per job) and its tasks bound to the CPUs Slurm gave them (task/affinity).
Needs Debian's slurm-wlm and root (slurmd runs jobs as their users);
the Slurm tests skip with the reason where it cannot start.

Several nodes on one machine: each node is a slurmd of its own, started with ``slurmd -N NAME``
(Debian's Slurm is built with multiple-slurmd support), with ``NodeHostname`` this machine,
``NodeAddr`` 127.0.0.1 and a port of its own; its spool, pid and log files are per node through
``%n`` in their paths. Jobs see their node in ``SLURMD_NODENAME``; ``scontrol update
NodeName=... State=DOWN`` takes one node down (its steps killed) while the other runs on.

Everything lives in a folder of its own (config, state, spool, pid files, and munged's socket
and key: a munged of its own) on free ports, so it
does not touch a cluster this machine may belong to; clients find it through SLURM_CONF. It is
stopped by the pids it started (every job of it cancelled first), never by name.

As a script, for a look by hand: ``python tests/slurm_cluster.py DIR [NODES]`` starts one and prints
the SLURM_CONF to export; Ctrl-C stops it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
GPUS = 4


def why_not() -> str | None:
    """Why no cluster can be started here, or None."""
    if os.name != "posix" or os.geteuid() != 0:
        return "the Slurm tests start slurmd, which needs root"
    missing = [name for name in DAEMONS if shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin") is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _pid(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def _sbin(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin") or name


class SlurmCluster:
    def __init__(self, folder: str, nodes: int = 1) -> None:
        self.folder = os.path.abspath(folder)
        self.conf = os.path.join(self.folder, "slurm.conf")
        self.host = socket.gethostname().split(".")[0]
        # One node: this machine's name, as on a workstation; several: gts0, gts1, ...
        self.nodes = [self.host] if nodes == 1 else [f"gts{index}" for index in range(nodes)]
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self._munged: int | None = None
        self._munge_folder = os.path.join(self.folder, "munge")
        self._munge_socket = os.path.join(self._munge_folder, "socket")

    def _write_config(self) -> None:
        for sub in ("state", "spool", "log", "gpus"):
            os.makedirs(os.path.join(self.folder, sub), exist_ok=True)
        for index in range(GPUS):  # what slurmd checks exists; Slurm numbers them for CUDA_VISIBLE_DEVICES
            device = os.path.join(self.folder, "gpus", f"gpu{index}")
            if not os.path.exists(device):
                os.mknod(device, 0o600 | 0o020000, os.makedev(195, index))
        d = self.folder
        several = len(self.nodes) > 1
        nodes = ",".join(self.nodes)
        per_node = "/%n" if several else ""
        for node in self.nodes if several else ():
            os.makedirs(os.path.join(d, "spool", node), exist_ok=True)
        lines = [
            f"ClusterName=gts{os.getpid()}",
            f"SlurmctldHost={self.host}",
            f"SlurmctldPort={_free_port()}",
            *([] if several else [f"SlurmdPort={_free_port()}"]),
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self._munge_socket}",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool{per_node}",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd{'-%n' if several else ''}.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log",
            f"SlurmdLogFile={d}/log/slurmd{'-%n' if several else ''}.log",
            "ProctrackType=proctrack/linuxproc",
            # Tasks are bound to the CPUs Slurm allocated them, as on most clusters (task/affinity; a
            # cluster with task/cgroup confines them the same way): a job that asks for 1 CPU runs on
            # one core. Of the 8 CPUs a node declares, those this machine has bind for real (a mask
            # of CPUs it lacks leaves the task on every CPU, as without binding), and a step of one
            # task asking more CPUs than this machine has cannot be laid out ("Unable to layout
            # tasks"): the pool's whole-node step is `srun --whole` of one task, which can.
            "TaskPlugin=task/affinity",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu",
            "SlurmdParameters=config_overrides",  # 8 CPUs declared over this machine's real ones
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=batch_sched_delay=0,sched_min_interval=100000",
            "MinJobAge=300",
            "KillWait=5",
            "ReturnToService=2",
            "MpiDefault=none",
        ]
        for node in self.nodes:
            where = f" NodeHostname={self.host} NodeAddr=127.0.0.1 Port={_free_port()}" if several else ""
            lines.append(f"NodeName={node}{where} CPUs=8 RealMemory=8000 Gres=gpu:{GPUS} State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={nodes} Default=YES MaxTime=INFINITE State=UP")
        with open(self.conf, "w", encoding="ascii") as handle:
            handle.write("\n".join(lines) + "\n")
        with open(os.path.join(self.folder, "gres.conf"), "w", encoding="ascii") as handle:
            handle.write(f"AutoDetect=off\nNodeName={nodes} Name=gpu File={d}/gpus/gpu[0-{GPUS - 1}]\n")

    def _start_munged(self) -> None:
        """A munged of this cluster's own, on a socket in its folder (AuthInfo=socket=...): never the
        machine's /run/munge one, which another test run on this machine (or its end) may start, stop
        or take over. Once a test Slurm shared it, and its socket was gone under a running test
        ("Munge encode failed: Failed to access /run/munge/munge.socket.2")."""
        folder = self._munge_folder  # as root, as every client of it is (the daemons, the tests' jobs)
        os.makedirs(folder, mode=0o755, exist_ok=True)
        key = os.path.join(folder, "munge.key")
        if not os.path.exists(key):
            subprocess.run([_sbin("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        options = [
            f"--socket={self._munge_socket}",
            f"--key-file={key}",
            f"--pid-file={folder}/munged.pid",
            f"--seed-file={folder}/munged.seed",
            f"--log-file={folder}/munged.log",
        ]
        subprocess.run([_sbin("munged"), "--force", *options], check=True, capture_output=True)
        self._munged = _pid(os.path.join(folder, "munged.pid"))

    def start(self, timeout: float = 60.0) -> None:
        self._write_config()
        self._start_munged()
        subprocess.run([_sbin("slurmctld"), "-f", self.conf], check=True, env=self.env)
        for node in self.nodes:
            named = ["-N", node] if len(self.nodes) > 1 else []
            subprocess.run([_sbin("slurmd"), "-f", self.conf, *named], check=True, env=self.env)
        deadline = time.monotonic() + timeout
        while True:
            state = self.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.split()
            if len(state) == len(self.nodes) and all(s in ("idle", "mixed", "allocated") for s in state):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the test Slurm cluster did not come up (node state {state!r})\n{self.logs()}")
            time.sleep(0.2)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([_sbin(argv[0]), *argv[1:]], capture_output=True, text=True, env=self.env, check=check)

    def jobs(self) -> list[str]:
        """The ids of the jobs the cluster still runs or queues."""
        listed = self.run("squeue", "-h", "-r", "-o", "%i", check=False).stdout.split()
        return [job for job in listed if job]

    def cancel_all(self, timeout: float = 60.0) -> None:
        jobs = self.jobs()
        if jobs:
            self.run("scancel", "--full", "--signal=KILL", *jobs, check=False)
            self.run("scancel", *jobs, check=False)
        deadline = time.monotonic() + timeout
        while self.jobs() and time.monotonic() < deadline:
            time.sleep(0.2)

    def set_node(self, node: str, state: str, reason: str = "a test") -> None:
        """``DOWN`` (its jobs' steps there are killed) or ``RESUME``."""
        args = [f"NodeName={node}", f"State={state}"] + ([f"Reason={reason}"] if state != "RESUME" else [])
        self.run("scontrol", "update", *args)

    def logs(self) -> str:
        texts = []
        daemons = ["slurmd.log"] if len(self.nodes) == 1 else [f"slurmd-{node}.log" for node in self.nodes]
        for name in ["slurmctld.log", *daemons]:
            try:
                with open(os.path.join(self.folder, "log", name), encoding="utf-8", errors="replace") as handle:
                    texts.append(f"--- {name}\n" + "".join(handle.readlines()[-30:]))
            except OSError:
                pass
        return "\n".join(texts)

    def stop(self) -> None:
        try:
            self.cancel_all()
        finally:
            names = ["slurmd.pid"] if len(self.nodes) == 1 else [f"slurmd-{node}.pid" for node in self.nodes]
            for name in [*names, "slurmctld.pid"]:
                _stop(_pid(os.path.join(self.folder, name)))
            if self._munged is not None:
                _stop(self._munged)


def _stop(pid: int | None, timeout: float = 20.0) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                if handle.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    return  # exited; only not reaped yet
        except (OSError, IndexError):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    reason = why_not()
    if reason:
        sys.exit(reason)
    cluster = SlurmCluster(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    cluster.start()
    print(f"export SLURM_CONF={cluster.conf}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
