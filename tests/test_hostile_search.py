"""A search's records under the result root are as hostile as the ledger: what is read back from
``.gts/search.jsonl`` or Optuna's journal is checked as a new value would be, and a file that is
not one of ours is refused at once, never followed, never waited on."""

import json
import os
import subprocess
import sys

import gts_test_tasks as tasks
import pytest
from helpers import ledger_rows
from test_search import search_config

from gpu_task_scheduler import ConfigManager, GPUTaskScheduler, LedgerError
from gpu_task_scheduler.errors import DamagedRecordError

SAMPLERS = ["random", pytest.param("tpe", marks=pytest.mark.filterwarnings("ignore::UserWarning"))]


def _needs(sampler):
    if sampler == "tpe":
        pytest.importorskip("optuna")


def _study(root):
    import optuna

    from gpu_task_scheduler.tuning.search import _FlockLock

    path = str(root / ".gts" / "optuna.journal")
    # The scheduler's own lock: Optuna's default one (a link at the same path) would wait 30 s there.
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(path, lock_obj=_FlockLock(path + ".lock"))
    )
    return optuna.load_study(study_name="gts", storage=storage)


def _record_a_trial_named(root, sampler, name):
    """Add to a search's records one more trial, not yet run, whose run is named ``name``."""
    if sampler == "random":
        with open(root / ".gts" / "search.jsonl", "a") as handle:
            handle.write(json.dumps({"number": 2, "values": {"x1": 0.5, "x2": 0.5}}) + "\n")
            handle.write(json.dumps({"number": 2, "name": name}) + "\n")
        return
    import optuna

    floats = optuna.distributions.FloatDistribution
    trial = _study(root).ask({"x1": floats(-5, 10), "x2": floats(0, 15)})
    trial.set_user_attr("gts_run", name)


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("name", ["../outside", ".", "", ".gts", "a\nb", 7])
def test_a_run_name_read_back_from_a_search_is_checked_as_a_new_one(in_tmp, sampler, name):
    _needs(sampler)
    root = in_tmp / "r"
    GPUTaskScheduler(search_config(root, sampler=sampler, n_runs=2), tasks.BraninTask).start()
    _record_a_trial_named(root, sampler, name)
    before = sorted(os.listdir(in_tmp)), sorted(os.listdir(root))
    for read_only in (True, False):  # what ConfigManager and --dry-run list, and a start
        config = search_config(root, sampler=sampler, n_runs=4)
        with pytest.raises(DamagedRecordError, match="which no sweep makes") as error:
            list(ConfigManager(config).iter_runs()) if read_only else GPUTaskScheduler(config, tasks.BraninTask).start()
        assert isinstance(error.value, LedgerError) and "use another result root" in str(error.value)
    assert (sorted(os.listdir(in_tmp)), sorted(os.listdir(root))) == before  # nothing ran, nothing outside
    assert len(ledger_rows(root)) == 2


def _gts(*args, timeout=30):
    """`gts` in its own process: a hang fails the test (timeout) instead of stalling the suite."""
    return subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", *args], capture_output=True, text=True, timeout=timeout
    )


def _search_file(in_tmp, sampler, n_runs=3):
    config = search_config("r", sampler=sampler, n_runs=n_runs)
    config["task"] = "gts_test_tasks:BraninTask"
    path = in_tmp / "s.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize(
    "sampler, where",
    [("random", "search.jsonl"), ("tpe", "optuna.journal"), ("tpe", "optuna.journal.lock")],
)
def test_a_fifo_in_place_of_a_search_file_is_refused_at_once(in_tmp, sampler, where):
    _needs(sampler)
    config = _search_file(in_tmp, sampler)
    (in_tmp / "r" / ".gts").mkdir(parents=True)
    os.mkfifo(in_tmp / "r" / ".gts" / where)  # opened as a file, it would block forever
    for args in (["run", config, "--dry-run"], ["run", config, "--plain"]):
        if where.endswith(".lock") and "--dry-run" in args:
            continue  # a dry run takes no lock
        result = _gts(*args)
        assert result.returncode != 0 and "not a regular file" in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert sorted(os.listdir(in_tmp / "r")) == [".gts"]


