"""Every process a run starts ends with it; the root stays locked while any does; a returned
main() is recorded whatever signal comes."""

import os
import shlex
import signal
import subprocess
import sys

import gts_test_tasks as tasks
import pytest
from conftest import wait_until
from helpers import ledger_rows, make_config
from test_process_control import finish, launch, started

from gpu_task_scheduler import GPUTaskScheduler, RunStatus, SchedulerBusyError


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def stopped(pid):
    """Every thread of ``pid`` is stopped (state T)."""
    states = []
    for thread in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{thread}/stat", "rb") as handle:
                states.append(handle.read().rsplit(b")", 1)[1].split()[0])
        except OSError:
            continue
    return bool(states) and all(state == b"T" for state in states)


def escapee(root, name):
    return int((root / name / "escapee.pid").read_text())


HOWS = ["setpgrp", "daemon", "daemon-noenv"]


@pytest.mark.parametrize("how", HOWS)
def test_processes_that_leave_the_group_end_with_a_run_that_returns(in_tmp, how):
    root = in_tmp / "r"
    summary = GPUTaskScheduler(make_config(root, [{"how": [how]}]), tasks.EscapeTask).start()
    assert summary.ok
    pid = escapee(root, f"how-{how},")
    assert not alive(pid)
    report = (root / f"how-{how}," / "worker.log").read_text()
    assert "outside its process group: pid" in report and str(pid) in report.split("pid", 1)[1]


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL", "timeout"])
def test_processes_that_leave_the_group_end_when_the_run_is_stopped(in_tmp, how, stop):
    root = in_tmp / "r"
    options = {"grace_period": 5}
    if stop == "timeout":
        options["timeout"] = 2
    scheduler = launch(make_config(root, [{"how": [how], "hang": [True]}], **options), "EscapeTask")
    name = f"hang-True,how-{how},"
    wait_until(lambda: started(root, name), message="the run and its escapee to start")
    pid = escapee(root, name)
    if stop != "timeout":
        scheduler.send_signal(getattr(signal, stop))
    finish(scheduler)
    wait_until(lambda: not alive(pid), timeout=10, message=f"the escaped process {pid} to end")
    if stop == "SIGKILL":  # a restart finds nothing running and runs it again
        assert ledger_rows(root)[name]["status"] == "running"
    else:
        assert ledger_rows(root)[name]["status"] == ("timed_out" if stop == "timeout" else "interrupted")


def test_the_root_stays_locked_while_a_run_of_a_killed_scheduler_lives_and_a_restart_stops_it(in_tmp):
    root = in_tmp / "r"
    config = make_config(root, [{"a": [1]}], global_config={"journal": str(in_tmp / "journal")})
    first = launch(config, "BlockTask")
    wait_until(lambda: started(root, "a-1,"), message="the run to start")
    run_pid = int((root / "a-1," / "started").read_text())
    os.kill(run_pid, signal.SIGSTOP)  # its lifeline cannot act: it outlives its scheduler
    # SIGSTOP is not synchronous: until every thread has stopped, the lifeline thread could still
    # wake when the scheduler dies and end the run (seen once on a loaded machine).
    wait_until(lambda: stopped(run_pid), message=f"every thread of {run_pid} to be stopped")
    try:
        first.kill()
        finish(first)
        assert alive(run_pid)
        os.environ["GTS_TEST_SLEEP"] = "0"
        summary = GPUTaskScheduler(config, tasks.BlockTask).start()
    finally:
        os.environ.pop("GTS_TEST_SLEEP", None)
        if alive(run_pid):
            os.kill(run_pid, signal.SIGKILL)
    assert summary.ok
    assert not alive(run_pid)  # stopped before the run started again
    assert (in_tmp / "journal").read_text().splitlines() == ["start a-1,", "start a-1,", "end a-1,"]


