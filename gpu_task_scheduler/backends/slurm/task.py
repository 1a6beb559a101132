"""What one task of a sweep's Slurm job array runs: the supervisor of one attempt.

``python -m gpu_task_scheduler.backends.slurm.task BATCH`` (the last line of
the array's batch script, after the ``setup`` lines) reads the batch file the
scheduler wrote under the result root, takes the attempt of its
``SLURM_ARRAY_TASK_ID``, and runs it as the local backend does (its folder,
its log, the runner or the command wrapper, the outcome file with the
attempt's token) with the ``CUDA_VISIBLE_DEVICES`` Slurm gave the job.

It talks to the scheduler through files on the shared file system, in the
root's ``.gts/slurm/events/``: ``TOKEN.N.start`` once the run started (node,
pid, job) and ``TOKEN.N.end`` once it has ended (N: the job's restart count,
so that a requeued job's new start is told apart); the scheduler gives an
attempt up by writing ``TOKEN.abandoned``.

The attempt's lease (``records/lease.py``) is renewed as long as the attempt
is not given up and the file system takes the renewal; otherwise the run is
stopped (SIGTERM, the grace period, SIGKILL), so that a job Slurm lost sight
of never runs beside its retry. A requeued job's new start first waits until
the old one's lease is over. SIGTERM (``gts stop``, Slurm's ``--signal``
before the time limit, a preemption) stops the run with the grace period, so
that a task can save a checkpoint; the end file says whether it came near the
time limit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ...records.lease import LeaseHolder, LeaseTerms, lease_state, wait_over
from ...records.paths import RunPaths, atomic_write
from ...records.protocol import Outcome
from ..supervisor import NodeWarmStarts, cannot_run, keep_lease, log_line, start_run

# SIGTERM this close to the end of the job's time (beyond the lead the scheduler asked Slurm for)
# was Slurm's warning of its time limit: Slurm may send it up to a minute early.
LIMIT_SLACK = 90.0
# The scheduler's kill: the supervisor kills its run at once (and still reports its end).
KILL_SIGNAL, KILL_SIGNAL_NUMBER = "USR2", signal.SIGUSR2
KILLED = threading.Event()


class Events:
    """This attempt's files in the events folder."""

    def __init__(self, folder: str, token: str, incarnation: int) -> None:
        self.folder, self.token, self.incarnation = folder, token, incarnation

    def path(self, kind: str) -> str:
        return os.path.join(self.folder, f"{self.token}.{self.incarnation}.{kind}")

    def abandoned(self) -> bool:
        return os.path.exists(os.path.join(self.folder, f"{self.token}.abandoned"))

    def write(self, kind: str, record: dict[str, Any]) -> None:
        atomic_write(self.path(kind), json.dumps({**record, "incarnation": self.incarnation}).encode(), durable=True)


def main(argv: list[str] | None = None) -> int:
    signalled = threading.Event()  # first: a SIGTERM from now on stops the run (or keeps it from starting)
    signal.signal(signal.SIGTERM, lambda signum, frame: signalled.set())

    def kill(signum: int, frame: Any) -> None:
        KILLED.set()
        signalled.set()

    signal.signal(KILL_SIGNAL_NUMBER, kill)
    args = sys.argv[1:] if argv is None else argv
    try:
        with open(args[0], encoding="utf-8") as handle:
            batch = json.load(handle)
    except (OSError, ValueError, IndexError) as error:
        print(
            f"gpu_task_scheduler: this node ({socket.gethostname()}) cannot read the sweep's batch file "
            f"({error}): the result root must be on a file system every node sees, at the same path",
            file=sys.stderr,
        )
        return 2
    index = int(os.environ["SLURM_ARRAY_TASK_ID"])
    run = batch["runs"][index]
    events = Events(batch["events"], run["token"], int(os.environ.get("SLURM_RESTART_COUNT") or 0))
    return supervise(run, batch, events, signalled)


