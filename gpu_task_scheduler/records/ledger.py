"""The record of every run, in SQLite under the result root.

Only the scheduler process writes it, in transactions (WAL journal), so a
scheduler killed at any moment leaves a consistent ledger. A run is recorded
as ``running`` *before* its child starts (that write is committed before the
child exists); on the next start, a run still marked ``running`` is settled
from the outcome file its child writes (``succeeded``) or marked
``interrupted`` and run again.

Durability: ``synchronous=NORMAL``. A commit is in the operating system's
hands the moment it returns, which is what survives a killed scheduler (the
kill -9 battery); only a power loss or kernel crash can take back the last
commits before a WAL checkpoint. What that costs is bounded: a run whose
success was lost is found again from the outcome file its process wrote
(and fsynced) into its folder, and adopted; anything else runs again. In
return a state change costs microseconds instead of an fsync (milliseconds),
and :meth:`Ledger.batch` lets the changes of one turn of the loop share one
transaction.

A new ledger is created with ``synchronous=OFF`` (then NORMAL): its creation
(the switch to WAL, the schema) synced six times, 3 to 40 ms before a new
root's first run could start. What those syncs kept safe from a power loss
is an empty ledger: until the first checkpoint the database file holds only
its header, and everything else is in the WAL, whose recovery keeps a
consistent prefix of the commits whatever reached the disk (NORMAL already
gives up the commits since the last checkpoint, here all of them); a ledger
lost altogether is started again, and its successes adopted from the runs'
outcome files as above.

A :class:`SweepLock` (an ``flock`` on ``.gts/lock``) stops two schedulers
from working on the same result root; the kernel drops it when its holder
dies, so a killed scheduler never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import logging
import math
import os
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from .. import __version__
from ..errors import LedgerError, SchedulerBusyError
from ..jsonable import to_jsonable
from ..recordclass import Record
from .paths import MAX_INLINE_RESULT, RootPaths, ledger_path_problem, open_regular, root_records_problem
from .status import RunStatus

logger = logging.getLogger("gpu_task_scheduler")

# 1: the first release. 2: runs.result_file (results too large to keep in the ledger).
# 3: runs.gpu_leftover (GPU memory a run's processes still held after it ended).
# 4: runs.stage and the status 'blocked' (stages; an older version could not read that status),
#    runs.node (the machine a run ran on, with the Ray backend).
# 5: runs.program (what the run ran: its task class or command, so a change of it is a config change),
#    runs.metrics (a summary of what the run reported as it trained, see metrics.py).
# 6: the status 'pruned' and the table verdicts (what the early_stop rule decided about each run).
# 7: the status 'paused' and the table trial_events (what a pausing method was told and decided, in order).
# 8: trial_events.detail (JSON: a population-based training member's values, an exploit's donor).
# 9: runs.provenance (JSON: the code, environment and seed an attempt ran with, see provenance.py).
# 10: runs.gpu_seconds and runs.energy (what every attempt of a run cost: its share of the GPUs'
#     busy time, and joules where the GPUs count energy; see gpu/usage.py).
# 11: verdicts.objectives (JSON: a run's value of each objective at a rung, for MO-ASHA).
# 12: runs.slot_seconds and runs.spans (the wall time every ended attempt held its slot, and each
#     attempt's slot, start and end: a run's duration and timeline across its attempts, and what a
#     sweep on CPU slots, where no GPU is measured, cost).
SCHEMA_VERSION = 12
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("ALTER TABLE runs ADD COLUMN result_file TEXT",),
    2: ("ALTER TABLE runs ADD COLUMN gpu_leftover TEXT",),
    3: ("ALTER TABLE runs ADD COLUMN stage TEXT", "ALTER TABLE runs ADD COLUMN node TEXT"),
    4: ("ALTER TABLE runs ADD COLUMN program TEXT", "ALTER TABLE runs ADD COLUMN metrics TEXT"),
    5: (),  # the table verdicts is created with the schema
    6: (),  # the table trial_events is created with the schema
    7: (),  # trial_events.detail is added after the schema where the table lacks it
    8: (),  # runs.provenance is added after the schema where the table lacks it
    9: (),  # runs.gpu_seconds and runs.energy are added after the schema where the table lacks them
    10: (),  # verdicts.objectives is added after the schema where the table lacks it
    11: (),  # runs.slot_seconds and runs.spans are added after the schema where the table lacks them
}
# Seconds the runs of a killed scheduler get to end by themselves before a new one stops them.
NATURAL_END = 2.0
# What the ledger keeps of one run: results up to 1 MiB of JSON (larger ones stay in
# the run folder, see backends/local/runner.py), causes and log tails up to 64 KiB.
MAX_TEXT = 64 << 10
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS runs (
    name TEXT PRIMARY KEY,
    run_index INTEGER,
    config_hash TEXT,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    slot TEXT, pid INTEGER, token TEXT, work_dir TEXT,
    started_at REAL, ended_at REAL,
    exit_code INTEGER, signal TEXT, cause TEXT, log_tail TEXT, result TEXT,
    gpu_memory_peak INTEGER, params TEXT, result_file TEXT, gpu_leftover TEXT, stage TEXT, node TEXT,
    program TEXT, metrics TEXT, provenance TEXT, gpu_seconds REAL, energy REAL, slot_seconds REAL, spans TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_index ON runs (run_index);
-- The early_stop rule's word on a run, kept so that a restart decides as the sweep before it did:
-- ASHA's value of each run at each rung it reached (stop 0 or 1), the median rule's stops.
-- rung is the rung's step (ASHA) or the step the run was stopped at (median).
CREATE TABLE IF NOT EXISTS verdicts (
    name TEXT NOT NULL, rung REAL NOT NULL, step REAL NOT NULL, value REAL NOT NULL,
    stop INTEGER NOT NULL, cause TEXT, objectives TEXT, PRIMARY KEY (name, rung)
);
-- A pausing early_stop method's history (tuning/trials.py), replayed in order at every start so that
-- it decides as the sweep before it did: kind 'began' (a new configuration, in bracket), 'rung' (its
-- value at a rung, and the decision: 'continue' or 'pause'), 'resumed' (promoted), 'ended', and
-- 'closed' (the sweep had no more new configurations; name NULL). Population-based training's
-- decisions are 'continue', 'snapshot', 'exploit', 'yield' and 'snapshot+yield'; detail (JSON)
-- holds a member's values at 'began', an exploit's donor, step and values, and 'late' for a report
-- told after the run went past it; with several objectives, each one's value at a 'rung' ("objectives", by
-- metric; value holds the first).
CREATE TABLE IF NOT EXISTS trial_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, stage TEXT, name TEXT, kind TEXT NOT NULL,
    bracket INTEGER, rung REAL, step REAL, value REAL, decision TEXT, detail TEXT
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
INSERT OR IGNORE INTO meta VALUES ('schema_version', '{SCHEMA_VERSION}');
"""


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
        running = self.status is RunStatus.RUNNING and self.started_at is not None
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


def _json_paths(key: str, most: int = 4) -> list[str]:
    """SQLite JSON paths at which a result may hold ``key``: the literal key, then each way of
    reading its dots as nesting, fewer levels first (as ``results`` flattens a nested result).
    Over ``most`` dots, only the literal key and the fully nested one.

    >>> _json_paths("nested.acc")
    ['$."nested.acc"', '$."nested"."acc"']
    """
    parts = key.split(".")
    if len(parts) == 1:
        return ["$." + json.dumps(key)]
    cuts = len(parts) - 1
    splits = [(0,) * cuts, (1,) * cuts] if cuts > most else list(itertools.product((0, 1), repeat=cuts))
    paths = []
    for split in sorted(splits, key=sum):
        pieces, current = [], parts[0]
        for cut, part in zip(split, parts[1:], strict=True):
            if cut:
                pieces.append(current)
                current = part
            else:
                current += "." + part
        pieces.append(current)
        paths.append("$." + ".".join(json.dumps(piece) for piece in pieces))
    return paths


