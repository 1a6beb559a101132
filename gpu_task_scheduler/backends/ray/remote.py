"""What runs in Ray's processes: the supervisor of one attempt, and the driver's stop channel.

:func:`supervise` is the body of a run's Ray task (a streaming generator: it
reports where the run started, then how it ended). It starts the run's
process as the local backend does (:class:`~..local.process.Child`: its own
session, its log, the lifeline that ends the run if this supervisor dies) with
the GPUs Ray gave the task as ``CUDA_VISIBLE_DEVICES``, and waits for it. The
Ray worker is reused by the next task (``max_calls=0``); each run still gets a
process of its own. A Python run (``prewarm``, the default) is forked from the
worker's warm process (``supervisor.NodeWarmStarts``, kept for the worker's
life: its imports are paid once per worker, not per attempt); the fork becomes
the worker's child, as a cold start is.

:class:`Control` is a small async actor of the driver's: a stop or kill the
engine asks for is posted there and reaches the supervisor, which waits on it
in a thread. When the driver (and with it the actor) is gone, the supervisor
kills its run: a run never outlives its scheduler, on any machine.

Each attempt holds a lease in its run folder (``records/lease.py``): the
supervisor takes it before the run starts, starts the run only if the driver
still wants the attempt, renews it after each word from the driver, stops the
run when it has had none for the lease's ``fence_after`` (the machine is cut
off, or the driver gave the attempt up), and releases it when the run's
processes are gone. The driver runs a lost attempt again only once its lease
says it is over, so an attempt whose machine the cluster lost sight of never
runs side by side with its retry.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from typing import Any

from ...records.lease import LeaseHolder, LeaseTerms
from ..supervisor import NodeWarmStarts, Word, cannot_run, keep_lease, log_line, start_run

# What a stop request may say; "end": the run is over, the supervisor stops waiting.
STOP, KILL, END = "stop", "kill", "end"
# Seconds a supervisor waits for the driver's word before it starts its run (the driver's first answer
# can take a while on a loaded machine; waiting is safe: an attempt the driver gave up never starts).
FIRST_WORD = 60.0


class Control:
    """Stop requests for the runs of one sweep, by attempt token (an async Ray actor of the driver's)."""

    def __init__(self) -> None:
        self._requests: dict[str, list[str]] = {}
        self._changed: dict[str, asyncio.Condition] = {}
        self._abandoned: set[str] = set()  # attempts the driver gave up (their machine was lost)

    async def renew(self, token: str) -> bool:
        """Whether the attempt ``token`` is still wanted: a supervisor asks before it starts its run
        and before each renewal of its lease."""
        return token not in self._abandoned

    async def abandon(self, token: str) -> None:
        """The driver gives the attempt up: from now on its supervisor hears that it is not wanted."""
        self._abandoned.add(token)

    def _condition(self, token: str) -> asyncio.Condition:
        if token not in self._changed:
            self._changed[token] = asyncio.Condition()
        return self._changed[token]

    async def wait(self, token: str, seen: int) -> str:
        """The request after the first ``seen`` ones for ``token``, once there is one."""
        condition = self._condition(token)
        async with condition:
            await condition.wait_for(lambda: len(self._requests.get(token, ())) > seen)
            request = self._requests[token][seen]
        if request == END:  # the supervisor asks no more
            self._requests.pop(token, None)
            self._changed.pop(token, None)
        return request

    async def request(self, token: str, what: str) -> None:
        self._requests.setdefault(token, []).append(what)
        condition = self._condition(token)
        async with condition:
            condition.notify_all()


_WARM: dict[tuple[str, ...], NodeWarmStarts] = {}  # this worker's, by what the sweep names to import
READY_WAIT = 10.0  # seconds the worker's first Python run waits for its warm process (then it starts cold)


def _warm_starts(run: dict[str, Any]) -> NodeWarmStarts | None:
    """This Ray worker's warm starts for the run's sweep (None: prewarm is off, or a driver of an
    older gts sent no word of it)."""
    imports = run.get("warm_imports")
    if imports is None:
        return None
    key = tuple(imports)
    if key not in _WARM:
        _WARM[key] = NodeWarmStarts(key, ready_wait=READY_WAIT)
    return _WARM[key]


def node_name() -> str:
    """This machine as the ledger and ``gts status`` show it: ``IP/node id`` (8 hex digits)."""
    import ray

    return f"{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_node_id()[:8]}"


def supervise(run: dict[str, Any], control: Any) -> Iterator[dict[str, Any]]:
    """Yields ``{"node", "pid"}`` once the run's process started (or ``{"lost": why}`` when this
    machine cannot run it), then ``{"returncode", "strays", "unstoppable", "fenced"}`` when it has
    ended (``fenced``: why this supervisor stopped the run itself, or None)."""
    import ray

    node = node_name()
    problem = cannot_run(run, node)
    if problem is not None:
        yield {"lost": problem}
        return
    terms = LeaseTerms(run["lease_every"], run["grace_period"])
    lease = LeaseHolder(run["lease"], run["token"])
    try:
        lease.renew()
    except OSError as error:
        yield {"lost": f"{node} cannot write the run's lease {run['lease']}: {error}"}
        return
    try:  # the lease is taken: only now may the driver's word let the run start (see records/lease.py)
        wanted = ray.get(control.renew.remote(run["token"]), timeout=FIRST_WORD)
    except Exception as error:  # no answer from the driver: the run must not start
        lease.release()
        yield {"lost": f"{node} had no word from the scheduler before the run started ({type(error).__name__})"}
        return
    if not wanted:
        lease.release()
        yield {"lost": "the scheduler gave the attempt up before it started"}
        return
    gpus = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    try:
        handle, ended = start_run(run, ",".join(str(gpu) for gpu in gpus), warm=_warm_starts(run))
    except OSError as error:  # as locally: the run fails, and its log says why
        log_line(run["log"], f"gpu_task_scheduler: the run could not start on {node}: {error}\n")
        lease.release()
        yield {"node": node, "pid": 0}
        yield {"returncode": 127, "strays": (), "unstoppable": (), "fenced": None}
        return
    fenced: list[str] = []
    threading.Thread(target=_obey, args=(control, run["token"], handle, ended, run["log"]), daemon=True).start()
    given_up = "the scheduler gave this attempt up (it lost sight of this machine)"
    threading.Thread(
        target=keep_lease,
        args=(_word(control, run["token"]), lease, terms, handle, ended, run["log"], fenced),
        kwargs={"given_up": given_up},
        daemon=True,
    ).start()
    yield {"node": node, "pid": handle.pid}
    ended.wait()
    result = handle.reap()
    lease.release()  # its processes are gone: a retry need not wait
    control.request.remote(run["token"], END)
    yield {
        "returncode": result.returncode,
        "strays": result.strays,
        "unstoppable": result.unstoppable,
        "fenced": fenced[0] if fenced else None,
    }


def _word(control: Any, token: str) -> Word:
    """The driver's word on the attempt: its Control actor's answer."""
    import ray

    return lambda timeout: bool(ray.get(control.renew.remote(token), timeout=timeout))


def _obey(control: Any, token: str, handle: Any, ended: threading.Event, log: str | None) -> None:
    """Pass the driver's stop requests on to the run; kill it if the driver is gone."""
    import ray

    seen = 0
    while True:
        try:
            request = ray.get(control.wait.remote(token, seen))
        except Exception as error:  # the driver, or its actor, is gone: so goes the run
            if not ended.is_set():
                log_line(log, f"gpu_task_scheduler: the scheduler is gone ({type(error).__name__}); stopping the run\n")
                handle.kill()
            return
        seen += 1
        if request == END:
            return
        if request == STOP:
            handle.stop()
        elif request == KILL:
            handle.kill()


def probe(root: str, nonce: str, answer: str) -> str | None:
    """A node's half of the shared-filesystem check: it reads the driver's probe file, writes its own."""
    from ...records.paths import META

    meta = os.path.join(root, META)
    try:
        with open(os.path.join(meta, "probe"), encoding="utf-8") as handle:
            if handle.read() != nonce:
                return f"{node_name()} reads another file at {root}/{META}/probe than the scheduler wrote"
        with open(os.path.join(meta, f"probe-{answer}"), "w", encoding="utf-8") as handle:
            handle.write(answer)
    except OSError as error:
        return f"{node_name()} cannot use the result root {root}: {error}"
    return None
