"""The seam between the engine and the way a run's process is started.

The engine decides *what* runs *where* and *when it must stop*; a launcher
starts one attempt of a run and hands back a :class:`Handle` through which
the engine stops it and, once it has exited, collects how it ended. The
local launcher (``backends/local``) starts a fresh process per run on this
machine; tests use a launcher without processes (``tests/fake_launcher.py``);
other launchers (pre-warmed processes, other machines) fit the same two
methods. Every launcher passes the same contract tests
(``tests/test_launcher_contract.py``).

Threading: ``on_exit`` may be called from any thread (it only posts an
event); every other method is called from the engine's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from ..gpu.devices import Slot
from ..recordclass import Record
from ..records.paths import RunPaths
from ..records.status import RunStatus
from ..sweep.expand import RunSpec
from ..sweep.options import SchedulerOptions


class LaunchError(Exception):
    """This attempt of the run could not be started (recorded as the run's failure).

    ``details``: the traceback, when the user's code raised (it is also written
    to the run's log, where the summary points)."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details


class Attempt(NamedTuple):
    """One attempt of a run on a slot."""

    spec: RunSpec
    slot: Slot
    paths: RunPaths
    token: str  # unique to this attempt; the run's outcome file must carry it
    number: int  # 1 for the first attempt recorded in the ledger
    # The step this attempt goes on from (the last one an earlier attempt reported), or None: it
    # starts afresh. A resumed attempt keeps the run's checkpoint folder.
    resume_step: float | None = None


class Ended(NamedTuple):
    """What the launcher knows about an attempt's end, beyond its outcome file."""

    returncode: int  # as Popen gives it: negative for a signal
    strays: tuple[int, ...] = ()  # processes it left outside its process group, stopped
    unstoppable: tuple[int, ...] = ()  # ... and those that could not be stopped
    lost: str | None = None  # the launcher lost the attempt (its machine went away): how, in words
    # The cluster stopped it (its time limit: TIMED_OUT; cancelled there: INTERRUPTED), and why in words.
    stopped: tuple[RunStatus, str] | None = None
    # The cluster took its machine back on schedule (a pool allocation's time limit): the attempt
    # stopped at its last checkpoint and goes on from its last reported step, not counted as a retry.
    handed_back: bool = False
    gpu_peak: int | None = None  # the GPU memory it was seen to use at most, where its machine measured it


class Handle(Protocol):
    pid: int  # the attempt's first process (its process group: GPU memory is counted by it)
    reports_outcome: bool  # False for a plain command: exit status 0 is its success

    def stop(self) -> None:
        """Ask the run to stop (SIGTERM to all of it). Its exit is reported once every process
        of it has ended, so a run saving a checkpoint keeps its grace period."""

    def kill(self) -> None:
        """Stop it at once (SIGKILL to all of it)."""

    def has_exited(self) -> bool:
        """Its first process has ended (the exit report may still be on its way)."""

    def reap(self) -> Ended:
        """After the exit report: stop what is left of it, release it, say how it ended."""


class OnPlaced(Protocol):
    def __call__(self, node: str, pid: int, since: float = 0.0) -> None:
        """The attempt runs on ``node`` as ``pid`` there, for ``since`` seconds already (an attempt a
        restarted scheduler follows keeps the clock its timeout counts on)."""


class Abilities(Record):
    """What a launcher can do besides starting attempts, declared: the engine asks a launcher for
    nothing it has not declared here (and probes none of its attributes)."""

    cluster_slots: bool = False  # slots(): the cluster's, not this machine's GPUs (Ray, Slurm)
    batches: bool = False  # flush() hands what started since the last flush to its cluster at once (Slurm's arrays)
    queue_places: bool = False  # its slots are places in a cluster's queue: no "slotN finished" line for each
    adopts: bool = False  # live_attempt(): it follows attempts an earlier scheduler left on its cluster
    watches: bool = False  # attach(inbox): the loop's inbox waits on its runs' ends itself
    runs_at_once: int | None = None  # what it takes at once (a search asks no more runs ahead); None: the slots'


class Launcher(Protocol):
    """Where runs run. ``abilities`` says which of the methods after ``close`` mean something; a
    launcher that has none of them inherits :class:`BaseLauncher`'s."""

    abilities: Abilities

    def open(self, lock_fd: int) -> None:
        """The result root is locked by ``lock_fd``; a launcher whose runs can outlive a crash of the
        scheduler lets them hold it (so no second scheduler takes the root while one lives)."""

    def start(self, attempt: Attempt, on_exit: Callable[[], None], on_placed: OnPlaced | None = None) -> Handle:
        """Start the attempt; ``on_exit()`` once it has ended. Raises LaunchError (or OSError).
        A launcher that runs attempts on other machines calls ``on_placed(node, pid, since)`` once it
        knows where the attempt runs (until then ``Handle.pid`` is a negative number of the launcher's,
        unique among its attempts); both from any thread."""

    def close(self) -> None:
        """The sweep is over (every run has ended): release what the launcher holds, e.g. processes
        started ahead for runs that will not come. Called while the root is still locked."""

    def slots(self, options: SchedulerOptions) -> list[Slot] | None:
        """``cluster_slots``: the slots of the sweep (raises GTSError when there are none). Its
        attempts start when the cluster places them: ``Handle.pid`` is negative until then, and the
        engine starts a run's clock (its ``timeout``, its duration) at ``on_placed``."""

    def slot_gpus(self, slot: Slot) -> float:
        """``cluster_slots``: the GPUs an attempt on ``slot`` asks its cluster for (its GPU-seconds are
        its duration times that, see gpu/usage.py)."""

    def flush(self) -> None:
        """``batches``: the engine has started what it can for now; hand over those started since
        the last flush."""

    def live_attempt(self, name: str) -> str | None:
        """``adopts``: the token of an attempt of run ``name`` that an earlier scheduler of this root
        handed to the cluster and that is still queued or running there (``gts run --detach``), or
        None. The engine starts the run with that token, and ``start`` then follows the live attempt
        instead of starting another."""

    def attach(self, inbox: Any) -> None:
        """``watches``: called before the first start. The local launcher gives the inbox its runs'
        pidfds to wait on (``Inbox.watch``), so the loop itself hears of their ends."""


class BaseLauncher:
    """What a launcher that declares no abilities does with the methods they name: nothing."""

    abilities = Abilities()

    def slots(self, options: SchedulerOptions) -> list[Slot] | None:
        return None

    def slot_gpus(self, slot: Slot) -> float:
        return float(len(slot.gpu_ids))

    def flush(self) -> None:
        pass

    def live_attempt(self, name: str) -> str | None:
        return None

    def attach(self, inbox: Any) -> None:
        pass