def _ledger_error(path: str, error: sqlite3.DatabaseError) -> LedgerError:
    if isinstance(error, sqlite3.OperationalError):  # disk full, read-only, I/O error, locked
        return LedgerError(
            f"cannot use the ledger {path!r}: {error}. Nothing is lost: fix the cause and start again; "
            "runs that finished meanwhile are recognised from their folders."
        )
    return LedgerError(
        f"the ledger {path!r} is damaged ({error}). Move it aside and start again: "
        "runs that succeeded are recognised from the .gts/outcome.json in their folders; "
        "every other run will run again."
    )


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


# Added by a later schema: a ledger read as it is (read-only, not migrated) may lack them.
_OPTIONAL_COLUMNS = {
    "result_file",
    "gpu_leftover",
    "stage",
    "node",
    "program",
    "metrics",
    "provenance",
    "gpu_seconds",
    "energy",
    "slot_seconds",
    "spans",
}


# Columns of tables an earlier version made (CREATE TABLE IF NOT EXISTS adds no column to them).
_ADDED_COLUMNS = (
    ("trial_events", "detail", "TEXT"),
    ("runs", "provenance", "TEXT"),
    ("runs", "gpu_seconds", "REAL"),
    ("runs", "energy", "REAL"),
    ("verdicts", "objectives", "TEXT"),
    ("runs", "slot_seconds", "REAL"),
    ("runs", "spans", "TEXT"),
)


class GroupedNumbers(NamedTuple):
    """See :meth:`Ledger.grouped_numbers`."""

    found: bool  # some run has the parameter averaged over
    groups: list[tuple[Any, ...]]  # (stage, parameters less it as JSON, runs, first run_index)
    numbers: list[tuple[Any, ...]]  # (stage, parameters less it as JSON, result key or None, number)
    others: list[str]  # succeeded runs, counted in groups, whose results must be read one by one
    unparsed: list[str]  # succeeded runs with no parameters as valid JSON: not in groups, read one by one


def pruned_cause(step: Any, cause: str) -> str:
    """``pruned at step 3: loss 1.92, rung cutoff 0.87``: a pruned run's cause, as the ledger keeps it."""
    at = f"{step:g}" if isinstance(step, (int, float)) else str(step)
    return f"pruned at step {at}: {cause}" if cause else f"pruned at step {at}"


TRIAL_EVENT_KINDS = ("began", "rung", "resumed", "ended", "closed")


MAX_SPANS = 200  # the attempts' spans a run keeps (its slot_seconds add up every one)
NOTES_META, MAX_NOTES = "notes", 200  # the meta key of the runs' notes (Ledger.note), and how many are kept


class TrialEvent(NamedTuple):
    kind: str
    stage: str | None
    name: str | None
    bracket: int | None
    rung: float | None
    step: float | None
    value: float | None
    decision: str | None
    detail: dict[str, Any] | None = None


