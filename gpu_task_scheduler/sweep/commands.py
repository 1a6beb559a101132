"""Shell-command sweeps: a run is a command built from a template.

A template is an argv list, ``["python", "train.py", "--lr", "{lr}"]``, or a
string that is split like a shell would split it (``shlex``) *before* the
values are filled in. Either way each value lands in exactly one argument and
no shell ever sees it, so a value such as ``; rm -rf ~`` is just text. Only
with ``shell: true`` is the string given to ``/bin/sh``, and even then no
value is written into it: each placeholder becomes a reference to an
environment variable holding the value (see ``shell_template.py``).

Placeholders: every config key, plus ``{work_dir}``, ``{run_name}``,
``{run_index}`` and ``{gpus}`` (the run's ``CUDA_VISIBLE_DEVICES``). Format
specs work (``{lr:.0e}``); an unknown placeholder is a ``ConfigError`` before
anything runs.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from ..gpu_task import GPUTask
from .templates import check_fields, fill, format_one

BUILTINS = ("work_dir", "run_name", "run_index", "gpus")
Template = str | Sequence[str]


def check_template(template: Any, known_keys: Iterable[str], *, shell: bool = False) -> list[str]:
    """Validate a template against the sweep's keys; return it as a list of parts."""
    if isinstance(template, str):
        if not template.strip():
            raise ConfigError("command is empty")
        parts = [template] if shell else _split(template)
    elif isinstance(template, (list, tuple)) and template:
        if shell:
            raise ConfigError("with shell: true, command must be one string")
        parts = []
        for index, part in enumerate(template):
            if isinstance(part, bool) or not isinstance(part, (str, int, float)):
                raise ConfigError(f"command[{index}] is {part!r}; every argument must be a string")
            parts.append(str(part))
    else:
        raise ConfigError(f"command must be a list of arguments or a string; got {template!r}")
    if shell:
        from .shell_template import compile_shell_template

        compile_shell_template(parts[0])  # a placeholder the shell would evaluate is refused now
    known = set(known_keys) | set(BUILTINS)
    for part in parts:
        check_fields(part, known)
    return parts


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as error:
        raise ConfigError(f"command {text!r} cannot be split into arguments: {error}") from None


def render(parts: Sequence[str], values: Mapping[str, Any]) -> list[str]:
    """The argv for one run (``shell`` templates: :func:`render_shell`, which also gives the environment)."""
    return [fill(part, values) for part in parts]


def render_shell(template: str, values: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """``(script, environment)`` for a ``shell: true`` run.

    The script is the template with every placeholder replaced by a reference
    to an environment variable that holds the value (formatted in Python, spec
    and conversion included); the values never appear in the script, so no
    quoting context of the template can make the shell execute one.

    >>> render_shell('echo "pre-{v}-post"', {"v": "$(id)"})
    ('echo "pre-${GTS_ARG_0}-post"', {'GTS_ARG_0': '$(id)'})
    """
    from .shell_template import compile_shell_template

    compiled = compile_shell_template(template)
    env = {}
    for variable, (field, spec, conversion) in compiled.fields.items():
        text = format_one(field, spec, conversion, values)
        if "\0" in text:
            raise ValueError(f"the value of {{{field}}} contains a NUL character, which no command can be given")
        env[variable] = text
    return compiled.script, env


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

    def _values(self) -> dict[str, Any]:
        values = dict(self._config)
        values.update(
            work_dir=self._work_dir,
            run_name=self.run_name,
            run_index=self.run_index,
            gpus=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        )
        return values

    def command(self) -> tuple[str | list[str], dict[str, str] | None]:
        """The run's argv (or, with ``shell``, its script) and the environment it needs (None: ours)."""
        if not self.shell:
            return render(self.parts, self._values()), None
        script, values = render_shell(self.parts[0], self._values())
        return script, {**os.environ, **values}

    def main(self) -> None:
        command, env = self.command()
        sys.stdout.flush()
        returncode, stopped_by = run_with_grace(command, shell=self.shell, env=env)
        if stopped_by is not None:
            raise CommandFailed(
                128 + stopped_by,
                f"the command was stopped by {signal.Signals(stopped_by).name} (it ended with status {returncode})",
            )
        if returncode != 0:
            code = returncode if returncode > 0 else 128 - returncode
            how = f"exit code {returncode}" if returncode > 0 else f"signal {-returncode}"
            raise CommandFailed(code, f"the command failed with {how}")
        return None  # the command's own result.json, if it writes one, is the run's result
