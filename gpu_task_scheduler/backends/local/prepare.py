"""Preparing one attempt of a run: its folder, task object and environment.

Runs in the scheduler process, right before the child starts. Whatever fails
here (the task's ``__init__`` or ``required_env()`` raises, the task object
cannot be pickled, the folder cannot be written) fails this run only.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from ...engine.launcher import Attempt, LaunchError
from ...errors import install_hint
from ...gpu.devices import Slot
from ...gpu_task import GPUTask
from ...jsonable import to_jsonable
from ...records import checkpoints
from ...records.paths import RunPaths, atomic_write, open_regular, step_name, write_all
from ...records.protocol import RunStart
from ...reporting import CHECKPOINT_ENV, JUDGED_ENV, METRICS_ENV, PAUSE_ENV, PRUNE_ENV, RESUME_ENV, RUNGS_ENV
from ...sweep.expand import RunSpec
from .keeper import WRAPPER_NAME
from .keeper import available as keeper_available

# The child starts our runner even when this package is not installed but only
# importable from the launcher's sys.path; appending keeps the child's own
# import precedence unchanged.
# The folder holding gpu_task_scheduler/ (os.path, not pathlib: 3 ms of a start).
# The checkpoint folders that attempts which started afresh set aside (``.gts/logs/attempt-N-
# checkpoint``) are kept for the newest this many; the older ones go (``gts clean`` removes the rest).
KEEP_SET_ASIDE = 2
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))))
_RUNNER_BOOT = (
    f"import sys; sys.path.append({_PACKAGE_PARENT!r}); "
    "from gpu_task_scheduler.backends.local.runner import main; main()"
)


TaskFactory = Callable[[RunSpec], GPUTask]


def log_launch_failure(paths: RunPaths, error: BaseException) -> None:
    """Append to the run's log why it could not start (with the traceback, if the
    user's code raised): the summary and ``gts status`` point there. Nothing is
    written into a folder that is not safe to write into."""
    if not paths.log or paths.unsafe() is not None:
        return
    text = f"{getattr(error, 'details', '')}gpu_task_scheduler: the run could not start: {error}\n"
    try:
        fd = open_regular(paths.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        with os.fdopen(fd, "ab") as handle:
            handle.write(text.encode("utf-8", "replace"))
    except OSError:
        pass  # the cause is recorded in the ledger either way


class Preload(NamedTuple):
    """What a Python run's task is: its module, or the script that defines it (``zygote.py`` leaves
    it to the run to import, with the run's environment)."""

    module: str | None  # the task class's module, or None for a class in the user's __main__ script
    main_file: str | None  # that script, loaded under another name (its __main__ block does not run)
    sys_path: tuple[str, ...]


class Launch(NamedTuple):
    argv: list[str]
    env: dict[str, str]
    cwd: str
    direct: bool = False  # a command without a Python runner: exit status 0 is its success (see below)
    spec_file: str | None = None  # a Python run's start record (the runner's argument)
    preload: Preload | None = None
    command: list[str] | None = None  # a direct launch's own command (what the wrapper starts)


def warm_candidate(launch: Launch) -> bool:
    """Whether a warm start is tried for ``launch`` at all: a GPUTask run, or a command whose program
    is named ``python...`` (the module is not even imported for other programs: a command sweep's
    start stays small). Whether it is then forked is ``zygote.WarmStarts.start``'s to say."""
    if launch.command is None:
        return launch.spec_file is not None
    return bool(launch.command) and os.path.basename(launch.command[0]).startswith("python")


