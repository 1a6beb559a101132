"""The warm process of a sweep's Python runs, and the run it forks (the scheduler's side is
``zygote.py``). A GPUTask run forked from it runs our runner (``runner.run``) on its start
record, as a cold one does; what follows is about commands.

A ``command: [python, train.py, ...]`` run spends most of its start importing: about 5 s of CPU
for PyTorch and Lightning on 2 cores, paid again by every attempt (each pause, resume, promotion
and PBT exploit is one). The warm process pays it once: it imports what the sweep's runs import
(``imports``), says whether it can be forked from, and then forks each attempt on request. The run
process is a fork of it that becomes what ``python train.py ...`` would have been:

* the leader of a session and process group of its own, its standard input ``/dev/null``, its
  output and errors the run's log, its descriptors only the run's lifeline and the root's lock;
* its environment, working folder, ``sys.argv`` and ``sys.path[0]`` those of the cold start; the
  signal handlers Python starts with; Python's, NumPy's and PyTorch's global generators seeded
  afresh from the OS (a script that seeds itself gets its own seed, as before);
* the script run as ``__main__`` (``runpy``), or ``-m module``; an exception it raises, its
  ``sys.exit`` and its end are the interpreter's, as in a cold start.

It is forked twice (the warm process forks a helper that forks the run and exits): the scheduler
adopts the run as a child subreaper for that moment (``zygote.py``), so the run is the scheduler's
own child, watched, stopped and reaped as a cold one is.

What it keeps of a command run's wrapper (``prepare.py``): it records its success in the run's
outcome file when the script ends with status 0 and it was not asked to stop (the scheduler writes
a byte ``S`` on the lifeline before its stop signal), and it kills its whole group when the
lifeline reads end of file (the scheduler is gone). At its end it writes the modules it imported
from outside the user's folders to ``.gts/imports.json``, from which the next warm process learns.

What is never forked from (the warm process says why, and the scheduler starts runs cold):

* a process that loaded the CUDA driver or NVML (``libcuda``, ``libnvidia-ml`` in its maps): a
  fork would share their state;
* a process with a Python thread besides its main one (named, with the module that defined its
  target): a fork copies a thread's locks, not the thread.

Threads that native libraries start at import and restart after a fork themselves (NumPy's
OpenBLAS pool: ``pthread_atfork``, which ``multiprocessing``'s default start relies on too) are
counted and said, not refused.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from ...proctree import descendants, kill_all, signal_on_parent_death
from . import isolation
from .process import ADOPTED_WORD, LIFELINE_ENV, STOP_WORD

IMPORTS_FILE = "imports.json"  # in the run's .gts folder: what it imported (the next warm process's list)
_FORKS_AT_MOST = 16  # descriptors a request carries


def serve(control_fd: int, info: dict[str, Any], own_fds: list[int]) -> dict[str, Any] | None:
    """The warm process: import ``info['imports']``, tell the scheduler what it has, then fork a run
    for each request. Returns (the request) only in a forked run; the warm process itself ends
    when the scheduler closes the socket."""
    signal_on_parent_death(signal.SIGKILL)  # it goes with the scheduler, even mid-import (its forks do not)
    handlers = isolation.signal_handlers()  # a cold start's, before any import: each fork's
    isolation.set_command_line([*sys.orig_argv[:-1], "{}"])  # its room for a fork's kept, not shown by ps
    control = socket.socket(fileno=control_fd)
    base_path = list(info["sys_path"])
    runner_path = list(sys.path)  # a cold runner's (python -c: "" first, this package's folder last)
    sys.path[:] = base_path  # as a cold start's, less the script's folder: the user's modules stay theirs
    told = b""
    while not told.endswith(b"\n"):
        chunk = control.recv(1 << 16)
        if not chunk:
            return None  # discarded before it was told what to import
        told += chunk
    asked = json.loads(told)
    names = asked.get("imports", ())
    imported, failed, effects = _import_all(names, set(asked.get("stated", ())))
    refused, native = _unforkable()
    if refused is None and effects:
        name, what = next(iter(effects.items()))
        refused = f"importing {name} changed {', '.join(what)}, which every run forked from it would inherit"
    output = _read_output()
    ready = {"imported": imported, "failed": failed, "refused": refused, "native_threads": native, "effects": effects}
    control.sendall(json.dumps(ready).encode("utf-8") + b"\n")
    while True:
        request, fds = _request(control)
        if request is None:
            os._exit(0)  # the scheduler closed it: the sweep is over, or it is gone
        request["preloaded"] = list(names)  # what it was told to import (the fork's imports file names them too)
        if refused:
            for fd in fds:
                os.close(fd)
            control.sendall(json.dumps({"error": refused}).encode("utf-8") + b"\n")
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        # The warm process's objects go to the collector's permanent generation for the fork: the
        # run's collections, and its end, never walk them. (Walking them wrote to every page they
        # are on, each page then copied for the run: a forked run of a torch and Lightning process
        # took 3 to 6 s to end on 2 busy cores, more than a cold one's 1.6 s.)
        gc.freeze()
        pid = _fork_twice()
        if pid == 0:  # the run
            control.close()
            request.update(
                fds=fds, output=output, sys_path=base_path, runner_path=runner_path, close=own_fds, handlers=handlers
            )
            return request
        gc.unfreeze()  # the warm process's own collections go on as before
        for fd in fds:
            os.close(fd)
        answer = {"pid": pid} if pid > 0 else {"error": "the warm process could not fork"}
        control.sendall(json.dumps(answer).encode("utf-8") + b"\n")


def _request(control: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """The scheduler's next request (one JSON object and a newline, its descriptors with its first
    bytes), or None once the scheduler closed the socket. A stream socket may hand a long request
    over in pieces: it is read to its newline."""
    data, fds = b"", []
    while not data.endswith(b"\n"):
        try:
            chunk, more, _, _ = socket.recv_fds(control, 1 << 20, _FORKS_AT_MOST)
        except OSError:
            chunk, more = b"", []
        fds += more
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None, []
        data += chunk
    return json.loads(data.decode("utf-8", "surrogateescape")), fds


def _import_all(names: Any, stated: set[str]) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """Import ``names``: those imported, those that failed, and what each import changed of the
    process-wide configuration every fork would inherit (``isolation.configuration``), or printed
    (a learned import only: what a stated one prints begins each run's log)."""
    imported, failed, effects = [], [], {}
    for name in names if isinstance(names, list) else ():
        if not isinstance(name, str) or name in sys.modules:
            continue
        before, printed = isolation.configuration(), _output_size()
        try:
            importlib.import_module(name)
        except BaseException:  # a module that fails here is the run's own to import (and fail)
            sys.modules.pop(name, None)
            failed.append(name)
            continue
        imported.append(name)
        what = isolation.changed(before, isolation.configuration())
        if name not in stated and _output_size() != printed:
            what.append("the run's log (it printed as it was imported)")
        if what:
            effects[name] = what
    return imported, failed, effects


def _output_size() -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        return os.lseek(1, 0, os.SEEK_END)
    except OSError:
        return 0


def gpu_driver_loaded(maps: str = "/proc/self/maps") -> str | None:
    """Why a process whose memory map is ``maps`` must not be forked from (a GPU driver), or None."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as handle:
            mapped = handle.read()
    except OSError:
        mapped = ""
    for library in ("libcuda.so", "libnvidia-ml.so"):
        if library in mapped:
            return f"it loaded {library} (a GPU driver's state is not to be shared by a fork)"
    return None


def _unforkable() -> tuple[str | None, int]:
    """Why this process must not be forked from (None: it may), and its native threads."""
    driver = gpu_driver_loaded()
    if driver is not None:
        return driver, 0
    others = [thread for thread in threading.enumerate() if thread is not threading.main_thread()]
    if others:
        named = ", ".join(f"{thread.name!r} (from {_module_of(thread)})" for thread in others)
        return f"an import started a Python thread: {named}", 0
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        threads = 1
    return None, threads - 1


def _module_of(thread: threading.Thread) -> str:
    """The module that defined what ``thread`` runs (its target, or its class's run)."""
    target = getattr(thread, "_target", None)
    if target is None and type(thread).run is not threading.Thread.run:
        target = type(thread).run
    return getattr(target, "__module__", None) or "an unknown module"


def _read_output() -> bytes:
    """What the imports printed (the warm process's output file): each run's log starts with it, as
    a cold start's would."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.lseek(1, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(1, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)[-(1 << 20) :]
    except OSError:
        return b""


def _fork_twice() -> int:
    """Fork a helper that forks the run and exits: the run's pid here, 0 in the run, -1 on failure.

    The run leads a session of its own before its pid is told here (it says it itself): the
    scheduler takes the pid for the run's process group at once (its signals, its GPU reservation,
    which other sweeps count only while that group exists). Told by the helper, the pid came
    before the run had called setsid() in 13 forks of 300 on a quiet machine, and another sweep
    that placed a run then saw no such group, took the reservation for a dead one and started a
    run the GPU had no room for (a loaded CI run saw 4 runs on a GPU that holds 3)."""
    read_end, write_end = os.pipe()
    try:
        helper = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return -1
    if helper == 0:
        os.close(read_end)
        try:
            run = os.fork()
        except OSError:
            os._exit(1)
        if run == 0:
            os.setsid()
            os.write(write_end, b"%d" % os.getpid())
            os.close(write_end)
            return 0
        os._exit(0)  # the run holds the pipe's other end until it has said its pid
    os.close(write_end)
    os.waitpid(helper, 0)
    with os.fdopen(read_end, "rb") as handle:
        text = handle.read()
    return int(text) if text.isdigit() else -1


# --- the run ---------------------------------------------------------------------------------


class _Run:
    pid = 0  # the run's own process: a process it forks inherits its exit handlers, never its outcome
    lifeline = -1
    lifeline_lost = ""  # why the lifeline can no longer be read (the script closed it), if it cannot
    lifeline_id: tuple[int, int] = (0, 0)  # its file's (st_dev, st_ino): a number reused is not it
    parent = 0  # the scheduler's pid (its parent, once adopted)
    code: Any = 1  # the script's exit status as the interpreter will make it (0: success)
    stopped = False
    ended = False  # the script has ended: its success is recorded at exit, whatever the lifeline says
    imports_file = ""
    outcome: dict[str, Any] = {}
    lock = threading.Lock()
    exclude: tuple[str, ...] = ()  # modules never learned (a GPUTask's own), with their submodules
    known: frozenset[str] = frozenset()
    preloaded: tuple[str, ...] = ()  # what the warm process was told to import: in the file too


def become_run(request: dict[str, Any], run_task: Callable[[str], int]) -> None:
    """In the forked run: take the cold start's process state, then run the command (``request``:
    argv, env, cwd, the descriptors' places, the outcome to record), or a GPUTask run's start record
    through ``run_task`` (``runner.run``, passed in: this module does not import the runner).
    Returns only to raise what the script raised, at the top of the program, so the interpreter
    ends it as a cold start's."""
    # Already the leader of a session of its own (_fork_twice).
    _Run.pid = os.getpid()
    cpus = request.get("cpus")
    if cpus and hasattr(os, "sched_setaffinity"):  # a pool's run: its own CPUs, as a cold start inherits them
        with contextlib.suppress(OSError, ValueError, TypeError):
            os.sched_setaffinity(0, cpus)  # the only thread here: every thread it starts has them too
    runner = request.get("runner")  # a GPUTask run's start record: our runner runs it, as in a cold start
    _place_descriptors(request, blocking=runner is not None)
    isolation.restore_signal_handlers(request["handlers"])  # a cold start's
    if runner is None:  # a command's: its wrapper shell starts it in the background, SIGINT and SIGQUIT ignored
        isolation.as_a_background_job()
    isolation.set_command_line(request["command"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    _reseed()
    _size_thread_pools()
    _Run.outcome = request.get("outcome", {})
    _Run.known = frozenset(sys.modules)
    _Run.preloaded = tuple(name for name in request.get("preloaded", ()) if isinstance(name, str))
    _Run.exclude = tuple(request.get("exclude", ()))
    _Run.imports_file = request["imports_file"]
    from ... import reporting

    reporting._first_report = _told_imports  # by then the script has imported what it trains with
    try:
        if runner is not None:
            _become_runner(request, runner, run_task)
        _start_command(request)
    except SystemExit as stop:
        _end(stop.code)
    _end(0)


def _start_command(request: dict[str, Any]) -> None:
    atexit.register(_at_exit)
    threading.Thread(target=_watch_lifeline, name="gts-lifeline", daemon=True).start()
    argv, base = request["argv"], request["sys_path"]
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[:] = ["", *base]
        _run(lambda: _run_code(argv[1]))
    elif argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[:] = [os.getcwd(), *base]
        _fresh_main()
        # What `python -m` itself calls (runpy's own entry for it), in the fresh __main__.
        as_main = getattr(runpy, "_run_module_as_main", None)
        if as_main is None:
            _run(lambda: runpy.run_module(argv[1], run_name="__main__", alter_sys=True))
        else:
            _run(lambda: as_main(argv[1]))
    else:
        sys.argv = list(argv)
        sys.path[:] = [os.path.dirname(os.path.realpath(argv[0])), *base]
        _run(lambda: _run_script(os.path.abspath(argv[0])))


def _end(code: Any) -> NoReturn:
    """The end of a forked run, as the interpreter ends a cold one, less the teardown of what the run
    inherited: its non-daemon threads joined, every exit handler run (the run's, and those of the
    libraries it inherited: logging's flush of its files, multiprocessing's joins), its standard
    streams flushed, its own modules' globals released and its own garbage collected (so that a file
    it never closed is flushed, and a ``__del__`` of its own runs, as at a cold end), then the
    process ends. The warm process's modules are not torn down: nothing of the run's is in them,
    and that teardown took seconds of the run's slot (torch's and Lightning's objects, each page
    they are on copied for the run as it was written). ``code``: ``SystemExit``'s, as the
    interpreter reads it."""
    shutdown = getattr(threading, "_shutdown", None)  # what the interpreter calls first (non-daemon threads)
    with contextlib.suppress(BaseException):
        if shutdown is not None:
            shutdown()
    status = _exit_status(code)
    atexit._run_exitfuncs()  # newest first; one that raises is said and the rest run, as at a cold end
    status = _flushed(status)
    _release_own_modules()
    with contextlib.suppress(BaseException):
        gc.collect()
    os._exit(_flushed(status))


def _exit_status(code: Any) -> int:
    """The process's exit status for ``sys.exit(code)``, as the interpreter makes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _flushed(status: int) -> int:
    """``sys.stdout`` and ``sys.stderr`` flushed; 120 if stdout could not be (the interpreter's)."""
    for stream, failed in ((sys.stdout, 120), (sys.stderr, status)):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream: the interpreter's status says it
            status = failed
    return status


def _release_own_modules() -> None:
    """The globals of the modules the run imported itself (its ``__main__`` first, then the others,
    newest first) set to None as the interpreter does at its end (single-underscore names first),
    so that what only they held is released: its ``__del__`` runs, a file is flushed and closed."""
    own = [name for name in sys.modules if name not in _Run.known or name == "__main__"]
    own.sort(key=lambda name: name != "__main__")
    for name in [own[0], *reversed(own[1:])] if own else []:
        module = sys.modules.get(name)
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for first in (True, False):
            for key in list(namespace):
                if key != "__builtins__" and (key.startswith("_") and not key.startswith("__")) == first:
                    with contextlib.suppress(BaseException):
                        namespace[key] = None


def _fresh_main() -> Any:
    """A new ``__main__`` module, as the interpreter makes it at its start."""
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __annotations__={})
    sys.modules["__main__"] = main
    return main


def _become_runner(request: dict[str, Any], spec_path: str, run: Callable[[str], int]) -> None:
    """A GPUTask run: the runner's own start (runner.run: its stop signals, its lifeline, its
    outcome). The scheduler is this process's parent by now (its first byte on the lifeline said
    so), so the parent-death signal the runner asks for is about the scheduler."""
    os.environ[LIFELINE_ENV] = str(request["lifeline"])
    sys.argv = ["-c", spec_path]
    sys.path[:] = request["runner_path"]
    atexit.register(_told_imports)
    sys.exit(run(spec_path))


def _run_code(code: str) -> None:
    """``code`` run as ``python -c code`` runs it, in a fresh ``__main__``."""
    main = _fresh_main()
    exec(compile(code, "<string>", "exec", dont_inherit=True), main.__dict__)


def _run_script(path: str) -> None:
    """``path`` run as ``python path`` runs it: in a fresh ``__main__`` whose ``__file__`` is its
    absolute path, with ``sys.argv[0]`` as given."""
    import importlib.machinery

    main = _fresh_main()
    main.__file__ = path
    main.__dict__.update(__cached__=None)
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    with open(path, "rb") as handle:  # as the interpreter reads it: bytes, its own coding line
        code = compile(handle.read(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _run(start: Any) -> None:
    try:
        start()
    except SystemExit as error:
        _Run.code = error.code
        raise
    except KeyboardInterrupt:  # the interpreter ends the process by SIGINT after it printed it
        _Run.code = 1
        raise
    except BaseException as error:
        # What the interpreter does with an exception nothing caught, with the run's frames only: a
        # cold start's traceback begins at the script (before, six of the warm process's frames
        # came first, and the log read as if gts had crashed). Then exit status 1, as there.
        _Run.code = 1
        _print_uncaught(error)
        raise SystemExit(1) from None
    else:
        _Run.code = 0
    finally:
        _Run.ended = True


# The files of the warm process's own frames above a forked run's: its ``-c`` bootstrap's first
# frame, the runner's main and this module.
_OWN_FILES = (__file__, os.path.join(os.path.dirname(__file__), "runner.py"))


def run_frames(traceback: Any) -> Any:
    """``traceback`` without the warm process's frames that precede the run's: from the script's
    first frame (``-m``: runpy's, as in a cold start; ``-c``: the code's own ``<string>``)."""
    entry, first = traceback, True
    while entry is not None:
        filename = entry.tb_frame.f_code.co_filename
        if filename not in _OWN_FILES and not (first and filename == "<string>"):
            return entry
        entry, first = entry.tb_next, False
    return traceback


def _print_uncaught(error: BaseException) -> None:
    """``error`` given to ``sys.excepthook`` (the script's, if it set one) as the interpreter gives
    an uncaught exception; a hook that fails is said, and the exception printed, as there."""
    kind, traceback = type(error), run_frames(error.__traceback__)
    error.with_traceback(traceback)  # what the hook prints (the interpreter's prints the exception's own)
    try:
        sys.excepthook(kind, error, traceback)
    except BaseException as failed:  # noqa: BLE001 - the interpreter says any failure of the hook
        print("Error in sys.excepthook:", file=sys.stderr)
        sys.__excepthook__(type(failed), failed, failed.__traceback__)
        print("\nOriginal exception was:", file=sys.stderr)
        sys.__excepthook__(kind, error, traceback)
    with contextlib.suppress(Exception):
        sys.stderr.flush()


def _place_descriptors(request: dict[str, Any], *, blocking: bool = False) -> None:
    """stdin /dev/null, stdout and stderr the log (after what the imports printed), the lifeline and
    the root's lock at the numbers they have in a cold start. Descriptors the imports opened are
    the libraries' (a fork keeps them, as ``multiprocessing``'s does); the warm process's own
    (its control socket, its lifeline) are closed."""
    fds = request["fds"]
    places = request["places"]  # the number each received descriptor takes (the log's: 1)
    high = [os.dup(fd) for fd in fds]  # copies that no dup2 below can overwrite before they are placed
    for fd in fds:
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    if null != 0:
        os.close(null)
    for fd, place in zip(high, places, strict=True):
        os.dup2(fd, place)
        if place == 1:
            os.dup2(fd, 2)
    for fd in high:
        if fd not in places and fd not in (0, 1, 2):
            os.close(fd)
    for fd in request["close"]:
        if fd not in places and fd not in (0, 1, 2):
            try:
                os.close(fd)
            except OSError:
                pass
    _Run.lifeline = request["lifeline"]
    os.set_inheritable(_Run.lifeline, False)
    status = os.fstat(_Run.lifeline)
    _Run.lifeline_id = (status.st_dev, status.st_ino)
    # Nothing runs before the scheduler says it made this process its child (its first byte); end
    # of file instead: it died first, and nothing is to run.
    if os.read(_Run.lifeline, len(ADOPTED_WORD)) != ADOPTED_WORD:
        os._exit(1)
    _Run.parent = os.getppid()  # the scheduler, which has adopted it
    os.set_blocking(_Run.lifeline, blocking)  # a runner's lifeline thread blocks on it
    if request.get("output"):
        os.write(1, request["output"])


def _reseed() -> None:
    """The process's generators seeded from the OS, as a cold start's are."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            numpy.random.seed()
        except Exception:
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.seed()  # the CPU generator now; CUDA's are seeded lazily, when CUDA starts
        except Exception:
            pass


def _size_thread_pools() -> None:
    """PyTorch's CPU thread pool sized by the run's ``OMP_NUM_THREADS``, as a cold start's is (torch
    reads it at its import, which here was the warm process's, without the run's variables: a pool's
    agent sets it to each run's share of the CPUs). Libraries that sized their pools at load
    otherwise (OpenBLAS's) keep the warm process's size, bound to the run's CPUs all the same."""
    torch = sys.modules.get("torch")
    value = os.environ.get("OMP_NUM_THREADS", "")
    if torch is None or not value.isdigit() or int(value) < 1:
        return
    try:
        if torch.get_num_threads() != int(value):
            torch.set_num_threads(int(value))
    except Exception:
        pass


def _lifeline_is_ours() -> bool:
    """Whether the lifeline's number still holds the lifeline. A script may close its inherited
    descriptors (``os.closerange(3, ...)``, as daemons do) and open others in their place: a closed
    lifeline is not the scheduler's death (a cold start's wrapper holds its own, out of the script's
    reach), and a file the script opened there is never read. From then on the run cannot hear a
    stop word: its outcome says so (``Outcome.unheard``), and a stop the scheduler made stands."""
    if _Run.lifeline_lost:
        return False
    try:
        status = os.fstat(_Run.lifeline)
        ours = (status.st_dev, status.st_ino) == _Run.lifeline_id
    except OSError:
        ours = False
    if not ours:
        _Run.lifeline_lost = f"the script closed descriptor {_Run.lifeline}, its lifeline to the scheduler"
    return ours


def _read_lifeline() -> bytes | None:
    """What the scheduler wrote on the lifeline since the last look (``b""``: it is gone; None:
    nothing, or the lifeline is lost), the stop word remembered. Called with the lock held."""
    if not _lifeline_is_ours():
        return None
    try:
        data = os.read(_Run.lifeline, 64)
    except BlockingIOError:
        return None
    except OSError:
        data = b""
    if STOP_WORD in data:  # written on the lifeline before the stop signal (process.Child.terminate)
        _Run.stopped = True
    return data


def _watch_lifeline() -> None:
    """Kill the run's whole group when the scheduler goes away, unless its script has ended (its
    success is then recorded, as the keeper spares a command that ended)."""
    poller = select.poll()
    poller.register(_Run.lifeline, select.POLLIN | select.POLLHUP)
    while True:
        poller.poll()
        with _Run.lock:
            data = _read_lifeline()
            if _Run.lifeline_lost:
                break
            if data != b"":
                continue
            _end_unless_ended()
            return
    # The script closed its lifeline: the scheduler (its parent, which adopted it) is watched
    # instead, through a pidfd of its own (a script that closes that too runs on, as a cold one
    # whose wrapper was killed: the next start of the sweep stops it).
    try:
        parent = os.pidfd_open(_Run.parent) if os.getppid() == _Run.parent else -1
    except (OSError, AttributeError):
        return
    if parent >= 0:
        watch = select.poll()  # not select(): a descriptor above 1023 is beyond it
        watch.register(parent, select.POLLIN)
        watch.poll()
    with _Run.lock:
        _end_unless_ended()


def _end_unless_ended() -> None:
    """The scheduler is gone: the run's whole group is killed, unless its script has ended (its
    success is then recorded, as the keeper spares a command that ended). Called with the lock held."""
    if _Run.ended:
        return
    kill_all(descendants(os.getpid()))
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _at_exit() -> None:
    """The script ended: its success recorded (unless it was asked to stop), and what it imported.
    Only in the run's own process: a process the script forked (a helper that ends with
    ``sys.exit(0)``) runs these handlers too, and must not speak for the run."""
    if os.getpid() != _Run.pid:
        return
    with _Run.lock:
        _Run.ended = True
        while _read_lifeline():
            pass
        code = _Run.code
        if (code is None or code == 0) and not _Run.stopped:
            _record_success()
    _told_imports()


def _record_success() -> None:
    from ...records.paths import open_regular

    outcome = _Run.outcome
    path = outcome["file"]
    folder = os.path.dirname(path)
    if os.path.islink(path) or os.path.islink(folder) or os.path.islink(os.path.dirname(folder)):
        os.write(2, b"gpu_task_scheduler: the run folder holds a symbolic link where its outcome goes\n")
        os._exit(4)
    # A script that reported through the module and was paused (or stopped early) there exits 0 once
    # it saved: it is paused, not done (recorded so, as the runner records a GPUTask's). Its stop
    # word may come after that exit: a Keras member told to exploit was recorded succeeded.
    reporting = sys.modules.get("gpu_task_scheduler.reporting")
    told = reporting.told() if reporting is not None else {}
    fields = {"status": "succeeded", "token": outcome["token"], "config_hash": outcome["config_hash"], **told}
    fields["pid"] = os.getpid()
    if _Run.lifeline_lost:
        fields["unheard"] = _Run.lifeline_lost
    line = json.dumps(fields)
    try:
        fd = open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            os.write(fd, line.encode("utf-8") + b"\n")
        finally:
            os.close(fd)
    except OSError:
        os._exit(4)


def _installed(real: str) -> bool:
    """Whether the module file ``real`` (its real path) is the standard library's or an installed
    package's: the only modules a warm process learns. The user's own code (the working folder, a
    library checkout on ``PYTHONPATH``, an editable install) is imported afresh by every run, so
    an edit made during a sweep reaches the runs after it, as it reaches cold ones. A package
    installed into a folder of the user's (a virtual environment in the working folder) is
    installed all the same."""
    if f"{os.sep}site-packages{os.sep}" in real or f"{os.sep}dist-packages{os.sep}" in real:
        return True
    standard = os.path.realpath(os.path.dirname(os.__file__))  # its extensions' lib-dynload is inside
    return real.startswith(standard + os.sep)


def _told_imports() -> None:
    if os.getpid() != _Run.pid:  # a process the run forked: what it imported is not the run's to say
        return
    try:
        _write_imports()
    except (OSError, ValueError):
        pass


def _write_imports() -> None:
    from ...records.paths import atomic_write

    folder = os.path.dirname(_Run.imports_file)
    if os.path.islink(folder) or os.path.islink(os.path.dirname(folder)):
        return  # the run's records folder is a link it planted: nothing is written through it
    # What the run imports, whole: those the warm process was told (asked for, learned from earlier
    # runs) and the run's own; a sweep started again recalls it (zygote.WarmStarts).
    told = set(_Run.preloaded)
    names = []
    for name, module in list(sys.modules.items()):
        if (name in _Run.known and name not in told) or name == "__main__" or module is None:
            continue
        if any(name == own or name.startswith(own + ".") for own in _Run.exclude):
            continue
        where = getattr(module, "__file__", None)
        if isinstance(where, str) and _installed(os.path.realpath(where)):
            names.append(name)
    atomic_write(_Run.imports_file, json.dumps(names).encode("utf-8"), durable=False)