def _json_dict(text: Any) -> dict[str, Any] | None:
    """An event's detail: a JSON object, or None (none, or not one: changed by hand)."""
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def value_words(value: Any) -> str:
    """A value at a rung as a pause's cause says it: ``0.87``, or several objectives' (a dict)
    ``loss 0.87, latency 12``; "" for anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{name} {v:.4g}" for name, v in value.items() if isinstance(v, (int, float)))
    return ""


def paused_cause(rung: Any, value: Any) -> str:
    """``paused at rung 3 (0.87 there): resumed if it is promoted`` (``value``: see value_words)."""
    at = f"{rung:g}" if isinstance(rung, (int, float)) else str(rung)
    shown = value_words(value)
    there = f" ({shown} there)" if shown else ""
    return f"paused at rung {at}{there}: resumed if it is promoted"


def _check_version(path: str, version: int | None) -> None:
    if version is not None and version > SCHEMA_VERSION:
        raise LedgerError(
            f"the ledger {path!r} has schema version {version}, written by a newer version of "
            f"gpu_task_scheduler; this version ({__version__}) reads up to {SCHEMA_VERSION}: upgrade "
            "to use this result root"
        )
    if version is not None and version < 1:
        raise LedgerError(f"the ledger {path!r} has the schema version {version}; move it aside and start again")


class Ledger:
    def __init__(self, paths: RootPaths, *, clock: Callable[[], float] = time.time) -> None:
        self.path = paths.ledger
        self._clock = clock
        problem = ledger_path_problem(paths.root) or root_records_problem(paths)
        if problem is not None:
            raise LedgerError(problem)
        os.makedirs(paths.meta, exist_ok=True)
        try:
            new = os.lstat(self.path).st_size == 0
        except FileNotFoundError:
            new = True
        except OSError as error:
            raise LedgerError(f"cannot read the ledger {self.path!r}: {error}") from error
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA synchronous=OFF" if new else "PRAGMA synchronous=NORMAL")  # the module's notes
            self._db.execute("PRAGMA journal_mode=WAL")
            version = self._version()
            if version is not None and version < SCHEMA_VERSION:
                for step in range(version, SCHEMA_VERSION):
                    for statement in _MIGRATIONS[step]:
                        self._db.execute(statement)
                self._db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
            self._db.executescript(_SCHEMA)
            # Tables made by an earlier version (CREATE TABLE IF NOT EXISTS adds no column to them).
            for table, column, kind in _ADDED_COLUMNS:
                found = self._db.execute(f"SELECT 1 FROM pragma_table_info('{table}') WHERE name = ?", (column,))
                if not found.fetchall():
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            if new:
                self._db.execute("PRAGMA synchronous=NORMAL")
            version = self._version()
            _check_version(self.path, version)
            self._check_columns()
            self._identity = self._file_identity()
        except sqlite3.DatabaseError as error:
            raise _ledger_error(self.path, error) from error
        except LedgerError:
            self._db.close()
            raise

    def _file_identity(self) -> tuple[int, int] | None:
        try:
            info = os.lstat(self.path)
        except OSError:
            return None
        return info.st_dev, info.st_ino

    def _check_columns(self) -> None:
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(runs)")}
        self._column_names = columns
        self._known_select = (
            f"SELECT name, status, config_hash, params, {self._column('program')}, started_at FROM runs"
        )
        missing = sorted(_FIELDS - columns - _OPTIONAL_COLUMNS)
        if missing:
            raise LedgerError(
                f"the ledger {self.path!r} has no column {', '.join(missing)} in its runs table; it "
                f"was not written by gpu_task_scheduler (schema version {SCHEMA_VERSION} here) or "
                "was changed by hand: move it aside and start again"
            )

    def _version(self) -> int | None:
        """The schema version of an existing ledger (None: a new, empty file)."""
        tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in tables:
            return None
        rows = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
        try:
            return int(rows[0][0]) if rows else None
        except (TypeError, ValueError):
            raise LedgerError(
                f"the ledger {self.path!r} has the schema version {rows[0][0]!r}, which is no "
                "version of gpu_task_scheduler; move it aside and start again"
            ) from None

    def close(self) -> None:
        try:
            self.commit()
        finally:
            self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    _batches = 0  # open batch() blocks
    _pending = False  # a transaction is open with writes not yet committed

    def _write(self, sql: str, params: tuple[Any, ...] | Mapping[str, Any]) -> None:
        try:
            if not self._pending:
                self._db.execute("BEGIN IMMEDIATE")
                self._pending = True
            self._db.execute(sql, params)
        except sqlite3.DatabaseError as error:
            self._rollback()
            raise _ledger_error(self.path, error) from error
        if not self._batches:
            self.commit()

    _identity: tuple[int, int] | None = None  # the ledger file this connection writes

    def commit(self) -> None:
        """Make every write so far durable against a crash of this process.

        Raises LedgerError if the ledger file was deleted or replaced since it was opened
        (someone removed ``.gts`` mid-sweep): what would be committed would go to a file no
        one can open again, so the sweep stops instead of running on unrecorded."""
        if self._pending:
            if self._identity is not None and self._file_identity() != self._identity:
                self._rollback()
                raise LedgerError(
                    f"the ledger {self.path!r} was deleted or replaced while the sweep ran; stopping the "
                    "sweep, since nothing it does can be recorded. Start it again: runs that succeeded are "
                    "recognised from the .gts/outcome.json in their folders"
                )
            try:
                self._db.execute("COMMIT")
            except sqlite3.DatabaseError as error:
                self._rollback()
                raise _ledger_error(self.path, error) from error
            self._pending = False

    def _rollback(self) -> None:
        if self._pending:
            self._pending = False
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.DatabaseError:
                pass  # the transaction is gone already

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Writes in the block share one transaction, committed when the block ends, also when it
        ends with an exception (what was written is still true). ``mark_running`` commits at once."""
        self._batches += 1
        try:
            yield
        finally:
            self._batches -= 1
            if not self._batches:
                self.commit()

    def _query(self, sql: str, params: tuple | dict[str, Any] = ()) -> list[sqlite3.Row]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as error:
            raise _ledger_error(self.path, error) from error

    def get_meta(self, key: str) -> str | None:
        rows = self._query("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def set_meta(self, key: str, value: str) -> None:
        self._write("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def note(self, name: str, text: str) -> None:
        """A word about run ``name`` that ``gts status``, the page and the report show (one a run,
        the latest; at most MAX_NOTES runs): what the scheduler saw that the user should know."""
        notes = self.notes()
        notes.pop(name, None)
        notes[name] = text
        while len(notes) > MAX_NOTES:
            notes.pop(next(iter(notes)))
        self.set_meta(NOTES_META, json.dumps(notes))

    def notes(self) -> dict[str, str]:
        """The runs' notes (:meth:`note`), oldest first; damaged ones are left out."""
        try:
            found = json.loads(self.get_meta(NOTES_META) or "{}")
        except (ValueError, RecursionError):
            return {}
        if not isinstance(found, dict):
            return {}
        return {str(k): v for k, v in found.items() if isinstance(v, str)}

    def _record(self, row: sqlite3.Row) -> RunRecord:
        """A row as a RunRecord; columns of a newer version are left out, missing ones
        of an older one are None, and what this version cannot read is an error that
        says which version wrote it."""
        values = {key: row[key] for key in row.keys() if key in _FIELDS}
        missing = [name for name in ("name", "status") if name not in values]
        if missing:
            raise LedgerError(
                f"the ledger {self.path!r} has no column {', '.join(missing)} in its runs table; it "
                f"was not written by gpu_task_scheduler (schema version {SCHEMA_VERSION} here); "
                "move it aside and start again"
            )
        values["status"] = self._status(values["name"], values["status"])
        for field, value in values.items():
            problem = _field_problem(field, value)
            if problem is not None:
                self._warn_once(values["name"], field, value, problem)
                values[field] = 0 if field == "attempts" else None
        return RunRecord(**values)

    _warned: set[tuple[str, str]] | None = None

    def _warn_once(self, name: Any, field: str, value: Any, problem: str) -> None:
        """A value changed by hand into something this version never writes: shown as unknown,
        said once per run and field, so that the rest of the ledger stays readable."""
        if self._warned is None:
            self._warned = set()
        if (str(name), field) in self._warned or len(self._warned) > 100:
            return
        self._warned.add((str(name), field))
        shown = repr(value)
        logger.warning(
            "the ledger %s records run %r with %s = %s, which is %s; taken as unknown",
            self.path,
            name,
            field,
            shown[:80] + ("..." if len(shown) > 80 else ""),
            problem,
        )

    def _status(self, name: str, status: str) -> RunStatus:
        try:
            return RunStatus(status)
        except ValueError:
            raise LedgerError(
                f"the ledger {self.path!r} records the run {name!r} with the status "
                f"{status!r}, which this version ({__version__}) does not know: a newer version of "
                "gpu_task_scheduler wrote it; upgrade to use this result root"
            ) from None

    def get(self, name: str) -> RunRecord | None:
        rows = self._query("SELECT * FROM runs WHERE name = ?", (name,))
        return self._record(rows[0]) if rows else None

    def known(self, name: str) -> KnownRun | None:
        """What deciding about the run ``name`` needs of its row (see records/known.py)."""
        rows = self._tuples(f"{self._known_select} WHERE name = ?", (name,))
        return self._known(*rows[0]) if rows else None

    def known_between(self, first: int, end: int) -> dict[str, KnownRun]:
        """The same for every run with ``first <= run_index < end``, by name (one query)."""
        rows = self._tuples(f"{self._known_select} WHERE run_index >= ? AND run_index < ?", (first, end))
        return {row[0]: self._known(*row) for row in rows}

    def last_end(self, names: tuple[str, ...]) -> float | None:
        """When the latest of these runs ended, as recorded (None: none has an end)."""
        latest: float | None = None
        for start in range(0, len(names), 500):  # SQLite takes at most 999 parameters
            chunk = names[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._tuples(f"SELECT MAX(ended_at) FROM runs WHERE name IN ({marks})", chunk)
            value = rows[0][0] if rows else None
            if isinstance(value, (int, float)) and (latest is None or value > latest):
                latest = float(value)
        return latest

    def _tuples(self, sql: str, params: tuple | dict[str, Any]) -> list[tuple[Any, ...]]:
        """``_query`` without a Row per row (a Row costs more than the query, per row)."""
        try:
            cursor = self._db.cursor()
            cursor.row_factory = None
            return cursor.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as error:
            raise _ledger_error(self.path, error) from error

    def _known(
        self,
        name: str,
        status: str,
        config_hash: str | None,
        params: str | None,
        program: str | None = None,
        started_at: float | None = None,
    ) -> KnownRun:
        known = _STATUSES.get(status)
        started = float(started_at) if isinstance(started_at, (int, float)) else None
        return KnownRun(self._status(name, status) if known is None else known, config_hash, params, program, started)

    def has_succeeded(self) -> bool:
        return bool(self._tuples("SELECT 1 FROM runs WHERE status = 'succeeded' LIMIT 1", ()))

    def succeeded_runs(self) -> Iterator[tuple[str, str | None, str]]:
        """(name, stage, params) of every run that succeeded, read a batch at a time."""
        try:
            cursor = self._db.cursor()
            cursor.row_factory = None
            cursor.execute("SELECT name, stage, params FROM runs WHERE status = 'succeeded' AND params IS NOT NULL")
            while batch := cursor.fetchmany(4096):
                yield from batch
        except sqlite3.DatabaseError as error:
            raise _ledger_error(self.path, error) from error

    def recorded_peaks(self, limit: int = 1000) -> list[int]:
        """The GPU memory peaks of the latest runs that succeeded (bytes on one GPU), newest first."""
        rows = self._tuples(
            "SELECT gpu_memory_peak FROM runs WHERE status = 'succeeded' AND gpu_memory_peak > 0 "
            "ORDER BY ended_at DESC LIMIT ?",
            (limit,),
        )
        return [int(row[0]) for row in rows if isinstance(row[0], int)]

    def empty(self) -> bool:
        return not self._query("SELECT 1 FROM runs LIMIT 1")

    def records(self) -> list[RunRecord]:
        return [self._record(row) for row in self._query("SELECT * FROM runs ORDER BY run_index, name")]

    def iter_records(
        self, where: str = "", params: tuple = (), *, limit: int | None = None, last: bool = False
    ) -> Iterator[RunRecord]:
        """The runs (``where``: an SQL condition on the runs table), in the sweep's order (``last``: from
        the end), read a batch at a time: a root of any size is walked in bounded memory."""
        order = "run_index DESC, name DESC" if last else "run_index, name"
        sql = f"SELECT * FROM runs {'WHERE ' + where if where else ''} ORDER BY {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        try:
            cursor = self._db.execute(sql, params)
            while batch := cursor.fetchmany(1024):
                yield from (self._record(row) for row in batch)
        except sqlite3.DatabaseError as error:
            raise _ledger_error(self.path, error) from error

    def status_entries(
        self,
        *,
        root: str,
        log_file: str | None,
        stale: bool,
        now: float,
        where: str = "",
        limit: int | None = None,
        last: bool = False,
    ) -> Iterator[str]:
        """Each run's entry in ``gts status --json`` (see reports/status.py), as JSON text that
        SQLite writes, in the sweep's order: a root of 300,000 runs in a second, in bounded memory.
        ``stale``: no scheduler holds the root (runs recorded as running are stale). A value of the
        wrong type (changed by hand) is shown as null; :meth:`problems` names it."""
        order = "run_index DESC, name DESC" if last else "run_index, name"
        sql = f"""SELECT json_object(
            'name', name, 'stage', {self._column("stage")},
            'status', CASE WHEN status = 'running' AND :stale THEN 'stale' ELSE status END,
            'node', {self._column("node")}, 'slot', slot,
            'started', CASE WHEN typeof(started_at) IN ('integer', 'real')
                THEN datetime(CAST(started_at AS INTEGER), 'unixepoch', 'localtime') END,
            'duration', CASE WHEN typeof(started_at) NOT IN ('integer', 'real') OR (status = 'running' AND :stale)
                THEN NULL
                WHEN {self._number("slot_seconds")} IS NOT NULL THEN {self._number("slot_seconds")}
                    + CASE WHEN status = 'running' THEN :now - started_at ELSE 0 END
                WHEN typeof(ended_at) IN ('integer', 'real') THEN ended_at - started_at
                WHEN status = 'running' THEN :now - started_at END,
            'exit', CASE WHEN status = 'paused' THEN NULL ELSE COALESCE(signal, CAST(exit_code AS TEXT)) END,
            'attempts', CASE WHEN typeof(attempts) = 'integer' THEN attempts ELSE 0 END,
            'cause', CASE WHEN status = 'running' AND :stale THEN :stale_cause ELSE cause END,
            'log', CASE WHEN :log IS NOT NULL AND status != 'blocked' AND typeof(name) = 'text' AND name != ''
                AND name NOT IN ('.', '..') AND instr(name, '/') = 0 AND instr(name, char(0)) = 0
                THEN :root || '/' || name || '/' || :log END,
            'gpu_memory_peak', CASE WHEN typeof(gpu_memory_peak) = 'integer' THEN gpu_memory_peak END,
            'gpu_leftover', {self._column("gpu_leftover")},
            'metrics', CASE WHEN json_valid({self._column("metrics")}) THEN json({self._column("metrics")}) END,
            'provenance', CASE WHEN json_valid({self._column("provenance")})
                THEN json({self._column("provenance")}) END,
            'gpu_seconds', {self._number("gpu_seconds")}, 'energy', {self._number("energy")},
            'pid', CASE WHEN status = 'running' AND NOT :stale AND typeof(pid) = 'integer' THEN pid END)
            FROM runs {"WHERE " + where if where else ""} ORDER BY {order}"""
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        values = {"stale": stale, "now": now, "root": root, "log": log_file, "stale_cause": STALE_CAUSE}
        try:
            cursor = self._db.cursor()
            cursor.row_factory = None
            cursor.execute(sql, values)
            while batch := cursor.fetchmany(4096):
                yield from (row[0] for row in batch)
        except sqlite3.DatabaseError as error:
            raise _ledger_error(self.path, error) from error

    def warn_problems(self, *, json_fields: bool = True) -> None:
        """Say (once per run and field) which values were changed by hand (:meth:`problems`)."""
        for name, field, value, problem in self.problems(json_fields=json_fields):
            self._warn_once(name, field, value, problem)

    def problems(self, limit: int = 20, *, json_fields: bool = True) -> list[tuple[str, str, Any, str]]:
        """Values changed by hand into what this version never writes: (run, field, value, what it
        is not), at most ``limit``, found by one scan in SQLite. ``json_fields``: also results and
        parameters that are not JSON (what reads neither need not pay for parsing them)."""
        checks = [(f, f"typeof({f}) NOT IN ('null', 'integer')", "an integer") for f in sorted(_INTEGERS)]
        checks += [(f, f"NOT ({_NUMBER.format(f)} OR {f} IS NULL)", "a time") for f in sorted(_TIMES)]
        checks += [(f, f"typeof({f}) NOT IN ('null', 'integer', 'real')", "a number") for f in sorted(_REALS)]
        if json_fields:
            checks += [(f, f"{f} IS NOT NULL AND NOT json_valid({f})", "JSON") for f in ("result", "params")]
        checks = [check for check in checks if check[0] in self._columns()]
        fields = ", ".join(f"CASE WHEN {condition} THEN 1 ELSE 0 END, {field}" for field, condition, _ in checks)
        where = " OR ".join(f"({condition})" for _, condition, _ in checks)
        found: list[tuple[str, str, Any, str]] = []
        for row in self._tuples(f"SELECT name, {fields} FROM runs WHERE {where} LIMIT ?", (limit,)):
            for index, (field, _, kind) in enumerate(checks):
                if row[1 + 2 * index]:
                    found.append((row[0], field, row[2 + 2 * index], f"not {kind}"))
        return found[:limit]

    def ranked(
        self, key: str, limit: int, *, descending: bool = False, stage: str | None = None, succeeded: bool = False
    ) -> list[str]:
        """The names of the ``limit`` runs whose recorded result has the smallest (``descending``:
        largest) number at ``key``, runs without one last, ties in the sweep's order; ranked by
        SQLite. ``key`` is read as ``results.metric`` reads a row: a result key (``nested.acc``
        reaches into a nested result, the literal key first), else a swept parameter, else
        ``metrics.NAME``, the last value a run reported. Only runs whose result is in the ledger:
        the rest (results kept in their folders) are the caller's to rank."""
        value, values = self._value_sql(key)
        values.update(stage=stage, limit=int(limit))
        where = "result IS NOT NULL AND json_valid(result) AND (params IS NULL OR json_valid(params))"
        if key.startswith("metrics.") and "metrics" in self._columns():  # ranked by what runs reported
            where = (
                "(metrics IS NULL OR json_valid(metrics)) AND (params IS NULL OR json_valid(params)) "
                "AND (result IS NULL OR json_valid(result))"
            )
        if stage is not None:
            where += " AND stage = :stage"
        if succeeded:
            where += " AND status = 'succeeded'"
        sql = (
            f"SELECT name, {value} AS v FROM runs WHERE {where} "
            f"ORDER BY v IS NULL, v {'DESC' if descending else 'ASC'}, run_index, name LIMIT :limit"
        )
        return [row[0] for row in self._tuples(sql, values)]

    def grouped_numbers(self, over: str, *, stage: str | None = None) -> GroupedNumbers:
        """What ``results.aggregate`` averages, read by SQLite: the succeeded runs grouped by their
        stage and parameters less ``over`` (each group's JSON text without it, how many runs, the
        first run's index), and every top-level number of their results in the sweep's order. Runs
        whose result is not in the ledger as valid JSON (kept in a file, left in their folder, or
        changed by hand) are named in ``others``, and those whose parameters are not valid JSON in
        ``unparsed``, for the caller to read one by one."""
        path = "$." + json.dumps(over)
        stage_sql = f"{self._column('stage')}"
        where = "status = 'succeeded' AND params IS NOT NULL AND json_valid(params)"
        values: dict[str, Any] = {"path": path, "stage": stage}
        if stage is not None:
            where += f" AND {stage_sql} = :stage"
        found = bool(
            self._tuples(
                "SELECT 1 FROM runs WHERE json_valid(params) AND json_type(params, :path) IS NOT NULL LIMIT 1", values
            )
        )
        groups = self._tuples(
            f"SELECT {stage_sql}, json_remove(params, :path), COUNT(*), MIN(run_index) FROM runs WHERE {where} "
            "GROUP BY 1, 2 ORDER BY 4",
            values,
        )
        inline = f"{where} AND result IS NOT NULL AND result_file IS NULL AND json_valid(result)"
        numbers = self._tuples(
            f"SELECT {stage_sql}, json_remove(params, :path), j.key, j.value FROM runs, json_each(runs.result) AS j "
            f"WHERE {inline} AND json_type(runs.result) IN ('object', 'integer', 'real') "
            "AND j.type IN ('integer', 'real') ORDER BY run_index, name, j.id",
            values,
        )
        others = [row[0] for row in self._tuples(f"SELECT name FROM runs WHERE {where} AND NOT ({inline})", values)]
        unparsed = self._tuples(
            "SELECT name FROM runs WHERE status = 'succeeded' AND (params IS NULL OR NOT json_valid(params))"
            + (f" AND {stage_sql} = :stage" if stage is not None else ""),
            values,
        )
        return GroupedNumbers(found, groups, numbers, others, [row[0] for row in unparsed])

    def params_and_values(self, key: str, *, stage: str | None = None) -> list[tuple[str | None, float]]:
        """Each succeeded run's parameters (JSON text) and its number at ``key`` (as :meth:`ranked` reads
        it; a key no result has is read as ``metrics.KEY``, the last value the run reported), read by
        SQLite in one scan: runs without a number are left out."""
        for wanted in (key, f"metrics.{key}") if not key.startswith(("metrics.", "result")) else (key,):
            value, values = self._value_sql(wanted)
            values["stage"] = stage
            where = "status = 'succeeded' AND (params IS NULL OR json_valid(params)) "
            where += "AND (result IS NULL OR json_valid(result))"
            if "metrics" in self._columns():
                where += " AND (metrics IS NULL OR json_valid(metrics))"
            if stage is not None:
                where += " AND stage = :stage"
            sql = f"SELECT params, v FROM (SELECT params, {value} AS v, run_index FROM runs WHERE {where}) "
            found = self._tuples(sql + "WHERE v IS NOT NULL ORDER BY run_index", values)
            if found:
                return [(params, float(v)) for params, v in found]
        return []

    def _value_sql(self, key: str) -> tuple[str, dict[str, Any]]:
        """An SQL expression for the number a run has at ``key`` (see :meth:`ranked`), with its
        bound values; NULL where it has none (or JSON that is not valid there)."""
        result_key = key[len("result.") :] if key.startswith("result.") else key
        values: dict[str, Any] = {"ppath": "$." + json.dumps(key)}
        numeric = "json_type({0}, {1}) IN ('integer', 'real')"
        if key == "result":  # a run whose main() returned a number
            return "CASE WHEN json_type(result) IN ('integer', 'real') THEN json_extract(result, '$') END", values
        if '"' in key:  # SQLite's JSON paths cannot name such a key: found by json_each, unnested
            return self._quoted_value_sql(key, result_key)
        paths = []
        for i, path in enumerate(_json_paths(result_key)):
            values[f"path{i}"] = path
            paths.append(f":path{i}")
        # The first path that holds a value decides, number or not (as the row's column does).
        found = " OR ".join(f"json_type(result, {path}) IS NOT NULL" for path in paths)
        number = ", ".join(
            f"CASE WHEN {numeric.format('result', path)} THEN json_extract(result, {path}) END" for path in paths
        )
        value = f"CASE WHEN {found} THEN COALESCE({number}, NULL) "
        if not key.startswith("result."):
            value += f"WHEN {numeric.format('params', ':ppath')} THEN json_extract(params, :ppath) "
            if key.startswith("metrics.") and "metrics" in self._columns():
                name, _, which = key[len("metrics.") :].rpartition(".")
                if which not in ("last", "min", "max") or not name:  # metrics.loss: its last value
                    name, which = key[len("metrics.") :], "last"
                values["mpath"] = "$." + json.dumps(name) + "." + which
                value += f"WHEN {numeric.format('metrics', ':mpath')} THEN json_extract(metrics, :mpath) "
        return value + "END", values

    def _quoted_value_sql(self, key: str, result_key: str) -> tuple[str, dict[str, Any]]:
        """:meth:`_value_sql` for a key that holds ``"`` (a metric named ``acc"top1``): the top-level
        key of that name, looked up by ``json_each`` (no JSON path can name it)."""

        def top(column: str, name: str, inner: str = "") -> tuple[str, str]:
            value = f"json_extract(value, '$.{inner}')" if inner else "value"
            kind = f"json_type(value, '$.{inner}')" if inner else "type"
            where = f"FROM json_each({column}) WHERE key = {name}"
            return f"(SELECT {value} {where})", f"(SELECT {kind} {where})"

        values: dict[str, Any] = {"rkey": result_key, "pkey": key}
        number, kind = top("result", ":rkey")
        sql = f"CASE WHEN {kind} IS NOT NULL THEN CASE WHEN {kind} IN ('integer', 'real') THEN {number} END "
        if not key.startswith("result."):
            number, kind = top("params", ":pkey")
            sql += f"WHEN {kind} IN ('integer', 'real') THEN {number} "
            if key.startswith("metrics.") and "metrics" in self._columns():
                name, _, which = key[len("metrics.") :].rpartition(".")
                if which not in ("last", "min", "max") or not name:
                    name, which = key[len("metrics.") :], "last"
                values["mkey"] = name
                number, kind = top("metrics", ":mkey", which)
                sql += f"WHEN {kind} IN ('integer', 'real') THEN {number} "
        return sql + "END", values

    # Orders of a page of runs that are columns of the table (any other key: a number, as ranked).
    _PAGE_ORDERS = {
        "index": "run_index",
        "name": "name",
        "status": "status",
        "stage": "stage",
        "started": "started_at",
        "duration": "COALESCE(slot_seconds, ended_at - started_at)",
        "attempts": "attempts",
        "slot": "slot",
        "node": "node",
    }

    def page(
        self,
        *,
        key: str | None = None,
        descending: bool = False,
        statuses: Sequence[str] = (),
        text: str = "",
        offset: int = 0,
        limit: int = 50,
    ) -> tuple[int, list[RunRecord]]:
        """One page of the runs, sorted and filtered by SQLite (a root of 100,000 runs answers at
        once): ``key`` a column of :attr:`_PAGE_ORDERS` or a number as :meth:`ranked` reads it (runs
        without one last; None: the sweep's order), ``statuses`` the runs in these states,
        ``text`` the runs whose name, parameters (as JSON), cause, slot or machine hold it. How
        many runs match, and the page's records."""
        conditions: list[str] = []
        values: dict[str, Any] = {}
        if statuses:
            marks = ", ".join(f":status{i}" for i in range(len(statuses)))
            conditions.append(f"status IN ({marks})")
            values.update({f"status{i}": status for i, status in enumerate(statuses)})
        if text:  # in the name, a parameter's value, the cause, the slot or the machine
            found = " OR ".join(f"instr(COALESCE({c}, ''), :text) > 0" for c in ("name", "params", "cause", "slot"))
            if "node" in self._columns():
                found += " OR instr(COALESCE(node, ''), :text) > 0"
            conditions.append(f"({found})")
            values["text"] = text
        order = "run_index, name"
        if key is not None:
            if key in self._PAGE_ORDERS:
                column = self._PAGE_ORDERS[key]
                if column in ("stage", "node") and column not in self._columns():
                    column = "NULL"
                if key == "duration" and "slot_seconds" not in self._columns():  # an older ledger, read as it is
                    column = "(ended_at - started_at)"
            else:
                column, more = self._value_sql(key)
                values.update(more)
            way = "DESC" if descending else "ASC"
            order = f"{column} IS NULL, {column} {way}"
            if key not in self._PAGE_ORDERS:  # no number there: text values (a parameter like 'adam') in order
                text_value = "CASE WHEN json_type(params, :ppath) = 'text' THEN json_extract(params, :ppath) END"
                order += f", {text_value} IS NULL, {text_value} {way}"
            order += ", run_index, name"
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        (total,) = self._tuples(f"SELECT COUNT(*) FROM runs {where}", values)[0]
        if key is not None and key not in self._PAGE_ORDERS:
            # A number in JSON: runs whose JSON was damaged by hand are left out of the pages, as
            # ranked() leaves them out (SQLite's JSON functions refuse it); the total counts them.
            valid = ["(result IS NULL OR json_valid(result))", "(params IS NULL OR json_valid(params))"]
            if key.startswith("metrics.") and "metrics" in self._columns():
                valid.append("(metrics IS NULL OR json_valid(metrics))")
            where = f"WHERE {' AND '.join([*conditions, *valid])}"
        values.update(limit=max(0, int(limit)), offset=max(0, int(offset)))
        rows = self._query(f"SELECT * FROM runs {where} ORDER BY {order} LIMIT :limit OFFSET :offset", values)
        return total, [self._record(row) for row in rows]

    def stages(self) -> list[str]:
        """The stages the runs belong to, sorted (none in a sweep without stages)."""
        rows = self._tuples(f"SELECT DISTINCT {self._column('stage')} FROM runs", ())
        return sorted(row[0] for row in rows if isinstance(row[0], str))

    def run_stages(self) -> dict[str, str | None]:
        """Each recorded run's stage (None without stages): two columns, not whole records."""
        rows = self._tuples(f"SELECT name, {self._column('stage')} FROM runs", ())
        return {name: stage if isinstance(stage, str) else None for name, stage in rows if isinstance(name, str)}

    def _column(self, name: str) -> str:
        """A column of a later schema, or NULL in a ledger read as an older version left it."""
        return name if name in self._columns() else "NULL"

    def _number(self, name: str) -> str:
        """A column's number, or NULL (an older ledger, or a value changed by hand into another type)."""
        column = self._column(name)
        return f"CASE WHEN typeof({column}) IN ('integer', 'real') THEN {column} END"

    def tally(self) -> tuple[list[tuple[str | None, str, int]], float | None]:
        """(stage, status, how many runs), counted by SQLite in one scan, in the order stages first
        appear; and how long the runs that succeeded took on average (None before any did)."""
        timed = f"status = 'succeeded' AND {_NUMBER.format('started_at')} AND {_NUMBER.format('ended_at')}"
        rows = self._tuples(
            f"SELECT {self._column('stage')}, status, COUNT(*), MIN(run_index), "
            f"SUM(CASE WHEN {timed} THEN ended_at - started_at END), SUM(CASE WHEN {timed} THEN 1 ELSE 0 END) "
            f"FROM runs GROUP BY 1, 2 ORDER BY 4",
            (),
        )
        for row in rows:
            if row[1] not in _STATUSES:  # a newer version's status: the error that says so
                (name,) = self._tuples("SELECT name FROM runs WHERE status = ? LIMIT 1", (row[1],))[0]
                self._status(name, row[1])
        seconds = sum(row[4] or 0.0 for row in rows)
        timed_runs = sum(row[5] or 0 for row in rows)
        return [(row[0], row[1], row[2]) for row in rows], (seconds / timed_runs if timed_runs else None)

    def _columns(self) -> set[str]:
        return self._column_names

    def counts(self) -> dict[RunStatus, int]:
        rows = self._query("SELECT status, COUNT(*) FROM runs GROUP BY status")
        return {RunStatus(status): count for status, count in rows}

    def mark_running(
        self,
        *,
        name: str,
        run_index: int,
        config_hash: str,
        slot: str,
        token: str,
        work_dir: str,
        params: str | None = None,
        stage: str | None = None,
        program: str | None = None,
        provenance: str | None = None,
    ) -> int:
        """Record a new attempt before its child starts; return the attempt number. An attempt
        recorded again under its own token (a start following what a cluster still runs) is the
        same attempt: it is not counted twice.

        The early_stop rule's verdicts on the run are kept when it resumes after an interruption
        (its sweep was stopped or killed: the rule goes on where it was) or a pause, and dropped when it starts
        again after it ended otherwise (a new curve, judged afresh)."""
        self._write(
            """DELETE FROM verdicts WHERE name = ?
               AND EXISTS (SELECT 1 FROM runs WHERE name = ? AND status NOT IN ('interrupted', 'running', 'paused'))""",
            (name, name),
        )
        self._write(
            """INSERT INTO runs (name, run_index, config_hash, status, attempts, slot, token, work_dir, started_at,
                                 params, stage, program, provenance)
               VALUES (?, ?, ?, 'running', 1, ?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT(name) DO UPDATE SET
                 params = excluded.params, stage = excluded.stage, program = excluded.program,
                 provenance = excluded.provenance,
                 run_index = excluded.run_index, config_hash = excluded.config_hash, status = 'running',
                 attempts = attempts + (token IS NOT excluded.token), slot = excluded.slot,
                 token = excluded.token, pid = NULL,
                 work_dir = excluded.work_dir, started_at = excluded.started_at, ended_at = NULL,
                 exit_code = NULL, signal = NULL, cause = NULL, log_tail = NULL, result = NULL,
                 gpu_memory_peak = NULL, gpu_leftover = NULL, node = NULL, metrics = NULL""",
            (name, run_index, config_hash, slot, token, work_dir, self._clock(), params, stage, program, provenance),
        )
        (attempts,) = self._tuples("SELECT attempts FROM runs WHERE name = ?", (name,))[0]
        self.commit()  # the run's process starts next: its record must exist before it does
        return int(attempts)

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
                   THEN max(0, ? - started_at) ELSE 0 END) FROM runs""",
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

    def record_verdict(
        self,
        name: str,
        *,
        rung: float,
        step: float,
        value: float,
        stop: bool,
        cause: str,
        objectives: Sequence[float] | None = None,
    ) -> None:
        """What the early_stop rule decided about ``name`` at ``rung`` (see tuning/stopping.py);
        ``objectives``: MO-ASHA's value of each objective there (``value`` is the first)."""
        self._write(
            "INSERT OR REPLACE INTO verdicts (name, rung, step, value, stop, cause, objectives) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                name,
                rung,
                step,
                value,
                int(stop),
                cause[:MAX_TEXT],
                None if objectives is None else json.dumps(list(objectives)),
            ),
        )

    def verdict_objectives(self, name: str | None = None) -> dict[tuple[str, float], list[float]]:
        """MO-ASHA's recorded values of each objective, by (run, rung); values of the wrong types
        (changed by hand) are left out."""
        where, params = ("WHERE name = ? AND", (name,)) if name is not None else ("WHERE", ())
        rows = self._tuples(f"SELECT name, rung, objectives FROM verdicts {where} json_valid(objectives)", params)
        found = {}
        for run, rung, text in rows:
            values = json.loads(text)
            if (
                isinstance(run, str)
                and isinstance(rung, (int, float))
                and isinstance(values, list)
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            ):
                found[(run, float(rung))] = [float(v) for v in values]
        return found

    def verdicts(self, name: str | None = None) -> list[tuple[str, float, float, float, bool, str | None]]:
        """Every recorded verdict (or those of the run ``name``): ``(name, rung, step, value, stop, cause)``;
        rows of the wrong types (changed by hand) are left out."""
        where, params = ("WHERE name = ?", (name,)) if name is not None else ("", ())
        rows = self._tuples(f"SELECT name, rung, step, value, stop, cause FROM verdicts {where} ORDER BY rowid", params)
        return [
            (name, float(rung), float(step), float(value), bool(stop), cause if isinstance(cause, str) else None)
            for name, rung, step, value, stop, cause in rows
            if isinstance(name, str)
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (rung, step, value))
        ]

    def record_trial_event(
        self,
        kind: str,
        *,
        stage: str | None = None,
        name: str | None = None,
        bracket: int | None = None,
        rung: float | None = None,
        step: float | None = None,
        value: float | None = None,
        decision: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        """One event of a pausing method's history (see the table trial_events)."""
        text = None if detail is None else json.dumps(to_jsonable(detail), sort_keys=True)
        self._write(
            "INSERT INTO trial_events (stage, name, kind, bracket, rung, step, value, decision, detail) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (stage, name, kind, bracket, rung, step, value, decision, text),
        )

    def trial_events(self) -> list[TrialEvent]:
        """A pausing method's history, oldest first; rows of the wrong types (changed by hand) are
        left out."""
        if not self._tuples("SELECT 1 FROM sqlite_master WHERE name = 'trial_events'", ()):
            return []  # a ledger of an older version, read as it is (a dry run)
        columns = "stage, name, kind, bracket, rung, step, value, decision"
        if self._tuples("SELECT 1 FROM pragma_table_info('trial_events') WHERE name = 'detail'", ()):
            columns += ", detail"  # not in a ledger of version 7 read as it is (a dry run)
        rows = self._tuples(f"SELECT {columns} FROM trial_events ORDER BY seq", ())
        events = []
        for stage, name, kind, bracket, rung, step, value, decision, *more in rows:
            numbers = (rung, step, value)
            if (
                kind not in TRIAL_EVENT_KINDS
                or not isinstance(stage, (str, type(None)))
                or not isinstance(name, (str, type(None)))
                or not isinstance(bracket, (int, type(None)))
                or any(x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))) for x in numbers)
                or not isinstance(decision, (str, type(None)))
            ):
                continue
            detail = _json_dict(more[0]) if more else None
            events.append(TrialEvent(kind, stage, name, bracket, rung, step, value, decision, detail))
        return events

    def forget_trials(self) -> None:
        """Drop a pausing method's history: the sweep starts every run afresh (force_rerun)."""
        self._write("DELETE FROM trial_events", ())

    def pause_verdict(self, name: str) -> str | None:
        """Why ``name`` pauses, if the last word of a pausing method on it was to pause it."""
        rows = self._tuples(
            "SELECT kind, decision, rung, value, detail FROM trial_events WHERE name = ? ORDER BY seq DESC LIMIT 1",
            (name,),
        )
        if not rows or rows[0][0] != "rung" or rows[0][1] not in ("pause", "exploit", "yield", "snapshot+yield"):
            return None
        several = (_json_dict(rows[0][4]) or {}).get("objectives")  # each objective's value there
        return paused_cause(rows[0][2], several if isinstance(several, dict) else rows[0][3])

    def stop_verdict(self, name: str) -> str | None:
        """Why the early_stop rule stopped ``name``, if it did (and the run has not started again since)."""
        rows = self._tuples(
            "SELECT cause, step FROM verdicts WHERE name = ? AND stop = 1 ORDER BY rung LIMIT 1", (name,)
        )
        if not rows:
            return None
        cause, step = rows[0]
        return pruned_cause(step, cause if isinstance(cause, str) else "")

    def block(
        self,
        *,
        name: str,
        run_index: int,
        config_hash: str,
        work_dir: str,
        params: str,
        stage: str | None,
        cause: str,
    ) -> None:
        """A run not started because a run it depends on did not succeed (its attempts so far are kept)."""
        self._write(
            """INSERT INTO runs (name, run_index, config_hash, status, attempts, work_dir, ended_at, cause,
                                 params, stage)
               VALUES (?, ?, ?, 'blocked', 0, ?, ?, ?, ?, ?)
               ON CONFLICT(name) DO UPDATE SET
                 run_index = excluded.run_index, config_hash = excluded.config_hash, status = 'blocked',
                 slot = NULL, pid = NULL, token = NULL, work_dir = excluded.work_dir, started_at = NULL,
                 ended_at = excluded.ended_at, exit_code = NULL, signal = NULL, cause = excluded.cause,
                 log_tail = NULL, result = NULL, result_file = NULL, gpu_memory_peak = NULL,
                 gpu_leftover = NULL, params = excluded.params, stage = excluded.stage""",
            (name, run_index, config_hash, work_dir, self._clock(), cause[:MAX_TEXT], params, stage),
        )

    def keep(self, name: str, *, params: str, config_hash: str, program: str | None = None) -> None:
        """A succeeded run's result taken as that of another config (``on_config_change: keep``)."""
        self._write(
            "UPDATE runs SET params = ?, config_hash = ?, program = COALESCE(?, program) WHERE name = ?",
            (params, config_hash, program, name),
        )

    def set_pid(self, name: str, pid: int) -> None:
        """The running attempt's process (the leader of its process group)."""
        self._write("UPDATE runs SET pid = ? WHERE name = ?", (pid, name))

    def set_node(self, name: str, node: str, pid: int) -> None:
        """The machine the running attempt runs on, and its process there."""
        self._write("UPDATE runs SET node = ?, pid = ? WHERE name = ?", (node, pid, name))

    def finish(
        self,
        name: str,
        status: RunStatus,
        *,
        exit_code: int | None = None,
        signal: str | None = None,
        cause: str | None = None,
        log_tail: str | None = None,
        result: str | None = None,
        ended_at: float | None = None,
        gpu_memory_peak: int | None = None,
        pid: int | None = None,
        result_file: str | None = None,
        gpu_leftover: str | None = None,
        metrics: str | None = None,
    ) -> None:
        if result is not None and len(result) > MAX_INLINE_RESULT:  # never let one run's result wedge the root
            cause = (cause or "") + f"result of {len(result):,} bytes not kept in the ledger"
            result = None
        # The attempt that ends (one recorded running): its time on its slot is added up, and its
        # span kept (the latest MAX_SPANS), so that a run's duration and timeline cover its attempts.
        # One statement: SQLite reads every column of the row as it was before the UPDATE.
        ends = "status = 'running' AND typeof(started_at) IN ('integer', 'real')"
        spans = f"""CASE WHEN json_valid(spans) AND json_type(spans) = 'array'
                       AND json_array_length(spans) < {MAX_SPANS} THEN spans
                   WHEN json_valid(spans) AND json_type(spans) = 'array' THEN json_remove(spans, '$[0]')
                   ELSE '[]' END"""
        attempt = (
            f""", slot_seconds = CASE WHEN {ends}
                 THEN COALESCE({self._number("slot_seconds")}, 0) + max(0, :end - started_at) ELSE slot_seconds END,
               spans = CASE WHEN {ends}
                 THEN json_insert({spans}, '$[#]', json_array(COALESCE(slot, '?'), started_at, :end)) ELSE spans END"""
            if "spans" in self._columns()
            else ""
        )
        self._write(
            f"""UPDATE runs SET status = :status, ended_at = :end, exit_code = :exit_code, signal = :signal,
               cause = :cause, log_tail = :log_tail, result = :result, gpu_memory_peak = :peak,
               pid = COALESCE(:pid, pid), result_file = :result_file, gpu_leftover = :leftover,
               metrics = COALESCE(:metrics, metrics){attempt}
               WHERE name = :name""",
            {
                "status": status.value,
                "end": self._clock() if ended_at is None else ended_at,
                "exit_code": exit_code,
                "signal": signal,
                "cause": None if cause is None else cause[:MAX_TEXT],
                "log_tail": None if log_tail is None else log_tail[-MAX_TEXT:],
                "result": result,
                "peak": gpu_memory_peak,
                "pid": pid,
                "result_file": result_file,
                "leftover": None if gpu_leftover is None else gpu_leftover[:MAX_TEXT],
                "metrics": None if metrics is None else metrics[:MAX_TEXT],
                "name": name,
            },
        )

    def adopt(
        self,
        *,
        name: str,
        run_index: int,
        config_hash: str,
        work_dir: str,
        result: str | None,
        ended_at: float | None,
        params: str | None = None,
        result_file: str | None = None,
        stage: str | None = None,
    ) -> None:
        """Record a success found in a run folder but missing from the ledger (what ran it is not known)."""
        if result is not None and len(result) > MAX_INLINE_RESULT:
            result = None
        self._write(
            """INSERT OR REPLACE INTO runs (name, run_index, config_hash, status, attempts, work_dir,
               ended_at, cause, result, params, result_file, stage)
               VALUES (?, ?, ?, 'succeeded', 1, ?, ?, ?, ?, ?, ?, ?)""",
            (
                name,
                run_index,
                config_hash,
                work_dir,
                ended_at,
                "recovered from the run folder's outcome file",
                result,
                params,
                result_file,
                stage,
            ),
        )

    @classmethod
    def read_only(cls, paths: RootPaths) -> Ledger | None:
        """The ledger of an existing result root, opened without writing anything (None if there is none)."""
        problem = root_records_problem(paths)
        if problem is not None:
            raise LedgerError(f"cannot read the ledger: {problem}")
        try:
            size = os.lstat(paths.ledger).st_size
        except FileNotFoundError:
            return None
        except OSError as error:
            raise LedgerError(f"cannot read the ledger {paths.ledger!r}: {error.strerror}") from None
        if size == 0 and not os.path.exists(paths.ledger + "-wal"):
            raise LedgerError(
                f"the ledger {paths.ledger!r} is empty (0 bytes): the scheduler that created it stopped "
                "before it recorded anything. Start the sweep again (it starts from scratch)"
            )
        ledger = cls.__new__(cls)
        ledger.path = paths.ledger
        ledger._clock = time.time
        try:
            # With no scheduler writing (no -wal file), open it immutable: SQLite then creates no
            # -shm file either, so reading leaves the result root exactly as it was.
            quiet = "&immutable=1" if not os.path.exists(paths.ledger + "-wal") else ""
            # A file: URI of the path, every character that means something in a URI escaped
            # (urllib.parse, imported here: a scheduler's start does not need its 2 ms).
            import urllib.parse

            uri = "file:" + urllib.parse.quote(os.path.abspath(paths.ledger)) + "?mode=ro" + quiet
            ledger._db = sqlite3.connect(uri, uri=True, timeout=30)
            ledger._db.row_factory = sqlite3.Row
            ledger._query("SELECT 1 FROM runs LIMIT 1")
            _check_version(paths.ledger, ledger._version())
            ledger._check_columns()
        except (sqlite3.DatabaseError, LedgerError) as error:
            if getattr(ledger, "_db", None) is not None:
                ledger._db.close()
            if isinstance(error, LedgerError):
                raise
            raise _ledger_error(paths.ledger, error) from error
        return ledger

    def unsettled(self) -> list[RunRecord]:
        """The runs an earlier start left ``running``, and those it recorded ``interrupted`` with an
        attempt's token (that attempt may have gone on to its end after it: records/prior.py)."""
        rows = self._query(
            "SELECT * FROM runs WHERE status = 'running' OR (status = 'interrupted' AND token IS NOT NULL)"
        )
        return [self._record(row) for row in rows]