# A command run without a Python runner (``gts queue``'s lines, ``command:`` sweeps) runs in one
# POSIX sh, the wrapper: it starts the command in the background and waits for it. A stop signal to
# the group reaches the command; the wrapper traps it and keeps waiting, so the command gets the
# whole grace period to act on it. When the command exits 0 without having been asked to stop, the
# wrapper records the success in the run's outcome file (one write of a few bytes, with the
# attempt's token; never through a link the run may have planted), so a scheduler killed a moment
# later still never runs it again. The values are in the environment and the arguments, never in
# the script.
#
# If the scheduler dies, the sweep's keeper (keeper.py) kills the run, unless its command has
# already ended: the wrapper tells it where it is by closing two descriptors, GTS_FORKED_FD once
# the command is started and GTS_LIFELINE_FD once it has ended. A shell line (``sh -c LINE``) is
# evaluated in the wrapper's background subshell, not in a second shell: one exec per run fewer.
_WAIT_AND_RECORD = (
    'trap "stopping=1; stopped=1" TERM INT HUP; '
    'while :; do wait "$child"; status=$?; '
    'if [ -n "$stopping" ] && kill -0 "$child" 2>/dev/null; then stopping=; continue; fi; break; done; '
    "{after_wait}"
    "f=$GTS_OUTCOME_FILE; d=${{f%/*}}; "
    'if [ "$status" -eq 0 ] && [ -z "$stopped" ]; then '
    'if [ -L "$f" ] || [ -L "$d" ] || [ -L "${{d%/*}}" ]; then '
    'echo "gpu_task_scheduler: the run folder holds a symbolic link where its outcome goes" >&2; exit 4; fi; '
    'printf \'{{"status": "succeeded", "token": "%s", "config_hash": "%s", "pid": %d}}\\n\' '
    '"$GTS_RUN_TOKEN" "$GTS_CONFIG_HASH" "$$" > "$f" || exit 4; fi; '
    'exit "$status"'
)
_LINE_START = '{ __gts_line=$1; shift; eval "$__gts_line"; } &'  # the line sees no arguments, as in sh -c
_ARGV_START = '"$@" &'
_KEPT_WAIT_AND_RECORD = (
    ' child=$!; eval "exec $GTS_FORKED_FD<&-"; '  # started: from here on the keeper looks at the command
    + _WAIT_AND_RECORD.format(after_wait='eval "exec $GTS_LIFELINE_FD<&-"; ')  # ended: the keeper spares it
)
# It changes into the run's directory itself: it can then be started with posix_spawn from anywhere
# (which cannot change the directory), so its two descriptors always get the low numbers that dash
# can name in a redirection (one digit; Popen would keep the scheduler's own, often above 9).
_CD = 'cd "${GTS_CWD:-.}" || exit 126; '
_KEPT_LINE_WRAPPER = _CD + _LINE_START + _KEPT_WAIT_AND_RECORD
_KEPT_ARGV_WRAPPER = _CD + _ARGV_START + _KEPT_WAIT_AND_RECORD
# Where there is no keeper (no /proc), each wrapper has a watcher that blocks on the lifeline: when
# the scheduler is gone, it freezes the command (SIGSTOP) and kills the whole group, unless the
# command had already exited (a zombie, or reaped), whose success is then recorded as it would
# have been. It says so in the run's log first (and what its read of the lifeline gave: a run
# killed at its start by a lifeline that was never open would otherwise die without a word).
_WATCHED_WRAPPER = (
    '"$@" & child=$!; '
    '{ trap "" TERM INT HUP; read -r _ <&"$GTS_LIFELINE_FD"; read_status=$?; '
    'if [ -r "/proc/$$/stat" ]; then kill -STOP "$child" 2>/dev/null; '
    'while read -r s 2>/dev/null <"/proc/$child/stat"; do '
    'case "${s##*) }" in Z*) exit 0;; [Tt]*) break;; esac; done; '
    '[ -r "/proc/$child/stat" ] || exit 0; fi; '
    'echo "gpu_task_scheduler: the scheduler is gone (its lifeline ended, read status $read_status): '
    'the run is killed" >&2; '
    "kill -KILL 0; } & watcher=$!; " + _WAIT_AND_RECORD.format(after_wait='kill -KILL "$watcher" 2>/dev/null; ')
)


def command_argv(argv: Sequence[str], *, kept: bool | None = None) -> list[str]:
    """The wrapper's argv for the command ``argv``; ``kept``: for a keeper (default: where there is one)."""
    if kept is None:
        kept = keeper_available()
    if not kept:
        return ["/bin/sh", "-c", _WATCHED_WRAPPER, WRAPPER_NAME, *argv]
    if len(argv) == 3 and argv[0] == "/bin/sh" and argv[1] == "-c":  # a shell line
        return ["/bin/sh", "-c", _KEPT_LINE_WRAPPER, WRAPPER_NAME, argv[2]]
    return ["/bin/sh", "-c", _KEPT_ARGV_WRAPPER, WRAPPER_NAME, *argv]


def class_factory(task_class: type[GPUTask]) -> TaskFactory:
    """``task_class(config, work_dir)`` for each run, as the original did."""

    def make(spec: RunSpec) -> GPUTask:
        return task_class(copy.deepcopy(spec.config), spec.work_dir)

    make.__name__ = task_class.__name__
    return make


