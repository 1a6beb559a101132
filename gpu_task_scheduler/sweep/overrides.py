"""Overrides on the command line, as Hydra writes them: ``gts run sweep.yaml lr=0.1,0.01 layers=2``.

* ``key=a,b`` sweeps ``key`` over the values; ``key=a`` fixes it. A key swept in
  ``test_config`` (or a stage's) gets the values in every block that has it; a key of
  ``global_config`` given several values becomes swept, in every block.
* ``+key=...`` adds a key the config does not have (a single value to
  ``global_config``, several swept in every block); without the ``+`` an
  unknown key is an error that lists the keys there are, and with it a key
  that exists is an error too, so a typo never silently adds a key.
* A dotted key reaches inside: ``scheduler_config.timeout=600``,
  ``global_config.model.layers=4`` or ``model.layers=4`` (into a dict of
  ``global_config``). Its value is one value: write a list as ``[0, 1]``.
* ``task=pkg.mod:Class``, ``shell=true`` and ``command=...`` set those keys.
* Values are read as YAML, with the config loader's float forms (``1e-3`` is a
  float). Commas inside brackets, braces or quotes do not split values.

Overrides change only what they name; the resulting config is validated as any
other, so a bad value is reported as the config's.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError, unknown_key_message
from .files import load_yaml

_TOP_VALUES = ("task", "command", "shell")
_EXAMPLE = {
    "scheduler_config": "timeout=600",
    "global_config": "epochs=10",
    "search": "n_runs=100",
    "early_stop": "min_step=3",
}


def split_values(text: str) -> list[str]:
    """``a,b`` -> ``["a", "b"]``; commas inside ``[]``, ``{}``, ``()`` or quotes do not split.

    >>> split_values("0.1,[1, 2],'x,y'")
    ['0.1', '[1, 2]', "'x,y'"]
    """
    parts, depth, quote, start = [], 0, "", 0
    for index, character in enumerate(text):
        if quote:
            if character == quote:
                quote = ""
        elif character in "'\"":
            quote = character
        elif character in "[{(":
            depth += 1
        elif character in "]})":
            depth -= 1
        elif character == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def _value(text: str, where: str) -> Any:
    try:
        return load_yaml(text)
    except Exception as error:  # yaml.YAMLError, through the lazy import
        raise ConfigError(f"the override {where} has a value that is not YAML: {text!r} ({error})") from None


def apply_overrides(config: dict[str, Any], overrides: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """The config with the overrides applied (``config`` itself is not changed), and one line per
    override saying what it did (for ``--dry-run``)."""
    config = copy.deepcopy(config)
    notes = []
    for override in overrides:
        key, sep, text = override.partition("=")
        add = key.startswith("+")
        path = key[1:].split(".") if add else key.split(".")
        if not sep or not all(path):
            raise ConfigError(
                f"the override {override!r} is not KEY=VALUE "
                "(e.g. lr=0.1,0.01, +seed=1,2, scheduler_config.timeout=600)"
            )
        notes.append(_apply(config, path, text, add, override))
    return config, notes


def _apply(config: dict[str, Any], path: list[str], text: str, add: bool, override: str) -> str:
    head = path[0]
    if head in _TOP_VALUES and len(path) == 1:
        _check_add(add, head in config, override, head)
        config[head] = _value(text, override)
        return f"{head} = {config[head]!r}"
    if head == "test_config":
        raise ConfigError(f"the override {override!r} names test_config; name the swept key itself (e.g. lr=0.1,0.01)")
    if head in (*_SECTIONS, "global_config") and len(path) == 1:
        raise ConfigError(f"the override {override!r} names {head}; name a key in it (e.g. {head}.{_EXAMPLE[head]})")
    if len(path) > 1 and len(split_values(text)) > 1:
        raise ConfigError(
            f"the override {override!r} gives several values to {'.'.join(path)}, a key inside a dict, which "
            f"is not swept: give one value, or a list as {'.'.join(path)}=[{text}]"
        )
    if head in _SECTIONS:
        section = _section(config, head, override)
        return _set_nested(section, path[1:], _value(text, override), add, override, head)
    space = _search_space(config)
    if space is not None and head in space:  # a search's bound: lr.loguniform=[1e-4,1e-2], lr={int: [2, 8]}
        if len(path) == 1:
            space[head] = _value(text, override)
            return f"test_config[0].{head} = {space[head]!r}"
        return _set_nested(space, path, _value(text, override), add, override, "test_config[0]")
    if head == "global_config":
        path = path[1:]
    if len(path) > 1:
        section = _section(config, "global_config", override)
        return _set_nested(section, path, _value(text, override), add, override, "global_config")
    return _sweep_or_fix(config, path[0], [_value(piece, override) for piece in split_values(text)], add, override)


_SECTIONS = ("scheduler_config", "search", "early_stop")  # dicts of settings: a key in them is set, not swept


def _search_space(config: dict[str, Any]) -> dict[str, Any] | None:
    """The one block of a search's test_config, if the config searches."""
    blocks = config.get("test_config")
    if "search" not in config or not isinstance(blocks, list) or len(blocks) != 1 or not isinstance(blocks[0], dict):
        return None
    return blocks[0]


