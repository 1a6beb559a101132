"""The scheduler with real child processes (tiny tasks), run in-process."""

import json
import os
import shutil
import signal

import gts_test_tasks as tasks
import pytest
from conftest import wait_until
from helpers import journal_lines, ledger_rows, make_config

from gpu_task_scheduler import GPUTaskScheduler, RunsFailedError, RunStatus, SchedulerBusyError
from gpu_task_scheduler.records import known
from gpu_task_scheduler.records.ledger.lock import SweepLock
from gpu_task_scheduler.records.paths import RootPaths, read_json


def start(config, task=tasks.RecordTask):
    return GPUTaskScheduler(config, task).start()


def test_runs_succeed_and_everything_is_recorded(in_tmp):
    root = in_tmp / "results"
    journal = str(in_tmp / "journal")
    config = make_config(
        root, [{"a": [1, 2], "b": ["x", "y"]}], slots=("cpu", "cpu"), global_config={"journal": journal}
    )
    summary = start(config)
    names = ["a-1,b-x,", "a-1,b-y,", "a-2,b-x,", "a-2,b-y,"]
    assert summary.ok and summary.exit_code == 0
    assert sorted(o.name for o in summary.succeeded) == names
    assert sorted(journal_lines(journal)) == sorted([f"start {n}" for n in names] + [f"end {n}" for n in names])
    rows = ledger_rows(root)
    assert {name: rows[name]["status"] for name in names} == {name: "succeeded" for name in names}
    for name in names:
        assert rows[name]["attempts"] == 1 and rows[name]["exit_code"] == 0
        assert rows[name]["slot"] in ("cpu0", "cpu1")
        assert rows[name]["ended_at"] >= rows[name]["started_at"]
        assert json.loads(rows[name]["result"])["config"]["a"] in (1, 2)
        assert (root / name / "worker.log").read_text().startswith(f"hello from {root / name}")
        assert json.loads((root / name / ".gts" / "config.json").read_text())["b"] in ("x", "y")
    log = (root / "scheduler.log").read_text()
    for name in names:
        assert f" receives task {name}\n" in log and f" finishes task {name}\n" in log
    assert "INFO cpu0 finished\n" in log and "INFO cpu1 finished\n" in log
    assert "4 succeeded, 0 failed, 0 skipped" in log


def test_environment_working_directory_and_task_state(in_tmp):
    config = make_config(in_tmp / "r", [{"i": [0]}], slots=("3",))
    result = start(config).succeeded[0].result
    assert result["cwd"] == str(in_tmp)
    assert result["attribute"] == "kept" and result["folder_existed_in_required_env"] is True
    assert result["env"] == {
        "CUDA_VISIBLE_DEVICES": "3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": "4",
        "GTS_TEST_NUMBER": "7",
    }
    assert result["pid"] != os.getpid()


def test_each_run_inherits_the_environment_as_it_is_when_the_run_starts(in_tmp, monkeypatch):
    """The scheduler's environment is decoded once and again only when it changed (a copy per run
    cost 80 us): a variable set, changed or removed between two sweeps reaches the next runs."""
    journal = in_tmp / "journal"
    config = make_config(in_tmp / "r", [{"i": [0, 1]}], force_rerun=True)
    config["command"] = ["sh", "-c", 'echo "$1 ${{GTS_TEST_SEEN-unset}}" >> "$0"', str(journal), "{i}"]
    seen = []
    for value in ("first", "second", None):
        if value is None:
            monkeypatch.delenv("GTS_TEST_SEEN")
        else:
            monkeypatch.setenv("GTS_TEST_SEEN", value)
        assert GPUTaskScheduler(config).start().ok
        seen.append(sorted(journal.read_text().splitlines()))
        journal.unlink()
    assert seen == [["0 first", "1 first"], ["0 second", "1 second"], ["0 unset", "1 unset"]]


def test_cpu_slots_hide_the_gpus(in_tmp):
    result = start(make_config(in_tmp / "r", [{"i": [0]}])).succeeded[0].result
    assert result["env"]["CUDA_VISIBLE_DEVICES"] == ""


def test_results_that_json_cannot_hold_are_converted(in_tmp):
    outcome = start(make_config(in_tmp / "r", [{"i": [0]}]), tasks.NoisyTask).succeeded[0]
    assert outcome.result["tuple"] == [1, 2] and outcome.result["set"] == [3]
    assert outcome.result["nan"] == "nan" and "object" in outcome.result["object"]


