"""What a warm-forked run shares with its warm process, and what it does not: the contract.

A forked run must be what a cold start of it would have been. This module is that contract's one
home; ``forkserver.py`` calls it, ``tests/test_warm_isolation.py`` holds a probe that is run cold
and warm and must see the same, field by field, but for what the table below says.

=========================================  ==============================================================
process state                               in a forked run
=========================================  ==============================================================
environment, working folder, ``argv``       the run's own (set before its script starts)
``sys.orig_argv``, ``/proc/PID/cmdline``    the cold start's command line (``ps`` shows ``python
                                            train.py ...``; cut to the warm process's own length, which
                                            is padded to 16 KiB)
variables Python and libraries read as      part of the warm process's identity (``zygote.READ_AT_START``):
they start (``PYTHONPATH``,                 a run whose values differ starts cold
``PYTHONHASHSEED``, ``MKL_*`` ...)
standard streams, descriptors               ``/dev/null``, the run's log, its lifeline, the root's lock;
                                            the warm process's own closed
signal dispositions                         those the warm process started with, before any import (a
                                            cold start's); a command's SIGINT and SIGQUIT ignored, as its
                                            cold wrapper shell starts it (a background job)
``random``, NumPy's, torch's generators     seeded afresh from the OS
root logger, ``decimal``'s context,         refused: a learned or stated module whose import changed one
``sys`` hooks, locale, recursion limit,     (``logging.basicConfig()`` at import) is imported by each run
switch interval, ``gc``, profile and        itself from then on (a new warm process without it); every run
trace functions, umask, int digits          forked from the first one starts cold
what a learned import prints                refused likewise (what a stated import prints begins each
                                            run's log, as a cold start that imports it would print it)
exit handlers                               the run's own process alone records its outcome (a process
                                            it forks inherits the handlers, never the outcome)
an uncaught exception                       ``sys.excepthook`` with the script's frames only, exit 1
the end                                     a cold end's (threads joined, exit handlers, streams flushed,
                                            the run's own modules released, its garbage collected), less
                                            the teardown of the warm process's modules
=========================================  ==============================================================

What a fork cannot make as a cold start makes it, and the docs say (docs/performance.md):

* **the string hash seed**: one per warm process (``PYTHONHASHSEED`` set for the sweep, or by a
  task, is taken as a cold start takes it); a run whose results depend on the iteration order of a
  set of strings sets it;
* **modules the run never imports** are in ``sys.modules`` (the warm process's), and what their
  import added to state that libraries share additively: ``warnings`` filters (NumPy, torch and
  Lightning each add some), ``sys.meta_path`` finders (six's, transformers'), variables a library
  sets with ``os.environ.setdefault`` (scikit-learn's ``KMP_DUPLICATE_LIB_OK``): every major
  library changes these, so refusing them would refuse warm starts altogether;
* **the collector's permanent generation** holds the warm process's objects (``gc.freeze()`` before
  each fork): the run's collections never walk them, nor does ``gc.get_objects()`` list them, and
  ``gc.get_freeze_count()`` counts them. Walking them copied every page they are on for the run;
* **at the run's end the warm process's modules are not torn down**: a ``__del__`` of an object only
  a library's module holds does not run (what the run's own modules hold is released, as at a cold
  end, with the builtins still there, where a cold end may have torn them down first). That teardown
  took 3 to 6 s of a forked torch and Lightning run's slot on 2 busy cores;
* **a new session**: the run leads its own session and process group (the scheduler signals it
  by pid), so ``os.setsid()`` and ``os.setpgrp()`` raise ``PermissionError``, where a cold
  start's script (a child of its wrapper) may call them.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
from typing import Any

COMMAND_ROOM = 16 << 10  # bytes of the warm process's command line a fork's may take


def configuration() -> dict[str, Any]:
    """The process-wide configuration an import must leave alone for its process to be forked
    from (each value compared as it is; the keys name it in the log). A module not imported yet
    is not imported here (that would be a change of its own): nothing has changed its state."""
    found: dict[str, Any] = {}
    logging = sys.modules.get("logging")
    if logging is not None:
        root = logging.getLogger()
        found["the root logger's handlers"] = tuple(id(handler) for handler in root.handlers)
        found["the root logger's level"] = root.level
        found["logging.disable()"] = logging.root.manager.disable
    decimal = sys.modules.get("decimal")
    if decimal is not None:
        context = decimal.getcontext()
        traps = tuple(context.traps.items())
        found["decimal's context"] = (context.prec, context.rounding, context.Emin, context.Emax, context.clamp, traps)
    locale = sys.modules.get("locale")
    if locale is not None:
        try:
            found["the locale"] = locale.setlocale(locale.LC_ALL)
        except locale.Error:
            pass
    umask = os.umask(0o22)
    os.umask(umask)
    found.update(
        {
            "sys.excepthook": id(sys.excepthook),
            "sys.displayhook": id(sys.displayhook),
            "sys.breakpointhook": id(sys.breakpointhook),
            "threading.excepthook": id(threading.excepthook),
            "sys.stdin, sys.stdout or sys.stderr": (id(sys.stdin), id(sys.stdout), id(sys.stderr)),
            "the recursion limit": sys.getrecursionlimit(),
            "the switch interval": sys.getswitchinterval(),
            "the garbage collector": (gc.isenabled(), gc.get_threshold()),
            "a profile or trace function": (id(sys.getprofile()), id(sys.gettrace())),
            "the umask": umask,
            "sys.set_int_max_str_digits()": sys.get_int_max_str_digits(),
            "signal handlers": dispositions(),
        }
    )
    return found


def changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What of :func:`configuration` differs between two looks. What the first look did not see (a
    module the import brought in) is compared with the module's state as it is made."""
    fresh = _as_made()
    return [name for name in after if before.get(name, fresh.get(name, after[name])) != after[name]]


