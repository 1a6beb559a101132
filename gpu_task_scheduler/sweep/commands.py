"""Shell-command sweeps: a run is a command built from a template.

A template is an argv list, ``["python", "train.py", "--lr", "{lr}"]``, or a
string that is split like a shell would split it (``shlex``) *before* the
values are filled in. Either way each value lands in exactly one argument and
no shell ever sees it, so a value such as ``; rm -rf ~`` is just text. Only
with ``shell: true`` is the string given to ``/bin/sh``, and even then no
value is written into it: each placeholder becomes a reference to an
environment variable holding the value (see ``shell_template.py``).

Placeholders: every config key, plus ``{work_dir}``, ``{run_name}``,
``{run_index}`` and ``{gpus}`` (the run's ``CUDA_VISIBLE_DEVICES``), and in a
stage that follows another, ``{dep_dir}`` (see ``stages.py``). Format
specs work (``{lr:.0e}``); an unknown placeholder is a ``ConfigError`` before
anything runs.

This module is the config-time half (checking and filling templates); running
the command is ``backends/local/tasks.py``'s ``CommandTask``.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from .templates import base_key, check_fields, fill, format_one, placeholders

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
    """The argv for one run (``shell`` templates: :func:`render_shell`, which also gives the environment).

    A part that uses a key the run does not have (a search's conditional key whose ``when`` is false;
    every other key was checked with the config) is left out, and with it the option just before it
    (``--momentum {momentum}``: both go; ``--momentum={momentum}`` is one part).

    >>> render(["train", "--lr", "{lr}", "--momentum", "{momentum}", "--out={work_dir}"], {"lr": 0.1, "work_dir": "w"})
    ['train', '--lr', '0.1', '--out=w']
    """
    argv: list[str] = []
    for index, part in enumerate(parts):
        fields = placeholders(part)
        if any(base_key(field) not in values for field, _, _ in fields):
            before = parts[index - 1] if index else ""
            if argv and before.startswith("-") and not placeholders(before) and argv[-1] == before:
                argv.pop()
            continue
        argv.append(fill(part, values))
    return argv


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
