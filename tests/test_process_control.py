"""The scheduler as its own process: Ctrl-C, SIGTERM, SIGKILL and restart, a task in __main__."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import gts_test_tasks as tasks
import pytest
from conftest import marked_pids, wait_until
from helpers import journal_lines, ledger_rows, make_config

from gpu_task_scheduler import GPUTaskScheduler

TESTS = os.path.dirname(os.path.abspath(__file__))
SCRIPT = textwrap.dedent(f"""
    import json, sys
    sys.path.insert(0, {TESTS!r})
    import gts_test_tasks as tasks
    from gpu_task_scheduler import GPUTaskScheduler
    task = None if sys.argv[2] == "-" else getattr(tasks, sys.argv[2])  # "-": the config's command
    summary = GPUTaskScheduler(json.loads(sys.argv[1]), task).start()
    sys.exit(summary.exit_code)
""")


def launch(config, task="BlockTask", **popen):
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, json.dumps(config), task],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **popen,
    )


def started(root, *names):
    return all((root / name / "started").exists() for name in names)


@pytest.fixture
def blocking_sweep(in_tmp):
    root = in_tmp / "r"
    config = make_config(
        root,
        [{"a": [0], "sleep": [0]}, {"a": [1, 2], "sleep": [600]}],
        slots=("cpu", "cpu"),
        global_config={"journal": str(in_tmp / "journal")},
        grace_period=5,
        ignored_keys_for_folder_name=["sleep"],
    )
    return root, config


def finish(process, timeout=30):
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER (conftest.py): its threads' stacks first
        try:
            output, _ = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        pytest.fail(f"the scheduler did not stop in {timeout}s (its stacks at the end):\n{output.decode()}")
    return output.decode()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_terminates_the_runs_and_records_them(blocking_sweep, no_leaked_processes, signum):
    root, config = blocking_sweep
    scheduler = launch(config)
    wait_until(lambda: started(root, "a-1,", "a-2,"), message="both blocking runs to start")
    scheduler.send_signal(signum)
    output = finish(scheduler)
    assert scheduler.returncode == -signum, output  # the signal's own exit status, as a shell expects
    assert f"received {signal.Signals(signum).name}" in output
    assert (
        "fails task" not in output and "stopped task a-1,sleep-600, (interrupted by" in output
    )  # no failure: it runs again
    rows = ledger_rows(root)
    assert rows["a-0,"]["status"] == "succeeded"
    for name in ("a-1,", "a-2,"):
        assert rows[name]["status"] == "interrupted"
        assert rows[name]["cause"] == f"interrupted by {signal.Signals(signum).name}"
        assert rows[name]["signal"] == "SIGTERM"
    assert not marked_pids(no_leaked_processes)


def test_a_second_ctrl_c_stops_at_once(in_tmp, no_leaked_processes):
    root = in_tmp / "r"
    config = make_config(
        root, [{"a": [1, 2]}], slots=("cpu", "cpu"), global_config={"ignore_term": True}, grace_period=600
    )
    scheduler = launch(config)
    wait_until(lambda: started(root, "a-1,", "a-2,"), message="both runs to start")
    scheduler.send_signal(signal.SIGINT)
    wait_until(lambda: "received SIGINT" in (root / "scheduler.log").read_text(), message="the first Ctrl-C")
    assert scheduler.poll() is None  # the runs ignore SIGTERM and the grace period is long
    scheduler.send_signal(signal.SIGINT)
    output = finish(scheduler, timeout=20)
    assert "received SIGINT again: killing 2 run(s) now" in output
    rows = ledger_rows(root)
    assert [(rows[n]["status"], rows[n]["signal"]) for n in ("a-1,", "a-2,")] == [("interrupted", "SIGKILL")] * 2
    assert not marked_pids(no_leaked_processes)


def test_sigkill_of_the_scheduler_kills_its_runs_and_a_restart_loses_nothing(
    blocking_sweep, no_leaked_processes, monkeypatch
):
    root, config = blocking_sweep
    journal = config["global_config"]["journal"]
    scheduler = launch(config)
    wait_until(lambda: started(root, "a-1,", "a-2,"), message="both blocking runs to start")
    scheduler.kill()
    finish(scheduler)
    wait_until(lambda: not marked_pids(no_leaked_processes), timeout=10, message="the orphaned runs to die")
    rows = ledger_rows(root)
    assert rows["a-0,"]["status"] == "succeeded"
    assert rows["a-1,"]["status"] == rows["a-2,"]["status"] == "running"

    monkeypatch.setenv("GTS_TEST_SLEEP", "0")
    summary = GPUTaskScheduler(config, tasks.BlockTask).start()
    assert summary.skipped == ["a-0,"]
    assert sorted(o.name for o in summary.succeeded) == ["a-1,", "a-2,"]
    lines = journal_lines(journal)
    assert [lines.count(f"end a-{i},") for i in range(3)] == [1, 1, 1]
    assert [lines.count(f"start a-{i},") for i in range(3)] == [1, 2, 2]
    rows = ledger_rows(root)
    assert [rows[f"a-{i},"]["status"] for i in range(3)] == ["succeeded"] * 3
    assert rows["a-1,"]["attempts"] == 2


def test_a_run_that_finished_just_before_the_scheduler_died_is_not_repeated(in_tmp):
    """The child records its own success; the ledger's 'running' is settled from it."""
    root, journal = in_tmp / "r", str(in_tmp / "journal")
    config = make_config(root, [{"a": [1]}], global_config={"journal": journal})
    GPUTaskScheduler(config, tasks.RecordTask).start()
    db_path = root / ".gts" / "ledger.sqlite3"
    import sqlite3

    db = sqlite3.connect(str(db_path))
    with db:  # as if the scheduler died after the child wrote its outcome, before recording it
        db.execute("UPDATE runs SET status = 'running', ended_at = NULL")
    db.close()
    summary = GPUTaskScheduler(config, tasks.RecordTask).start()
    assert summary.skipped == ["a-1,"]
    assert journal_lines(journal).count("end a-1,") == 1
    assert ledger_rows(root)["a-1,"]["status"] == "succeeded"


