"""The ledger's store: the SQLite connection, its schema and migrations (records/ledger/schema.py),
transactions (``commit``, ``batch``) and the rows read as records. Every concern of the ledger
(records/ledger/__init__.py) writes and reads through it, in the same transactions.

Durability: see records/ledger/__init__.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from ...errors import LedgerError
from ...version import __version__
from ..paths import RootPaths, ledger_path_problem, root_records_problem
from ..status import RunStatus
from .record import _FIELDS, _STATUSES, KnownRun, RunRecord, _field_problem
from .schema import (
    _ADDED_COLUMNS,
    _MIGRATIONS,
    _OPTIONAL_COLUMNS,
    _SCHEMA,
    SCHEMA_VERSION,
    _check_version,
    _ledger_error,
)

logger = logging.getLogger("gpu_task_scheduler")

_S = TypeVar("_S", bound="Store")

NOTES_META, MAX_NOTES = "notes", 200  # the meta key of the runs' notes (Store.note), and how many are kept


class Store:
    """One connection to a result root's ledger (``.gts/ledger.db``), opened for writing (the
    scheduler) or read as it is (:meth:`read_only`)."""

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

    def __enter__(self: _S) -> _S:
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

    def _tuples(self, sql: str, params: tuple | dict[str, Any]) -> list[tuple[Any, ...]]:
        """``_query`` without a Row per row (a Row costs more than the query, per row)."""
        try:
            cursor = self._db.cursor()
            cursor.row_factory = None
            return cursor.execute(sql, params).fetchall()
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

    def _column(self, name: str) -> str:
        """A column of a later schema, or NULL in a ledger read as an older version left it."""
        return name if name in self._columns() else "NULL"

    def _number(self, name: str) -> str:
        """A column's number, or NULL (an older ledger, or a value changed by hand into another type)."""
        column = self._column(name)
        return f"CASE WHEN typeof({column}) IN ('integer', 'real') THEN {column} END"

    def _columns(self) -> set[str]:
        return self._column_names

    @classmethod
    def read_only(cls: type[_S], paths: RootPaths) -> _S | None:
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
            # check_same_thread=False: a reader's owner may be closed by another thread (a
            # ConfigManager.iter_runs() generator left unfinished is closed by whichever thread
            # collects it: seen under load, an error "ignored" in a generator's finally). It only
            # reads, and one owner uses it at a time.
            ledger._db = sqlite3.connect(uri, uri=True, timeout=30, check_same_thread=False)
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
