"""Stages: runs that start only after the runs of an earlier stage they depend on succeeded.

A config with ``stages`` instead of ``test_config``::

    stages:
      - name: train
        command: python train.py --lr {lr} --seed {seed} --out {work_dir}
        test_config: [{lr: [0.1, 0.01], seed: [0, 1]}]
      - name: eval
        after: train
        command: python eval.py --checkpoint {dep_dir}/model.pt
        test_config: [{lr: [0.1, 0.01], seed: [0, 1]}]

Each stage is a sweep of its own (its blocks' cross products, its
``global_config`` over the top-level one, its own ``task`` or ``command`` or
the config's); its runs come after the runs of every earlier stage, in the
original's order within a stage. A run's folder is ``<stage>.<name>``
(``train.lr-0.1,seed-0,``): one folder under the root per run, as without
stages, so the root's safety checks, its index and ``gts logs`` work
unchanged, and ``ls`` groups a stage's runs together.

A run of a stage with ``after: train`` depends on the ``train`` runs that
have its values for the keys both stages sweep (each ``eval`` run waits for
its own ``train`` run); ``match: [seed]`` names the keys to compare instead.
A stage that sweeps none of them (a report over every training run) depends
on all of them. Every run must depend on at least one run of each stage it
follows: a value that no run of the earlier stage has is a ``ConfigError``
before anything runs.

This module is the config-time half: parsing stages and finding each run's
dependencies. Waiting for them is ``engine/pending.py``'s.
"""

from __future__ import annotations

import collections
import copy
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import ConfigError, unknown_key_message
from ..jsonable import to_jsonable
from ..recordclass import Record, field

STAGE_KEYS = ("name", "after", "match", "global_config", "test_config", "task", "command", "shell", "early_stop")
STAGE_SEPARATOR = "."  # between a stage's name and its run's name in the run's folder name
_NAME = r"[A-Za-z0-9_-]{1,64}\Z"  # compiled where a config has stages (re's cache)


class Stage(Record, frozen=False):
    name: str | None  # None: the one implicit stage of a config without stages
    global_config: dict[str, Any]  # the top-level global_config updated with the stage's own
    blocks: list[dict[str, Sequence[Any]]]
    after: tuple[str, ...] = ()
    match: tuple[str, ...] | None = None  # the keys compared with each stage in `after` (None: those both sweep)
    task_ref: str | type | None = None  # 'package.module:Class', or the class itself (Python configs)
    command: Any = None
    early_stop: Any = None  # its early_stop value as written (checked by tuning/stopping.parse_early_stop)
    shell: bool | None = None
    raw: dict[str, Any] = field(default_factory=dict)  # as written (for the ledger's record of the sweep)
    fewest_dependencies: int = 0  # of any of its runs (`{dep_dir}` needs every run to have exactly one)
    most_dependencies: int = 0

    def run_name(self, name: str) -> str:
        """A run's name in this stage: ``train.lr-0.1,``; ``report`` for the one run of a stage that sweeps nothing."""
        if self.name is None:
            return name
        return f"{self.name}{STAGE_SEPARATOR}{name}" if name else self.name

    def swept(self) -> set[str]:
        return {key for block in self.blocks for key in block}

    def keys(self) -> list[str]:
        keys = dict.fromkeys(self.global_config)
        for block in self.blocks:
            keys.update(dict.fromkeys(block))
        return list(keys)

    def configs(self) -> Iterable[dict[str, Any]]:
        """Every run's merged config, in order (values only: no names, no copies)."""
        import itertools

        for block in self.blocks:
            keys = list(block)
            for values in itertools.product(*block.values()):
                merged = dict(self.global_config)
                merged.update(zip(keys, values, strict=True))
                yield merged


