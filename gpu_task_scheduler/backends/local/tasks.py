"""The tasks the scheduler itself provides, and how a sweep's task is chosen.

* a ``GPUTask`` subclass given by the caller, or named in the config
  (``task: "package.module:Class"``, imported here);
* :class:`CommandTask`: a ``command:`` template filled with the run's values
  (templates are checked and filled by ``sweep/commands.py``);
* :class:`ShellLineTask`: one line of ``gts queue`` input, run by ``/bin/sh``.
"""

from __future__ import annotations

import copy
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from ...errors import ConfigError, TaskClassError
from ...gpu_task import GPUTask
from ...sweep.commands import check_template, render, render_shell
from ...sweep.expand import RunSpec, Sweep
from .prepare import TaskFactory, by_value_problem, class_factory


def check_task_class(task_class: object) -> type[GPUTask]:
    if not (isinstance(task_class, type) and issubclass(task_class, GPUTask)):
        raise TaskClassError(
            f"gpu_task_class must be a subclass of gpu_task_scheduler.gpu_task.GPUTask; got {task_class!r}"
        )
    return task_class


def import_task(reference: str) -> type[GPUTask]:
    """``"package.module:ClassName"`` -> the class (the current directory is importable, as with ``python -m``)."""
    module_name, _, class_name = reference.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
        task_class = getattr(module, class_name)
    except Exception as error:
        raise ConfigError(f"cannot import the task {reference!r}: {type(error).__name__}: {error}") from error
    return check_task_class(task_class)


def command_factory(sweep: Sweep, command: Any, shell: bool, keys: list[str] | None = None) -> TaskFactory:
    parts = check_template(command, sweep.keys() if keys is None else keys, shell=shell)

    def make(spec: RunSpec) -> GPUTask:
        return CommandTask(
            copy.deepcopy(spec.config),
            spec.work_dir,
            parts=parts,
            shell=shell,
            run_name=spec.name,
            run_index=spec.index,
        )

    make.__name__ = "CommandTask"
    return make


def resolve_task(
    sweep: Sweep, task_class: type[GPUTask] | None = None, *, command: Any = None, shell: bool | None = None
) -> TaskFactory:
    """What each run of ``sweep`` runs: ``task_class``, else a command (given here or in the
    config), else the config's ``task``; a stage's own ``task`` or ``command`` for its runs.
    A ``TaskClassError`` when a run has none."""
    if not sweep.staged:
        factory = _resolve_default(sweep, task_class, command=command, shell=shell)
        sweep.set_program(None, sweep.task_record)
        return factory
    default: TaskFactory | None = None
    if all(stage.task_ref is not None or stage.command is not None for stage in sweep.stages):
        try:  # every stage names its own: the sweep needs no task of its own
            default = _resolve_default(sweep, task_class, command=command, shell=shell)
        except TaskClassError:
            pass
    else:
        default = _resolve_default(sweep, task_class, command=command, shell=shell)
    by_stage: dict[str | None, TaskFactory] = {}
    for stage in sweep.stages:
        if stage.command is not None:
            stage_shell = stage.shell if stage.shell is not None else sweep.shell
            keys = stage.keys() + (["dep_dir"] if stage.after else [])
            by_stage[stage.name] = command_factory(sweep, stage.command, stage_shell, keys)
            sweep.set_program(stage.name, {"command": stage.command, "shell": stage_shell})
        elif isinstance(stage.task_ref, str):
            by_stage[stage.name] = class_factory(import_task(stage.task_ref))
            sweep.set_program(stage.name, {"task": stage.task_ref})
        elif stage.task_ref is not None:
            by_stage[stage.name] = class_factory(check_task_class(stage.task_ref))
            sweep.set_program(stage.name, _class_record(stage.task_ref))
        else:
            assert default is not None
            by_stage[stage.name] = class_factory(default) if isinstance(default, type) else default
            sweep.set_program(stage.name, sweep.task_record)

    def make(spec: RunSpec) -> GPUTask:
        return by_stage[spec.stage](spec)

    make.__name__ = "the stage's task"
    return make


def _resolve_default(
    sweep: Sweep, task_class: type[GPUTask] | None, *, command: Any, shell: bool | None
) -> TaskFactory:
    if task_class is not None:
        checked = check_task_class(task_class)
        problem = by_value_problem(checked) if sweep.options.backend == "local" else None  # Ray pickles by value
        if problem is not None:
            raise TaskClassError(problem)
        sweep.task_record = _class_record(task_class) or sweep.task_record
        return checked
    if command is not None or sweep.command is not None:
        command = command if command is not None else sweep.command
        shell = sweep.shell if shell is None else shell
        factory = command_factory(sweep, command, shell, sweep.keys() + (["dep_dir"] if sweep.followed else []))
        sweep.task_record = {"command": command, "shell": shell}
        return factory
    if sweep.task_ref is not None:
        sweep.task_record = {"task": sweep.task_ref}
        return import_task(sweep.task_ref)
    raise NoTaskError(
        "no task to run: pass gpu_task_class, or set task ('package.module:Class') or command in the config"
    )