def test_deleting_the_records_mid_sweep_does_not_free_the_root(in_tmp):
    root = in_tmp / "r"
    config = make_config(root, [{"a": [1]}], scheduler_log_file_path=None)
    first = launch(config, "BlockTask")
    try:
        wait_until(lambda: started(root, "a-1,"), message="the run to start")
        subprocess.run(["rm", "-rf", str(root / ".gts")], check=True)
        with pytest.raises(SchedulerBusyError):
            GPUTaskScheduler(config, tasks.BlockTask).start()
    finally:
        first.send_signal(signal.SIGTERM)
        finish(first)


def test_a_signal_while_the_outcome_is_recorded_does_not_undo_the_run(in_tmp):
    root = in_tmp / "r"
    summary = GPUTaskScheduler(make_config(root, [{"a": [1]}]), tasks.SignalledWhileRecordedTask).start()
    outcome = summary.outcomes["a-1,"]
    assert outcome.status is RunStatus.SUCCEEDED, outcome
    assert outcome.result == {"value": "slow"}


def test_the_window_after_main_returns_is_recognised():
    from gpu_task_scheduler.backends.local import runner

    class Frame:
        f_code = runner._call_main.__code__
        f_lasti = runner._AFTER_MAIN + 2

    assert runner._main_has_returned(Frame)
    Frame.f_lasti = runner._AFTER_MAIN
    assert not runner._main_has_returned(Frame)


TRAP = 'trap \'sleep 1; echo saved > "$0/checkpoint"; exit 0\' TERM; echo > "$0/started"; while :; do sleep 0.05; done'


@pytest.mark.parametrize("how", ["run", "queue"])
def test_a_command_gets_its_grace_period_to_save_a_checkpoint(in_tmp, how):
    root = in_tmp / "r"
    if how == "run":
        (in_tmp / "sweep.yaml").write_text(
            f"scheduler_config: {{gpu: [cpu], result_root_folder: {root}, grace_period: 20}}\n"
            "test_config: [{a: [1]}]\n"
            f"command: [sh, -c, '{TRAP.replace(chr(39), chr(39) * 2)}', '{{work_dir}}']\n"
        )
        argv = ["run", str(in_tmp / "sweep.yaml"), "--plain"]
        folder = root / "a-1,"
    else:
        argv = ["queue", "--gpus", "cpu", "--log-dir", str(root), "--grace-period", "20"]
        folder = in_tmp
    process = subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler", *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=in_tmp,
    )
    if how == "queue":
        process.stdin.write(f"sh -c {shlex.quote(TRAP)} {shlex.quote(str(in_tmp))}\n".encode())
    process.stdin.close()
    process.stdin = None  # read to its end: the queue ends when its one command does
    wait_until(lambda: (folder / "started").exists(), message="the command to start")
    process.send_signal(signal.SIGTERM)
    output = finish(process)
    assert (folder / "checkpoint").read_text() == "saved\n", output
    assert process.returncode == 130 if how == "queue" else process.returncode in (130, -signal.SIGTERM), output


@pytest.mark.parametrize("how", ["close", "exec"])
def test_a_run_that_lost_its_lifeline_still_dies_with_its_scheduler(in_tmp, how):
    root = in_tmp / "r"
    scheduler = launch(make_config(root, [{"how": [how]}]), "LifelineLossTask")
    name = f"how-{how},"
    wait_until(lambda: started(root, name), message="the run to start")
    pid = int((root / name / "started").read_text())
    wait_until(lambda: how != "exec" or open(f"/proc/{pid}/comm").read().strip() == "sleep", message="the exec")
    scheduler.kill()
    finish(scheduler)
    wait_until(lambda: not alive(pid), timeout=10, message=f"the run {pid} to die with its scheduler")


def test_a_python_runs_own_subprocesses_die_with_a_sigkilled_scheduler(in_tmp, no_leaked_processes):
    root = in_tmp / "r"
    scheduler = launch(make_config(root, [{"hang": [True]}]), "GrandchildTask")
    pid_file = root / "hang-True," / "grandchild.pid"
    wait_until(pid_file.exists, message="the grandchild to start")
    grandchild = int(pid_file.read_text())
    scheduler.kill()
    finish(scheduler)
    wait_until(lambda: not alive(grandchild), timeout=10, message="the run's subprocess to die with its scheduler")
