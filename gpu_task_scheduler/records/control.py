"""``gts stop ROOT``: asking the scheduler that holds a result root to stop, from another shell.

The request is a word in ``.gts/stop-request`` (``stop``, ``drain`` or
``now``), then SIGUSR1 to the scheduler, which reads and removes the file.
A signal alone could not say which: two signals sent at once may arrive as
one, and SIGTERM would also end a program that runs the sweep from Python.
The scheduler is found through the root's lock (the pid that holds it), so
only a live scheduler of that root is ever signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
from collections.abc import Iterator

from ..errors import ConfigError, GTSError
from .ledger.lock import scheduler_process
from .paths import RootPaths, atomic_write, open_regular

CONTROL_SIGNAL = signal.SIGUSR1
MODES = ("stop", "drain", "now")


def request_stop(root: str, mode: str) -> int:
    """Ask the scheduler of ``root`` to stop (``mode``); its pid. GTSError when none runs there."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    paths = RootPaths(root)
    try:
        is_root = stat.S_ISDIR(os.lstat(paths.meta).st_mode)  # a link is not followed
    except OSError:
        is_root = False
    if not is_root:
        if not os.path.lexists(root):
            raise ConfigError(f"{root} does not exist")
        raise ConfigError(f"{root} is not a result root (it has no .gts folder)")
    running, pid, holder = scheduler_process(root)
    if not running or pid is None:
        state = "no scheduler is running on" if running is False else "cannot tell which scheduler holds"
        known = holder and holder != "unknown"
        raise GTSError(f"{state} {root}" + (f" (the last one: {holder})" if known else ""))
    if not _taking_requests(root, pid):
        raise GTSError(
            f"the scheduler of {root} (pid {pid}) does not take stop requests (it runs its sweep outside "
            f"its program's main thread, or is an earlier version); stop it with: kill -TERM {pid}"
        )
    try:
        atomic_write(paths.stop_request, mode.encode(), durable=False)
        os.kill(pid, CONTROL_SIGNAL)
    except PermissionError:
        raise GTSError(f"the scheduler of {root} (pid {pid}) belongs to another user") from None
    except OSError as error:
        raise GTSError(f"cannot ask the scheduler of {root} (pid {pid}) to stop: {error}") from None
    return pid


@contextlib.contextmanager
def taking_requests(root: str, enabled: bool) -> Iterator[None]:
    """While the scheduler handles CONTROL_SIGNAL, ``.gts/control`` names its pid, so that
    ``gts stop`` signals only a scheduler that handles it (a sweep run outside a program's main
    thread cannot take signals: the signal's default action would end the program)."""
    path = RootPaths(root).control
    if enabled:
        atomic_write(path, str(os.getpid()).encode(), durable=False)
    try:
        yield
    finally:
        if enabled:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _taking_requests(root: str, pid: int) -> bool:
    try:
        with os.fdopen(open_regular(RootPaths(root).control), "rb") as handle:
            return handle.read(32).strip() == str(pid).encode()
    except OSError:
        return False


def take_stop_request(root: str) -> str:
    """The request sent to this scheduler, removed; ``stop`` when there is none or it is unreadable."""
    path = RootPaths(root).stop_request
    try:
        with os.fdopen(open_regular(path), "rb") as handle:
            word = handle.read(16).decode("ascii", "replace").strip()
        os.unlink(path)
    except OSError:
        return "stop"
    return word if word in MODES else "stop"
