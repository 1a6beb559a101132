"""Config in, runs out: validation and lazy expansion of a sweep.

Pure: nothing here touches the filesystem (beyond reading a config file) or
the GPUs. The whole config is validated when a :class:`Sweep` is built, so a
bad value is reported before the first run starts or the first file is
written; runs are then produced one at a time, so a sweep of a million runs
never sits in memory.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..digest import sha256_hex
from ..errors import ConfigError, did_you_mean, unknown_key_message
from ..gpu.devices import parse_memory
from ..jsonable import to_jsonable
from .files import ConfigSource, load_config
from .metrics_source import metrics_source
from .naming import NameRegistry, folder_name, value_text
from .options import SchedulerOptions, parse_scheduler_config
from .spec import Foreign, RunSpec, config_hash, params_text
from .stages import Dependencies, Stage, parse_stages

if TYPE_CHECKING:  # imported where a config has a search or early_stop (7 ms a start without one)
    from ..tuning.search import Search, Searcher, Trial
    from ..tuning.space import Distribution  # and its space's distributions (1.5 ms)
    from ..tuning.stopping import Rule

logger = logging.getLogger("gpu_task_scheduler")

TOP_LEVEL_KEYS = (
    "scheduler_config",
    "global_config",
    "test_config",
    "stages",
    "task",
    "command",
    "shell",
    "early_stop",
    "search",
    "pbt",
    "metrics",
)


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
        from ..tuning.space import is_distribution  # here: only a search's config needs the distributions

        if is_distribution(value):
            raise ConfigError(
                f"{where} is a distribution ({value!r}), which only a search samples: add a search section, "
                "e.g. search: {sampler: random, n_runs: 20, metric: loss, mode: min}, or give a list of values"
            )
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


def _for_params(foreign: Foreign, params: str, index: int) -> Callable[[str], bool]:
    """``foreign`` asked about one run's values."""
    return lambda candidate: foreign(candidate, params, index)


def _params_digest(params: str) -> Callable[[], str]:
    """The suffix that tells a run's folder from another config's: a hash of its values (computed only when needed)."""
    return lambda: sha256_hex(params)


_IMMUTABLE = (type(None), bool, int, float, str)


def _without(characters: Sequence[str], text: str) -> str:
    for character in characters:
        text = text.replace(character, "")
    return text