FAILURES = [
    ("raise", 1, None, "ValueError: boom"),
    ("exit2", 2, None, "SystemExit: 2"),
    ("os_exit3", 3, None, "exit code 3"),
    ("segv", None, "SIGSEGV", "killed by SIGSEGV"),
]


@pytest.mark.parametrize("mode, exit_code, signal_name, described", FAILURES)
def test_failures_are_recorded_with_their_cause(in_tmp, mode, exit_code, signal_name, described):
    root = in_tmp / "r"
    summary = start(make_config(root, [{"mode": [mode, "ok"]}], slots=("cpu", "cpu")), tasks.FailTask)
    assert not summary.ok and summary.exit_code == 1
    assert [o.name for o in summary.succeeded] == ["mode-ok,"]
    (failed,) = summary.failed
    assert (failed.status, failed.exit_code, failed.signal) == (RunStatus.FAILED, exit_code, signal_name)
    assert failed.describe() == described
    assert f"about to {mode}" in failed.log_tail
    row = ledger_rows(root)[failed.name]
    assert (row["status"], row["exit_code"], row["signal"]) == ("failed", exit_code, signal_name)
    assert f"about to {mode}" in row["log_tail"]
    report = summary.report()
    assert str(root / failed.name) in report and described in report and f"about to {mode}" in report
    with pytest.raises(RunsFailedError) as raised:
        summary.raise_for_failures()
    assert raised.value.summary is summary
    assert f"fails task mode-{mode}, ({described})" in (root / "scheduler.log").read_text()


def test_sys_exit_zero_is_a_success(in_tmp):
    summary = start(make_config(in_tmp / "r", [{"mode": ["exit0"]}]), tasks.FailTask)
    assert [o.status for o in summary.outcomes.values()] == [RunStatus.SUCCEEDED]


def test_succeeded_runs_are_skipped_and_failed_runs_run_again(in_tmp):
    root, journal, flag = in_tmp / "r", str(in_tmp / "journal"), in_tmp / "fail"
    flag.write_text("")
    config = make_config(
        root,
        [{"a": [1]}, {"a": [2], "fail_if": [str(flag)]}],
        global_config={"journal": journal},
        ignored_keys_for_folder_name=["fail_if"],
    )
    first = start(config)
    assert [o.name for o in first.succeeded] == ["a-1,"] and [o.name for o in first.failed] == ["a-2,"]
    flag.unlink()
    second = start(config)
    assert second.skipped == ["a-1,"] and [o.name for o in second.succeeded] == ["a-2,"]
    assert journal_lines(journal).count("end a-1,") == 1
    assert journal_lines(journal).count("start a-2,") == 2
    assert ledger_rows(root)["a-2,"]["attempts"] == 2
    assert "cpu0 skips task a-1," in (root / "scheduler.log").read_text()
    third = start(config)
    assert third.skipped == ["a-1,", "a-2,"] and not third.outcomes


def test_resume_reads_the_ledger_in_windows_and_finds_rows_outside_them(in_tmp, monkeypatch):
    """Runs are decided from ledger rows read a few run indices at a time; a row the window
    does not hold (the sweep was reordered since) is still found, and a deleted folder still
    means the run is done again."""
    monkeypatch.setattr(known, "WINDOW", 2)
    root, journal = in_tmp / "r", str(in_tmp / "journal")
    values = list(range(7))
    first = start(make_config(root, [{"a": values}], global_config={"journal": journal}))
    assert len(first.succeeded) == 7
    for value in values:  # the ledger alone says they succeeded
        (root / f"a-{value}," / ".gts" / "outcome.json").unlink()
    reordered = make_config(root, [{"a": values[::-1]}], global_config={"journal": journal})
    again = start(reordered)
    assert sorted(again.skipped) == sorted(f"a-{v}," for v in values) and not again.outcomes
    shutil.rmtree(root / "a-3,")
    third = start(reordered)
    assert [o.name for o in third.succeeded] == ["a-3,"] and len(third.skipped) == 6
    assert journal_lines(journal).count("end a-3,") == 2 and journal_lines(journal).count("end a-4,") == 1


def test_force_rerun_runs_everything_and_keeps_old_logs(in_tmp):
    root, journal = in_tmp / "r", str(in_tmp / "journal")
    start(make_config(root, [{"a": [1, 2]}], global_config={"journal": journal}))
    summary = start(make_config(root, [{"a": [1, 2]}], global_config={"journal": journal}, force_rerun=True))
    assert len(summary.succeeded) == 2 and not summary.skipped
    assert journal_lines(journal).count("end a-1,") == 2
    assert (root / "a-1," / ".gts" / "logs" / "attempt-1-worker.log").read_text().startswith("hello")
    assert (root / "a-1," / "worker.log").read_text().startswith("hello")
    assert ledger_rows(root)["a-1,"]["attempts"] == 2