def _section(config: dict[str, Any], name: str, override: str) -> dict[str, Any]:
    section = config.setdefault(name, {})
    if section is None:
        section = config[name] = {}
    if not isinstance(section, dict):
        raise ConfigError(f"the override {override!r} reaches into {name}, which is not a dict")
    return section


def _check_add(add: bool, exists: bool, override: str, key: str) -> None:
    if add and exists:
        raise ConfigError(f"the override {override!r} adds {key!r}, which the config has; drop the +")


def _set_nested(section: dict[str, Any], path: list[str], value: Any, add: bool, override: str, where: str) -> str:
    target = section
    for depth, part in enumerate(path[:-1]):
        if part not in target:
            if not add:
                inside = ".".join([where, *path[:depth]])
                raise ConfigError(unknown_key_message(f"{inside} (override {override!r})", part, list(target)))
            target[part] = {}
        target = target[part]
        if not isinstance(target, dict):
            raise ConfigError(f"the override {override!r}: {where}.{'.'.join(path[: depth + 1])} is not a dict")
    last = path[-1]
    known = last in target
    if where in _SECTIONS and len(path) == 1:
        known = True  # defaults fill these sections; their validation names an unknown key
    elif not known and not add:
        inside = ".".join([where, *path[:-1]])
        raise ConfigError(unknown_key_message(f"{inside} (override {override!r})", last, list(target)))
    else:
        _check_add(add, known, override, last)
    target[last] = value
    return f"{where}.{'.'.join(path)} = {value!r}"


def _blocks(config: dict[str, Any], create: bool = False) -> list[Any]:
    """The test_config blocks of the config, or of every stage (``create``: a missing test_config becomes [{}])."""
    stages = config.get("stages")
    holders = [s for s in stages if isinstance(s, dict)] if isinstance(stages, list) else [config]
    blocks: list[Any] = []
    for holder in holders:
        found = holder.get("test_config")
        if not isinstance(found, list) and create:
            holder["test_config"] = found = [{}]
        blocks += found if isinstance(found, list) else []
    return blocks


def _sweep_or_fix(config: dict[str, Any], key: str, values: list[Any], add: bool, override: str) -> str:
    blocks = _blocks(config)
    with_key = [block for block in blocks if isinstance(block, dict) and key in block]
    found = config.get("global_config")
    global_config: dict[str, Any] = found if isinstance(found, dict) else {}
    in_global = key in global_config
    _check_add(add, bool(with_key) or in_global, override, key)
    if with_key:
        for block in with_key:
            block[key] = list(values)
        what = f"= {values[0]!r}" if len(values) == 1 else f"swept over {values!r}"
        return f"{key} {what} in {len(with_key)} test_config block(s)"
    if not in_global and not add:
        known = sorted({k for block in blocks if isinstance(block, dict) for k in block} | set(global_config))
        raise ConfigError(
            unknown_key_message(f"the config (override {override!r})", key, known) + f" To add it, write +{override}"
        )
    if len(values) == 1:
        _section(config, "global_config", override)[key] = values[0]
        return f"global_config.{key} = {values[0]!r}"
    if in_global:
        del config["global_config"][key]
    if not blocks:
        blocks = _blocks(config, create=True)
    for block in blocks:
        if isinstance(block, dict):
            block[key] = list(values)
    return f"{key} swept over {values!r} in every test_config block"
