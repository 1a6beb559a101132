"""The layout of a result root and of a run folder, owned in one place.

::

    <result_root>/
        .gts/ledger.sqlite3      the record of every run (see ledger.py)
        .gts/lock                held by the running scheduler
        <run folder>/
            worker.log           the run's stdout and stderr (``log_file``)
            ...                  whatever the task writes
            .gts/config.json     the run's resolved config
            .gts/task.pkl        the task object handed to the child process
            .gts/spec.json       what the child needs to start
            .gts/outcome.json    written by the child when main() ends
            .gts/logs/           logs of earlier attempts
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Optional

META = ".gts"


def atomic_write(path: str, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the new one, never half.

    ``durable`` also survives a power loss (fsync of the file and its folder);
    informational files skip that cost.
    """
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if not durable:
        return
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_json(path: str, value: Any, *, durable: bool = True) -> None:
    atomic_write(path, json.dumps(value, indent=1, sort_keys=True).encode("utf-8"), durable=durable)


def read_json(path: str) -> Optional[Any]:
    """The JSON in ``path``, or None if it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class RootPaths:
    root: str

    @property
    def meta(self) -> str:
        return os.path.join(self.root, META)

    @property
    def ledger(self) -> str:
        return os.path.join(self.meta, "ledger.sqlite3")

    @property
    def lock(self) -> str:
        return os.path.join(self.meta, "lock")


@dataclass(frozen=True)
class RunPaths:
    work_dir: str
    log_name: Optional[str]  # None: the run's output is discarded, as in the original

    @property
    def meta(self) -> str:
        return os.path.join(self.work_dir, META)

    @property
    def log(self) -> Optional[str]:
        return os.path.join(self.work_dir, self.log_name) if self.log_name else None

    @property
    def config(self) -> str:
        return os.path.join(self.meta, "config.json")

    @property
    def task(self) -> str:
        return os.path.join(self.meta, "task.pkl")

    @property
    def spec(self) -> str:
        return os.path.join(self.meta, "spec.json")

    @property
    def outcome(self) -> str:
        return os.path.join(self.meta, "outcome.json")

    def old_log(self, attempt: int) -> str:
        return os.path.join(self.meta, "logs", f"attempt-{attempt}-{self.log_name}")

    def tail(self, lines: int = 20, max_bytes: int = 16384) -> str:
        """The last ``lines`` lines of the run's log (reads at most ``max_bytes``)."""
        if self.log is None:
            return ""
        try:
            with open(self.log, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - max_bytes))
                data = handle.read()
        except OSError:
            return ""
        text = data.decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])