def test_a_deleted_run_folder_means_run_again(in_tmp):
    root, journal = in_tmp / "r", str(in_tmp / "journal")
    config = make_config(root, [{"a": [1]}], global_config={"journal": journal})
    start(config)
    for path in sorted((root / "a-1,").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (root / "a-1,").rmdir()
    assert len(start(config).succeeded) == 1
    assert journal_lines(journal).count("end a-1,") == 2


def test_folders_without_a_record_run_unless_skip_existing_folders(in_tmp):
    root, journal = in_tmp / "r", str(in_tmp / "journal")
    (root / "a-1,").mkdir(parents=True)  # left behind by the original GPUTaskScheduler
    legacy = make_config(root, [{"a": [1, 2]}], global_config={"journal": journal}, skip_existing_folders=True)
    summary = start(legacy)
    assert summary.skipped == ["a-1,"] and [o.name for o in summary.succeeded] == ["a-2,"]
    summary = start(make_config(root, [{"a": [1, 2]}], global_config={"journal": journal}))
    assert summary.skipped == ["a-2,"] and [o.name for o in summary.succeeded] == ["a-1,"]


def test_a_lost_ledger_is_rebuilt_from_the_run_folders(in_tmp):
    root, journal = in_tmp / "r", str(in_tmp / "journal")
    config = make_config(root, [{"a": [1, 2]}], global_config={"journal": journal})
    start(config)
    for suffix in ("", "-wal", "-shm"):
        path = root / ".gts" / f"ledger.sqlite3{suffix}"
        if path.exists():
            path.unlink()
    summary = start(config)
    assert summary.skipped == ["a-1,", "a-2,"]
    assert journal_lines(journal).count("end a-1,") == 1
    assert ledger_rows(root)["a-1,"]["status"] == "succeeded"


def test_a_changed_config_is_not_adopted_from_the_folder(in_tmp):
    root, journal = in_tmp / "r", str(in_tmp / "journal")
    start(make_config(root, [{"a": [1]}], global_config={"journal": journal, "epochs": 1}))
    (root / ".gts" / "ledger.sqlite3").unlink()
    summary = start(make_config(root, [{"a": [1]}], global_config={"journal": journal, "epochs": 2}))
    assert [o.name for o in summary.succeeded] == ["a-1,"]


def test_identical_configs_run_once(in_tmp):
    root, journal = in_tmp / "r", str(in_tmp / "journal")
    config = make_config(root, [{"a": [1, 2]}, {"a": [1]}], slots=("cpu", "cpu"), global_config={"journal": journal})
    summary = start(config)
    assert journal_lines(journal).count("start a-1,") == 1
    assert sorted(o.name for o in summary.succeeded) == ["a-1,", "a-2,"] and summary.skipped == ["a-1,"]


def test_colliding_names_get_their_own_folders(in_tmp):
    root = in_tmp / "r"
    long = "v" * 30
    summary = start(make_config(root, [{"s": [long + "1", long + "2"]}], slots=("cpu", "cpu")))
    names = sorted(o.name for o in summary.succeeded)
    assert len(names) == 2 and names[0] == f"s-{long},"
    assert {o.result["config"]["s"] for o in summary.succeeded} == {long + "1", long + "2"}
    assert all((root / name / "worker.log").exists() for name in names)


def test_retries_are_bounded(in_tmp):
    root = in_tmp / "r"
    summary = start(make_config(root, [{"succeed_on": [2, 5]}], max_retries=2), tasks.FlakyTask)
    by_name = summary.outcomes
    assert by_name["succeed_on-2,"].status is RunStatus.SUCCEEDED and by_name["succeed_on-2,"].attempts == 2
    assert by_name["succeed_on-5,"].status is RunStatus.FAILED and by_name["succeed_on-5,"].attempts == 3
    assert (root / "succeed_on-5," / "attempts.txt").read_text() == "3"
    assert ledger_rows(root)["succeed_on-5,"]["attempts"] == 3
    log = (root / "scheduler.log").read_text()
    assert "succeed_on-5, will be retried (attempt 3 of 3)" in log
    # An attempt that is retried is no failure of the task: only the last one is logged as one.
    fails = [line for line in log.splitlines() if "fails task" in line]
    assert len(fails) == 1 and "succeed_on-5," in fails[0] and "ERROR" in fails[0], fails
    assert log.count("attempt 1 of task succeed_on-2, ended (RuntimeError: flaky failure on attempt 1)") == 1
    assert (root / "succeed_on-5," / ".gts" / "logs" / "attempt-1-worker.log").exists()


@pytest.mark.parametrize(
    "task, block, cause",
    [
        (tasks.BadInitTask, {"bad": [True]}, "BadInitTask failed before main(): KeyError: 'missing dataset'"),
        (tasks.UnpicklableTask, {"x": [1]}, "object cannot be pickled"),
        (tasks.BadEnvTask, {"x": [1]}, "BadEnvTask.required_env() returned BAD=['not', 'a', 'string']"),
    ],
)
def test_runs_that_cannot_start_fail_alone(in_tmp, task, block, cause):
    root = in_tmp / "r"
    summary = start(make_config(root, [block, {"bad": [False]}] if task is tasks.BadInitTask else [block]), task)
    (failed,) = summary.failed
    assert failed.status is RunStatus.FAILED and cause in failed.cause
    assert ledger_rows(root)[failed.name]["status"] == "failed"
    if task is tasks.BadInitTask:
        assert [o.name for o in summary.succeeded] == ["bad-False,"]
    # The summary points to a log that exists and says what happened (with the traceback, when user code raised).
    log = (root / failed.name / "worker.log").read_text()
    assert failed.log_path == str(root / failed.name / "worker.log") and cause in log
    if task is tasks.BadInitTask:
        assert "Traceback" in log and 'raise KeyError("missing dataset")' in log
        assert "missing dataset" in failed.log_tail and "missing dataset" in ledger_rows(root)[failed.name]["log_tail"]


def test_a_task_that_cannot_start_without_a_log_file_still_shows_its_traceback(in_tmp):
    root = in_tmp / "r"
    summary = start(make_config(root, [{"bad": [True]}], log_file=None), tasks.BadInitTask)
    (failed,) = summary.failed
    assert failed.log_path is None and 'raise KeyError("missing dataset")' in failed.log_tail


def test_processes_a_run_started_are_stopped_when_it_ends(in_tmp):
    root = in_tmp / "r"
    summary = start(make_config(root, [{"hang": [False]}]), tasks.GrandchildTask)
    pid = summary.succeeded[0].result["grandchild"]

    def gone():
        try:
            with open(f"/proc/{pid}/stat") as handle:
                return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except OSError:
            return True

    wait_until(gone, timeout=10, message=f"the grandchild {pid} to be gone")


def test_a_slot_gets_its_next_run_as_soon_as_the_child_exits(in_tmp):
    # An exit is an event the loop wakes on: with looks at the GPUs an hour apart, a loop that
    # polled for exits would take hours here; the bound is that far from what it measures.
    root = in_tmp / "r"
    start(make_config(root, [{"i": list(range(5))}], gpu_poll_interval=3600))
    rows = ledger_rows(root)
    gaps = [
        rows[name]["ended_at"] - read_json(str(root / name / ".gts" / "outcome.json"))["finished_at"] for name in rows
    ]
    assert max(gaps) < 60, gaps


def test_a_second_scheduler_on_the_same_root_is_refused(in_tmp):
    root = in_tmp / "r"
    root.mkdir()
    with SweepLock(RootPaths(str(root))):
        with pytest.raises(SchedulerBusyError, match=f"pid {os.getpid()} on host"):
            start(make_config(root, [{"i": [0]}]))
    assert not (root / "i-0,").exists()
    assert len(start(make_config(root, [{"i": [0]}])).succeeded) == 1


def test_no_scheduler_log_when_disabled(in_tmp):
    config = make_config(in_tmp / "r", [{"i": [0]}], scheduler_log_file_path=None, log_file=None)
    summary = start(config)
    assert summary.ok and not (in_tmp / "scheduler.log").exists()
    assert sorted(os.listdir(in_tmp / "r" / "i-0,")) == [".gts"]


def test_signal_handlers_are_restored(in_tmp):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    start(make_config(in_tmp / "r", [{"i": [0]}]))
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_gpu_listed_twice_runs_two_runs_at_once(in_tmp):
    root = in_tmp / "r"
    summary = start(
        make_config(root, [{"i": [0, 1]}], slots=("5", "5"), global_config={"expect": 2}), tasks.RendezvousTask
    )
    assert summary.ok and [o.result["slot"] for o in summary.succeeded] == ["5", "5"]
    assert sorted(o.slot for o in summary.succeeded) == ["gpu5", "gpu5"]


def test_hostile_values_create_folders_only_inside_the_root(in_tmp):
    root = in_tmp / "deep" / "r"
    values = ["../../escaped", "/abs/path", "..", "new\nline", "semi;colon $(touch pwned) `id`", "ünicöde"]
    summary = start(make_config(root, [{"v": values}], slots=("cpu", "cpu")))
    assert len(summary.succeeded) == len(values)
    assert sorted(o.result["config"]["v"] for o in summary.succeeded) == sorted(values)
    assert sorted(p.name for p in in_tmp.iterdir()) == ["deep"]
    assert sorted(p.name for p in (in_tmp / "deep").iterdir()) == ["r"]
    folders = [p for p in root.iterdir() if p.name != ".gts" and p.name != "scheduler.log"]
    assert len(folders) == len(values) and all(p.parent == root and p.is_dir() for p in folders)
    # (No shell sees these values here; test_reliability's command-sweep tests show that none ever does.)


def test_a_command_run_records_its_success_so_a_killed_scheduler_never_repeats_it(in_tmp):
    """Command sweeps start no Python runner; the wrapper records the success itself."""
    from gpu_task_scheduler.records.ledger import Ledger

    root, journal = in_tmp / "r", in_tmp / "journal"
    config = make_config(root, [{"i": [0, 1]}])
    config["command"] = ["sh", "-c", 'echo "ran $1" >> "$0"', str(journal), "{i}"]
    assert GPUTaskScheduler(config).start().ok
    rows = ledger_rows(root)
    outcome = read_json(str(root / "i-0," / ".gts" / "outcome.json"))
    assert (outcome["status"], outcome["token"]) == ("succeeded", rows["i-0,"]["token"])
    # As a scheduler killed after the command ended, before it recorded the end, leaves the ledger:
    with Ledger(RootPaths(str(root))) as ledger:
        row = rows["i-0,"]
        ledger.mark_running(
            name="i-0,",
            run_index=0,
            config_hash=row["config_hash"],
            slot="cpu0",
            token=row["token"],
            work_dir=row["work_dir"],
        )
    again = GPUTaskScheduler(config).start()
    assert sorted(again.skipped) == ["i-0,", "i-1,"] and ledger_rows(root)["i-0,"]["status"] == "succeeded"
    assert journal.read_text().splitlines() == ["ran 0", "ran 1"]


def test_a_queue_line_that_plants_a_link_where_its_outcome_goes_writes_nothing_through_it(in_tmp):
    from gpu_task_scheduler.backends.local.tasks import ShellLineTask

    root, outside = in_tmp / "r", in_tmp / "outside"
    outside.write_text("precious\n")
    config = make_config(root, [{"command": [f'ln -s {outside} "$GTS_OUTCOME_FILE"']}])
    (failed,) = GPUTaskScheduler(config, ShellLineTask).start().failed
    assert outside.read_text() == "precious\n"
    assert failed.exit_code == 4 and "symbolic link where its outcome goes" in failed.log_tail


@pytest.mark.parametrize("prewarm", [True, False])
def test_runs_know_who_they_are_for_experiment_trackers(in_tmp, prewarm):
    root = in_tmp / "r"
    config = make_config(root, [{"a": [1, 2, 3], "succeed_on": [1]}, {"a": [4], "succeed_on": [2]}], max_retries=1)
    config["scheduler_config"].update(prewarm=prewarm, ignored_keys_for_folder_name=["succeed_on"])
    summary = start(config, tasks.IdentityTask)
    seen = {o.name: o.result for o in summary.succeeded}
    for index, name in enumerate(["a-1,", "a-2,", "a-3,", "a-4,"]):
        attempt = "2" if name == "a-4," else "1"
        assert seen[name] == {
            "GTS_RUN_NAME": name,
            "GTS_RUN_DIR": str(root / name),
            "GTS_SWEEP_ROOT": str(root),
            "GTS_RUN_INDEX": str(index),
            "GTS_ATTEMPT": attempt,
        }


def test_commands_know_who_they_are_too(in_tmp):
    root = in_tmp / "r"
    config = make_config(root, [{"a": [7]}])
    config["command"] = [
        "sh",
        "-c",
        'echo "$GTS_RUN_NAME $GTS_RUN_INDEX $GTS_ATTEMPT $GTS_SWEEP_ROOT" > "$GTS_RUN_DIR/who"',
    ]
    assert GPUTaskScheduler(config).start().ok
    assert (root / "a-7," / "who").read_text() == f"a-7, 0 1 {root}\n"