class NoTaskError(TaskClassError):
    """The sweep names no task: each interface says so in its own words (``gts run``: --task)."""


def _class_record(task_class: type) -> dict[str, Any] | None:
    """``{"task": "module:Class"}``, or None for a class that cannot be imported by that name."""
    if task_class.__module__ == "__main__" or "<locals>" in task_class.__qualname__:
        return None
    return {"task": f"{task_class.__module__}:{task_class.__qualname__}"}


class CommandFailed(SystemExit):
    """The run's command exited non-zero; the run's process exits with the same code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def run_with_grace(command: str | list[str], *, shell: bool, env: dict[str, str] | None) -> tuple[int, int | None]:
    """Run the command; a stop signal to us is left to the command to act on.

    The scheduler signals the run's whole process group, so the command has
    the signal already (we pass it on only if it was sent to us alone). We
    keep waiting, so a command that traps SIGTERM to save a checkpoint gets
    the whole grace period; the scheduler's SIGKILL ends both of us after it.
    Returns ``(returncode, stop signal or None)``.
    """
    import subprocess  # here, in the run's process: the scheduler's start does not need it

    received: list[int] = []
    children: list[subprocess.Popen] = []

    # Started by the scheduler, we lead the run's session and group, and a stop
    # reaches the command through the group; a second copy could count as
    # "stop now" to it. Otherwise (run by hand, or the command left the group)
    # we pass the signal on.
    scheduled = os.getsid(0) == os.getpid()

    def on_stop(signum: int, frame: Any) -> None:
        received.append(signum)
        for child in children:
            try:
                if not scheduled or os.getpgid(child.pid) != os.getpgrp():
                    os.kill(child.pid, signum)
            except OSError:
                pass

    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {signum: signal.signal(signum, on_stop) for signum in stops}
    try:
        children.append(subprocess.Popen(command, shell=shell, env=env, stdin=subprocess.DEVNULL))
        returncode = children[0].wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return returncode, (received[0] if received else None)


class CommandTask(GPUTask):
    """Runs one command per run, in the run folder's context, with the run's GPUs."""

    def __init__(
        self,
        config: dict[str, Any],
        work_dir: str,
        *,
        parts: Sequence[str],
        shell: bool = False,
        run_name: str = "",
        run_index: int = 0,
    ) -> None:
        super().__init__(config, work_dir)
        self.parts = list(parts)
        self.shell = shell
        self.run_name = run_name
        self.run_index = run_index

    def direct_command(self, gpus: str) -> tuple[list[str], dict[str, str]]:
        """The run's argv (with ``shell``, ``/bin/sh -c`` and the script) and the variables the script
        needs: the scheduler runs it without a Python process; ``main()`` runs the same by hand."""
        values = dict(self._config)
        values.update(work_dir=self._work_dir, run_name=self.run_name, run_index=self.run_index, gpus=gpus)
        if len(self.dependencies) == 1:  # a stage whose runs each wait for one run (checked with the config)
            values["dep_dir"] = self.dependencies[0]
        if not self.shell:
            return render(self.parts, values), {}
        script, variables = render_shell(self.parts[0], values)
        return ["/bin/sh", "-c", script], variables

    def main(self) -> None:
        argv, variables = self.direct_command(os.environ.get("CUDA_VISIBLE_DEVICES", ""))
        run_command(argv, shell=False, env={**os.environ, **variables} if variables else None)
        return None  # the command's own result.json, if it writes one, is the run's result


def run_command(command: str | list[str], *, shell: bool, env: dict[str, str] | None = None) -> None:
    """Run a run's command in this process's place: its failure is ours, with the same exit status
    (a signal N as 128 + N, as a shell reports it)."""
    sys.stdout.flush()
    returncode, stopped_by = run_with_grace(command, shell=shell, env=env)
    if stopped_by is not None:
        raise CommandFailed(
            128 + stopped_by,
            f"the command was stopped by {signal.Signals(stopped_by).name} (it ended with status {returncode})",
        )
    if returncode != 0:
        code = returncode if returncode > 0 else 128 - returncode
        how = f"exit code {returncode}" if returncode > 0 else f"signal {-returncode}"
        raise CommandFailed(code, f"the command failed with {how}")


class ShellLineTask(GPUTask):
    """Runs ``config["command"]`` through the shell, as simple-gpu-scheduler does.

    The scheduler starts the shell itself (``direct_command``), not a Python
    runner: a few milliseconds instead of a Python start per line; ``main()``
    does the same, for running the task by hand.
    """

    def direct_command(self, gpus: str) -> tuple[list[str], dict[str, str]]:
        return ["/bin/sh", "-c", self._config["command"]], {}

    def main(self) -> Any:
        run_command(self._config["command"], shell=True)
        return None
