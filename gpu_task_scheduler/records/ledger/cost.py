"""What a result root's runs cost and what made them: the GPU-seconds, energy and slot time of every
attempt (gpu/usage.py adds them as runs run, so a kill -9 loses little), and each run's provenance
(records/provenance.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .store import Store


class Cost(Store):
    def add_usage(self, usage: Mapping[str, Any]) -> None:
        """Add what runs' attempts cost since the last time (run name -> gpu/usage.py's Usage) to the
        runs' totals: a running run's now and then, the rest at its end, so a kill -9 loses little."""
        with self.batch():
            for name, used in usage.items():
                self._write(
                    """UPDATE runs SET gpu_seconds = COALESCE(gpu_seconds, 0) + ?,
                       energy = CASE WHEN ? IS NULL THEN energy ELSE COALESCE(energy, 0) + ? END WHERE name = ?""",
                    (used.gpu_seconds, used.joules, used.joules, name),
                )

    def gpu_seconds_spent(self) -> float:
        """Every GPU-second the root's runs are recorded to have cost, over all their attempts."""
        return self.cost()[0]

    def cost(self) -> tuple[float, float | None]:
        """What the root's runs are recorded to have cost, over all their attempts: GPU-seconds, and
        joules (None where no run recorded energy)."""
        (seconds, joules) = self._tuples(
            f"SELECT total({self._number('gpu_seconds')}), SUM({self._number('energy')}) FROM runs", ()
        )[0]
        return float(seconds), None if joules is None else float(joules)

    def held_seconds(self, now: float) -> float:
        """The wall time the root's runs held their slots, over all their attempts (the running ones'
        until ``now``): what a sweep cost where no GPU is measured (CPU slots)."""
        if "slot_seconds" not in self._columns():
            return 0.0
        ((seconds,),) = self._tuples(
            f"""SELECT total(COALESCE({self._number("slot_seconds")}, 0)
                 + CASE WHEN status = 'running' AND typeof(started_at) IN ('integer', 'real')
                   AND {self._column("node")} IS NOT '' THEN max(0, ? - started_at) ELSE 0 END) FROM runs""",
            (now,),
        )
        return float(seconds)

    def provenances(self) -> dict[str, dict[str, Any]]:
        """Every run's provenance that is a JSON object (records/provenance.py), by name: one scan."""
        rows = self._tuples(
            f"SELECT name, {self._column('provenance')} FROM runs WHERE json_valid({self._column('provenance')})", ()
        )
        found = {}
        for name, text in rows:
            value = json.loads(text)
            if isinstance(value, dict):
                found[name] = value
        return found

    def set_provenance(self, name: str, provenance: str) -> None:
        """What made ``name``'s current attempt (records/provenance.py), recorded once it started."""
        self._write("UPDATE runs SET provenance = ? WHERE name = ?", (provenance, name))
