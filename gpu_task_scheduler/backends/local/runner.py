"""The child process of one run: ``python -m gpu_task_scheduler.backends.local.runner SPEC``.

It loads the task object the scheduler prepared, calls its ``main()``, and
records the outcome in the run folder *before* exiting, atomically, so a run
whose ``main()`` returned is never repeated even if the scheduler dies a
moment later. Exit codes: 0 ``main()`` returned, 1 it raised, 3 the task
could not be loaded (import or unpickle error), 4 the outcome could not be
written.

A task class defined in the user's ``__main__`` script is found by loading
that script under another module name, so its ``if __name__ == "__main__":``
block (which starts the sweep) does not run again.

Every process the run starts ends with it. The runner is a child subreaper,
so descendants that leave the run's process group (``setpgrp()``, a daemon's
double fork and ``setsid()``) are re-parented to it; when ``main()`` ends they
are killed and reaped, and named in the log. A stop signal (SIGTERM from the
scheduler) is passed on to them too.

A stop signal that arrives after ``main()`` returned waits until the outcome
is recorded: a run whose ``main()`` returned is recorded once, whatever
signal comes. Before that, the signal acts as it would without us.
"""

from __future__ import annotations

import dis
import importlib.util
import json
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from types import ModuleType
from typing import Any

# imported up front: nothing slow may stand between main() and its record
from ...proctree import become_subreaper, descendants, kill_all, signal_on_parent_death, wait_gone
from ...records.paths import MAX_INLINE_RESULT, atomic_write
from ...records.protocol import RESULT_FILE, Outcome, RunStart
from ...reporting import Paused, Pruned, told

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_LOAD_ERROR = 3
EXIT_OUTCOME_ERROR = 4
MAIN_ALIAS = "__gts_main__"

# Held while the outcome is written: if the scheduler dies at that moment, the
# lifeline waits for the record to be complete before killing the run, so a
# main() that returned is always recorded.
_RECORDING = threading.Lock()


def _watch_lifeline() -> None:
    """Kill this run's whole process group when the scheduler goes away."""
    from .process import LIFELINE_ENV

    fd_text = os.environ.pop(LIFELINE_ENV, None)
    if fd_text is None:
        return
    fd = int(fd_text)

    def wait_for_eof() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            return  # the run closed our descriptor itself; nothing left to watch
        with _RECORDING:
            kill_all(descendants(os.getpid()))  # those that left the group first
            os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=wait_for_eof, name="gts-lifeline", daemon=True).start()


class _State:
    pid = 0  # the run's own process (its outcome is written by it alone; see _record)
    returned = False  # main() returned (or exited with status 0): its outcome must be recorded
    pending: int | None = None  # a stop signal that came after that


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _call_main(task: Any) -> Any:
    try:
        result = task.main()
    except SystemExit as error:
        if error.code in (None, 0):
            _State.returned = True
        raise
    _State.returned = True
    return result


def _offset_after_main_call() -> int:
    """The bytecode offset in _call_main from which main() has returned."""
    seen_main = False
    for instruction in dis.get_instructions(_call_main):
        if instruction.argval == "main":
            seen_main = True
        elif seen_main and instruction.opname.startswith("CALL"):
            return instruction.offset
    return 1 << 30


_AFTER_MAIN = _offset_after_main_call()


def _main_has_returned(frame: Any) -> bool:
    # A signal is handled between bytecodes of the innermost Python frame. In
    # _call_main past the call, main() has returned, even before the flag is set.
    return _State.returned or (
        frame is not None and frame.f_code is _call_main.__code__ and frame.f_lasti > _AFTER_MAIN
    )


def _on_stop_signal(signum: int, frame: Any) -> None:
    if _main_has_returned(frame):
        _State.pending = _State.pending or signum
        return
    _signal_escaped(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)  # then as if we had no handler: the signal ends the run
    os.kill(os.getpid(), signum)


# Sent by the kernel when the scheduler dies (PR_SET_PDEATHSIG): a signal of our own,
# which no task uses, so that it can mean exactly "the scheduler is gone".
_SCHEDULER_GONE: int | None = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else None