def _checked_env(env: Any, task_class: type) -> dict[str, str]:
    where = f"{task_class.__name__}.required_env()"
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise LaunchError(f"{where} must return a dict of environment variables; got {type(env).__name__}")
    checked = {}
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise LaunchError(f"{where} returned the invalid variable name {key!r}")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or "\0" in str(value):
            raise LaunchError(f"{where} returned {key}={value!r}; values must be strings")
        checked[key] = str(value)
    return checked


def by_value(task_class: type) -> bool:
    """Whether the run's process cannot import ``task_class`` by name: it was defined in a
    ``__main__`` with no file to import again (the REPL, a notebook, ``python - < sweep.py``,
    ``python -c``), so it must travel by value (cloudpickle)."""
    if task_class.__module__ != "__main__":
        return False
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return not path or not os.path.isfile(path)


def unguarded_start_problem(task_classes: Sequence[type], frame: Any) -> str | None:
    """Why the sweep must not start from ``frame`` (the caller of ``start()``), or None.

    A run of a class defined in the user's script finds it by loading that script again in its
    own process (``runner.py``). Where the script calls ``start()`` outside an
    ``if __name__ == "__main__":`` block, that load would start the sweep again in every run's
    process, and each would fail, naming the user's own sweep as "another scheduler". So the
    script's source is read where the call is made at its top level: a call under no ``if`` that
    tests ``__name__`` is refused before anything runs."""
    if not any(cls.__module__ == "__main__" and not by_value(cls) for cls in task_classes):
        return None
    main = sys.modules["__main__"]
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back
    if frame is None:  # started from code that is not the script's top level (a thread, atexit)
        return None
    import ast

    path, line = str(main.__file__), frame.f_lineno
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node.lineno <= line <= (node.end_lineno or node.lineno):
            if any(isinstance(name, ast.Name) and name.id == "__name__" for name in ast.walk(node.test)):
                return None
    names = ", ".join(sorted({cls.__name__ for cls in task_classes if cls.__module__ == "__main__"}))
    return (
        f'{os.path.basename(path)} starts the sweep at line {line} outside an `if __name__ == "__main__":` '
        f"block. Each run's process loads the script again to find {names}, and would start the sweep again "
        'there: put the call to start() (and what only the sweep needs) under `if __name__ == "__main__":`. '
        "Nothing ran"
    )


def by_value_problem(task_class: type) -> str | None:
    """Why runs of ``task_class`` could not start here (asked before the sweep starts), or None."""
    if not by_value(task_class):
        return None
    try:
        import cloudpickle  # noqa: F401
    except ImportError:
        return (
            f"{task_class.__name__} is defined in a script without a file (read from stdin, python -c, the "
            "REPL), so its runs' processes cannot import it: put it in a module or a script file, or "
            f"{install_hint('interactive')}: cloudpickle carries it across by value"
        )
    return None


def _pickle_task(task: GPUTask) -> bytes:
    import pickle  # here: a command sweep never pickles (the import would cost its start 1.4 ms)

    try:
        if by_value(type(task)):  # only pickling by value can carry the class across
            problem = by_value_problem(type(task))
            if problem is not None:
                raise LaunchError(problem)
            import cloudpickle

            return cloudpickle.dumps(task)
        return pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL)
    except LaunchError:
        raise
    except Exception as error:
        raise LaunchError(f"the {type(task).__name__} object cannot be pickled for its process: {error}") from error


def _rungs(rule: object) -> tuple[str, dict[str, Any]] | None:
    """``("stop" or "pause", where report() waits)`` for a rule that judges runs at rungs (ASHA, the
    pausing methods, PBT: report() waits there for the verdict); None for one that does not."""
    from ...tuning.stopping import Asha, Pausing  # here: a sweep without early_stop never needs the rules (4 ms)

    if isinstance(rule, Asha):
        return "stop", {"steps": rule.rungs}
    if isinstance(rule, Pausing):
        return "pause", rule.waits()
    return None


class _Inherited:
    """``dict(os.environ)``, made again only when the environment changed: the copy decodes each
    variable in Python (80 us a run here, with 40 variables), the check compares the raw bytes
    ``os.environ`` keeps (a C comparison, 1 us). Where that mapping is not there, every run copies."""

    copied: tuple[dict[Any, Any], dict[str, str]] = ({}, {})  # (raw, decoded): one attribute, set at once

    @classmethod
    def environment(cls) -> dict[str, str]:
        raw = getattr(os.environ, "_data", None)
        if not isinstance(raw, dict):
            return dict(os.environ)
        copied = cls.copied
        if raw != copied[0] or not copied[0]:
            copied = cls.copied = (dict(raw), dict(os.environ))
        return dict(copied[1])


