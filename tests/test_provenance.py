"""What made each run (records/provenance.py): the code's commit and whether it had uncommitted
changes, the environment and the seed, in the ledger, `gts status --json`, `gts results` and the
page's run view; `gts retry` says when the code changed since the runs it reruns."""

import json
import os
import subprocess
import sys

import pytest
from helpers import ledger_rows

from gpu_task_scheduler.records.provenance import code_changed, collected, git_state, short

CONFIG = """scheduler_config: {gpu: [cpu], result_root_folder: r}
command: [python, -c, "print(1)"]
test_config: [{seed: [1, 2]}]
"""


def gts(*argv, cwd):
    return subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", *argv], cwd=str(cwd), capture_output=True, text=True, timeout=120
    )


def git(*argv, cwd):
    subprocess.run(["git", *argv], cwd=str(cwd), check=True, capture_output=True)


@pytest.fixture
def repository(in_tmp):
    """A git repository with one commit and an uncommitted change to a tracked file."""
    git("init", "-q", cwd=in_tmp)
    git("config", "user.email", "gts@example.invalid", cwd=in_tmp)
    git("config", "user.name", "gts", cwd=in_tmp)
    (in_tmp / "train.py").write_text("lr = 0.1\n")
    (in_tmp / "sweep.yaml").write_text(CONFIG)
    git("add", ".", cwd=in_tmp)
    git("commit", "-q", "-m", "first", cwd=in_tmp)
    (in_tmp / "train.py").write_text("lr = 0.2\n")
    return in_tmp


def test_every_run_names_the_commit_and_says_it_was_dirty(repository):
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repository, capture_output=True, text=True).stdout
    run = gts("run", "sweep.yaml", "--plain", cwd=repository)
    assert run.returncode == 0, run.stderr
    rows = ledger_rows(repository / "r")
    for name, row in rows.items():
        recorded = json.loads(row["provenance"])
        assert recorded["git"]["commit"] == commit.strip() and recorded["git"]["dirty"] is True
        assert len(recorded["git"]["diff_sha256"]) == 64
        assert recorded["python"].count(".") == 2 and recorded["host"] and len(recorded["packages_sha256"]) == 64
        assert recorded["seed"] == int(name[5])  # seed-1, and seed-2,
    status = json.loads(gts("status", "r", "--json", cwd=repository).stdout)
    assert {run["name"]: run["provenance"]["git"]["commit"] for run in status["runs"]} == {
        name: commit.strip() for name in rows
    }
    table = gts("results", "r", "--format", "json", cwd=repository)
    assert {row["commit"] for row in json.loads(table.stdout)} == {commit.strip()[:12] + "+dirty"}


def test_results_made_outside_a_repository_record_no_code_and_nothing_fails(in_tmp):
    (in_tmp / "sweep.yaml").write_text(CONFIG)
    assert gts("run", "sweep.yaml", "--plain", cwd=in_tmp).returncode == 0
    for row in ledger_rows(in_tmp / "r").values():
        recorded = json.loads(row["provenance"])
        assert recorded["git"] is None and recorded["python"] and recorded["packages_sha256"]
    assert "commit" not in json.loads(gts("results", "r", "--format", "json", cwd=in_tmp).stdout)[0]


def test_retry_says_when_the_code_changed_since_a_run_it_reruns(repository):
    assert gts("run", "sweep.yaml", "--plain", cwd=repository).returncode == 0
    same = gts("retry", "r", "seed-1,", "--force", "--plain", cwd=repository)
    assert same.returncode == 0 and "code changed" not in same.stderr
    (repository / "train.py").write_text("lr = 0.3\n")  # other uncommitted changes
    changed = gts("retry", "r", "seed-1,", "--force", "--plain", cwd=repository)
    assert "the uncommitted changes to commit" in changed.stderr
    git("commit", "-q", "-am", "second", cwd=repository)
    again = gts("retry", "r", "seed-2,", "--force", "--plain", cwd=repository)
    assert "warning: the code changed since seed-2, was run: commit" in again.stderr