def _on_scheduler_gone(signum: int, frame: Any) -> None:
    """As the pipe lifeline does: the whole run ends with its scheduler. A main() that
    returned is recorded first (run() then stops what the run left); the record lock
    cannot be waited for here, in the thread that may hold it."""
    if _main_has_returned(frame):
        _State.pending = _State.pending or signal.SIGTERM
        return
    kill_all(descendants(os.getpid()))
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _escaped() -> list[int]:
    """Descendants that left the run's process group."""
    group = os.getpgrp()
    found = []
    for pid in descendants(os.getpid(), zombies=False):
        try:
            if os.getpgid(pid) != group:
                found.append(pid)
        except OSError:
            continue
    return found


def _signal_escaped(signum: int) -> None:
    kill_all(_escaped(), signum)  # the group itself had the signal from the scheduler


def stop_leftovers() -> list[int]:
    """Kill and reap every descendant still running; return those that had left the group."""
    escaped: list[int] = []
    for _ in range(64):  # a process may fork while we look; each round kills what it finds
        escaped.extend(pid for pid in _escaped() if pid not in escaped)
        found = descendants(os.getpid())
        if not found:
            break
        kill_all(found)
        wait_gone(found, timeout=5)
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
    return escaped


def _report_leftovers() -> None:
    escaped = stop_leftovers()
    if escaped:
        try:
            print(
                f"gpu_task_scheduler: stopped {len(escaped)} process(es) the run had started outside its "
                f"process group: pid {', '.join(map(str, escaped))}",
                file=sys.stderr,
                flush=True,
            )
        except OSError:
            pass


class _TaskUnpickler(pickle.Unpickler):
    def __init__(self, handle: Any, main_module: ModuleType | None) -> None:
        super().__init__(handle)
        self._main = main_module

    def find_class(self, module: str, name: str) -> Any:
        if module == "__main__" and self._main is not None:
            module = self._main.__name__
        return super().find_class(module, name)


