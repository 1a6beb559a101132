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
import numbers
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, unknown_key_message
from ..gpu.devices import Slot, normalize_gpu_entries, parse_memory, parse_slots
from ..jsonable import to_jsonable
from ..records.paths import META, ledger_path_problem
from .files import ConfigSource, load_config
from .naming import NameRegistry, config_string, safe_folder_name

logger = logging.getLogger("gpu_task_scheduler")

TOP_LEVEL_KEYS = ("scheduler_config", "global_config", "test_config", "task", "command", "shell")


# --- scheduler_config: every key, its default and its check -----------------


def _bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else "a bool (true or false)"


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else "a string"


def _key_name(value: Any) -> str | None:
    return None if isinstance(value, str) and value else "a non-empty string (a config key)"


def _path(value: Any) -> str | None:
    ok = isinstance(value, (str, os.PathLike)) and isinstance(os.fspath(value), str)
    ok = ok and bool(os.fspath(value)) and "\0" not in os.fspath(value)
    return None if ok else "a non-empty path (without NUL characters)"


def _optional(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    def optional(value: Any) -> str | None:
        problem = check(value)
        return None if value is None or problem is None else f"{problem} or null"

    return optional


def _int_at_least(minimum: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= minimum
        return None if ok else f"an integer >= {minimum}"

    return check


def _seconds(allow_zero: bool) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = (
            isinstance(value, numbers.Real)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (float(value) >= 0 if allow_zero else float(value) > 0)
        )
        return None if ok else ("a number of seconds >= 0" if allow_zero else "a number of seconds > 0")

    return check


def _string_list(value: Any) -> str | None:
    ok = isinstance(value, (list, tuple)) and all(isinstance(item, str) and item for item in value)
    return None if ok else "a list of non-empty strings"


def _log_file(value: Any) -> str | None:
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or not value
        or os.path.isabs(value)
        or ".." in value.split("/")
        or "\0" in value
        or value.endswith("/")
        or os.path.normpath(value) == "."
    ):
        return "a file name relative to the run folder (without '..') or null"
    if os.path.normpath(value).split("/")[0] == META:
        return f"a file name outside {META}/, which holds the scheduler's own records"
    return None


def _memory(value: Any) -> str | None:
    try:
        parse_memory(value, "")
    except ConfigError:
        return 'a memory size such as 10000000000, "10GB" or "9.5GiB"'
    return None


def _one_of(*choices: Any) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices else "one of " + ", ".join(repr(c) for c in choices)

    return check


def _fraction(value: Any) -> str | None:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < float(value) <= 1
    return None if ok else "a fraction in (0, 1]"


def _percent(value: Any) -> str | None:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < float(value) <= 100
    return None if ok else "a percentage in (0, 100]"


PLACEMENTS = ("first_fit", "round_robin", "random", "most_free")


def _command_option(value: Any) -> str | None:
    ok = (isinstance(value, str) and value.strip()) or (
        isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value)
    )
    return None if ok else "a command: a list of arguments or a string"


_EMAIL_KEYS = {
    "host",
    "port",
    "sender",
    "recipients",
    "starttls",
    "ssl",
    "ca_file",
    "allow_insecure_auth",
    "username_env",
    "password_env",
    "subject",
}


def _email_option(value: Any) -> str | None:
    problem = (
        "a dict with host, sender, recipients (a list) and optionally port, starttls or ssl (true/false), "
        "ca_file, allow_insecure_auth, username_env, password_env, subject"
    )
    if (
        not isinstance(value, Mapping)
        or not {"host", "sender", "recipients"} <= set(value)
        or not set(value) <= _EMAIL_KEYS
    ):
        return problem
    recipients = value["recipients"]
    if not isinstance(recipients, (list, tuple)) or not recipients or not all(isinstance(r, str) for r in recipients):
        return problem
    if not isinstance(value.get("port", 25), int) or isinstance(value.get("port", 25), bool):
        return problem
    if not all(isinstance(value.get(key, False), bool) for key in ("starttls", "ssl", "allow_insecure_auth")):
        return problem
    if value.get("starttls") and value.get("ssl"):
        return problem + " (starttls and ssl together: choose one)"
    if value.get("ca_file") is not None and not isinstance(value.get("ca_file"), str):
        return problem
    return None