@pytest.mark.parametrize(
    "before, after, words",
    [
        (None, {"git": {"commit": "a"}}, None),  # not recorded: nothing to say
        ({"git": {"commit": "a", "diff_sha256": None}}, {"git": {"commit": "a", "diff_sha256": None}}, None),
        ({"git": {"commit": "a" * 40}}, {"git": {"commit": "b" * 40}}, "commit aaaaaaaaaaaa then, bbbbbbbbbbbb now"),
        ({"git": {"commit": "a", "diff_sha256": "x"}}, {"git": {"commit": "a", "diff_sha256": "y"}}, "differ"),
        ({"git": None}, {"git": {"commit": "a"}}, None),  # made outside a repository
    ],
)
def test_what_counts_as_a_change_of_code(before, after, words):
    found = code_changed(before, after)
    assert (found is None) if words is None else (words in found)


def test_untracked_files_such_as_results_do_not_make_the_code_dirty(repository):
    git("checkout", "-q", "--", "train.py", cwd=repository)
    (repository / "results").mkdir()
    (repository / "results" / "out.json").write_text("{}")
    state = git_state(str(repository))
    assert state["dirty"] is False and state["diff_sha256"] is None
    assert short({"git": state}) == state["commit"][:12] and collected.cache_info() is not None
    assert os.path.isdir(repository / ".git")


def test_a_diff_git_cannot_read_is_recorded_as_not_known_never_as_clean(repository):
    """git's diff fails (here a blob of the commit is gone from the object store): the code's state
    is not known, so ``dirty`` is None, not False, and no hash stands for it."""
    blob = subprocess.run(
        ["git", "rev-parse", "HEAD:train.py"], cwd=str(repository), capture_output=True, text=True, check=True
    ).stdout.strip()
    os.remove(repository / ".git" / "objects" / blob[:2] / blob[2:])
    state = git_state(str(repository))
    assert state is not None and len(state["commit"]) == 40
    assert state["dirty"] is None and state["diff_sha256"] is None


def test_the_users_external_diff_tools_and_textconv_drivers_are_never_run(repository):
    ran = repository / "ran"
    tool = repository / "tool.sh"
    tool.write_text(f'#!/bin/sh\necho ran >> {ran}\ncat "$@"\n')
    tool.chmod(0o755)
    git("config", "diff.external", str(tool), cwd=repository)
    git("config", "diff.conv.textconv", str(tool), cwd=repository)
    (repository / ".gitattributes").write_text("*.py diff=conv\n")
    state = git_state(str(repository))
    assert state["dirty"] is True and state["diff_sha256"]
    assert not ran.exists()


def test_a_table_says_when_uncommitted_changes_are_not_known():
    commit = "3f2a9c1d4e5b" + "0" * 28
    assert short({"git": {"commit": commit, "dirty": None}}) == "3f2a9c1d4e5b+dirty?"
    assert short({"git": {"commit": commit, "dirty": False}}) == "3f2a9c1d4e5b"
    assert short({"git": {"commit": commit}}) == "3f2a9c1d4e5b"


def test_reading_what_made_the_runs_holds_up_no_run(in_tmp, monkeypatch):
    """git's diff of a large change took 13.7 s in the loop, and a 0.1 s run was recorded as 13.8 s.
    Read in a thread of its own: here it takes until the first run has ended, and the runs go on
    meanwhile; each is still recorded with it."""
    import threading
    import time

    import gts_test_tasks as tasks
    from conftest import wait_until
    from helpers import make_config

    from gpu_task_scheduler import GPUTaskScheduler
    from gpu_task_scheduler.records import provenance

    root = in_tmp / "r"
    ended = threading.Event()
    real = provenance.collected

    def slow(folder):
        ended.wait(60)  # until a run has ended (the test's watcher says so)
        return real(folder)

    monkeypatch.setattr(provenance, "collected", slow)

    def a_run_ended():
        rows = ledger_rows(root) if (root / ".gts" / "ledger.sqlite3").exists() else {}
        return ended.is_set() or any(row["status"] == "succeeded" for row in rows.values())

    def watch():
        try:
            wait_until(a_run_ended, timeout=60, message="a run to end while git is read")
        finally:
            ended.set()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        started = time.monotonic()
        summary = GPUTaskScheduler(make_config(root, [{"a": [1, 2, 3]}]), tasks.RecordTask).start()
        took = time.monotonic() - started
    finally:
        ended.set()
        watcher.join()
    assert summary.ok and took < 30, took
    rows = ledger_rows(root)
    assert all(json.loads(row["provenance"])["python"] for row in rows.values())
    assert all(row["ended_at"] - row["started_at"] < 10 for row in rows.values())
