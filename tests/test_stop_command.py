"""`gts stop ROOT [--drain | --now]` from another shell, against a sweep running in its own process."""

import signal
import threading

import gts_test_tasks as tasks
import pytest
from conftest import marked_pids, wait_until
from helpers import ledger_rows, make_config
from test_process_control import finish, launch, started

from gpu_task_scheduler import GPUTaskScheduler, GTSError
from gpu_task_scheduler.cli.main import main
from gpu_task_scheduler.records.control import request_stop


def test_gts_stop_stops_the_runs_with_the_grace_period_and_the_sweep_exits_interrupted(
    in_tmp, no_leaked_processes, capsys
):
    root = in_tmp / "r"
    config = make_config(root, [{"a": [1, 2, 3]}], slots=("cpu", "cpu"), grace_period=5)
    scheduler = launch(config)
    wait_until(lambda: started(root, "a-1,", "a-2,"), message="both runs to start")
    assert main(["stop", str(root), "--wait"]) == 0
    assert f"(pid {scheduler.pid}) to stop its runs" in capsys.readouterr().out
    output = finish(scheduler)
    assert scheduler.returncode == 130, output  # a Python program running the sweep is not killed by it
    assert "gts stop: starting no more runs; stopping 2 running run(s)" in output
    rows = ledger_rows(root)
    assert {n: (rows[n]["status"], rows[n]["signal"], rows[n]["cause"]) for n in rows} == {
        "a-1,": ("interrupted", "SIGTERM", "interrupted by gts stop"),
        "a-2,": ("interrupted", "SIGTERM", "interrupted by gts stop"),
    }
    assert not (root / ".gts" / "stop-request").exists()
    assert not marked_pids(no_leaked_processes)


def test_gts_stop_drain_lets_the_running_runs_finish_and_starts_no_more(in_tmp, no_leaked_processes):
    root = in_tmp / "r"
    flag = in_tmp / "go"
    config = make_config(
        root, [{"a": [1, 2, 3, 4]}], slots=("cpu", "cpu"), global_config={"wait_for": str(flag)}, grace_period=5
    )
    scheduler = launch(config, "WaitForFileTask")
    wait_until(lambda: started(root, "a-1,", "a-2,"), message="both runs to start")
    assert main(["stop", str(root), "--drain"]) == 0
    wait_until(lambda: "gts stop --drain" in (root / "scheduler.log").read_text(), message="the drain to be seen")
    flag.write_text("")  # the running runs may end now
    output = finish(scheduler)
    assert scheduler.returncode == 130, output
    rows = ledger_rows(root)
    assert {n: rows[n]["status"] for n in rows} == {"a-1,": "succeeded", "a-2,": "succeeded"}
    assert "starting no more runs; 2 running run(s) may finish" in output
    # The summary names the runs never started, and is no error: nothing failed.
    assert "Sweep summary: 2 succeeded, 0 failed, 0 skipped, 2 not started" in output
    assert "not started (the sweep was stopped before their turn): a-3,, a-4," in output
    assert "ERROR" not in output
    assert not marked_pids(no_leaked_processes)


def test_gts_stop_now_kills_runs_that_ignore_sigterm_at_once(in_tmp, no_leaked_processes):
    root = in_tmp / "r"
    config = make_config(
        root, [{"a": [1, 2]}], slots=("cpu", "cpu"), global_config={"ignore_term": True}, grace_period=600
    )
    scheduler = launch(config)
    wait_until(lambda: started(root, "a-1,", "a-2,"), message="both runs to start")
    assert main(["stop", str(root), "--now"]) == 0
    output = finish(scheduler, timeout=20)  # not the 600 s grace period
    assert "gts stop --now: killing 2 run(s) now" in output
    assert "Sweep summary: 0 succeeded, 0 failed, 2 interrupted, 0 skipped" in output, output
    rows = ledger_rows(root)
    assert [(rows[n]["status"], rows[n]["signal"]) for n in ("a-1,", "a-2,")] == [("interrupted", "SIGKILL")] * 2
    assert not marked_pids(no_leaked_processes)


def test_gts_stop_says_clearly_when_nothing_runs(in_tmp, capsys):
    root = in_tmp / "r"
    assert main(["stop", str(root)]) == 2  # a path that does not exist
    assert f"{root} does not exist" in capsys.readouterr().err
    root.mkdir()
    assert main(["stop", str(root)]) == 2  # a folder that is no result root
    assert "is not a result root" in capsys.readouterr().err
    config = make_config(root, [{"a": [1]}])
    config["command"] = ["true"]
    GPUTaskScheduler(config).start()
    with pytest.raises(GTSError, match="no scheduler is running on"):
        request_stop(str(root), "stop")
    assert main(["stop", str(root)]) == 1
    assert "no scheduler is running on" in capsys.readouterr().err


def test_an_unreadable_stop_request_means_stop(in_tmp, no_leaked_processes):
    root = in_tmp / "r"
    config = make_config(root, [{"a": [1]}], slots=("cpu",), grace_period=5)
    scheduler = launch(config)
    wait_until(lambda: started(root, "a-1,"), message="the run to start")
    (root / ".gts" / "stop-request").write_text("garbage")  # an unreadable request means: stop
    scheduler.send_signal(signal.SIGUSR1)
    output = finish(scheduler)
    assert scheduler.returncode == 130 and "interrupted by gts stop" in output


def test_a_sweep_outside_the_main_thread_is_not_signalled(in_tmp, no_leaked_processes):
    """There, SIGUSR1 would keep its default action and end the whole program."""
    root, flag = in_tmp / "r", in_tmp / "go"
    config = make_config(root, [{"a": [1]}], global_config={"wait_for": str(flag)})
    results = []
    sweep = threading.Thread(target=lambda: results.append(GPUTaskScheduler(config, tasks.WaitForFileTask).start()))
    sweep.start()
    try:
        wait_until(lambda: started(root, "a-1,"), message="the run to start")
        with pytest.raises(GTSError, match=r"does not take stop requests .* kill -TERM"):
            request_stop(str(root), "stop")
    finally:
        flag.write_text("")
        sweep.join(timeout=60)
    assert results and results[0].ok
    assert not (root / ".gts" / "control").exists()


def test_a_run_stopped_before_its_first_report_is_not_said_to_report_no_metrics(in_tmp, no_leaked_processes, capsys):
    """Interrupted before it reported anything, a run under early_stop was warned about as one that
    "reported no metrics" (as a misspelt metric is): it had no chance to."""
    root = in_tmp / "r"
    config = make_config(root, [{"a": [1, 2]}], slots=("cpu", "cpu"), grace_period=5)
    config["early_stop"] = {"method": "median", "metric": "loss", "mode": "min", "min_step": 1}
    scheduler = launch(config)
    wait_until(lambda: started(root, "a-1,", "a-2,"), message="both runs to start")
    assert main(["stop", str(root), "--wait"]) == 0
    output = finish(scheduler)
    assert scheduler.returncode == 130, output
    assert "reported no metrics" not in output
    assert {row["status"] for row in ledger_rows(root).values()} == {"interrupted"}
    assert not marked_pids(no_leaked_processes)