def _load_main_script(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MAIN_ALIAS, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the script {path!r} that defines the task class")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MAIN_ALIAS] = module
    spec.loader.exec_module(module)
    return module


def load_task(spec: RunStart) -> Any:
    sys.path[:0] = [entry for entry in spec.sys_path if entry not in sys.path]
    main_module = None
    if spec.main_file:  # loaded once per process: a pre-warmed runner has it already
        loaded = sys.modules.get(MAIN_ALIAS)
        same = loaded is not None and getattr(loaded, "__file__", None) == spec.main_file
        main_module = loaded if same else _load_main_script(spec.main_file)
    with open(spec.task_file, "rb") as handle:
        return _TaskUnpickler(handle, main_module).load()


def _jsonable_result(spec: RunStart, result: Any) -> dict[str, Any]:
    """The outcome's result fields. A result of over 1 MiB of JSON goes to its own
    file next to the outcome, so no run's result can make the ledger unusable."""
    fields: dict[str, Any] = {}
    try:
        text = json.dumps(result, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        from ...jsonable import to_jsonable

        text = json.dumps(to_jsonable(result))
        fields["result_note"] = f"converted from {type(result).__name__}"
    if len(text) > MAX_INLINE_RESULT:
        path = os.path.join(os.path.dirname(spec.outcome_file), RESULT_FILE)
        atomic_write(path, text.encode("utf-8"))
        fields.update(result_file=RESULT_FILE, result_bytes=len(text))
    else:
        fields["result"] = json.loads(text)
    return fields


def _record(spec: RunStart, outcome: dict[str, Any]) -> None:
    if os.getpid() != _State.pid:
        # A process main() forked that returned or called sys.exit through the runner's frames:
        # it is not the run, and its end is none of the run's (a helper ending with sys.exit(0)
        # recorded the run's success while the run itself failed).
        return
    folder = os.path.dirname(spec.outcome_file)
    if os.path.islink(folder) or os.path.islink(os.path.dirname(folder)):
        raise OSError(f"{folder} was replaced by a symbolic link; the outcome is not written through it")
    Outcome(token=spec.token, config_hash=spec.config_hash, finished_at=time.time(), pid=os.getpid(), **outcome).write(
        spec.outcome_file
    )


def _write_outcome(spec: RunStart, outcome: dict[str, Any]) -> None:
    with _RECORDING:
        _record(spec, outcome)


def _error(phase: str, error: BaseException) -> dict[str, Any]:
    # A command run's failure speaks for itself ("the command failed with exit code 3").
    try:
        text = getattr(error, "message", None) or f"{type(error).__name__}: {error}"
    except Exception:  # an exception whose __str__ raises
        text = type(error).__name__
    return {"status": "failed", "phase": phase, "error": text[:4000]}


def _print_traceback(error: BaseException, headline: str | None = None) -> None:
    """The user's frames only (the runner's own frame is noise in their log).
    The log itself may be what failed (a full disk): the outcome is already
    recorded, so a failure to print is ignored."""
    try:
        traceback.print_exception(type(error), error, error.__traceback__.tb_next if error.__traceback__ else None)
        if headline:
            print(f"gpu_task_scheduler: {headline}: {type(error).__name__}: {error}", file=sys.stderr)
        sys.stderr.flush()
    except OSError:
        pass


def run(spec_path: str) -> int:
    _prepare_process()
    try:
        return _run(spec_path)
    finally:
        _report_leftovers()


def _prepare_process() -> None:
    become_subreaper()
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _on_stop_signal)
    # A second lifeline, for a run that exec's another program (its threads are gone then;
    # the exec'd program dies of the signal's default action): a signal when the scheduler
    # dies. If it died before we got here, the pipe lifeline sees EOF at once.
    if _SCHEDULER_GONE is not None:
        signal.signal(_SCHEDULER_GONE, _on_scheduler_gone)
        signal_on_parent_death(_SCHEDULER_GONE)
    _watch_lifeline()


def _told() -> dict[str, str]:
    """What early stopping told the run, for its outcome: ``{"pruned": cause}``, ``{"paused": cause}``."""
    return told()


def _run(spec_path: str) -> int:
    _State.pid = os.getpid()
    spec = RunStart.read(spec_path)
    os.environ.update(spec.run_env)
    try:
        task = load_task(spec)
    except BaseException as error:  # anything the user's module does at import time
        _write_outcome(spec, _error("load", error))
        _print_traceback(error, "the task could not be loaded")
        return EXIT_LOAD_ERROR
    try:
        result = _call_main(task)
        _RECORDING.acquire()  # main() returned: from here the lifeline waits until it is recorded
    except SystemExit as error:
        if error.code not in (None, 0):
            _write_outcome(spec, _error("main", error))
            raise
        _RECORDING.acquire()
        result = None  # sys.exit(0) inside main() is a successful end
    except BaseException as error:
        told = _told()
        _write_outcome(spec, {**_error("main", error), **told})
        if isinstance(error, (Pruned, Paused)) and told:  # the end early stopping asked for: no traceback
            print(f"gpu_task_scheduler: {'stopped early' if 'pruned' in told else 'paused'}: {error}", file=sys.stderr)
        else:
            _print_traceback(error)
        return EXIT_FAILED
    if os.getpid() != _State.pid:  # a process main() forked came back through here: nothing is its to record
        _RECORDING.release()
        return EXIT_OK
    try:
        # main() caught Pruned or Paused (to save, say) and returned
        _record(spec, {"status": "succeeded", **_jsonable_result(spec, result), **_told()})
    except OSError as error:
        print(f"gpu_task_scheduler: could not record the run's success: {error}", file=sys.stderr)
        return EXIT_OUTCOME_ERROR
    finally:
        _RECORDING.release()
    try:  # a log that cannot take the last lines (a full disk) does not undo a recorded success
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        pass
    return EXIT_OK


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--fork-server":
        from .forkserver import become_run, serve
        from .process import CONTROL_ENV, LIFELINE_ENV

        info = json.loads(sys.argv[2])
        info["sys_path"] = sys.path[1:-1]  # a cold `python script.py`'s, but its first: no "", no our append
        own = [int(os.environ.pop(LIFELINE_ENV))] if LIFELINE_ENV in os.environ else []
        request = serve(int(os.environ.pop(CONTROL_ENV)), info, own)
        if request is None:
            sys.exit(EXIT_OK)
        become_run(request, run)  # a forked run: the script's end, exception or exit is the interpreter's
        return
    if len(sys.argv) != 2:
        print(
            "usage: python -m gpu_task_scheduler.backends.local.runner SPEC_FILE (started by the scheduler)",
            file=sys.stderr,
        )
        sys.exit(2)
    sys.exit(run(sys.argv[1]))


if __name__ == "__main__":
    main()
