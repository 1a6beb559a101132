"""What made a run: the code (the git commit of the working directory's repository, whether it had
uncommitted changes, and a hash of them), the environment (Python's version, a hash of the
installed packages, the host) and its seed, recorded with each attempt in the ledger
(``runs.provenance``, JSON), so that a result in a paper can name exactly what produced it.

Read once per scheduler (:func:`collected`): two ``git`` calls and a listing of the folders on
``sys.path``, some 30 ms, paid just after the first run started (it is not
delayed; the runs started before are recorded then), never by a sweep that starts nothing. Where
git or a repository is missing, ``git`` is None: nothing fails for it.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from typing import Any

from ..digest import sha256

GIT_SECONDS = 10.0  # a repository on a slow file system; past this, the code is not named


def git_state(folder: str) -> dict[str, Any] | None:
    """``{"commit", "dirty", "diff_sha256"}`` of the repository ``folder`` is in, or None (none, or
    no git). Dirty: a tracked file differs from the commit (``git diff HEAD``). Untracked files do
    not count: a sweep's own results are often untracked files in the repository, and would make
    every run after the first one's dirty, each with another hash."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}  # read only: takes no index lock

    def git(*argv: str) -> bytes | None:
        try:
            done = subprocess.run(
                ["git", *argv], cwd=folder, capture_output=True, env=env, timeout=GIT_SECONDS, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    head = git("rev-parse", "--verify", "HEAD")
    if head is None:
        return None
    diff = git("diff", "HEAD", "--binary") or b""
    digest = sha256(diff).hexdigest() if diff else None
    return {"commit": head.decode("ascii", "replace").strip(), "dirty": bool(diff), "diff_sha256": digest}


def packages_digest() -> str:
    """A hash of the installed distributions' names and versions: of the names of the
    ``NAME-VERSION.dist-info`` (and ``.egg-info``) folders on ``sys.path``, sorted. Equal where
    the same packages are installed; 1 ms, where reading each distribution's metadata took 185."""
    names: set[str] = set()
    for folder in sys.path:
        try:
            entries = os.listdir(folder or ".")
        except OSError:  # not a folder (a zip), or gone
            continue
        names.update(entry.lower() for entry in entries if entry.endswith((".dist-info", ".egg-info")))
    return sha256("\n".join(sorted(names)).encode()).hexdigest()


@functools.lru_cache(maxsize=4)
def collected(folder: str) -> dict[str, Any]:
    """The code and environment this scheduler runs its runs with (the working directory ``folder``;
    read once a process)."""
    return {
        "git": git_state(folder),
        "python": "{}.{}.{}".format(*sys.version_info[:3]),
        "packages_sha256": packages_digest(),
        "host": os.uname().nodename,
    }


def of_run(config: dict[str, Any], made_with: dict[str, Any]) -> str:
    """A run's provenance as the ledger keeps it (JSON): ``made_with`` (:func:`collected`), and its
    ``seed`` where its config has one."""
    record = dict(made_with)
    seed = config.get("seed")
    if isinstance(seed, (int, float, str)) and not isinstance(seed, bool):
        record["seed"] = seed
    return json.dumps(record, sort_keys=True)


def code_changed(recorded: dict[str, Any] | None, now: dict[str, Any]) -> str | None:
    """How the code differs from what a run was recorded with (None: the same, or not known)."""
    before, after = (recorded or {}).get("git"), now.get("git")
    if not isinstance(before, dict) or not isinstance(after, dict):
        return None
    if before.get("commit") != after.get("commit"):
        return f"commit {str(before.get('commit'))[:12]} then, {str(after.get('commit'))[:12]} now"
    if before.get("diff_sha256") != after.get("diff_sha256"):
        return f"the uncommitted changes to commit {str(after.get('commit'))[:12]} differ"
    return None


def short(recorded: dict[str, Any] | None) -> str | None:
    """``3f2a9c1d4e5b`` or ``3f2a9c1d4e5b+dirty``: the commit a run was made with, for a table."""
    code = (recorded or {}).get("git")
    if not isinstance(code, dict) or not isinstance(code.get("commit"), str):
        return None
    return code["commit"][:12] + ("+dirty" if code.get("dirty") else "")
