"""Stopping from the terminal, exit codes, a late look at a deadline, resuming a queue, safe output."""

import json
import signal
import subprocess
import sys

import pytest
from conftest import wait_until
from helpers import ledger_rows, make_config
from test_process_control import finish, launch, started

from gpu_task_scheduler.cli.main import main as gts


def _gts(*argv, cwd, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler", *argv],
        cwd=cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **kwargs,
    )


def test_sighup_stops_the_sweep_gracefully(in_tmp, no_leaked_processes):
    root = in_tmp / "r"
    scheduler = launch(make_config(root, [{"a": [1]}], grace_period=5), "BlockTask")
    wait_until(lambda: started(root, "a-1,"), message="the run to start")
    scheduler.send_signal(signal.SIGHUP)
    output = finish(scheduler)
    assert scheduler.returncode == -signal.SIGHUP, output
    assert ledger_rows(root)["a-1,"]["status"] == "interrupted"
    assert "interrupted by SIGHUP" in output


def test_a_sweep_started_with_sighup_ignored_outlives_it(in_tmp, no_leaked_processes):
    """``nohup``: SIGHUP comes ignored, and stays so (the sweep took it over, and stopped when the
    terminal closed); SIGTERM still stops it, gracefully."""
    root = in_tmp / "r"
    ignored = lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)  # noqa: E731 - as nohup starts it
    scheduler = launch(make_config(root, [{"a": [1]}], grace_period=5), "BlockTask", preexec_fn=ignored)
    wait_until(lambda: started(root, "a-1,"), message="the run to start")
    scheduler.send_signal(signal.SIGHUP)
    with pytest.raises(subprocess.TimeoutExpired):
        scheduler.wait(timeout=2)  # nothing that could be waited on would say it did not stop
    assert ledger_rows(root)["a-1,"]["status"] == "running"
    scheduler.send_signal(signal.SIGTERM)
    output = finish(scheduler)
    assert scheduler.returncode == -signal.SIGTERM, output
    assert ledger_rows(root)["a-1,"]["status"] == "interrupted" and "SIGHUP" not in output, output


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_gts_run_exits_130_when_stopped(in_tmp, signum):
    (in_tmp / "s.yaml").write_text(
        f"scheduler_config: {{gpu: [cpu], result_root_folder: {in_tmp / 'r'}}}\n"
        "test_config: [{a: [1]}]\n"
        "command: [sh, -c, 'echo > {work_dir}/started; exec sleep 60']\n"
    )
    process = _gts("run", "s.yaml", "--plain", cwd=in_tmp)
    wait_until(lambda: (in_tmp / "r" / "a-1," / "started").exists(), message="the run to start")
    process.send_signal(signum)
    output = finish(process)
    assert process.returncode == 130, output
    assert output.count("Sweep summary") == 1


def test_queue_resume_skips_lines_that_succeeded(in_tmp):
    lines = "echo one >> out\nexit 3\necho three >> out\n"
    first = _gts("queue", "--gpus", "cpu", "--log-dir", "q", cwd=in_tmp)
    assert first.communicate(lines.encode(), timeout=60) and first.returncode == 1
    again = _gts("queue", "--gpus", "cpu", "--log-dir", "q", "--resume", cwd=in_tmp)
    output = again.communicate(lines.replace("exit 3", "echo two >> out").encode(), timeout=60)[0].decode()
    assert again.returncode == 0, output
    assert (in_tmp / "out").read_text() == "one\nthree\ntwo\n"  # only the changed line ran again
    assert "2 skipped" in output