def _display(value: Any) -> str:
    """A sampled value in a folder name: a float to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else value_text(value)


def _hash_piece(key: str, value: Any) -> str:
    """``"key":value`` as :func:`config_hash` writes it."""
    return f"{json.dumps(key)}:{json.dumps(to_jsonable(value), sort_keys=True, separators=(',', ':'))}"


class _Rendering:
    """One test block, each of its values rendered once for all the runs that use it.

    A block of 1,000 x 100 values has 100,000 runs but only 1,100 values: each
    value's text in folder names, its JSON in the run's params and its JSON in
    the config hash are made here once, and a run's strings are joins of these
    pieces. They equal :func:`config_string`, :func:`params_text` and
    :func:`config_hash` of the whole run byte for byte (``tests/test_naming.py``
    checks that on random configs), since each of those renders keys in sorted
    order, one value at a time.

    ``columns[k]`` holds, for each value of the block's k-th key, the tuple
    (value, name piece, params piece, hash piece); ``order`` is the key positions
    in sorted order, ``named`` the same without the keys left out of folder
    names, and ``hash_template`` the merged config's keys in sorted order, each
    a global piece (position -1) or a block position.
    """

    def __init__(self, block: Mapping[str, Sequence[Any]], global_pieces: Mapping[str, str], o: SchedulerOptions):
        self.keys = list(block)
        self.columns = [
            [
                (
                    value,
                    f"{key}{o.test_config_string_indicator}{value_text(value)[: o.config_string_value_maxlen]}"
                    f"{o.test_config_string_separator}",
                    f"{json.dumps(key)}: {json.dumps(to_jsonable(value))}",
                    _hash_piece(key, value),
                )
                for value in values
            ]
            for key, values in block.items()
        ]
        self.order = sorted(range(len(self.keys)), key=lambda i: self.keys[i])
        ignored = set(o.ignored_keys_for_folder_name)
        named = [i for i in self.order if self.keys[i] not in ignored]
        self.named = self.order if named == self.order else named
        position = {key: i for i, key in enumerate(self.keys)}
        self.hash_template = [
            (global_pieces[key], -1) if key not in position else ("", position[key])
            for key in sorted(set(global_pieces) | set(position))
        ]


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
        self.search: Search | None = None
        if raw.get("search") is not None:
            from ..tuning.search import parse_search

            self.search = parse_search(raw["search"])
        self.space: dict[str, Distribution] = {}
        self._space_raw: Any = None
        if self.search is not None:
            raw = self._take_space(raw)
        budget = _Budget()
        for section in ("global_config", "test_config", "stages", "command"):
            check_values(raw.get(section), section, budget)
        self.staged = raw.get("stages") is not None
        if self.staged and raw.get("test_config") is not None:
            raise ConfigError(
                "the config has both stages and a top-level test_config; with stages, each stage has its "
                "own test_config: move it into the stages"
            )
        try:
            self.global_config = copy.deepcopy(parse_global_config(raw.get("global_config")))
            self.blocks = copy.deepcopy(parse_test_config(raw.get("test_config")))
            self.stages = (
                parse_stages(
                    raw["stages"],
                    self.global_config,
                    parse_global=parse_global_config,
                    parse_blocks=parse_test_config,
                )
                if self.staged
                else [Stage(None, self.global_config, self.blocks)]
            )
        except (TypeError, copy.Error) as error:
            raise ConfigError(f"config values could not be copied: {error}") from error
        if self.staged:
            self.blocks = [block for stage in self.stages for block in stage.blocks]
        self._check_memory_values()
        self.task_ref = raw.get("task")
        if self.task_ref is not None and (not isinstance(self.task_ref, str) or ":" not in self.task_ref):
            raise ConfigError(f"task must be 'package.module:ClassName'; got {self.task_ref!r}")
        self.command = copy.deepcopy(raw.get("command"))
        self.shell = raw.get("shell", False)
        if not isinstance(self.shell, bool):
            raise ConfigError(f"shell must be true or false; got {self.shell!r}")
        self._check_commands()
        if self.staged and raw.get("early_stop") is not None:
            raise ConfigError(
                "early_stop applies to the runs of one stage: with stages, give it in the stage whose runs "
                "it may stop (e.g. in the train stage), not at the top level"
            )
        self.early_stop_raw = copy.deepcopy(raw.get("early_stop"))
        # The early_stop rule of each stage that has one (None: the one stage of a config without stages).
        self.stopping: dict[str | None, Rule] = {}
        for stage in self.stages:
            raw_rule = stage.early_stop if self.staged else self.early_stop_raw
            if raw_rule is None:
                continue
            from ..tuning.stopping import parse_early_stop

            rule = parse_early_stop(
                raw_rule, "early_stop" if stage.name is None else f"stage {stage.name!r}: early_stop"
            )
            if rule is not None:
                self.stopping[stage.name] = rule
        self.pbt_raw = copy.deepcopy(raw.get("pbt"))
        if self.pbt_raw is not None:
            self._take_pbt()
        self.metrics_raw = copy.deepcopy(raw.get("metrics"))
        self.tensorboard = metrics_source(self.metrics_raw, self.stages, self.space, self.stopping.values())
        self.rerun_pruned = False  # `gts retry --pruned`: runs stopped early run again (to their end)
        self.unjudged: frozenset[str] = frozenset()  # runs the early_stop rule leaves alone in this start
        self._has_test_config = raw.get("test_config") is not None
        # What its runs run, set by backends/local/tasks.resolve_task: {"task": "mod:Class"} or
        # {"command": ..., "shell": ...}; None when it cannot be named (a class in __main__).
        self.task_record: dict[str, Any] | None = None
        # What each stage's runs run (None: the one stage of a config without stages), as canonical
        # JSON; set with task_record. A stage missing here runs something that cannot be named.
        self.programs: dict[str | None, str] = {}
        self.selected: frozenset[str] | None = None  # `gts retry`: only the runs with these names
        self.size = sum(math.prod(len(values) for values in block.values()) for block in self.blocks)
        if self.search is not None:  # each sampled run, and the runs of later stages that follow it
            follow = sum(
                math.prod(len(v) for v in block.values()) for stage in self.stages[1:] for block in stage.blocks
            )
            self.size = self.search.n_runs * (1 + follow)
        self.parallel = 1  # runs the engine starts at once (set by it): a search asks no more ahead
        self.searcher: Searcher | None = None
        self.live = False  # follow() was called: the engine runs this sweep (a search may ask)
        self.trial_of: dict[str, int] = {}  # a search's run name -> its (first) trial number
        self.twins: dict[str, list[int]] = {}  # a run name -> later trials that asked for the same values
        self.asked = 0  # trials asked, over every start
        self.in_flight = 0
        self.waiting: set[str] = set()  # a search's runs paused by a pausing method: no longer in flight, not told
        self.lookup: Callable[[str], Any] = lambda name: None  # the ledger's record of a run (set by the engine)
        self.followed = frozenset(other for stage in self.stages for other in stage.after)
        if self.size > sys.maxsize:
            raise ConfigError(
                f"the sweep has {self.size:.3e} runs, more than any machine can run; check the lists in test_config"
            )

    def _take_space(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """A search's space, checked; the rest of the config sees one representative value a key."""
        assert self.search is not None
        found = raw.get("stages")
        stages: Sequence[Any] = found if isinstance(found, (list, tuple)) else ()
        staged = bool(stages) and isinstance(stages[0], Mapping)
        where = "the first stage's test_config" if staged else "test_config"
        blocks = stages[0].get("test_config") if staged else raw.get("test_config")
        if not isinstance(blocks, (list, tuple)) or len(blocks) != 1:
            raise ConfigError(
                f"a search samples one space: give {where} as one block of key -> distribution, e.g. "
                "[{lr: {loguniform: [1.0e-5, 1.0e-1]}, layers: {int: [2, 8]}}]"
            )
        from ..tuning.space import parse_space

        self.space = parse_space(blocks[0], f"{where}[0]")
        self._space_raw = copy.deepcopy(blocks[0])
        shown = [{key: [d.representative()] for key, d in self.space.items()}]
        if not staged:
            return {**raw, "test_config": shown}
        first = stages[0].get("name")
        for stage in stages[1:]:
            after = stage.get("after") if isinstance(stage, Mapping) else None
            if after not in (first, [first]) or "match" in stage:
                raise ConfigError(
                    f"with a search, each later stage follows the search's stage {first!r} alone (after: "
                    f"{first}, no match): its runs run for each sampled run; stage {stage.get('name')!r} does not"
                )
            for block in stage.get("test_config") or ():
                if isinstance(block, Mapping) and set(block) & set(self.space):
                    raise ConfigError(
                        f"stage {stage.get('name')!r} sweeps {sorted(set(block) & set(self.space))}, which the "
                        "search samples: a later stage takes those values from the run it follows"
                    )
        return {**raw, "stages": [{**stages[0], "test_config": shown}, *stages[1:]]}

    def _check_memory_values(self) -> None:
        """Per-run GPU memory needs (``gpu_memory_key``) are checked up front too."""
        key = self.options.gpu_memory_key
        for stage in self.stages:
            where = "" if stage.name is None else f"stage {stage.name!r}: "
            if key in stage.global_config:
                parse_memory(stage.global_config[key], f"{where}global_config[{key!r}]")
            for index, block in enumerate(stage.blocks):
                for value in block.get(key, ()):
                    parse_memory(value, f"{where}test_config[{index}][{key!r}]")

    def _check_commands(self) -> None:
        """Each command template against the keys of the runs it runs (``{dep_dir}``: in a stage whose
        every run has exactly one dependency)."""
        from .commands import BUILTINS, check_template
        from .templates import base_key, placeholders

        for stage in self.stages:
            own = stage.command is not None
            command = stage.command if own else self.command
            if command is None or (stage.task_ref is not None and not own):
                continue
            shell = (stage.shell if stage.shell is not None else self.shell) if own else self.shell
            extra = ["dep_dir"] if stage.after else []
            where = "command" if stage.name is None else f"the command of stage {stage.name!r}"
            try:
                parts = check_template(command, stage.keys() + extra, shell=shell)
            except ConfigError as error:
                if stage.name is None:
                    raise
                whose = "its own command" if own else "the top-level command"
                raise ConfigError(f"stage {stage.name!r} runs {whose}, and: {error}") from None
            fields = {base_key(field) for part in parts for field, _, _ in placeholders(part)}
            conditional = sorted(key for key in fields if key in self.space and self.space[key].when)
            if shell and conditional:  # a script cannot leave out what a run does not have
                raise ConfigError(
                    f"{where} (shell: true) uses {', '.join(conditional)}, which only some runs have (when); "
                    "give the command as a list of arguments: a run without the key leaves its argument out"
                )
            given = set(BUILTINS) | set(extra) | set(stage.global_config)
            for index, block in enumerate(stage.blocks):  # every run has every key its command uses
                missing = sorted(fields - given - set(block))
                if missing:
                    block_name = (
                        f"test_config[{index}]" if stage.name is None else f"stage {stage.name!r} block {index}"
                    )
                    raise ConfigError(
                        f"{where} uses {{{missing[0]}}}, which the runs of {block_name} do not have (their keys: "
                        f"{', '.join(sorted(set(block) | set(stage.global_config))) or 'none'}): give {missing[0]!r} "
                        "in that block or in global_config"
                    )
            if "gpus" in fields and self.options.backend == "ray":
                raise ConfigError(
                    f"{where} uses {{gpus}}, which the Ray backend cannot fill in: Ray chooses a run's GPUs "
                    "on the machine that runs it, after the command is built. Read $CUDA_VISIBLE_DEVICES "
                    "there instead (shell: true, or in the script)"
                )
            uses = "dep_dir" in fields
            if uses and (stage.fewest_dependencies, stage.most_dependencies) != (1, 1):
                fewest, most = stage.fewest_dependencies, stage.most_dependencies
                count = fewest if fewest == most else f"{fewest} to {most}"
                raise ConfigError(
                    f"{where} uses {{dep_dir}}, but its runs wait for {count} "
                    "runs each; {dep_dir} names the one run a run waits for. "
                    "Read $GTS_DEP_DIRS (the folders, one per line) instead, or set match: so that "
                    "each run waits for one"
                )

    def keys(self) -> list[str]:
        """Every key a run's config can have."""
        keys: dict[str, None] = {}
        for stage in self.stages:
            keys.update(dict.fromkeys(stage.keys()))
        return list(keys)

    def __len__(self) -> int:
        return self.size if self.selected is None else len(self.selected)

    def identity(self) -> str | None:
        """A digest of what decides every run's folder name and config: global_config, the
        blocks and the naming options, by their ``repr`` (which tells a tuple from a list and
        1 from 1.0; an object whose ``repr`` holds its address gives another digest at each
        start, which only costs the check it saves). Two starts with the same identity give
        every run the same name and config (see engine/changes.py)."""
        o = self.options
        naming = (
            o.test_config_string_indicator,
            o.test_config_string_separator,
            o.config_string_value_maxlen,
            o.ignored_keys_for_folder_name,
            o.ignored_characters_for_folder_name,
        )
        swept: Any = self.blocks
        if self.staged:
            swept = [(s.name, s.global_config, s.blocks, s.after, s.match) for s in self.stages]
        try:
            text = repr((self.global_config, swept, naming, sorted(self.programs.items(), key=str)))
        except Exception:  # a value whose repr raises
            return None
        return sha256_hex(text)

    def set_program(self, stage: str | None, record: Mapping[str, Any] | None) -> None:
        """What the runs of ``stage`` run: ``{"task": "mod:Class"}`` or ``{"command": ..., "shell": ...}``
        (None: it cannot be named, e.g. a class defined in ``__main__``)."""
        if record is None:
            self.programs.pop(stage, None)
            return
        try:
            self.programs[stage] = json.dumps(to_jsonable(record), sort_keys=True, separators=(",", ":"))
        except (TypeError, ValueError):
            self.programs.pop(stage, None)

    def task_files(self) -> dict[str, str]:
        """The file of each task class's module (``{"mypkg.tasks": "/abs/mypkg/tasks.py"}``), kept in
        the ledger so that ``gts retry`` started elsewhere can find it. Modules imported by now."""
        files = {}
        records = [self.task_record or {}, *(json.loads(text) for text in self.programs.values())]
        for record in records:
            task = record.get("task") if isinstance(record, dict) else None
            module = sys.modules.get(task.partition(":")[0]) if isinstance(task, str) else None
            path = getattr(module, "__file__", None)
            if module is not None and isinstance(path, str) and os.path.isabs(path):
                files[module.__name__] = path
        return files

    def record(self) -> str | None:
        """The sweep as JSON, kept in the ledger so that ``gts retry`` can run its runs again
        without the config file. None when it is not plain JSON (a value that is an object, a
        tuple, a range). Notification settings, which may hold a password, are left out."""
        options = {k: v for k, v in self.options.as_dict().items() if k not in ("notify_command", "notify_email")}
        config = {
            "scheduler_config": options,
            "global_config": self.global_config,
            "test_config": self.blocks if self._has_test_config else None,
            **(self.task_record or {}),  # none: `gts retry --task` names it
            **({"early_stop": self.early_stop_raw} if self.early_stop_raw is not None else {}),
            **({"pbt": self.pbt_raw} if self.pbt_raw is not None else {}),
            **({"metrics": self.metrics_raw} if self.metrics_raw is not None else {}),
        }
        if self.staged:
            del config["test_config"]
            config["stages"] = [stage.raw for stage in self.stages]
        if self.search is not None:  # its space as written, not the values shown to the rest
            if self.staged:
                config["stages"][0] = {**config["stages"][0], "test_config": [self._space_raw]}
            else:
                config["test_config"] = [self._space_raw]
            config["search"] = self.search.as_config()
        try:
            text = json.dumps(config, allow_nan=False)
        except (TypeError, ValueError):
            return None
        return text if json.loads(text) == config else None

    def test_configs(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(block index, test values) for every run, in the original's order (stage by stage)."""
        for block_index, block in enumerate(self.blocks):
            keys = list(block)
            for values in itertools.product(*block.values()):
                yield block_index, dict(zip(keys, values, strict=False))

    def __iter__(self) -> Iterator[RunSpec]:
        return self.runs()

    def follow(self, wake: Callable[[], None]) -> None:
        """Called as a sweep starts: an open-ended sweep whose ``runs()`` yields :data:`NOT_READY`
        calls ``wake()`` (from any thread) when its next run is known. A config's sweep never waits
        (a search waits for its runs to end: the engine's loop goes on by itself then)."""
        self.live = True

    def settled(self, spec: RunSpec, status: str, record: Any) -> None:
        """``spec`` will not run again in this start (the engine's word, with its ledger record): a
        search tells its sampler how it ended (see tuning/search.py)."""
        if self.search is not None:
            from .sampled import settled

            settled(self, spec, status, record)

    def _take_pbt(self) -> None:
        """The ``pbt`` config, as the one stage's rule: checked against the rest of the config."""
        from ..tuning.pbt import parse_pbt, pbt_rule, perturbed_keys

        if self.staged:
            raise ConfigError("pbt trains one population: it cannot be given with stages (give it without stages)")
        if self.stopping:
            raise ConfigError(
                "give pbt or early_stop, not both: population-based training decides itself which runs go on"
            )
        config = parse_pbt(self.pbt_raw)
        assert config is not None
        keys = set(self.global_config) | set(self.space) | {key for block in self.blocks for key in block}
        for key in perturbed_keys(config):
            if key not in keys:
                where = "perturb" if key in config.perturb else "resample"
                raise ConfigError(
                    f"pbt.{where}.{key}: no run has the key {key!r}{did_you_mean(key, keys)} pbt changes a "
                    "value of each run's config: give the key in global_config or test_config"
                )
            if key in self.space and self.space[key].when:
                raise ConfigError(
                    f"pbt changes {key!r}, which only some runs have (when): a member that copies another's "
                    "weights takes its values, and a member without the key has none to change"
                )
        self.stopping[None] = pbt_rule(config)

    def paused(self, spec: RunSpec) -> None:
        """``spec`` was paused by a pausing early_stop method: a search samples on (it holds no slot),
        and tells its sampler once the run is settled for good (:meth:`settled`)."""
        if self.search is not None and spec.name in self.trial_of and spec.name not in self.waiting:
            self.waiting.add(spec.name)
            self.in_flight -= 1

    def runs(self, foreign: Foreign | None = None) -> Iterator[RunSpec]:
        """The runs, lazily. ``foreign(name, params, index)`` says whether the result
        root records the folder ``name`` for other values than ``params`` (see
        :func:`params_text`); such a folder is never given to this run. A search yields
        the runs it asked so far, and, once the engine runs it (:meth:`follow`), asks for more."""
        if self.search is not None:
            from .sampled import search_runs

            yield from search_runs(self, foreign)
            return
        registry = NameRegistry()
        o = self.options
        root, ignored_characters = o.result_root_folder, o.ignored_characters_for_folder_name
        dependencies = Dependencies(self.stages) if self.followed else None
        index, block_index = 0, 0
        for stage in self.stages:
            prefix = stage.run_name
            program = self.programs.get(stage.name)
            rule = self.stopping.get(stage.name)
            global_pieces = {key: _hash_piece(key, value) for key, value in stage.global_config.items()}
            copy_global = (
                copy.deepcopy
                if any(not isinstance(v, _IMMUTABLE) for v in stage.global_config.values())
                else dict  # plain values are shared safely; a list or dict is each run's own
            )
            for block in stage.blocks:
                r = _Rendering(block, global_pieces, o)
                for combo in itertools.product(*r.columns):
                    test_config = dict(zip(r.keys, [piece[0] for piece in combo], strict=True))
                    merged = copy_global(stage.global_config)
                    merged.update(test_config)
                    text = "{" + ",".join([p if i < 0 else combo[i][3] for p, i in r.hash_template]) + "}"
                    digest = sha256_hex(text)
                    params = "{" + ", ".join([combo[i][2] for i in r.order]) + "}"
                    # The original's unfiltered string, raw (only folder names need escaping).
                    shown = prefix(_without(ignored_characters, "".join([combo[i][1] for i in r.order])))
                    wanted = shown
                    if r.named is not r.order:
                        wanted = prefix(_without(ignored_characters, "".join([combo[i][1] for i in r.named])))
                    wanted = folder_name(wanted)
                    name, duplicate = registry.assign(
                        wanted,
                        digest,
                        suffix=_params_digest(params),
                        foreign=None if foreign is None else _for_params(foreign, params, index),
                    )
                    after: tuple[str, ...] = ()
                    if dependencies is not None:
                        after = dependencies.of(stage.name, merged)
                        dependencies.note(stage.name, name, merged)
                    if self.selected is not None and name not in self.selected:
                        index += 1
                        continue
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
                        params=params,
                        stage=stage.name,
                        after=after,
                        program=program,
                        early_stop=rule,
                    )
                    index += 1
                block_index += 1

    def trial_run(self, trial: Trial, registry: NameRegistry, foreign: Foreign | None) -> RunSpec:
        """The run of a search's trial: its exact values in its config; in its name, floats to 4
        significant digits (unique: a clash gets a suffix of the exact values' hash)."""
        # In the order the config writes the keys; a conditional key whose when is false is absent.
        values = {key: trial.values[key] for key in self._space_raw if key in trial.values}
        spec = self._sampled(self.stages[0], values, trial.number, 0, registry, foreign, name=trial.name)
        self.trial_of.setdefault(spec.name, trial.number)
        return spec

    def followers(self, run: RunSpec, registry: NameRegistry, foreign: Foreign | None) -> Iterator[RunSpec]:
        """With stages, the runs of the later stages for one run of the search's stage: each of their
        blocks' combinations, with the sampled values, waiting for that run (``after``)."""
        for stage in self.stages[1:]:
            for block_index, block in enumerate(stage.blocks):
                for combo in itertools.product(*block.values()):
                    values = {**run.test_config, **dict(zip(block, combo, strict=True))}
                    yield self._sampled(stage, values, run.index, block_index, registry, foreign, after=(run.name,))

    def _sampled(
        self,
        stage: Stage,
        values: dict[str, Any],
        index: int,
        block: int,
        registry: NameRegistry,
        foreign: Foreign | None,
        *,
        name: str | None = None,
        after: tuple[str, ...] = (),
    ) -> RunSpec:
        """A run of a search (``name``: the one its trial was given before, if any)."""
        o = self.options
        merged = copy.deepcopy(stage.global_config)
        merged.update(values)
        shown = "".join(
            f"{key}{o.test_config_string_indicator}{_display(value)}{o.test_config_string_separator}"
            for key, value in values.items()
            if key not in o.ignored_keys_for_folder_name
        )
        params = params_text(values)
        digest = config_hash(merged)
        if name is not None:
            _, duplicate = registry.assign(name, digest)
        else:
            wanted = folder_name(stage.run_name(_without(o.ignored_characters_for_folder_name, shown)))
            name, duplicate = registry.assign(
                wanted,
                digest,
                suffix=_params_digest(params),
                foreign=None if foreign is None else _for_params(foreign, params, index),
            )
        return RunSpec(
            index=index,
            block=block,
            test_config=values,
            config=merged,
            test_config_string=shown,
            name=name,
            work_dir=os.path.join(o.result_root_folder, name),
            config_hash=digest,
            duplicate=duplicate,
            params=params,
            stage=stage.name,
            after=after,
            program=self.programs.get(stage.name),
            early_stop=self.stopping.get(stage.name),
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