def test_a_task_class_in_main_does_not_rerun_the_main_block(in_tmp):
    script = in_tmp / "sweep.py"
    script.write_text(
        textwrap.dedent("""
        import sys
        from gpu_task_scheduler import GPUTask, GPUTaskScheduler

        HELPER = "defined at module level"

        class MainTask(GPUTask):
            def main(self):
                return {"module": __name__, "helper": HELPER, "lr": self._config["lr"]}

        if __name__ == "__main__":
            with open("main-block-runs", "a") as handle:
                handle.write("x")
            config = {"scheduler_config": {"gpu": ["cpu"], "scheduler_log_file_path": None},
                      "test_config": [{"lr": [0.1, 0.2]}]}
            summary = GPUTaskScheduler(config, MainTask).start()
            print(sorted((o.name, o.result["module"], o.result["helper"]) for o in summary.succeeded))
            sys.exit(summary.exit_code)
    """)
    )
    result = subprocess.run([sys.executable, str(script)], cwd=str(in_tmp), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (in_tmp / "main-block-runs").read_text() == "x"
    assert (
        "[('lr-0.1,', '__gts_main__', 'defined at module level'), "
        "('lr-0.2,', '__gts_main__', 'defined at module level')]"
    ) in result.stdout


def test_ctrl_c_kills_a_run_that_ignores_sigterm_after_the_grace_period(in_tmp, no_leaked_processes):
    root = in_tmp / "r"
    config = make_config(root, [{"a": [1]}], global_config={"ignore_term": True}, grace_period=1)
    scheduler = launch(config)
    wait_until(lambda: started(root, "a-1,"), message="the run to start")
    scheduler.send_signal(signal.SIGINT)
    output = finish(scheduler)
    assert scheduler.returncode == -signal.SIGINT
    assert "a-1, did not stop within 1s of SIGTERM; sending SIGKILL" in output
    row = ledger_rows(root)["a-1,"]
    assert (row["status"], row["signal"], row["cause"]) == ("interrupted", "SIGKILL", "interrupted by SIGINT")
    assert not marked_pids(no_leaked_processes)