def test_results_escape_control_characters_on_a_terminal(in_tmp, capsys, monkeypatch):
    config = make_config(in_tmp / "r", [{"v": ["\x1b]0;owned\x07", "plain"]}], scheduler_log_file_path=None)
    config["command"] = ["true"]
    from gpu_task_scheduler import GPUTaskScheduler

    assert GPUTaskScheduler(config).start().ok
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert gts(["results", str(in_tmp / "r")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b]0;owned\\x07" in out
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert gts(["results", str(in_tmp / "r"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["v"] == "\x1b]0;owned\x07"  # data stays exact


def test_status_tells_runs_of_a_killed_scheduler_from_running_ones(in_tmp, capsys):
    root = in_tmp / "r"
    scheduler = launch(make_config(root, [{"a": [1]}]), "BlockTask")
    wait_until(lambda: started(root, "a-1,"), message="the run to start")
    assert gts(["status", str(root), "--json"]) == 0
    live = json.loads(capsys.readouterr().out)
    assert live["scheduler"]["running"] is True and live["runs"][0]["status"] == "running"
    scheduler.kill()
    finish(scheduler)
    assert gts(["status", str(root), "--json"]) == 0
    dead = json.loads(capsys.readouterr().out)
    assert dead["scheduler"]["running"] is False and dead["counts"]["running"] == 0
    assert dead["counts"]["stale"] == 1
    (run,) = dead["runs"]
    assert run["status"] == "stale" and run["duration"] is None and "nothing runs it" in run["cause"]
    assert gts(["status", str(root)]) == 0
    text = capsys.readouterr().out
    assert "no scheduler is running" in text and "stale" in text


def test_status_of_a_folder_that_is_no_result_root_is_a_usage_error(in_tmp, capsys):
    assert gts(["status", str(in_tmp / "missing")]) == 2
    assert f"{str(in_tmp / 'missing')!r} does not exist." in capsys.readouterr().err
    assert gts(["results", str(in_tmp)]) == 2
    assert "is not a result root" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["status"], ["results"], ["plot", "--timeline", "-o", "x.png"], ["logs", "--failed"], ["report", "-o", "r.html"]],
)
def test_a_missing_root_is_said_not_to_exist_with_the_folder_it_may_mean(in_tmp, monkeypatch, capsys, argv):
    (in_tmp / "results").mkdir()
    monkeypatch.chdir(in_tmp)
    assert gts([argv[0], "reslts", *argv[1:]]) == 2
    assert "'reslts' does not exist; did you mean 'results'?" in capsys.readouterr().err
    assert gts([argv[0], "reslts/demo", *argv[1:]]) == 2  # the first folder that is missing is the one meant
    assert "'reslts/demo' does not exist; did you mean 'results/demo'?" in capsys.readouterr().err
    assert gts(["stop", "nowhere"]) == 2
    assert "nowhere does not exist" in capsys.readouterr().err


def test_a_resumed_sweep_says_once_on_the_console_what_it_skipped(in_tmp):
    (in_tmp / "s.yaml").write_text(
        f"scheduler_config: {{gpu: [cpu], result_root_folder: {in_tmp / 'r'}}}\n"
        "test_config: [{a: [1, 2, 3, 4, 5]}]\ncommand: [echo, '{a}']\n"
    )
    argv = [sys.executable, "-m", "gpu_task_scheduler", "run", "s.yaml", "--plain"]
    first = subprocess.run(argv, cwd=in_tmp, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0
    again = subprocess.run(argv, cwd=in_tmp, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0
    assert "skips task" not in again.stderr and "receives task" not in again.stderr
    assert again.stderr.count("skipped 5 runs: 5 because they succeeded before") == 1
    assert " finished" not in again.stderr  # its slots ran nothing: none finished anything
    log = (in_tmp / "r" / "scheduler.log").read_text()  # gts run logs into the result root
    assert log.count("cpu0 skips task a-3,") == 1 and log.count("cpu0 receives task a-3,") == 2


@pytest.mark.parametrize(
    "argv,slots",
    [
        (["--gpus", "0,1,2"], ["0", "1", "2"]),  # simple-gpu-scheduler's meaning: three GPUs, a slot each
        (["--gpus", "0", "1", "2"], ["0", "1", "2"]),
        (["--gpus", "0+1", "2+3"], ["0,1", "2,3"]),
        (["--gpus", "0,1+2"], ["0", "1,2"]),
    ],
)
def test_gpus_on_the_command_line_as_simple_gpu_scheduler_means_them(in_tmp, argv, slots):
    (in_tmp / "s.yaml").write_text(
        "scheduler_config: {gpu: [cpu], scheduler_log_file_path: null}\ntest_config: [{a: [1]}]\ncommand: ['true']\n"
    )
    from gpu_task_scheduler import ConfigManager
    from gpu_task_scheduler.cli.commands.run import _config_among_gpus, _run_config
    from gpu_task_scheduler.cli.main import build_parser

    args = build_parser().parse_args(["run", "s.yaml", *argv, "--dry-run"])
    _config_among_gpus(args)
    envs = ConfigManager(_run_config(args)).get_gpu_envs()
    assert [env["env"]["CUDA_VISIBLE_DEVICES"] for env in envs] == slots


def test_the_config_file_may_come_after_gpus(in_tmp, capsys):
    (in_tmp / "s.yaml").write_text(
        "scheduler_config: {gpu: [0], scheduler_log_file_path: null}\ntest_config: [{a: [1, 2]}]\ncommand: ['true']\n"
    )
    assert gts(["run", "--gpus", "cpu", "cpu", "s.yaml", "--plain"]) == 0
    assert gts(["run", "--gpus", "cpu", "cpu"]) == 2
    assert "needs a config file" in capsys.readouterr().err


def test_a_level_the_application_set_on_our_logger_is_kept(in_tmp, caplog):
    import logging

    from gpu_task_scheduler import GPUTaskScheduler

    ours = logging.getLogger("gpu_task_scheduler")
    ours.setLevel(logging.WARNING)
    try:
        config = make_config(in_tmp / "r", [{"a": [1]}], scheduler_log_file_path=None)
        config["command"] = ["true"]
        with caplog.at_level(logging.DEBUG):  # the root accepts everything: only our level can hold INFO back
            ours.setLevel(logging.WARNING)
            assert GPUTaskScheduler(config).start().ok
        assert not [r for r in caplog.records if r.name == "gpu_task_scheduler" and r.levelno < logging.WARNING]
        assert ours.level == logging.WARNING
    finally:
        ours.setLevel(logging.NOTSET)
