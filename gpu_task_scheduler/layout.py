"""Names in a result root, as pure facts (no I/O): a leaf every layer may import.

The config layer checks a user's ``log_file`` and keeps run names short enough with these;
``records/paths.py`` builds the root's layout on them and adds what needs the file system
(where the root is opened: a real folder, a path SQLite can open).
"""

from __future__ import annotations

import os

META = ".gts"  # the folder, in the root and in each run folder, that holds the scheduler's records
# Linux and macOS limit one path component to 255 bytes.
MAX_NAME_BYTES = 255
# What a run that returns nothing (a command) may leave in its folder as its result.
RESULT_FILE = "result.json"


def log_name_problem(value: object) -> str | None:
    """What is wrong with ``log_file`` (a run's log, relative to its folder), or None.

    >>> log_name_problem("logs/out.txt") is None
    True
    >>> log_name_problem(".gts/x.log")
    "a file name outside .gts/, which holds the scheduler's own records"
    """
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or not value
        or os.path.isabs(value)
        or ".." in value.split("/")
        or "\0" in value
        or value.endswith("/")
        or os.path.normpath(value) == "."
    ):
        return "a file name relative to the run folder (without '..') or null"
    if os.path.normpath(value).split("/")[0] == META:
        return f"a file name outside {META}/, which holds the scheduler's own records"
    return None