def supervise(
    run: dict[str, Any],
    batch: dict[str, Any],
    events: Events,
    signalled: threading.Event,
    *,
    killed: threading.Event = KILLED,
    node: str | None = None,
    job: str | None = None,
    gpus: str | None = None,
    slot: str | None = None,
    cpus: tuple[int, ...] = (),
    on_started: Callable[[int], None] | None = None,
    on_ended: Callable[[], dict[str, Any]] | None = None,
    warm: NodeWarmStarts | None = None,
) -> int:
    """Run the attempt ``run`` to its end (or until ``signalled``; ``killed``: at once) and write its
    start and end to ``events``. A pool's agent (``agent.py``) supervises several attempts at once in
    threads of its own: it names the node, the job, the GPUs, and hears of the run's pid
    (``on_started``), and adds what it measured of the run to its end (``on_ended``: its GPU memory
    peak) and forks Python runs from its node's warm process (``warm``); an array task takes them
    from Slurm's environment, and starts its one attempt cold."""
    node = node or socket.gethostname().split(".")[0]
    job = job or f"{os.environ.get('SLURM_ARRAY_JOB_ID', '?')}_{os.environ.get('SLURM_ARRAY_TASK_ID', '?')}"
    problem = cannot_run(run, node)
    if problem is not None:
        events.write("end", {"lost": problem})
        return 2
    terms = LeaseTerms(batch["lease_every"], run["grace_period"])
    lease = LeaseHolder(run["lease"], run["token"])
    held = lease_state(run["lease"], run["token"])
    if held is not None and held[0] != "released":  # a requeued job: its earlier start must be over first
        wait_over(run["lease"], run["token"], terms)
    try:
        lease.renew()
    except OSError as error:
        events.write("end", {"lost": f"{node} cannot write the run's lease {run['lease']}: {error}"})
        return 2
    # The lease is taken: only now may the attempt start, if the scheduler still wants it (records/lease.py).
    if events.abandoned() or signalled.is_set():
        lease.release()
        events.write("end", {"lost": "the scheduler gave the attempt up before it started", "signalled": True})
        return 0
    started = time.monotonic()
    try:
        handle, ended = start_run(run, os.environ.get("CUDA_VISIBLE_DEVICES", "") if gpus is None else gpus, cpus, warm)
    except OSError as error:  # as locally: the run fails, and its log says why
        log_line(run["log"], f"gpu_task_scheduler: the run could not start on {node}: {error}\n")
        lease.release()
        events.write("end", {"returncode": 127, "strays": [], "unstoppable": [], "node": node})
        return 1
    if on_started is not None:
        on_started(handle.pid)
    where = {"node": node, "pid": handle.pid, "job": job, "at": time.time()}
    events.write("start", where if slot is None else {**where, "slot": slot})
    fenced: list[str] = []
    given_up = "the scheduler gave this attempt up (Slurm requeued its job, or lost its node)"
    threading.Thread(
        target=keep_lease,
        args=(lambda timeout: not events.abandoned(), lease, terms, handle, ended, run["log"], fenced),
        kwargs={"given_up": given_up},
        daemon=True,
    ).start()
    paths = RunPaths(run["work_dir"], None)
    succeeded_before: list[bool] = []  # whether the run had recorded its success when a SIGTERM came
    stopping = threading.Thread(
        target=_stop_on_signal,
        args=(signalled, handle, ended, terms, lambda: succeeded_before.append(succeeded(paths, run["token"]))),
        kwargs={"killed": killed},
        daemon=True,
    )
    stopping.start()
    while not ended.wait(0.5):  # in steps: SIGTERM's handler runs in this thread
        pass
    result = handle.reap()
    lease.release()  # its processes are gone: a retry need not wait
    limit = None
    if signalled.is_set() and batch.get("time_seconds"):
        near = batch["time_seconds"] - batch["signal_lead"] - LIMIT_SLACK
        if time.monotonic() - started >= near:
            limit = f"stopped at Slurm's time limit (time: {batch['time']})"
    if signalled.is_set() and not any(succeeded_before) and succeeded(paths, run["token"]):
        cut_short(paths, run["log"])
    events.write(
        "end",
        {
            "returncode": result.returncode,
            "strays": list(result.strays),
            "unstoppable": list(result.unstoppable),
            "fenced": fenced[0] if fenced else None,
            "signalled": signalled.is_set(),
            "limit": limit,
            **(on_ended() if on_ended is not None else {}),
        },
    )
    code = result.returncode
    return code if 0 <= code < 256 else 128 + (-code if code < 0 else 1)


def succeeded(paths: RunPaths, token: str) -> bool:
    """Whether this attempt's outcome file records its success."""
    if paths.unsafe(records_only=True) is not None:
        return False
    outcome = Outcome.read(paths.outcome, token=token)
    return outcome is not None and outcome.succeeded


def set_aside_success(run: dict[str, Any], token: str) -> None:
    """Slurm took the run's job (or allocation) down while it ran: a success the run recorded is of
    a run cut short (it saved on SIGTERM and exited 0), set aside so that it runs again. One
    recorded just before Slurm's signal is set aside too: running it again is the safe side."""
    paths = RunPaths(run["work_dir"], None)
    if succeeded(paths, token):
        cut_short(paths, run.get("log"))


def cut_short(paths: RunPaths, log: str | None) -> None:
    """The run recorded its success only after Slurm's SIGTERM reached the job: a requeue or a
    preemption signals every process of it, and a run that saves a checkpoint on SIGTERM and exits 0
    (or a wrapper not yet signalled when its command did) is a run cut short, not one that ended. Its
    outcome is set aside (``outcome.json.cut-short``): the scheduler then runs it again, as any
    attempt Slurm took down (or records the stop it asked for, or the time limit)."""
    try:
        os.replace(paths.outcome, paths.outcome + ".cut-short")
    except OSError:
        return
    log_line(
        log,
        "gpu_task_scheduler: the run recorded its success only after Slurm's SIGTERM (a requeue, a "
        "preemption, a stop or the time limit): it was cut short, not finished\n",
    )


def _stop_on_signal(
    signalled: threading.Event,
    handle: Any,
    ended: threading.Event,
    terms: LeaseTerms,
    on_signal: Callable[[], Any],
    *,
    killed: threading.Event = KILLED,
) -> None:
    """SIGTERM to this supervisor: stop the run, SIGKILL it when the grace period ends."""
    signalled.wait()
    on_signal()  # at once: whether the run had recorded its success before
    if ended.is_set():
        return
    if not killed.is_set():
        handle.stop()
        stopped = time.monotonic()
        while not ended.wait(max(0.01, min(0.2, terms.grace_period))) and not killed.is_set():
            if time.monotonic() - stopped >= terms.grace_period:
                break
    if not ended.is_set():
        handle.kill()


if __name__ == "__main__":
    status = main()
    # Everything is written: end now, without the interpreter's finalization. In the full test suite
    # a supervisor that had written its end file now and then lived on for over a minute, keeping its
    # job RUNNING (the cause was not pinned down; its daemon threads are the suspects).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