class SweepLock:
    """An exclusive lock on a result root, released by the kernel when the last holder dies.

    The lock is an ``flock`` on the result root *folder* itself, not on a file
    under ``.gts/``: deleting ``.gts`` (or the lock file) mid-sweep cannot free
    it. Every run's process inherits the locked descriptor (:attr:`fd`), so
    the root stays locked while any process of a run lives, also one whose
    scheduler was killed and that outlived its lifeline (stopped, stuck in a
    system call, exec'd). ``.gts/lock`` names the holder, for messages only.

    A scheduler that finds the root locked by such leftovers of a dead
    scheduler (same host, holder pid gone) stops them, if they carry a run
    token (they are runs of this root), and takes the lock; anything else
    holding it is named in a :class:`SchedulerBusyError`.
    """

    def __init__(self, paths: RootPaths, *, leftover_timeout: float = 10.0) -> None:
        self._paths = paths
        self._leftover_timeout = leftover_timeout
        self.fd: int | None = None
        self._meta_fd: int | None = None

    def acquire(self) -> None:
        problem = root_records_problem(self._paths)
        if problem is not None:
            raise LedgerError(problem)
        os.makedirs(self._paths.meta, exist_ok=True)
        fd = os.open(self._paths.root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
        try:
            if not self._try_lock(fd):
                self._take_over_from_leftovers(fd)
            self._meta_fd = self._lock_meta()
            self._write_holder()
        except BaseException:
            os.close(fd)
            if self._meta_fd is not None:
                os.close(self._meta_fd)
                self._meta_fd = None
            raise
        self.fd = fd

    def _lock_meta(self) -> int:
        """Lock ``.gts`` itself too, by the folder we open (no link followed): two roots can only
        share one ledger folder through a mount, and then the second scheduler stops here."""
        flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self._paths.meta, flags)
        except OSError as error:
            raise LedgerError(f"cannot open {self._paths.meta!r} ({error.strerror}); refusing to use it") from None
        if not self._try_lock(fd):
            os.close(fd)
            raise SchedulerBusyError(
                f"the records folder {self._paths.meta!r} is in use by another scheduler (the same folder is "
                "reachable from another result root, e.g. through a mount): two sweeps never share one ledger"
            )
        return fd

    @staticmethod
    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def holder(self) -> str:
        """Who holds the lock, as its holder wrote it (for messages only)."""
        try:
            with os.fdopen(open_regular(self._paths.lock), "rb") as handle:
                return handle.read(4096).decode("utf-8", "replace").strip() or "unknown"
        except OSError:
            return "unknown"

    def _take_over_from_leftovers(self, fd: int) -> None:
        from ..proctree import TOKEN_ENV, environ_has, holders, kill_all, wait_gone

        holder = self.holder()
        busy = SchedulerBusyError(
            f"another scheduler is already running on {self._paths.root!r} ({holder}); "
            "wait for it to finish or stop it first"
        )
        pid, host = _parse_holder(holder)
        if pid is None or host != os.uname().nodename or _pid_alive(pid):
            raise busy
        # The runs of a killed scheduler end by themselves within moments (their lifeline), each
        # first finishing the record of a main() that returned. So: wait for that; then ask those
        # still there to stop as the scheduler would (SIGCONT for a stopped one, then SIGTERM, which
        # a run that is recording holds until its record is written); SIGKILL only what is left after
        # that, so that no run whose main() returned is cut off before its record. flock has no timed
        # wait, hence the polling.
        if self._wait_for_lock(fd, NATURAL_END):
            return
        others: list[int] = []
        for signals, wait in (((signal.SIGCONT, signal.SIGTERM), self._leftover_timeout), ((signal.SIGKILL,), 5.0)):
            processes = holders(self._paths.root)
            ours = [p for p in processes if environ_has(p, TOKEN_ENV)]
            others = [p for p in processes if p not in ours]
            if ours:
                logger.warning(
                    "the scheduler that held %s (%s) is gone, but %d process(es) of its runs are still "
                    "alive: sending %s to pid %s",
                    self._paths.root,
                    holder,
                    len(ours),
                    " and ".join(signal.Signals(s).name for s in signals),
                    ", ".join(map(str, ours)),
                )
                for signum in signals:
                    kill_all(ours, signum)
                wait_gone(ours, timeout=wait)
            if self._wait_for_lock(fd, 1.0 if others else wait):
                return
        if not self._try_lock(fd):
            still = [p for p in holders(self._paths.root) if p != os.getpid()] or others
            raise SchedulerBusyError(
                f"{self._paths.root!r} is still locked although its scheduler ({holder}) is gone: held by "
                f"pid {', '.join(map(str, still)) or 'unknown'}; stop those processes and start again"
            ) from None

    def _wait_for_lock(self, fd: int, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        delay = 0.005
        while not self._try_lock(fd):
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        return True

    def _write_holder(self) -> None:
        # The host as socket.gethostname() names it (gethostname(2) is uname's nodename), without
        # importing socket (2 ms of every start).
        text = f"pid {os.getpid()} on host {os.uname().nodename}\n".encode()
        try:
            lock_fd = open_regular(self._paths.lock, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except OSError:
            return  # informational only
        try:
            os.write(lock_fd, text)
        finally:
            os.close(lock_fd)

    def release(self) -> None:
        if self.fd is not None:
            try:
                fd = open_regular(self._paths.lock, os.O_WRONLY | os.O_TRUNC)
                os.close(fd)
            except OSError:
                pass
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
        if self._meta_fd is not None:
            os.close(self._meta_fd)
            self._meta_fd = None

    def __enter__(self) -> SweepLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def scheduler_state(root: str) -> tuple[bool | None, str]:
    """``(running, holder)``: whether a live scheduler holds the result root, read
    without touching the lock (``/proc/locks`` lists every ``flock`` with the pid
    that took it), and who it is. ``running`` is None when this cannot be known
    here (no ``/proc/locks``, or a holder on another host)."""
    running, _, holder = scheduler_process(root)
    return running, holder


def scheduler_process(root: str) -> tuple[bool | None, int | None, str]:
    """``scheduler_state`` with the holder's pid (None when it cannot be told)."""
    holder = SweepLock(RootPaths(root)).holder()
    try:
        info = os.stat(root)
        with open("/proc/locks") as handle:
            table = handle.read().splitlines()
    except OSError:
        pid, host = _parse_holder(holder)
        if pid is None or host != os.uname().nodename:
            return None, None, holder
        return _pid_alive(pid), pid, holder
    wanted = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in table:
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == wanted and fields[4].isdigit():
            pid = int(fields[4])  # held; by a live scheduler, or only by its leftovers
            return _pid_alive(pid), pid, holder
    return False, None, holder


def _parse_holder(text: str) -> tuple[int | None, str | None]:
    """``pid 12 on host h`` -> ``(12, 'h')``."""
    parts = text.split()
    if len(parts) == 5 and parts[0] == "pid" and parts[2:4] == ["on", "host"] and parts[1].isdigit():
        return int(parts[1]), parts[4]
    return None, None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
