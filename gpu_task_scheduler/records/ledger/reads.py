"""The ledger's read side: what ``gts status``, ``gts results``, importance and the web page ask of
the runs, answered by SQLite in one scan each (a root of 300,000 runs in a second, in bounded
memory), and the values changed by hand that those answers leave out."""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from ..status import QUEUED, RunStatus
from .record import _INTEGERS, _NUMBER, _REALS, _STATUSES, _TIMES, RunRecord
from .schema import _ledger_error
from .store import Store

STALE_CAUSE = (
    "recorded as running, but no scheduler holds the result root (it was stopped or killed): "
    "nothing runs it; the next start runs it again"
)


class GroupedNumbers(NamedTuple):
    """See :meth:`Ledger.grouped_numbers`."""

    found: bool  # some run has the parameter averaged over
    groups: list[tuple[Any, ...]]  # (stage, parameters less it as JSON, runs, first run_index)
    numbers: list[tuple[Any, ...]]  # (stage, parameters less it as JSON, result key or None, number)
    others: list[str]  # succeeded runs, counted in groups, whose results must be read one by one
    unparsed: list[str]  # succeeded runs with no parameters as valid JSON: not in groups, read one by one


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


class Reads(Store):
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
        followed: bool = True,
        where: str = "",
        limit: int | None = None,
        last: bool = False,
    ) -> Iterator[str]:
        """Each run's entry in ``gts status --json`` (see reports/status.py), as JSON text that
        SQLite writes, in the sweep's order: a root of 300,000 runs in a second, in bounded memory.
        ``stale``: no scheduler holds the root (runs recorded as running are stale). ``followed``: a
        scheduler follows the runs (it hears when a cluster places one: one still waiting shows as
        queued); a detached sweep's are shown running, as nothing here can tell. A value of the
        wrong type (changed by hand) is shown as null; :meth:`problems` names it."""
        order = "run_index DESC, name DESC" if last else "run_index, name"
        node = self._column("node")
        sql = f"""SELECT json_object(
            'name', name, 'stage', {self._column("stage")},
            'status', CASE WHEN status = 'running' AND :stale THEN 'stale'
                WHEN status = 'running' AND {node} = '' AND :followed THEN '{QUEUED}' ELSE status END,
            'node', NULLIF({self._column("node")}, ''), 'slot', slot,
            'queued_for', CASE WHEN status = 'running' AND {node} = '' AND :followed AND NOT :stale
                AND typeof(started_at) IN ('integer', 'real') THEN :now - started_at END,
            'started', CASE WHEN typeof(started_at) IN ('integer', 'real')
                THEN datetime(CAST(started_at AS INTEGER), 'unixepoch', 'localtime') END,
            'duration', CASE WHEN typeof(started_at) NOT IN ('integer', 'real') OR (status = 'running' AND :stale)
                OR (status = 'running' AND {node} = '' AND :followed) THEN NULL
                WHEN {self._number("slot_seconds")} IS NOT NULL THEN {self._number("slot_seconds")}
                    + CASE WHEN status = 'running' THEN :now - started_at ELSE 0 END
                WHEN typeof(ended_at) IN ('integer', 'real') THEN ended_at - started_at
                WHEN status = 'running' THEN :now - started_at END,
            'last_duration', CASE WHEN typeof(started_at) NOT IN ('integer', 'real') OR (status = 'running' AND :stale)
                OR (status = 'running' AND {node} = '' AND :followed) THEN NULL
                WHEN status = 'running' THEN :now - started_at
                WHEN typeof(ended_at) IN ('integer', 'real') THEN ended_at - started_at END,
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
        values = {
            "stale": stale,
            "followed": followed,
            "now": now,
            "root": root,
            "log": log_file,
            "stale_cause": STALE_CAUSE,
        }
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
                if '"' in key:  # no JSON path can name it (a "bad JSON path" error): json_each, as _value_sql
                    text_value = "(SELECT value FROM json_each(params) WHERE key = :pkey AND type = 'text')"
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

    def tally(self) -> tuple[list[tuple[str | None, str, int]], float | None]:
        """(stage, status, how many runs), counted by SQLite in one scan, in the order stages first
        appear; and how long the runs that succeeded took on average (None before any did). A run
        recorded running that waits for a cluster's machine counts as ``queued``."""
        timed = f"status = 'succeeded' AND {_NUMBER.format('started_at')} AND {_NUMBER.format('ended_at')}"
        rows = self._tuples(
            f"SELECT {self._column('stage')}, CASE WHEN status = 'running' AND {self._column('node')} = '' "
            f"THEN '{QUEUED}' "
            "ELSE status END, COUNT(*), MIN(run_index), "
            f"SUM(CASE WHEN {timed} THEN ended_at - started_at END), SUM(CASE WHEN {timed} THEN 1 ELSE 0 END) "
            f"FROM runs GROUP BY 1, 2 ORDER BY 4",
            (),
        )
        for row in rows:
            if row[1] not in _STATUSES and row[1] != QUEUED:  # a newer version's status: the error that says so
                (name,) = self._tuples("SELECT name FROM runs WHERE status = ? LIMIT 1", (row[1],))[0]
                self._status(name, row[1])
        seconds = sum(row[4] or 0.0 for row in rows)
        timed_runs = sum(row[5] or 0 for row in rows)
        return [(row[0], row[1], row[2]) for row in rows], (seconds / timed_runs if timed_runs else None)

    def left_nothing(self) -> int:
        """How many runs succeeded with no result (none returned, no result.json) and no metric
        recorded: what such a run wrote elsewhere goes unnoticed (engine/summary.py says so too)."""
        ((count,),) = self._tuples(
            f"""SELECT COUNT(*) FROM runs WHERE status = 'succeeded' AND result IS NULL
                AND {self._column("result_file")} IS NULL AND {self._column("metrics")} IS NULL""",
            (),
        )
        return int(count)

    def counts(self) -> dict[RunStatus, int]:
        rows = self._query("SELECT status, COUNT(*) FROM runs GROUP BY status")
        return {RunStatus(status): count for status, count in rows}
