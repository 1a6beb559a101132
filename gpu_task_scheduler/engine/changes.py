"""Runs whose config changed since they succeeded, found before anything runs (``on_config_change``).

Two kinds, both under a folder name the root records as succeeded:

* ``config``: the same swept values, another config (a ``global_config``
  change, or another task class or command): the run's result is not this config's.
* ``values``: other swept values under the same name, where the recorded run
  is no longer in the sweep and these values were never run: most likely
  the same run with a key left out of folder names changed, or a value
  that the name cuts short (``config_string_value_maxlen``). (A new config
  that merely shares a cut name with a run still in the sweep is not a
  change: it gets a folder of its own, as always.)
* ``renamed``: the same run (stage and swept values) under another folder
  name, because a naming option changed (the separator, the length limit,
  the keys or characters left out of names): it would run again in a new
  folder while its result sits in the old one.

``stop`` (the default) lists them and runs nothing; ``rerun`` runs them again
(``config`` in place, ``values`` and ``renamed`` in a folder of their own); ``keep``
treats the recorded results as this config's, except for ``renamed`` runs,
whose results it cannot move between folders: it refuses them.
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

from ..digest import blake2b_8 as _digest
from ..errors import ConfigError
from ..jsonable import to_jsonable
from ..records.known import RootIndex
from ..records.ledger import Ledger
from ..records.paths import RunPaths, read_json
from ..records.status import RunStatus
from ..sweep.expand import Sweep
from .decide import program_changed

SHOWN = 20  # changes listed in the error; the rest are counted


class Change(NamedTuple):
    name: str
    position: int  # the run's index in the sweep: changes are listed in the sweep's order
    kind: str  # "config", "values" or "renamed"
    differences: str  # "epochs: 1 -> 2; seed: 1 -> 2"


def _canonical(value: Any) -> str:
    return json.dumps(to_jsonable(value), sort_keys=True)


def _differences(old: Any, new: Any) -> str:
    if not isinstance(old, dict) or not isinstance(new, dict):
        return "its recorded config cannot be read"

    def shown(config: dict[str, Any], key: str) -> str:
        return repr(config[key]) if key in config else "(none)"

    def same(key: str) -> bool:  # as the config hash sees them: 1 and 1.0 differ, as do [1] and (1,)
        return key in old and key in new and _canonical(old[key]) == _canonical(new[key])

    found = [
        f"{key}: {shown(old, key)} -> {shown(new, key)}"
        for key in sorted(set(old) | set(new), key=str)
        if not same(key)
    ]
    return "; ".join(found[:5]) + ("; ..." if len(found) > 5 else "") or "no difference in its recorded config"


def find_changes(sweep: Sweep, ledger: Ledger, root: str) -> list[Change]:
    """Every change (see the module's notes), in sweep order; reads the whole sweep once. An
    open-ended sweep (`gts queue`: each line is its own run) has none."""
    try:
        len(sweep)
    except TypeError:
        return []
    if not ledger.has_succeeded():
        return []
    identity = sweep.identity()
    if identity is not None and ledger.get_meta("sweep_identity") == identity:
        return []  # the sweep that recorded these runs, unchanged: nothing to look for
    index = RootIndex(ledger, root)
    # Each succeeded run's identity (its stage and swept values) -> its folder name, and the swept
    # values alone; as digests, so a large root costs little memory here.
    recorded: dict[bytes, bytes] = {}
    recorded_values: set[bytes] = set()
    for name, stage, params in ledger.succeeded_runs():
        recorded[_digest(f"{stage}\0{params}")] = _digest(name)
        recorded_values.add(_digest(params))
    in_sweep: set[bytes] = set()
    collisions: list[tuple[str, int, str, str]] = []
    renamed: dict[bytes, tuple[str, int]] = {}  # identity -> (new name, index)

    def probe(name: str, params: str, at: int) -> bool:
        known = index.known(name, at)
        if known is not None and known.status is RunStatus.SUCCEEDED and known.params not in (None, params):
            collisions.append((name, at, known.params or "", params))
        return index.foreign(name, params, at)

    changes = []
    for spec in sweep.runs(probe):
        in_sweep.add(_digest(spec.params))
        known = index.known(spec.name, spec.index)
        if known is None:
            identity_digest = _digest(f"{spec.stage}\0{spec.params}")
            old_folder = recorded.get(identity_digest)
            if old_folder is not None and old_folder != _digest(spec.name):
                renamed[identity_digest] = (spec.name, spec.index)
            continue
        if known.status is not RunStatus.SUCCEEDED or known.params != spec.params:
            continue
        differences = []
        if known.config_hash not in (None, spec.config_hash):
            paths = RunPaths(spec.work_dir, None)
            old = read_json(paths.config) if paths.unsafe() is None else None
            differences.append(_differences(old, to_jsonable(spec.config)))
        if program_changed(known.program, spec.program):
            assert known.program is not None and spec.program is not None
            differences.append(_differences(json.loads(known.program), json.loads(spec.program)))
        if differences:
            changes.append(Change(spec.name, spec.index, "config", "; ".join(differences)))
    for name, at, old_params, new_params in collisions:
        if _digest(old_params) not in in_sweep and _digest(new_params) not in recorded_values:
            changes.append(Change(name, at, "values", _differences(json.loads(old_params), json.loads(new_params))))
    if renamed:
        naming = _naming_differences(ledger.get_meta("sweep_config"), sweep)
        for old_name, stage, params in ledger.succeeded_runs():  # the old names, read again only now
            found = renamed.get(_digest(f"{stage}\0{params}"))
            if found is not None:
                name, at = found
                changes.append(Change(name, at, "renamed", f"its result is in {old_name!r}; {naming}"))
    return sorted(changes, key=lambda change: change.position)


_NAMING = (
    "test_config_string_indicator",
    "test_config_string_separator",
    "config_string_value_maxlen",
    "ignored_keys_for_folder_name",
    "ignored_characters_for_folder_name",
)


def _naming_differences(recorded: str | None, sweep: Sweep) -> str:
    """Which naming options changed since the recorded sweep, in words."""
    try:
        old = json.loads(recorded or "")["scheduler_config"]
        assert isinstance(old, dict)
    except (ValueError, KeyError, TypeError, AssertionError):
        return "the folder names changed (the naming options of the earlier sweep are not recorded)"
    new = to_jsonable(sweep.options.as_dict())
    found = [f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in _NAMING if old.get(key) != new.get(key)]
    return "the folder names changed (" + ("; ".join(found) or "a naming rule changed") + ")"


def settle_changes(sweep: Sweep, ledger: Ledger, root: str) -> frozenset[str]:
    """What ``on_config_change`` makes of the changes, the same for a start and ``--dry-run``:
    ``stop`` raises the listing (ConfigError) when there is any; ``keep`` gives the folders this
    start's runs of other values may take over; ``rerun`` looks for nothing."""
    mode = sweep.options.on_config_change
    if mode == "rerun":
        return frozenset()
    changes = find_changes(sweep, ledger, root)
    if changes and mode == "stop":
        raise refuse(changes, root)
    moved = [change for change in changes if change.kind == "renamed"]
    if moved:  # keep: a result cannot be kept as this config's in another folder
        raise refuse(
            moved,
            root,
            choice="Folder names changed, and a result is not moved between folders: run them again "
            "(gts run --accept-changes; on_config_change: rerun), or set the naming options back",
        )
    return frozenset(change.name for change in changes if change.kind == "values")


_KIND_WORDS = {"values": "swept values changed", "config": "config changed", "renamed": "folder name changed"}
_CHOICE = (
    "Choose: run them again (gts run --accept-changes; scheduler_config on_config_change: rerun), or "
    "keep their results as this config's (gts run --keep; on_config_change: keep)"
)


def refuse(changes: list[Change], root: str, *, choice: str = _CHOICE) -> ConfigError:
    """The error that stops a start (``on_config_change: stop``), listing the changes."""
    lines = [
        f"{os.path.join(root, change.name)}: {_KIND_WORDS[change.kind]} ({change.differences})"
        for change in changes[:SHOWN]
    ]
    if len(changes) > SHOWN:
        lines.append(f"... and {len(changes) - SHOWN} more")
    return ConfigError(
        f"{len(changes)} run(s) of this root succeeded with another config than this start gives them, so "
        "their results are not this config's; nothing was run:\n  " + "\n  ".join(lines) + "\n" + choice
    )
