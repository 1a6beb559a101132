"""A run's row through its life: recorded running before its process starts, its pid and machine,
its end (or blocked, kept, adopted from its folder), and what deciding about it reads back.
A lifecycle write that ends an attempt adds up its time on its slot and keeps its span."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

from ..paths import MAX_INLINE_RESULT
from ..status import RunStatus
from .record import KnownRun, RunRecord
from .schema import MAX_TEXT, _ledger_error
from .store import Store

MAX_SPANS = 200  # the attempts' spans a run keeps (its slot_seconds add up every one)


class Runs(Store):
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
        queued: bool = False,
    ) -> int:
        """Record a new attempt before its child starts; return the attempt number. An attempt
        recorded again under its own token (a start following what a cluster still runs) is the
        same attempt: it is not counted twice, and keeps the moment it was first handed over (where
        the TensorBoard feed starts looking, engine/feeds.py). ``queued``: it waits for a machine of a cluster
        (its ``node`` is '' until :meth:`set_node`; ``gts status`` shows it queued, not running).

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
                                 params, stage, program, provenance, node)
               VALUES (?, ?, ?, 'running', 1, ?, ?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT(name) DO UPDATE SET
                 params = excluded.params, stage = excluded.stage, program = excluded.program,
                 provenance = excluded.provenance,
                 run_index = excluded.run_index, config_hash = excluded.config_hash, status = 'running',
                 attempts = attempts + (token IS NOT excluded.token), slot = excluded.slot,
                 token = excluded.token, pid = NULL,
                 work_dir = excluded.work_dir, ended_at = NULL,
                 started_at = CASE WHEN token IS excluded.token THEN started_at ELSE excluded.started_at END,
                 exit_code = NULL, signal = NULL, cause = NULL, log_tail = NULL, result = NULL,
                 gpu_memory_peak = NULL, gpu_leftover = NULL, node = excluded.node, metrics = NULL""",
            (
                name,
                run_index,
                config_hash,
                slot,
                token,
                work_dir,
                self._clock(),
                params,
                stage,
                program,
                provenance,
                "" if queued else None,
            ),
        )
        (attempts,) = self._tuples("SELECT attempts FROM runs WHERE name = ?", (name,))[0]
        self.commit()  # the run's process starts next: its record must exist before it does
        return int(attempts)

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
        """The running attempt's process (the leader of its process group), started now: its
        duration counts from here, not from before a wait for its warm process (zygote.py)."""
        self._write("UPDATE runs SET pid = ?, started_at = ? WHERE name = ?", (pid, self._clock(), name))

    def set_node(self, name: str, node: str, pid: int, since: float = 0.0) -> None:
        """The machine the running attempt runs on, and its process there, which started ``since``
        seconds ago: an attempt that waited in a cluster's queue counts its time from then (its
        duration, its slot's seconds), not from when it was handed over."""
        self._write(
            "UPDATE runs SET started_at = CASE WHEN node = '' THEN ? ELSE started_at END, node = ?, pid = ? "
            "WHERE name = ?",
            (self._clock() - max(0.0, since), node, pid, name),
        )

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
        # An attempt that never left a cluster's queue (node '': never placed) held no slot.
        ends = f"status = 'running' AND typeof(started_at) IN ('integer', 'real') AND {self._column('node')} IS NOT ''"
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

    def unsettled(self) -> list[RunRecord]:
        """The runs an earlier start left ``running``, and those it recorded ``interrupted`` with an
        attempt's token (that attempt may have gone on to its end after it: records/prior.py)."""
        rows = self._query(
            "SELECT * FROM runs WHERE status = 'running' OR (status = 'interrupted' AND token IS NOT NULL)"
        )
        return [self._record(row) for row in rows]
