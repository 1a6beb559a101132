"""A run's row as the ledger's readers get it (:class:`RunRecord`, :class:`KnownRun`), and what
values this version writes in each field: a value changed by hand into anything else reads as unknown."""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from ...recordclass import Record
from ..status import RunStatus


class RunRecord(Record):
    name: str
    run_index: int | None
    config_hash: str | None
    status: RunStatus
    attempts: int
    slot: str | None
    pid: int | None
    token: str | None
    work_dir: str | None
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    signal: str | None
    cause: str | None
    log_tail: str | None
    result: str | None  # JSON text of what main() returned
    gpu_memory_peak: int | None = None  # bytes on one GPU, as NVML saw the run's processes
    params: str | None = None  # JSON of the run's swept values (its test_config)
    result_file: str | None = None  # a result too large for the ledger: this file in the run's .gts/
    gpu_leftover: str | None = None  # GPU memory its processes still held after it ended, in words
    stage: str | None = None  # its stage, in a config with stages
    node: str | None = None  # the machine its last attempt ran on (Ray backend): "ip/node id"
    program: str | None = None  # what it ran, as RunSpec.program (None: not known, e.g. a class in __main__)
    metrics: str | None = None  # JSON: what its last attempt reported, per metric {last, step, min, max}
    provenance: str | None = None  # JSON: the code, environment and seed its last attempt ran with
    gpu_seconds: float | None = None  # its share of the GPUs' busy time, over all its attempts (gpu/usage.py)
    energy: float | None = None  # joules of its share of the GPUs' energy, where they count it
    slot_seconds: float | None = None  # the wall time its ended attempts held their slots, added up
    spans: str | None = None  # JSON: [[slot, start, end], ...] of its ended attempts (the latest MAX_SPANS)

    @property
    def spans_value(self) -> list[tuple[str, float, float]]:
        """Its ended attempts' slots, starts and ends (empty when none, or damaged)."""
        try:
            value = json.loads(self.spans) if self.spans else []
        except (ValueError, RecursionError):
            return []
        found = []
        for span in value if isinstance(value, list) else ():
            if isinstance(span, list) and len(span) == 3 and all(isinstance(t, (int, float)) for t in span[1:]):
                found.append((str(span[0]), float(span[1]), float(span[2])))
        return found

    def attempt_spans(self, now: float, *, running: bool) -> list[tuple[str, float, float]]:
        """Each attempt's slot, start and end, oldest first: the ended ones recorded (spans), then
        the last one where it is not among them (``running``: it runs until ``now``)."""
        spans = self.spans_value
        # (SQLite's JSON keeps 15 digits of a time: to within 10 microseconds of started_at)
        if self.started_at is None or (spans and abs(spans[-1][1] - self.started_at) < 1e-3):
            return spans
        end = self.ended_at if self.ended_at is not None else (now if running else self.started_at)
        return [*spans, (self.slot or "?", self.started_at, max(end, self.started_at))]

    def held_seconds(self, now: float) -> float | None:
        """The wall time it held a slot, over all its attempts (a running one's until ``now``)."""
        # (one waiting in a cluster's queue, its node '', holds no slot yet)
        running = self.status is RunStatus.RUNNING and self.started_at is not None and self.node != ""
        current = max(0.0, now - self.started_at) if running and self.started_at is not None else 0.0
        if isinstance(self.slot_seconds, (int, float)):
            return self.slot_seconds + current
        if self.started_at is None:
            return None
        end = self.ended_at if self.ended_at is not None else (now if running else None)
        return None if end is None else end - self.started_at

    @property
    def metrics_value(self) -> dict[str, Any]:
        """The reported metrics' summary (empty when none; a hand-damaged one reads as none)."""
        try:
            value = json.loads(self.metrics) if self.metrics else {}
        except (ValueError, RecursionError):
            return {}
        return value if isinstance(value, dict) else {}

    @property
    def provenance_value(self) -> dict[str, Any] | None:
        """What made its last attempt (records/provenance.py), or None (not recorded, or damaged)."""
        try:
            value = json.loads(self.provenance) if self.provenance else None
        except (ValueError, RecursionError):
            return None
        return value if isinstance(value, dict) else None

    @property
    def params_value(self) -> dict[str, Any]:
        return {} if self.params is None else json.loads(self.params)

    @property
    def result_value(self) -> Any:
        return None if self.result is None else json.loads(self.result)


class KnownRun(NamedTuple):
    """The part of a run's row that decides whether it runs: a few strings, so many fit in memory."""

    status: RunStatus
    config_hash: str | None
    params: str | None  # JSON of its swept values
    program: str | None = None  # what it ran (RunSpec.program)
    started_at: float | None = None  # when its last attempt started (runs of later stages compare it)


_STATUSES = {status.value: status for status in RunStatus}


_FIELDS = set(RunRecord._fields)
_INTEGERS = {"run_index", "attempts", "pid", "exit_code", "gpu_memory_peak"}
_NUMBER = "(typeof({0}) IN ('integer', 'real') AND abs({0}) < 1e12)"  # a time as this version writes it
STALE_CAUSE = (
    "recorded as running, but no scheduler holds the result root (it was stopped or killed): "
    "nothing runs it; the next start runs it again"
)
_TIMES = {"started_at", "ended_at"}
_REALS = {"gpu_seconds", "energy", "slot_seconds"}
_JSON = {"result": "JSON", "params": "a JSON object", "provenance": "a JSON object"}


def _field_problem(field: str, value: Any) -> str | None:
    """Why a recorded value cannot be what this version writes in ``field`` (None: it can)."""
    if value is None or field == "status":
        return None
    if field in _INTEGERS:
        return None if isinstance(value, int) else "not an integer"
    if field in _TIMES:
        return None if isinstance(value, (int, float)) and abs(value) < 1e12 else "not a time"
    if field in _REALS:
        return None if isinstance(value, (int, float)) and math.isfinite(value) else "not a number"
    if not isinstance(value, str):
        return "not text"
    if field in _JSON:
        try:
            decoded = json.loads(value)
        except (ValueError, RecursionError):
            return f"not {_JSON[field]}"
        if field == "params" and not isinstance(decoded, dict):
            return "not a JSON object"
    return None
