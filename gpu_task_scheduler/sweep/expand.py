"""Config in, runs out: validation and lazy expansion of a sweep.

Pure: nothing here touches the filesystem (beyond reading a config file) or
the GPUs. The whole config is validated when a :class:`Sweep` is built, so a
bad value is reported before the first run starts or the first file is
written; runs are then produced one at a time, so a sweep of a million runs
never sits in memory.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, unknown_key_message
from ..gpu.devices import parse_memory
from ..jsonable import to_jsonable
from .files import ConfigSource, load_config
from .naming import NameRegistry, config_string, safe_folder_name
from .options import SchedulerOptions, parse_scheduler_config

logger = logging.getLogger("gpu_task_scheduler")

# What an open-ended sweep's runs() yields while its next run is not known yet
# (gts queue waiting for a line); it calls the ``wake`` given to Sweep.follow when there is more.
NOT_READY: Any = object()

TOP_LEVEL_KEYS = ("scheduler_config", "global_config", "test_config", "task", "command", "shell")


# --- global_config and test_config ------------------------------------------

MAX_DEPTH = 100
MAX_VALUES = 1_000_000


class _Budget:
    def __init__(self) -> None:
        self.left = MAX_VALUES


def check_values(value: Any, where: str, budget: _Budget | None = None, depth: int = 0) -> None:
    """Reject what would wedge a sweep later: nesting deeper than ``MAX_DEPTH``,
    more than ``MAX_VALUES`` values in all (a YAML alias bomb: aliases share one
    object that every later step would expand), and strings that cannot be
    written as UTF-8 (lone surrogates, as ``os.listdir`` returns for undecodable
    names: SQLite and JSON cannot store them).

    >>> check_values({"a": ["x", "\\udcff"]}, "global_config")
    Traceback (most recent call last):
    ...
    gpu_task_scheduler.errors.ConfigError: global_config['a'][1] is the string '\\udcff', which holds ...
    """
    budget = budget or _Budget()
    budget.left -= 1
    if budget.left < 0:
        raise ConfigError(
            f"the config holds more than {MAX_VALUES:,} values (counting each use of a YAML "
            f"alias), at {where}; a sweep config this large is a mistake (an alias bomb?)"
        )
    if depth > MAX_DEPTH:
        raise ConfigError(f"{where} is nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ConfigError(
                f"{where} is the string {value[:40]!r}, which holds {value[error.start]!r} "
                "(a lone surrogate, e.g. from an undecodable file name) and cannot be stored; "
                "decode such names with errors='replace' or use bytes.hex()"
            ) from None
    elif isinstance(value, Mapping):
        for key, item in value.items():
            check_values(key, f"{where} key {key!r}", budget, depth + 1)
            check_values(item, f"{where}[{key!r}]", budget, depth + 1)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for index, item in enumerate(value):
            check_values(item, f"{where}[{index}]", budget, depth + 1)


def _check_keys(mapping: Mapping[Any, Any], where: str) -> None:
    for key in mapping:
        if not isinstance(key, str):
            raise ConfigError(f"{where} has the key {key!r} ({type(key).__name__}); keys must be strings")
        if not key:
            raise ConfigError(f"{where} has an empty key; keys must be non-empty strings")


def _values(value: Any, where: str) -> Sequence[Any]:
    """A test-block entry must be an ordered, re-iterable, non-empty sequence."""
    hint = f"; write a list of values, e.g. [{value!r}]"
    if isinstance(value, (str, bytes)):
        raise ConfigError(f"{where} is the string {value!r}, not a list of values{hint}")
    if isinstance(value, Mapping):
        raise ConfigError(f"{where} is a dict, not a list of values")
    if isinstance(value, (set, frozenset)):
        raise ConfigError(f"{where} is a set, whose order changes between runs; use a list")
    if isinstance(value, (list, tuple, range)) or (hasattr(value, "__len__") and hasattr(value, "__getitem__")):
        if len(value) == 0:
            raise ConfigError(f"{where} is an empty list; give at least one value or remove the key")
        return value
    if hasattr(value, "__iter__"):
        raise ConfigError(f"{where} is a one-shot iterator ({type(value).__name__}); use a list")
    raise ConfigError(f"{where} is {value!r}, not a list of values{hint}")


def parse_global_config(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"global_config must be a dict; got {type(raw).__name__} {raw!r}")
    _check_keys(raw, "global_config")
    return dict(raw)


def parse_test_config(raw: Any) -> list[dict[str, Sequence[Any]]]:
    if raw is None:
        return [{}]
    if isinstance(raw, Mapping):
        raise ConfigError("test_config must be a list of blocks (dicts); wrap the dict in a list: [{...}]")
    if not isinstance(raw, (list, tuple)):
        raise ConfigError(f"test_config must be a list of blocks (dicts); got {type(raw).__name__} {raw!r}")
    blocks = []
    for index, block in enumerate(raw):
        where = f"test_config[{index}]"
        if not isinstance(block, Mapping):
            raise ConfigError(f"{where} must be a dict of key -> list of values; got {type(block).__name__} {block!r}")
        _check_keys(block, where)
        blocks.append({key: _values(values, f"{where}[{key!r}]") for key, values in block.items()})
    return blocks


# --- hashing ------------------------------------------------------------------


def params_text(test_config: Mapping[str, Any]) -> str:
    """A run's swept values as canonical JSON (keys sorted): what the ledger records as its identity."""
    return json.dumps(to_jsonable(test_config))