def parse_stages(
    raw: Any,
    global_config: Mapping[str, Any],
    *,
    parse_global: Any,
    parse_blocks: Any,
) -> list[Stage]:
    """The config's ``stages``, checked; ``parse_global``/``parse_blocks`` are expand.py's parsers."""
    if isinstance(raw, Mapping) or not isinstance(raw, (list, tuple)) or not raw:
        raise ConfigError(
            "stages must be a non-empty list of stages, e.g. [{name: train, test_config: [...]}, "
            f"{{name: eval, after: train, test_config: [...]}}]; got {raw!r}"
        )
    stages: list[Stage] = []
    for index, item in enumerate(raw):
        where = f"stages[{index}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where} must be a dict with name, test_config and optionally after; got {item!r}")
        for key in item:
            if key not in STAGE_KEYS:
                raise ConfigError(unknown_key_message(where, key, STAGE_KEYS))
        name = item.get("name")
        if not isinstance(name, str) or not re.match(_NAME, name):
            raise ConfigError(
                f"{where} needs a name of letters, digits, '_' and '-' (at most 64): it starts the folder "
                f"name of each of its runs; got {name!r}"
            )
        where = f"stage {name!r}"
        if any(stage.name == name for stage in stages):
            raise ConfigError(f"{where} appears twice in stages; stage names must be unique")
        after = item.get("after", ())
        after = (after,) if isinstance(after, str) else after
        if not isinstance(after, (list, tuple)) or not all(isinstance(a, str) for a in after):
            raise ConfigError(f"{where}: after must be a stage name or a list of them; got {item.get('after')!r}")
        after = tuple(dict.fromkeys(after))  # a stage named twice is waited for once
        earlier = [stage.name for stage in stages]
        for other in after:
            if other not in earlier:
                hint = "it comes later in stages: list stages in the order they run" if other in _names(raw) else ""
                raise ConfigError(
                    f"{where}: after names {other!r}, which is not an earlier stage"
                    + (f" ({hint})" if hint else f"; earlier stages: {', '.join(map(repr, earlier)) or 'none'}")
                )
        match = item.get("match")
        if match is not None:
            if not after:
                raise ConfigError(f"{where}: match needs after (the stage whose runs to match)")
            if isinstance(match, str) or not isinstance(match, (list, tuple)):
                raise ConfigError(f"{where}: match must be a list of keys; got {match!r}")
            if not all(isinstance(key, str) for key in match):
                raise ConfigError(f"{where}: match must be a list of keys; got {match!r}")
        merged = dict(global_config)
        merged.update(parse_global(item.get("global_config")))
        shell = item.get("shell")
        if shell is not None and not isinstance(shell, bool):
            raise ConfigError(f"{where}: shell must be true or false; got {shell!r}")
        task = item.get("task")
        if task is not None and not (isinstance(task, str) and ":" in task) and not isinstance(task, type):
            raise ConfigError(f"{where}: task must be 'package.module:ClassName'; got {task!r}")
        if task is not None and item.get("command") is not None:
            raise ConfigError(f"{where} has both task and command; give one")
        try:
            blocks = parse_blocks(item.get("test_config"))
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from None
        stages.append(
            Stage(
                name=name,
                global_config=merged,
                blocks=copy.deepcopy(blocks),
                after=tuple(after),
                match=None if match is None else tuple(match),
                task_ref=task,
                command=copy.deepcopy(item.get("command")),
                shell=shell,
                early_stop=copy.deepcopy(item.get("early_stop")),
                raw=copy.deepcopy(dict(item)),  # a task given as a class makes the record None
            )
        )
    _check_matches(stages)
    return stages


def _names(raw: Sequence[Any]) -> list[Any]:
    return [item.get("name") for item in raw if isinstance(item, Mapping)]


def match_keys(stage: Stage, earlier: Stage) -> tuple[str, ...]:
    """The keys whose values a run of ``stage`` shares with the runs of ``earlier`` it depends on."""
    if stage.match is not None:
        return stage.match
    return tuple(sorted(stage.swept() & earlier.swept()))


def value_key(config: Mapping[str, Any], keys: Sequence[str]) -> str:
    """The values of ``keys`` in ``config`` as one comparable text (``1`` and ``1.0`` differ, as in names)."""
    return json.dumps([to_jsonable(config.get(key)) for key in keys], sort_keys=True)


def _check_matches(stages: list[Stage]) -> None:
    """Every run of a stage depends on at least one run of each stage it follows."""
    by_name = {stage.name: stage for stage in stages}
    for stage in stages:
        counts = [0] * sum(1 for _ in stage.configs()) if stage.after else []
        for other in stage.after:
            earlier = by_name[other]
            keys = match_keys(stage, earlier)
            for key in keys:
                for side in (stage, earlier):
                    if key not in side.keys():
                        raise ConfigError(
                            f"stage {stage.name!r}: match names {key!r}, which stage {side.name!r} does not have; "
                            f"its keys: {', '.join(side.keys()) or 'none'}"
                        )
            found = collections.Counter(value_key(config, keys) for config in earlier.configs())
            for position, config in enumerate(stage.configs()):
                counts[position] += found[value_key(config, keys)]
                if value_key(config, keys) not in found:
                    values = ", ".join(f"{key}={config.get(key)!r}" for key in keys)
                    raise ConfigError(
                        f"stage {stage.name!r} has a run with {values}, but no run of stage {other!r} has "
                        f"those values: each {stage.name} run waits for the {other} runs with its values of "
                        f"{', '.join(keys)} (set match: to choose the keys compared)"
                    )
        if counts:
            stage.fewest_dependencies, stage.most_dependencies = min(counts), max(counts)


class Dependencies:
    """Finds each run's dependencies as the runs are produced, in the sweep's order.

    The runs of a stage that a later stage follows are remembered (their names,
    under the values compared) until the sweep ends; other runs are not.
    """

    def __init__(self, stages: Sequence[Stage]) -> None:
        by_name = {stage.name: stage for stage in stages}
        self._pairs = {
            stage.name: [(other, match_keys(stage, by_name[other])) for other in stage.after] for stage in stages
        }
        # (earlier stage, keys) -> value text -> the names of its runs with those values
        self._index: dict[tuple[str | None, tuple[str, ...]], dict[str, list[str]]] = {}
        for pairs in self._pairs.values():
            for other, keys in pairs:
                self._index.setdefault((other, keys), {})
        self.followed = frozenset(other for pairs in self._pairs.values() for other, _ in pairs)

    def note(self, stage: str | None, name: str, config: Mapping[str, Any]) -> None:
        """A run of ``stage`` was produced (whether or not it runs in this start)."""
        if stage in self.followed:
            for (other, keys), index in self._index.items():
                if other == stage:
                    names = index.setdefault(value_key(config, keys), [])
                    if name not in names:
                        names.append(name)

    def of(self, stage: str | None, config: Mapping[str, Any]) -> tuple[str, ...]:
        """The names of the runs a run of ``stage`` with ``config`` waits for."""
        found: list[str] = []
        for other, keys in self._pairs.get(stage, ()):
            found += self._index[(other, keys)].get(value_key(config, keys), ())
        return tuple(found)
