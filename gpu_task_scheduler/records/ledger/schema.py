"""The ledger's tables, their versions and the migrations between them, and the words of its errors.

A ledger written by an earlier version is migrated when it is opened for writing (records/ledger/store.py);
one read as it is (``Ledger.read_only``) may lack the columns of :data:`OPTIONAL_COLUMNS`, which every
query reads through ``Store._column``.
"""

from __future__ import annotations

import sqlite3

from ...errors import LedgerError
from ...version import __version__

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


def _check_version(path: str, version: int | None) -> None:
    if version is not None and version > SCHEMA_VERSION:
        raise LedgerError(
            f"the ledger {path!r} has schema version {version}, written by a newer version of "
            f"gpu_task_scheduler; this version ({__version__}) reads up to {SCHEMA_VERSION}: upgrade "
            "to use this result root"
        )
    if version is not None and version < 1:
        raise LedgerError(f"the ledger {path!r} has the schema version {version}; move it aside and start again")
