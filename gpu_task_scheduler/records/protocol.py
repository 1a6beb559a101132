"""The two files between the scheduler and a run's process, each one typed record.

* :class:`RunStart` (``.gts/spec.json``): what the run's process is to run,
  written by the scheduler before it starts the process.
* :class:`Outcome` (``.gts/outcome.json``): how ``main()`` ended, written
  atomically by the run's process *before* it exits. It carries the
  attempt's token, so an outcome left by an earlier attempt (or forged by a
  run into another folder) is never taken for this one's.

Both are read defensively: a file that is missing, too large, not JSON or not
of the expected shape reads as None; nothing in it is trusted beyond its
fields' types.
"""

from __future__ import annotations

import json
from typing import Any

from ..recordclass import Record
from .paths import atomic_write_json, read_json

RESULT_FILE = "result.json"  # the only name a large result is written to, next to the outcome


class RunStart(Record):
    token: str
    config_hash: str
    task_file: str
    outcome_file: str
    main_file: str | None
    sys_path: list[str]
    run_env: dict[str, str]  # the run's identity (GTS_RUN_NAME, ...), set before its task is loaded

    def write(self, path: str) -> None:
        atomic_write_json(path, self._asdict())

    @classmethod
    def read(cls, path: str) -> RunStart:
        """Raises ValueError for a file that is not a start record (only the scheduler writes it)."""
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        if not isinstance(data, dict) or set(data) != set(cls._fields):
            raise ValueError(f"{path} is not a run's start record")
        return cls(**data)


class Outcome(Record):
    status: str  # "succeeded" or "failed"
    token: str | None = None
    config_hash: str | None = None
    finished_at: float | None = None
    pid: int | None = None
    result: Any = None  # what main() returned, as JSON (None when it is in result_file)
    result_file: str | None = None  # RESULT_FILE when the result was over MAX_INLINE_RESULT
    result_bytes: int | None = None
    result_note: str | None = None  # e.g. "converted from ndarray"
    phase: str | None = None  # for a failure: "load" (import, unpickle) or "main"
    error: str | None = None  # for a failure: the exception, in one line
    pruned: str | None = None  # report() raised Pruned (early_stop), with this cause
    paused: str | None = None  # report() raised Paused (a pausing early_stop method), with this cause
    # Why the run could not hear whether it was asked to stop (a warm-forked script that closed its
    # lifeline): a success it records then stands only if the scheduler did not stop it.
    unheard: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @property
    def large_result_file(self) -> str | None:
        """The name of the file holding a large result, if any (nothing else is ever read)."""
        return RESULT_FILE if self.result_file == RESULT_FILE else None

    @property
    def failure(self) -> str | None:
        """The failure's cause in words, or None."""
        if self.succeeded or self.error is None:
            return None
        if self.phase == "load":
            return f"the task could not be loaded in the run's process: {self.error}"
        return self.error

    def write(self, path: str) -> None:
        atomic_write_json(path, {key: value for key, value in self._asdict().items() if value is not None})

    @classmethod
    def read(cls, path: str, *, token: str | None = None) -> Outcome | None:
        """The outcome in ``path``; None if there is none of the right shape (or, given a token, of another attempt)."""
        data = read_json(path)
        if not isinstance(data, dict) or data.get("status") not in ("succeeded", "failed"):
            return None
        known = set(cls._fields)
        outcome = cls(**{key: value for key, value in data.items() if key in known})
        for name, kinds in _TYPES.items():
            value = getattr(outcome, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
                return None
        if token is not None and outcome.token != token:
            return None
        return outcome


_TYPES: dict[str, tuple[type, ...]] = {
    "token": (str,),
    "config_hash": (str,),
    "finished_at": (int, float),
    "pid": (int,),
    "result_file": (str,),
    "result_bytes": (int,),
    "result_note": (str,),
    "phase": (str,),
    "error": (str,),
    "pruned": (str,),
    "paused": (str,),
    "unheard": (str,),
}
