"""Where a Slurm pool's driver and its agents meet: files under the result root, no port.

``<root>/.gts/slurm/pool/``:

* ``pool.json``: what every agent needs (the events folder, the lease terms, the
  pool's id that names its jobs), and ``options.pickle``, the sweep's options
  (the agents place runs by them as a local sweep would);
* ``queue/SEQ.TOKEN.json``: an attempt waiting for a node, in the order the engine
  started it. An agent takes one by renaming it into its own ``claimed/``: a
  rename is atomic on every POSIX file system (NFS and Lustre included), so
  exactly one agent, or the driver withdrawing it, wins;
* ``agents/AGENT/``: one agent's ``beat.json`` (its node, slots and runs,
  rewritten every second) and ``claimed/`` (its attempts until their end was
  written);
* ``jobs/NAME.sh``: the batch script of the allocations, ``drain/JOB``: the
  job was warned of its time limit (its batch script writes it on Slurm's
  ``--signal=B:USR1``), ``closed``: the sweep needs no more nodes;
* ``state.json``: the pool as the driver last saw it (``gts status`` reads it);
  ``allocations``: how many allocations ``gts pool`` asked the driver to keep.

An attempt's start and end go to ``events/`` as an array task's do
(``task.py``), with two more kinds there: ``TOKEN.stop`` and ``TOKEN.kill``
(the driver's word to the agent that runs it) and ``TOKEN.drained`` (the agent
stopped it because its allocation ends: the attempt is handed back, not lost).

Per run nothing stays here: its queue entry moves to a claim, which the agent
deletes once the end is written, and the driver deletes the events once it has
read the end. A pool of thousands of runs leaves only the run folders' own files.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from ...finite import ascii_int
from ...records.paths import META, atomic_write, read_json

AGENT_BEAT = 1.0  # seconds between two heartbeats of an agent


class PoolFiles:
    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.folder = os.path.join(self.root, META, "slurm", "pool")
        self.settings = os.path.join(self.folder, "pool.json")
        self.options = os.path.join(self.folder, "options.pickle")
        self.queue = os.path.join(self.folder, "queue")
        self.agents = os.path.join(self.folder, "agents")
        self.jobs = os.path.join(self.folder, "jobs")
        self.drains = os.path.join(self.folder, "drain")
        self.events = os.path.join(self.folder, "events")
        self.closed = os.path.join(self.folder, "closed")
        self.state = os.path.join(self.folder, "state.json")
        self.target = os.path.join(self.folder, "allocations")  # `gts pool --allocations K`: the pool's size now

    def make(self) -> None:
        for folder in (self.queue, self.agents, self.jobs, self.drains, self.events):
            os.makedirs(folder, exist_ok=True)

    def claimed(self, agent: str) -> str:
        return os.path.join(self.agents, agent, "claimed")

    def beat(self, agent: str) -> str:
        return os.path.join(self.agents, agent, "beat.json")

    def drain(self, job: str) -> str:
        return os.path.join(self.drains, job)

    def event(self, token: str, kind: str) -> str:
        return os.path.join(self.events, f"{token}.{kind}")

    @staticmethod
    def listdir(folder: str) -> list[str]:
        """A folder's names; none where it is gone (an agent's folder removed while read)."""
        try:
            return os.listdir(folder)
        except OSError:
            return []

    def remove_agent(self, agent: str) -> None:
        """An agent of an allocation that is over: its folder goes (files stay few)."""
        for entry in self.listdir(self.claimed(agent)):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.claimed(agent), entry))
        for path in (self.claimed(agent), self.beat(agent), os.path.join(self.agents, agent)):
            with contextlib.suppress(OSError):
                os.rmdir(path) if os.path.isdir(path) else os.unlink(path)

    def live_attempts(self, silence: float = 60.0) -> tuple[int, int]:
        """Attempts queued, and claimed by an agent that beat within ``silence`` seconds (its node's
        clock): what a detached pool still runs, without asking Slurm."""
        try:
            queued = sum(1 for name in os.listdir(self.queue) if token_of(name))
            agents = os.listdir(self.agents)
        except OSError:
            return 0, 0
        claimed = 0
        for agent in agents:
            beat = read_json(self.beat(agent))
            if isinstance(beat, dict) and not beat.get("over") and time.time() - float(beat.get("at") or 0) < silence:
                try:
                    claimed += sum(1 for name in os.listdir(self.claimed(agent)) if token_of(name))
                except OSError:
                    pass
        return queued, claimed


def entry_name(seq: int, token: str) -> str:
    return f"{seq:09d}.{token}.json"


def token_of(entry: str) -> str | None:
    """The attempt's token in a queue entry's name, or None for a name that is no entry."""
    parts = entry.split(".")
    if len(parts) == 3 and ascii_int(parts[0]) is not None and parts[2] == "json" and parts[1]:
        return parts[1]
    return None


def job_of(agent: str) -> str:
    """The allocation an agent runs in: its id is ``JOB.RESTARTS.NODE.NONCE``."""
    return agent.split(".", 1)[0]


Attempt = tuple[str, dict[str, Any], str]  # an earlier start's attempt: its token, its run, its entry's name


def left_attempts(files: PoolFiles, alive: set[str], seq: int) -> tuple[dict[str, Attempt], list[tuple[str, str]], int]:
    """What an earlier start left, for a later one: the attempts to follow by run name (queued, or
    claimed by an agent of an allocation in ``alive``), the given up ones' ``(lease, token)`` (to be
    over before anything runs again), and the highest entry number seen (``seq`` or more).

    A run has one attempt to follow: of two of one run (one given up whose claim lingers, and the
    retry queued before the kill), the newer by its entry's number; the older is given up. The
    claims of allocations not in ``alive`` are given up and their agents' folders removed. The events
    of attempts no one follows are swept, but the words that give attempts up: an agent that was in
    fact alive (squeue slow to list it) takes the lease after the wait, and must find the word."""
    adoptable: dict[str, Attempt] = {}
    stale: list[tuple[str, str]] = []

    def found(attempt: Attempt) -> None:
        name = attempt[1]["name"]
        earlier = adoptable.get(name)
        if earlier is not None and earlier[0] != attempt[0]:
            older, attempt = sorted((earlier, attempt), key=lambda item: int(item[2].split(".")[0]))
            give_up(files, older, stale)
        adoptable[name] = attempt

    def entries(folder: str) -> list[Attempt]:
        nonlocal seq
        listed = []
        for entry in files.listdir(folder):
            if not token_of(entry):
                continue
            seq = max(seq, int(entry.split(".")[0]))
            run = read_json(os.path.join(folder, entry))
            if isinstance(run, dict) and isinstance(run.get("name"), str):
                listed.append((str(run["token"]), run, entry))
        return listed

    for attempt in entries(files.queue):
        found(attempt)
    for agent in files.listdir(files.agents):
        for attempt in entries(files.claimed(agent)):
            if job_of(agent) in alive:
                found(attempt)
            else:
                give_up(files, attempt, stale)
        if job_of(agent) not in alive:
            files.remove_agent(agent)
    followed = {token for token, _run, _entry in adoptable.values()} | {token for _lease, token in stale}
    for name in files.listdir(files.events):
        if name.partition(".")[0] not in followed:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(files.events, name))
    return adoptable, stale, seq


def give_up(files: PoolFiles, attempt: Attempt, stale: list[tuple[str, str]]) -> None:
    """An earlier start's attempt that no start follows: withdrawn from the queue (an agent's claim
    of it then fails), told abandoned (an agent that took it stops it, or never starts it: it looks
    after it took the run's lease), and its lease added to ``stale``, to be waited for."""
    token, run, entry = attempt
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(files.queue, entry))
    with contextlib.suppress(OSError):
        atomic_write(files.event(token, "abandoned"), b"")
    stale.append((str(run["lease"]), token))