# key -> (default factory, check). Defaults match the original GPUTaskScheduler.
SCHEDULER_KEYS: dict[str, tuple[Callable[[], Any], Callable[[Any], str | None]]] = {
    "force_rerun": (lambda: False, _bool),
    "result_root_folder": (lambda: os.path.abspath("results/"), _path),
    "temp_folder": (lambda: os.path.abspath("temp/"), _path),
    "test_config_string_indicator": (lambda: "-", _text),
    "test_config_string_separator": (lambda: ",", _text),
    "test_config_string_inst_separator": (lambda: "+", _text),
    "log_file": (lambda: "worker.log", _log_file),
    "scheduler_log_file_path": (lambda: "scheduler.log", _optional(_path)),
    "config_string_value_maxlen": (lambda: 30, _optional(_int_at_least(1))),
    "ignored_keys_for_folder_name": (lambda: [], _string_list),
    "ignored_characters_for_folder_name": (lambda: [" ", "[", "]"], _string_list),
    # Beyond the original.
    "skip_existing_folders": (lambda: False, _bool),
    "max_retries": (lambda: 0, _int_at_least(0)),
    "timeout": (lambda: None, _optional(_seconds(allow_zero=False))),
    "grace_period": (lambda: 10.0, _seconds(allow_zero=True)),
    # GPU awareness (see gpu/placement.py).
    "max_runs_per_gpu": (lambda: 1, _int_at_least(1)),
    "gpu_memory": (lambda: None, _optional(_memory)),
    "gpu_memory_key": (lambda: "gpu_memory", _key_name),
    "learn_gpu_memory": (lambda: "max", _one_of("max", "mean", None)),
    "memory_margin": (lambda: "512MiB", _memory),
    "placement": (lambda: "first_fit", _one_of(*PLACEMENTS)),
    "busy_memory_fraction": (lambda: None, _optional(_fraction)),
    "busy_utilization": (lambda: None, _optional(_percent)),
    "max_oom_retries": (lambda: 2, _int_at_least(0)),
    "gpu_poll_interval": (lambda: 2.0, _seconds(allow_zero=False)),
    "cpu_fallback": (lambda: 0, _int_at_least(0)),
    "max_host_cpu_percent": (lambda: None, _optional(_percent)),
    "min_host_free_memory": (lambda: None, _optional(_memory)),
    # Notifications when the sweep ends (see reports/notify.py).
    "notify_command": (lambda: None, _optional(_command_option)),
    "notify_email": (lambda: None, _optional(_email_option)),
}


@dataclass(frozen=True)
class SchedulerOptions:
    """``scheduler_config`` after validation, with every default filled in."""

    values: Mapping[str, Any]
    slots: tuple[Slot, ...] | None  # None for "gpu": "all", resolved when the sweep starts

    def __getattr__(self, key: str) -> Any:
        try:
            return self.values[key]
        except KeyError:
            raise AttributeError(key) from None

    def as_dict(self) -> dict[str, Any]:
        return copy.deepcopy(dict(self.values))


def parse_scheduler_config(raw: Any) -> SchedulerOptions:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"scheduler_config must be a dict; got {type(raw).__name__} {raw!r}")
    for key in raw:
        if key != "gpu" and key not in SCHEDULER_KEYS:
            raise ConfigError(unknown_key_message("scheduler_config", key, ["gpu", *SCHEDULER_KEYS]))
    if "gpu" not in raw:
        raise ConfigError('could not find gpu in scheduler_config; add e.g. "gpu": ["0", "1"] or "gpu": ["cpu"]')
    parsed = parse_slots(raw["gpu"])
    slots = None if parsed is None else tuple(parsed)
    values: dict[str, Any] = {"gpu": normalize_gpu_entries(raw["gpu"])}
    for key, (default, check) in SCHEDULER_KEYS.items():
        if key not in raw:
            values[key] = default()
            continue
        value = raw[key]
        problem = check(value)
        if problem is not None:
            raise ConfigError(f"scheduler_config[{key!r}] must be {problem}; got {value!r} ({type(value).__name__})")
        values[key] = os.fspath(value) if isinstance(value, os.PathLike) else copy.deepcopy(value)
    root = values["result_root_folder"]
    if os.path.exists(root) and not os.path.isdir(root):
        raise ConfigError(f"scheduler_config['result_root_folder'] is {root!r}, which exists and is not a folder")
    problem = ledger_path_problem(root)
    if problem is not None:
        raise ConfigError(f"scheduler_config['result_root_folder']: {problem}")
    return SchedulerOptions(values=values, slots=slots)


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
        self.options = parse_scheduler_config(raw["scheduler_config"])
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

    def memory_margin(self) -> int:
        return parse_memory(self.options.memory_margin, "memory_margin")

    def host_memory_floor(self) -> int:
        return parse_memory(self.options.min_host_free_memory, "min_host_free_memory")

    def memory_need(self, config: Mapping[str, Any]) -> int | None:
        """The GPU memory a run declares (its config, else ``gpu_memory``), in bytes, or None."""
        value = config.get(self.options.gpu_memory_key, self.options.gpu_memory)
        return None if value is None else parse_memory(value, self.options.gpu_memory_key)

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
