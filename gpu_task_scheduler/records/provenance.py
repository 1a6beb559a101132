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
import hashlib
import json
import os
import selectors
import subprocess
import sys
import time
from typing import Any

from ..digest import sha256

GIT_SECONDS = 10.0  # a repository on a slow file system; past this, the code is not named


def git_state(folder: str) -> dict[str, Any] | None:
    """``{"commit", "dirty", "diff_sha256"}`` of the repository ``folder`` is in, or None (none, or
    no git). Dirty: a tracked file differs from the commit (``git diff HEAD``). Untracked files do
    not count: a sweep's own results are often untracked files in the repository, and would make
    every run after the first one's dirty, each with another hash. Where the diff could not be
    read whole (git failed, or ran past :data:`GIT_SECONDS`), ``dirty`` and ``diff_sha256`` are
    None: not known, never "clean"."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}  # read only: takes no index lock
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--verify", "HEAD"],
            cwd=folder,
            capture_output=True,
            env=env,
            timeout=GIT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    # The user's external diff tools and textconv drivers are never run, and the diff is hashed as
    # it comes (a change of 300 MB once took 1.26 GB and 13.7 s held whole).
    digest = _diff_digest(["git", "diff", "HEAD", "--binary", "--no-ext-diff", "--no-textconv"], folder, env)
    commit = head.stdout.decode("ascii", "replace").strip()
    if digest is None:
        return {"commit": commit, "dirty": None, "diff_sha256": None}
    return {"commit": commit, "dirty": digest[1] > 0, "diff_sha256": digest[0] if digest[1] else None}


def _diff_digest(argv: list[str], folder: str, env: dict[str, str]) -> tuple[str, int] | None:
    """The sha256 of what ``argv`` prints and how many bytes, read in chunks; None if it failed or
    ran past :data:`GIT_SECONDS` (it is then killed)."""
    deadline = time.monotonic() + GIT_SECONDS
    try:
        process = subprocess.Popen(
            argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )
    except OSError:
        return None
    assert process.stdout is not None
    hasher, size = hashlib.sha256(), 0
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return None  # past its time: not known
                chunk = os.read(process.stdout.fileno(), 1 << 20)
                if not chunk:
                    break
                hasher.update(chunk)
                size += len(chunk)
        code = process.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
    return (hasher.hexdigest(), size) if code == 0 else None


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
    """``3f2a9c1d4e5b``, ``3f2a9c1d4e5b+dirty``, or ``3f2a9c1d4e5b+dirty?`` (whether it had
    uncommitted changes is not known): the commit a run was made with, for a table."""
    code = (recorded or {}).get("git")
    if not isinstance(code, dict) or not isinstance(code.get("commit"), str):
        return None
    dirty = code.get("dirty")
    return code["commit"][:12] + ("+dirty" if dirty else "+dirty?" if dirty is None and "dirty" in code else "")