def _environment(slot: Slot, extra_env: dict[str, str]) -> dict[str, str]:
    env = _Inherited.environment()
    env.update(slot.env())
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # so GPU ids mean the same to CUDA as to nvidia-smi and NVML
    env["MPLBACKEND"] = "Agg"  # runs have no screen; a task may override it through required_env()
    env["PYTHONUNBUFFERED"] = "1"  # so the log file follows the run live
    env.update(extra_env)
    return env


def run_identity(spec: RunSpec, attempt: int, resume_step: float | None = None) -> dict[str, str]:
    """What a run is, for experiment trackers (W&B, MLflow, TensorBoard run names), in its
    environment. Per run, so not in a pre-warmed runner's environment: the runner sets them
    before it loads the run's task (read them in ``main()``, not at a module's import)."""
    work_dir = os.path.abspath(spec.work_dir)
    identity = {
        "GTS_RUN_NAME": spec.name,
        "GTS_RUN_DIR": work_dir,
        "GTS_SWEEP_ROOT": os.path.dirname(work_dir),
        "GTS_RUN_INDEX": str(spec.index),
        "GTS_ATTEMPT": str(attempt),
        METRICS_ENV: RunPaths(work_dir, None).metrics,
        PRUNE_ENV: RunPaths(work_dir, None).pruned,
        CHECKPOINT_ENV: RunPaths(work_dir, None).checkpoint,
        RESUME_ENV: "" if resume_step is None else step_name(resume_step),
    }
    rungs = None if spec.early_stop is None else _rungs(spec.early_stop)
    if spec.early_stop is not None and rungs is not None:  # report() waits at the rule's rungs for the verdict
        identity[RUNGS_ENV] = json.dumps({"metric": spec.early_stop.metric, **rungs[1]})
        identity[JUDGED_ENV] = RunPaths(work_dir, None).judged
        if rungs[0] == "pause":  # report() raises Paused when told
            identity[PAUSE_ENV] = RunPaths(work_dir, None).pause
    if spec.stage is not None:
        identity["GTS_STAGE"] = spec.stage
        # One per line: a folder name may hold ':' or ' ', never a newline (naming.py escapes it).
        identity["GTS_DEP_DIRS"] = "\n".join(dependency_dirs(spec))
    return identity


def dependency_dirs(spec: RunSpec) -> list[str]:
    """The folders of the runs ``spec`` waited for (absolute: the run's current directory is not the root's)."""
    root = os.path.dirname(os.path.abspath(spec.work_dir))
    return [os.path.join(root, name) for name in spec.after]


def _rotate_log(paths: RunPaths, attempt: int, *, resumed: bool) -> None:
    """Keep the log and the metrics of an earlier attempt instead of overwriting them: an attempt
    reports its own curve (one that goes on from a checkpoint, from the step after it; one that
    ignores it, from its first step again). An attempt that starts afresh also finds the checkpoint
    folder of the one before kept aside; a resumed attempt goes on with it."""
    kept = [(paths.log, paths.old_log(attempt - 1)), (paths.metrics, paths.old_metrics(attempt - 1))]
    for current, old in kept:
        if current and os.path.lexists(current):
            os.makedirs(paths.old_logs, exist_ok=True)
            os.replace(current, old)
    if not resumed and _has_entries(paths.checkpoint):  # an empty one stays: nothing to keep aside
        checkpoints.set_aside(paths, attempt - 1, KEEP_SET_ASIDE)


def _has_entries(folder: str) -> bool:
    try:
        with os.scandir(folder) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


