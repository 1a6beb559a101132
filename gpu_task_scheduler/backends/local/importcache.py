"""What the warm processes of earlier sweeps imported for a script, remembered on this machine: a
sweep of the same script in another result root forks its first runs from a warm process that
imports it all, not only what a read of the source finds (``sourceimports.py``: the imports in a
function, or in a library's lazy loader, are learned only from the runs' ends).

Only what is safe to import ahead is kept, and it is checked again where it is used:

* a list is kept for one script as it is (its path and mtime, or a ``-c`` code): an edit starts
  afresh;
* it is written once a warm process that imported it all is ready: it imported every name,
  did not die, and changed nothing every fork would inherit (a thread, a GPU driver, a signal
  disposition: ``WarmProcess.effects``); the packages that did change something are kept as
  *unwanted*, so that a later sweep never imports them ahead either;
* a warm process that dies as it imports removes the list it was started with;
* at use, each name must still resolve, on the run's own ``sys.path``, to an installed module (the
  standard library's or a package's, ``forkserver._installed``): never one of the user's own files,
  which a fork must import afresh (an edit counts);
* the files are the user's (``$GTS_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpu_task_scheduler``, else
  ``~/.cache/gpu_task_scheduler``; the folder made ``0700``), read as untrusted (bounded, a list of
  module names or nothing), written by a rename (a kill leaves the old list or the new one), and at
  most :data:`MOST_FILES` of them are kept (the oldest go).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Sequence

logger = logging.getLogger("gpu_task_scheduler")

CACHE_ENV = "GTS_CACHE_DIR"
FOLDER = "warm-imports"
MOST_NAMES = 2048  # module names kept for one script
MOST_BYTES = 1 << 20  # a list file larger than this is not read
MOST_FILES = 256  # lists kept on the machine


def folder() -> str:
    """Where the lists are kept."""
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "gpu_task_scheduler"
    )
    return os.path.join(base, FOLDER)


def _file(key: str) -> str:
    return os.path.join(folder(), hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32] + ".json")


def recall(key: str) -> tuple[list[str], list[str]]:
    """The modules warm processes of earlier sweeps imported for ``key`` (a script as it is), and
    the packages they found unwanted; nothing where none was kept, or the file is damaged."""
    try:
        with open(_file(key), "rb") as handle:
            data = handle.read(MOST_BYTES + 1)
        kept = json.loads(data) if len(data) <= MOST_BYTES else None
    except (OSError, ValueError, RecursionError):
        return [], []
    if not isinstance(kept, dict) or kept.get("key") != key:
        return [], []  # another script's (a hash collision), or changed by hand

    def names(field: str) -> list[str]:
        found = kept.get(field)
        found = found if isinstance(found, list) else []
        return [name for name in found[:MOST_NAMES] if isinstance(name, str) and module_name(name)]

    return names("imports"), names("unwanted")


def module_name(name: str) -> bool:
    """Whether ``name`` is a module's dotted name (``a.b_c``), not text a warm process would be
    asked to import as something else."""
    return 0 < len(name) <= 512 and all(part.isidentifier() for part in name.split("."))


def installed(names: Iterable[str], search: Sequence[str]) -> list[str]:
    """Those of ``names`` that resolve, on ``search`` (the run's ``sys.path``), to an installed module,
    found without importing anything."""
    from .forkserver import _installed
    from .sourceimports import _origin

    kept = []
    for name in names:
        where = _origin(name, search)
        if where is not None and _installed(os.path.realpath(where)):
            kept.append(name)
    return kept


def remember(keys: Iterable[str], imports: Sequence[str], unwanted: Iterable[str]) -> None:
    """Keep ``imports`` (a ready warm process's) and ``unwanted`` for each of ``keys``; a failure to
    write is said in the log, never raised (the next sweep learns them again)."""
    keys = list(keys)
    if not keys:
        return
    where = folder()
    try:
        os.makedirs(where, mode=0o700, exist_ok=True)
        for key in keys:
            text = json.dumps({"key": key, "imports": list(imports)[:MOST_NAMES], "unwanted": sorted(unwanted)})
            fd, temporary = tempfile.mkstemp(dir=where, prefix=".new-")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(text)
                os.replace(temporary, _file(key))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
        _bound(where)
    except OSError as error:
        logger.info("warm starts: what the runs import could not be kept for later sweeps (%s)", error)


def forget(keys: Iterable[str]) -> None:
    """Remove the lists of ``keys`` (a warm process started with them died as it imported)."""
    for key in keys:
        with contextlib.suppress(OSError):
            os.unlink(_file(key))


def _bound(where: str) -> None:
    """At most MOST_FILES lists: the least recently written go, and what a kill left half-written
    an hour ago (a sweep writing now may be writing the newer ones)."""
    with os.scandir(where) as entries:
        found = [(entry.stat().st_mtime, entry.path) for entry in entries if entry.is_file(follow_symlinks=False)]
    lists = sorted((item for item in found if item[1].endswith(".json")), reverse=True)
    left = [item for item in found if os.path.basename(item[1]).startswith(".new-") and item[0] < time.time() - 3600]
    for _, path in lists[MOST_FILES:] + left:
        with contextlib.suppress(OSError):
            os.unlink(path)
