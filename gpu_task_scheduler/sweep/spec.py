"""A run of a sweep as the engine gets it (:class:`RunSpec`), its identity (:func:`params_text`,
:func:`config_hash`), and what an open-ended sweep yields while its next run is not known
(:data:`NOT_READY`). sweep/expand.py makes runs from a config, sweep/sampled.py from a search's
trials, sweep/stream.py from lines on stdin: each depends on this module, none on another."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..digest import sha256_hex
from ..jsonable import to_jsonable
from ..recordclass import Record

if TYPE_CHECKING:
    from ..tuning.stopping import Rule

# What an open-ended sweep's runs() yields while its next run is not known yet
# (gts queue waiting for a line); it calls the ``wake`` given to Sweep.follow when there is more.
NOT_READY: Any = object()


# --- hashing ------------------------------------------------------------------


def params_text(test_config: Mapping[str, Any]) -> str:
    """A run's swept values as canonical JSON (keys sorted): what the ledger records as its identity."""
    return json.dumps(to_jsonable(test_config))


def config_hash(config: Mapping[str, Any]) -> str:
    text = json.dumps(to_jsonable(config), sort_keys=True, separators=(",", ":"))
    return sha256_hex(text)


# --- runs -----------------------------------------------------------------------


class RunSpec(Record):
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
    params: str = ""  # params_text(test_config): the run's identity in the ledger
    stage: str | None = None  # its stage's name, in a config with stages
    after: tuple[str, ...] = ()  # the names of the runs it waits for (earlier stages' runs)
    program: str | None = None  # what it runs (Sweep.programs): a change of it is a config change
    early_stop: Rule | None = None  # its stage's early_stop rule (an ASHA run's report() waits at its rungs)


# ``foreign(name, params, index)``: does the result root record the folder ``name`` for
# other swept values than ``params`` (asked for run ``index``)? See records/known.py.
Foreign = Callable[[str, str, int], bool]
