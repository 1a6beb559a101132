"""Everything under a result root is hostile: symbolic links are never followed, FIFOs never block."""

import json
import os

import pytest
from gts_test_tasks import PlantTask, RecordTask
from helpers import make_config

from gpu_task_scheduler import ConfigError, GPUTaskScheduler, RunStatus
from gpu_task_scheduler.results import rows


@pytest.fixture
def outside(tmp_path):
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "worker.log").write_text("precious\n")
    return folder


def _listing(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, ds, fs in os.walk(folder) for f in fs + ds)


@pytest.mark.parametrize("plant", ["folder", "meta", "log", "log-parent", "logs"])
def test_a_planted_symbolic_link_is_refused_for_that_run_only(tmp_path, outside, plant):
    root = tmp_path / "root"
    log_file = "out/worker.log" if plant == "log-parent" else "worker.log"
    config = make_config(root, [{"x": [1, 2]}], log_file=log_file)
    victim = root / "x-1,"
    if plant == "folder":
        root.mkdir()
        victim.symlink_to(outside)
    else:
        (victim / ".gts").mkdir(parents=True)
        target = {
            "meta": victim / ".gts",
            "log": victim / "worker.log",
            "log-parent": victim / "out",
            "logs": victim / ".gts" / "logs",
        }[plant]
        if target.is_dir():
            target.rmdir()
        target.symlink_to(outside / "worker.log" if plant == "log" else outside)
        if plant == "logs":  # an earlier attempt's log must be moved there
            (victim / "worker.log").write_text("attempt 1\n")
    before = _listing(outside)
    summary = GPUTaskScheduler(config, RecordTask).start()
    assert [o.name for o in summary.succeeded] == ["x-2,"]
    failed = summary.outcomes["x-1,"]
    assert failed.status is RunStatus.FAILED and "symbolic link" in failed.cause, failed.cause
    assert _listing(outside) == before and (outside / "worker.log").read_text() == "precious\n"


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_planted_non_regular_log_is_refused_without_blocking(tmp_path, kind):
    root = tmp_path / "root"
    (root / "x-1,").mkdir(parents=True)
    log = root / "x-1," / "worker.log"
    os.mkfifo(log) if kind == "fifo" else log.mkdir()
    summary = GPUTaskScheduler(make_config(root, [{"x": [1]}]), RecordTask).start()
    assert "not a regular file" in summary.outcomes["x-1,"].cause


@pytest.mark.parametrize("plant", ["fifo-log", "fifo-result", "link-result", "link-meta"])
def test_what_a_run_plants_in_its_folder_neither_hangs_nor_fools_the_scheduler(tmp_path, outside, plant):
    forged = outside / "forged.json"
    forged.write_text(json.dumps({"loss": -1}))
    root = tmp_path / "root"
    config = make_config(root, [{"plant": [plant]}], global_config={"forged": str(forged), "outside": str(outside)})
    summary = GPUTaskScheduler(config, PlantTask).start()
    outcome = summary.outcomes[f"plant-{plant},"]
    if plant == "link-meta":  # its record would be read through the link: not trusted
        assert outcome.status is RunStatus.FAILED and "symbolic link" in outcome.cause
    else:
        assert outcome.status is RunStatus.SUCCEEDED
    table = rows(str(root))
    assert "result.loss" not in table[0] and "result" not in table[0]
    assert sorted(os.listdir(outside)) == ["forged.json", "worker.log"]


def test_results_of_a_relative_root_are_read_from_the_root_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": "rel", "scheduler_log_file_path": None},
        "test_config": [{"v": [3]}],
        "command": ["sh", "-c", 'printf \'{{"v": %s}}\' "$1" > "$2/result.json"', "sh", "{v}", "{work_dir}"],
    }
    assert GPUTaskScheduler(config).start().ok
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "rel" / "v-3,").mkdir(parents=True)
    (elsewhere / "rel" / "v-3," / "result.json").write_text('{"v": 666}')
    monkeypatch.chdir(elsewhere)
    assert rows(str(tmp_path / "rel"))[0]["result.v"] == 3


@pytest.mark.parametrize("log_file", [".gts/ledger.sqlite3", "./.gts/x.log", ".gts", "logs/", "."])
def test_log_file_may_not_point_into_our_records(tmp_path, log_file):
    with pytest.raises(ConfigError, match="log_file"):
        GPUTaskScheduler(make_config(tmp_path / "r", [{"x": [1]}], log_file=log_file), RecordTask)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("kind", ["fifo", "link", "huge"])
def test_records_are_read_only_from_small_regular_files(tmp_path, kind):
    from gpu_task_scheduler.records.paths import read_json

    target = tmp_path / "outcome.json"
    if kind == "fifo":
        os.mkfifo(target)  # opening it for reading would block forever
    elif kind == "link":
        (tmp_path / "forged.json").write_text('{"status": "succeeded"}')
        target.symlink_to(tmp_path / "forged.json")
    else:
        target.write_text('{"a": "' + "x" * 100 + '"}')
    assert read_json(str(target), limit=64) is None


def test_a_record_longer_than_one_read_is_read_whole_up_to_its_limit(tmp_path):
    from gpu_task_scheduler.records.paths import read_json

    target = tmp_path / "result.json"
    value = {"a": "x" * 200_000}  # three reads and a bit
    target.write_text(json.dumps(value))
    size = target.stat().st_size
    assert read_json(str(target)) == value
    assert read_json(str(target), limit=size) == value
    assert read_json(str(target), limit=size - 1) is None


def test_a_queue_keeps_no_outcome_of_runs_that_succeeded():
    from gpu_task_scheduler import RunOutcome, RunStatus, SweepSummary

    summary = SweepSummary(keep_succeeded=False)
    for index in range(1000):
        summary.record(RunOutcome(name=f"job-{index}", work_dir="w", status=RunStatus.SUCCEEDED, log_tail="x" * 999))
    summary.record(RunOutcome(name="bad", work_dir="w", status=RunStatus.FAILED, log_tail="why"))
    assert list(summary.outcomes) == ["bad"] and summary.outcomes["bad"].log_tail == "why"
    assert summary.succeeded_count == 1000 and summary.report().startswith("Sweep summary: 1000 succeeded, 1 failed")
