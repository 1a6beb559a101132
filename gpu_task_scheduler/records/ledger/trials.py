"""What the trial schedulers decided, kept so that a restart decides as the sweep before it did:
the early_stop rule's verdicts (a value at each rung, stop or not) and a pausing method's events
(tuning/trials.py replays them in order), and the causes a paused or pruned run is shown with."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ...jsonable import to_jsonable
from .schema import MAX_TEXT
from .store import Store


def pruned_cause(step: Any, cause: str) -> str:
    """``pruned at step 3: loss 1.92, rung cutoff 0.87``: a pruned run's cause, as the ledger keeps it."""
    at = f"{step:g}" if isinstance(step, (int, float)) else str(step)
    return f"pruned at step {at}: {cause}" if cause else f"pruned at step {at}"


TRIAL_EVENT_KINDS = ("began", "rung", "resumed", "ended", "closed")


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


class Trials(Store):
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