def _prepare_folder(spec: RunSpec, paths: RunPaths, attempt: int, *, resumed: bool = False) -> None:
    """The run folder, ready for this attempt: its records folder, nothing of an earlier attempt's
    end, its config. A folder this call creates holds nothing yet, so nothing in it is checked,
    removed or set aside (two mkdirs and one file: the common case, a run's first attempt); one
    that was there is checked for links first and cleared of what an earlier attempt left."""
    config = json.dumps(to_jsonable(spec.config), indent=1, sort_keys=True).encode("utf-8")
    try:
        try:
            os.mkdir(paths.work_dir)
        except (FileExistsError, FileNotFoundError):  # there already, or its parent is missing
            fresh = False
        else:
            fresh = True
            os.mkdir(paths.meta)
            os.mkdir(paths.checkpoint)
            if paths.log and os.path.dirname(paths.log) != paths.work_dir:  # a log_file in a subfolder
                os.makedirs(os.path.dirname(paths.log), exist_ok=True)
            fd = os.open(paths.config, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
            try:  # informational: no rename needed in a folder no one knew
                write_all(fd, config)
            finally:
                os.close(fd)
    except OSError as error:
        raise LaunchError(f"could not prepare the run folder: {error}") from error
    if fresh:
        return
    problem = paths.unsafe()
    if problem is not None:
        raise LaunchError(f"the run folder is not safe to use: {problem}")
    try:
        os.makedirs(paths.meta, exist_ok=True)
        # An earlier attempt's end, and what it was told, are not this one's.
        for stale in (paths.outcome, paths.pruned, paths.judged, paths.pause):
            try:
                os.unlink(stale)
            except FileNotFoundError:
                pass
        _rotate_log(paths, attempt, resumed=resumed)
        os.makedirs(paths.checkpoint, exist_ok=True)
        if paths.log and os.path.dirname(paths.log) != paths.work_dir:  # a log_file in a subfolder
            os.makedirs(os.path.dirname(paths.log), exist_ok=True)
        atomic_write(paths.config, config, durable=False)  # informational
    except OSError as error:
        raise LaunchError(f"could not prepare the run folder: {error}") from error


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def prepare(
    *,
    spec: RunSpec,
    slot: Slot,
    make_task: TaskFactory,
    paths: RunPaths,
    token: str,
    attempt: int,
    resume_step: float | None = None,
    python: str = sys.executable,
) -> Launch:
    _prepare_folder(spec, paths, attempt, resumed=resume_step is not None)
    task_name = getattr(make_task, "__name__", "the task")
    try:
        task = make_task(spec)
        task_name = type(task).__name__
        if spec.after:
            task.__dict__["_gts_dependencies"] = tuple(dependency_dirs(spec))  # GPUTask.dependencies
        extra_env = _checked_env(task.required_env(), type(task))
        # A task that is a command (CommandTask, a gts queue line) says which: it runs without Python.
        direct_command = getattr(task, "direct_command", None)
        direct = direct_command(slot.cuda_visible_devices) if callable(direct_command) else None
    except LaunchError:
        raise
    except Exception as error:
        details = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        raise LaunchError(f"{task_name} failed before main(): {type(error).__name__}: {error}", details) from error
    env = _environment(slot, extra_env)
    identity = run_identity(spec, attempt, resume_step)
    if direct is not None:
        env.update(direct[1])
        env.update(identity)
        env.update(GTS_OUTCOME_FILE=os.path.abspath(paths.outcome), GTS_CONFIG_HASH=spec.config_hash)
        return Launch(argv=command_argv(direct[0]), env=env, cwd=os.getcwd(), direct=True, command=list(direct[0]))
    payload = _pickle_task(task)
    main_file = None
    if type(task).__module__ == "__main__" and not by_value(type(task)):  # the script, loaded again there
        main_file = os.path.abspath(str(sys.modules["__main__"].__file__))
    start = RunStart(
        token=token,
        config_hash=spec.config_hash,
        task_file=os.path.abspath(paths.task),
        outcome_file=os.path.abspath(paths.outcome),
        main_file=main_file,
        sys_path=[os.path.abspath(p) if p else os.getcwd() for p in sys.path if isinstance(p, str)],
        run_env=identity,
    )
    try:
        atomic_write(paths.task, payload)
        start.write(paths.spec)
    except OSError as error:
        raise LaunchError(f"could not write the run's start files: {error}") from error
    module = type(task).__module__
    return Launch(
        argv=[python, "-c", _RUNNER_BOOT, os.path.abspath(paths.spec)],
        env=env,
        cwd=os.getcwd(),
        spec_file=os.path.abspath(paths.spec),
        preload=Preload(None if module == "__main__" else module, main_file, tuple(start.sys_path)),
    )


def prepare_attempt(attempt: Attempt, make_task: TaskFactory) -> Launch:
    """:func:`prepare` for one attempt, as every launcher calls it."""
    return prepare(
        spec=attempt.spec,
        slot=attempt.slot,
        make_task=make_task,
        paths=attempt.paths,
        token=attempt.token,
        attempt=attempt.number,
        resume_step=attempt.resume_step,
    )


def runner_argv_for(mode: str, info: str, python: str = sys.executable) -> list[str]:
    """Our runner in ``mode`` (``--fork-server``: the warm process, ``forkserver.py``)."""
    return [python, "-c", _RUNNER_BOOT, mode, info]