def config_hash(config: Mapping[str, Any]) -> str:
    text = json.dumps(to_jsonable(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# --- runs -----------------------------------------------------------------------


@dataclass(frozen=True)
class RunSpec:
    """One run of the sweep."""

    index: int  # position in the sweep, 0-based, in the original's order
    block: int  # which test_config block produced it
    test_config: dict[str, Any]  # the block's values for this run
    config: dict[str, Any]  # global_config updated with test_config
    test_config_string: str  # the original's unfiltered name, shown in the scheduler log
    name: str  # the folder name (filtered, made safe and unique)
    work_dir: str
    config_hash: str
    duplicate: bool  # the same config under the same name came earlier in the sweep
    renamed_from: str | None = None  # the colliding name, when the name was disambiguated


def _for_params(foreign: Callable[[str, str], bool], params: str) -> Callable[[str], bool]:
    """``foreign`` asked about one run's values."""
    return lambda candidate: foreign(candidate, params)


class Sweep:
    """A validated sweep. Iterating it yields :class:`RunSpec` lazily."""

    def __init__(self, config: ConfigSource) -> None:
        raw = load_config(config)
        for key in raw:
            if key not in TOP_LEVEL_KEYS:
                raise ConfigError(unknown_key_message("the config", key, TOP_LEVEL_KEYS))
        if "scheduler_config" not in raw:
            raise ConfigError(
                "could not find scheduler_config in config; add e.g. {'scheduler_config': {'gpu': ['0']}}"
            )
        self.options: SchedulerOptions = parse_scheduler_config(raw["scheduler_config"])
        budget = _Budget()
        for section in ("global_config", "test_config", "command"):
            check_values(raw.get(section), section, budget)
        try:
            self.global_config = copy.deepcopy(parse_global_config(raw.get("global_config")))
            self.blocks = copy.deepcopy(parse_test_config(raw.get("test_config")))
        except (TypeError, copy.Error) as error:
            raise ConfigError(f"config values could not be copied: {error}") from error
        self._check_memory_values()
        self.task_ref = raw.get("task")
        if self.task_ref is not None and (not isinstance(self.task_ref, str) or ":" not in self.task_ref):
            raise ConfigError(f"task must be 'package.module:ClassName'; got {self.task_ref!r}")
        self.command = copy.deepcopy(raw.get("command"))
        self.shell = raw.get("shell", False)
        if not isinstance(self.shell, bool):
            raise ConfigError(f"shell must be true or false; got {self.shell!r}")
        if self.command is not None:
            from .commands import check_template

            check_template(self.command, self.keys(), shell=self.shell)
        self._has_test_config = raw.get("test_config") is not None
        self.size = sum(math.prod(len(values) for values in block.values()) for block in self.blocks)
        if self.size > sys.maxsize:
            raise ConfigError(
                f"the sweep has {self.size:.3e} runs, more than any machine can run; check the lists in test_config"
            )

    def _check_memory_values(self) -> None:
        """Per-run GPU memory needs (``gpu_memory_key``) are checked up front too."""
        key = self.options.gpu_memory_key
        if key in self.global_config:
            parse_memory(self.global_config[key], f"global_config[{key!r}]")
        for index, block in enumerate(self.blocks):
            for value in block.get(key, ()):
                parse_memory(value, f"test_config[{index}][{key!r}]")

    def keys(self) -> list[str]:
        """Every key a run's config can have."""
        keys = dict.fromkeys(self.global_config)
        for block in self.blocks:
            keys.update(dict.fromkeys(block))
        return list(keys)

    def __len__(self) -> int:
        return self.size

    def _name(self, test_config: Mapping[str, Any], filter_keys: bool) -> str:
        o = self.options
        return config_string(
            test_config,
            indicator=o.test_config_string_indicator,
            separator=o.test_config_string_separator,
            maxlen=o.config_string_value_maxlen,
            ignored_keys=o.ignored_keys_for_folder_name if filter_keys else (),
            ignored_characters=o.ignored_characters_for_folder_name,
        )

    def test_configs(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(block index, test values) for every run, in the original's order."""
        for block_index, block in enumerate(self.blocks):
            keys = list(block)
            for values in itertools.product(*block.values()):
                yield block_index, dict(zip(keys, values, strict=False))

    def __iter__(self) -> Iterator[RunSpec]:
        return self.runs()

    def follow(self, wake: Callable[[], None]) -> None:
        """Called as a sweep starts: an open-ended sweep whose ``runs()`` yields :data:`NOT_READY`
        calls ``wake()`` (from any thread) when its next run is known. A config's sweep never waits."""

    def runs(self, foreign: Callable[[str, str], bool] | None = None) -> Iterator[RunSpec]:
        """The runs, lazily. ``foreign(name, params)`` says whether the result root
        records the folder ``name`` for other values than ``params`` (see
        :func:`params_text`); such a folder is never given to this run."""
        registry = NameRegistry()
        root = self.options.result_root_folder
        for index, (block_index, test_config) in enumerate(self.test_configs()):
            merged = copy.deepcopy(self.global_config)
            merged.update(test_config)
            digest = config_hash(merged)
            wanted = safe_folder_name(self._name(test_config, filter_keys=True))
            # The original's unfiltered string, raw (only folder names need escaping).
            shown = self._name(test_config, filter_keys=False)
            params = params_text(test_config)
            name, duplicate = registry.assign(
                wanted,
                digest,
                suffix=hashlib.sha256(params.encode("utf-8", "surrogatepass")).hexdigest(),
                foreign=None if foreign is None else _for_params(foreign, params),
            )
            renamed_from = None
            if name != wanted:
                renamed_from = wanted
                logger.warning(
                    "run %d would share folder %r with a different config; using %r instead "
                    "(a name of its own values only, the same on every start)",
                    index,
                    wanted,
                    name,
                )
            yield RunSpec(
                index=index,
                block=block_index,
                test_config=test_config,
                config=merged,
                test_config_string=shown,
                name=name,
                work_dir=os.path.join(root, name),
                config_hash=digest,
                duplicate=duplicate,
                renamed_from=renamed_from,
            )

    def all_test_config_in_string(self) -> str:
        """The original's ``get_all_test_config_in_string()``: raw blocks, as written."""
        o = self.options
        text = ""
        for block in self.blocks if self._has_test_config else []:
            for key in sorted(block):
                text += f"{key}{o.test_config_string_indicator}{block[key]}{o.test_config_string_separator}"
            text += o.test_config_string_inst_separator
        return text
