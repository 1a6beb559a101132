"""What a result root knows of a sweep's runs before they start, read in bulk.

Resuming a sweep whose 100,000 runs succeeded must not cost 100,000 ledger
queries and a dozen file-system calls per run. :class:`RootIndex` reads the
ledger's rows a window of consecutive run indices at a time (the order in
which a sweep asks), and lists the root's folders once: a run the ledger
records as succeeded is skippable when its folder is there, with no query or
system call of its own. Runs the ledger does not know (new ones, or all of
them after the ledger was lost) are looked at one by one, as they must be:
only they are read from (an adopted success) or written into.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from .ledger import Ledger
from .ledger.record import KnownRun
from .paths import RunPaths, read_json

# Ledger rows read per query; a window holds only a few strings per run.
WINDOW = 4096
# How long a listing of the root's folders is trusted. Only runs the ledger records
# are decided from it (whether their folder is still there); a folder deleted by hand
# less than this long before its run comes up is not noticed, and the run is skipped.
LISTING_SECONDS = 60.0

_MISSING = object()


class RootIndex:
    """The ledger's rows and the root's folders, for deciding about runs in sweep order."""

    def __init__(
        self,
        ledger: Ledger | None,
        root: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        take_over: frozenset[str] = frozenset(),
    ) -> None:
        """``take_over``: folders that this start's runs of other swept values may have
        (``on_config_change: keep``; see engine/changes.py)."""
        self.ledger, self._root, self._clock = ledger, root, clock
        self._take_over = take_over
        self._window: dict[str, KnownRun] = {}
        self._first = self._end = 0
        # Rows may sit outside the window (the sweep changed since they were written): a name
        # not found there is asked for alone, unless the ledger had no rows at all.
        self._scattered = ledger is not None and not ledger.empty()
        self._folders: frozenset[str] = frozenset()
        self._listed_at: float | None = None

    def known(self, name: str, index: int) -> KnownRun | None:
        """The ledger's row for the folder ``name``, asked for the sweep's run ``index``."""
        if self.ledger is None:
            return None
        if not self._first <= index < self._end:
            self._first, self._end = index, index + WINDOW
            self._window = self.ledger.known_between(self._first, self._end)
        known = self._window.get(name)
        if known is None and self._scattered:
            known = self.ledger.known(name)
        return known

    def has_folder(self, name: str) -> bool:
        """Is ``name`` a real folder (not a link) in the root, as listed at most LISTING_SECONDS ago?"""
        now = self._clock()
        if self._listed_at is None or now - self._listed_at > LISTING_SECONDS:
            try:
                with os.scandir(self._root) as entries:
                    self._folders = frozenset(e.name for e in entries if e.is_dir(follow_symlinks=False))
            except OSError:
                self._folders = frozenset()
            self._listed_at = now
        return name in self._folders

    def foreign(self, name: str, params: str, index: int) -> bool:
        """Does the root record the folder ``name`` for a run with other swept values than ``params``?
        Asked of the ledger, and for folders it does not know, of the folder's own
        ``.gts/config.json``. Folders with no record at all (a legacy root) belong to whoever wants them."""
        known = self.known(name, index)
        if known is not None:
            return known.params is not None and known.params != params and name not in self._take_over
        if not self.has_folder(name):
            return False
        paths = RunPaths(os.path.join(self._root, name), None)
        if paths.unsafe() is not None:
            return False  # not read through; running there is refused with the reason
        recorded = read_json(paths.config)
        if not isinstance(recorded, dict):
            return False
        return any(recorded.get(key, _MISSING) != value for key, value in json.loads(params).items())