@pytest.mark.parametrize(
    "sampler, where",
    [("random", "search.jsonl"), ("tpe", "optuna.journal"), ("tpe", "optuna.journal.lock")],
)
def test_a_linked_search_file_is_not_written_through(in_tmp, sampler, where):
    _needs(sampler)
    config = _search_file(in_tmp, sampler)
    (in_tmp / "r" / ".gts").mkdir(parents=True)
    outside = in_tmp / "outside"
    (in_tmp / "r" / ".gts" / where).symlink_to(outside)
    result = _gts("run", config, "--plain")
    assert result.returncode != 0 and "symbolic link" in result.stderr, result.stderr
    assert not outside.exists()
    assert sorted(os.listdir(in_tmp / "r")) == [".gts"]


def _damage(root, sampler, how):
    path = root / ".gts" / ("search.jsonl" if sampler == "random" else "optuna.journal")
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    damaged = {
        "binary": b"\xff\xfe\x00garbage\n",
        "garbage": b'{"op_code": 4, "number": \n',
        "not an object": b"[1, 2]\n",
    }
    if how in damaged:  # in the middle: line 2
        path.write_bytes(lines[0] + damaged[how] + b"".join(lines[1:]))
    else:  # a crash while the last line was written
        path.write_bytes(data + b'{"number": 7, "val')
    return path


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("how", ["binary", "garbage", "not an object"])
def test_a_damaged_search_file_is_refused_with_what_to_do(in_tmp, capsys, sampler, how):
    _needs(sampler)
    config = _search_file(in_tmp, sampler)
    assert _gts("run", config, "--plain").returncode == 0
    path = _damage(in_tmp / "r", sampler, how)
    before = path.read_bytes()
    for args in (["run", config, "--dry-run"], ["run", config, "search.n_runs=5", "--plain"]):
        result = _gts(*args)
        assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
        assert f"{os.path.join('r', '.gts', path.name)}" in result.stderr and "is damaged at line 2" in result.stderr
        assert "restore it from a backup" in result.stderr
    assert path.read_bytes() == before and len(ledger_rows(in_tmp / "r")) == 3


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_last_line_cut_short_is_dropped_and_the_search_goes_on(in_tmp, sampler):
    _needs(sampler)
    config = _search_file(in_tmp, sampler)
    assert _gts("run", config, "--plain").returncode == 0
    path = _damage(in_tmp / "r", sampler, "cut")
    dry = _gts("run", config, "search.n_runs=5", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert path.read_bytes().endswith(b'"val')  # a dry run writes nothing, not even the repair
    result = _gts("run", config, "search.n_runs=5", "--plain")
    assert result.returncode == 0, result.stderr
    assert len(ledger_rows(in_tmp / "r")) == 5
    # The fragment was cut off before anything was appended: every line is whole again.
    assert all(json.loads(line) for line in path.read_bytes().splitlines())


@pytest.mark.parametrize(
    "name, work_dir",
    [("../outside", "{root}/../outside"), (".gts", "{root}/.gts"), ("a\x01b", "{root}/a\x01b"), ("x-1,", "/etc")],
)
def test_an_active_run_the_ledger_records_under_a_name_no_sweep_makes_is_refused(in_tmp, name, work_dir):
    """A run recorded active is looked at in its folder at the next start: the ledger is no more
    trusted than a search's records."""
    import sqlite3

    from helpers import make_config

    root = in_tmp / "r"
    config = make_config(root, [{"x": [1]}], slots=("cpu",), scheduler_log_file_path=None)
    assert GPUTaskScheduler(config, tasks.BraninTask).start().ok is False  # no x1: failed, recorded
    db = sqlite3.connect(root / ".gts" / "ledger.sqlite3")
    with db:
        db.execute("UPDATE runs SET name = ?, work_dir = ?, status = 'running'", (name, work_dir.format(root=root)))
    db.close()
    with pytest.raises(DamagedRecordError, match="the ledger records an active run"):
        GPUTaskScheduler(config, tasks.BraninTask).start()
    assert not (in_tmp / "outside").exists() and sorted(os.listdir(root)) == [".gts", "x-1,"]
