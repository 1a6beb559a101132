"""``ConfigManager``: the original's view of a sweep, over :class:`Sweep`.

Same methods and return shapes as the original. Unlike it, constructing one
writes nothing (the original created ``temp_folder``) and never changes the
caller's dict, and runs are produced lazily.

On a search config (``search:``), the runs are those the search has sampled so far (none before
its first start): the space's ranges are no list of values to take a product of.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from .errors import GTSError
from .gpu.devices import Slot
from .sweep.expand import RunSpec, Sweep
from .sweep.files import ConfigSource


class ConfigManager:
    def __init__(self, config: ConfigSource) -> None:
        self._sweep = Sweep(config)
        self._runs: Iterator[RunSpec] = self.iter_runs()
        self._counter = 0
        self._total: int | None = None if self._sweep.search is not None else len(self._sweep)

    @property
    def sweep(self) -> Sweep:
        return self._sweep

    def iter_runs(self) -> Iterator[RunSpec]:
        """Every run of the sweep, from the start, independent of get_next_config().

        Folder names are the ones the scheduler gives: where the result root
        records a folder for other values, this run's name is its own (read
        only; nothing is written)."""
        from .records.known import RootIndex
        from .records.ledger import Ledger
        from .records.paths import RootPaths

        root = self._sweep.options.result_root_folder

        def runs() -> Iterator[RunSpec]:  # the ledger is opened on the first run asked for, closed after the last
            try:
                ledger = Ledger.read_only(RootPaths(root))
            except GTSError:
                ledger = None  # a damaged ledger: the scheduler will say so; names from the folders alone
            try:
                yield from self._sweep.runs(RootIndex(ledger, root).foreign)
            finally:
                if ledger is not None:
                    ledger.close()

        return runs()

    def get_all_scheduler_config(self) -> dict[str, Any]:
        return self._sweep.options.as_dict()

    def get_all_global_config(self) -> dict[str, Any]:
        return copy.deepcopy(self._sweep.global_config)

    def get_all_test_config(self) -> list[dict[str, Any]]:
        """Each run's swept values; a search's: those of the runs sampled so far."""
        if self._sweep.search is not None:
            return [copy.deepcopy(spec.test_config) for spec in self.iter_runs()]
        return [test_config for _, test_config in self._sweep.test_configs()]

    def get_all_test_config_in_string(self) -> str:
        return self._sweep.all_test_config_in_string()

    def get_gpu_envs(self) -> list[dict[str, Any]]:
        return [{"name": slot.name, "env": slot.env()} for slot in self._slots()]

    def _slots(self) -> list[Slot]:
        slots = self._sweep.options.slots
        if slots is None:  # "all": ask the machine
            from .gpu.devices import discover_slots, open_monitor

            monitor, why = open_monitor()
            try:
                options = self._sweep.options
                return discover_slots(None, cpu_fallback=options.cpu_fallback, monitor=monitor, why_no_monitor=why)
            finally:
                if monitor is not None:
                    monitor.close()
        return list(slots)

    def get_next_config(self, create_dir: bool = False) -> dict[str, Any]:
        """The next run as ``{"config", "test_config_string", "test_config_string_filtered",
        "work_dir"}``, or ``{"config": None}`` when none is left. ``create_dir`` is
        accepted for compatibility and ignored, as in the original."""
        spec: RunSpec | None = next(self._runs, None)
        if spec is None:
            return {"config": None}
        self._counter += 1
        return {
            "config": spec.config,
            "test_config_string": spec.test_config_string,
            "test_config_string_filtered": spec.name,
            "work_dir": spec.work_dir,
        }

    def get_num_left_config(self) -> int:
        """Runs :meth:`get_next_config` has yet to give; a search's: of those sampled so far."""
        if self._total is None:
            self._total = sum(1 for _ in self.iter_runs())
        return self._total - self._counter

    def get_results(self) -> list[dict[str, Any]]:
        """One row per recorded run of this sweep's result root (see ``gpu_task_scheduler.results``)."""
        from .results import rows

        return rows(self._sweep.options.result_root_folder)

    def get_num_gpu(self) -> int:
        return len(self._slots())