def _as_made() -> dict[str, Any]:
    found: dict[str, Any] = {}
    if "logging" in sys.modules:
        found.update({"the root logger's handlers": (), "the root logger's level": 30, "logging.disable()": 0})
    decimal = sys.modules.get("decimal")
    if decimal is not None:
        made = decimal.DefaultContext
        traps = tuple(made.traps.items())
        found["decimal's context"] = (made.prec, made.rounding, made.Emin, made.Emax, made.clamp, traps)
    return found


def _signals() -> list[signal.Signals]:
    return [number for number in signal.valid_signals() if number not in (signal.SIGKILL, signal.SIGSTOP)]


def dispositions() -> tuple[tuple[int, int], ...]:
    """Each signal's handler (``id`` of it), to compare."""
    return tuple((int(number), id(signal.getsignal(number))) for number in _signals())


def signal_handlers() -> dict[int, Any]:
    """Each signal's handler now (the warm process's at its start: a cold start's)."""
    found = {}
    for number in _signals():
        try:
            found[int(number)] = signal.getsignal(number)
        except (OSError, ValueError):
            continue
    return found


def restore_signal_handlers(handlers: dict[int, Any]) -> None:
    for number, handler in handlers.items():
        if handler is None:  # set outside Python: left as it is
            continue
        try:
            signal.signal(number, handler)
        except (OSError, ValueError, RuntimeError):
            continue


def as_a_background_job() -> None:
    """SIGINT and SIGQUIT ignored, as a shell without job control starts a background command: a
    cold command run is one of its wrapper shell (prepare.py), so its script starts so, and
    Python then installs no KeyboardInterrupt handler."""
    for number in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(number, signal.SIG_IGN)


def set_command_line(argv: list[str]) -> None:
    """``sys.orig_argv`` and what ``/proc/PID/cmdline`` (``ps``, ``pgrep -f``) show: the command a
    cold start runs. The kernel reads the latter from the process's own memory, between the
    addresses ``/proc/self/stat`` gives; written in place, cut to that room."""
    sys.orig_argv = list(argv)
    try:
        with open("/proc/self/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49)
        room = end - start
        text = b"\0".join(os.fsencode(part) for part in argv)[: room - 1]
        with open("/proc/self/mem", "r+b", buffering=0) as memory:
            memory.seek(start)
            memory.write(text + b"\0" * (room - len(text)))
    except (OSError, ValueError, IndexError):
        pass  # a kernel that refuses: ps shows the warm process's line
