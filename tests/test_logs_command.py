"""`gts logs ROOT RUN [-f] [-n N]` and `gts logs ROOT --failed`, on real runs."""

import json
import subprocess
import sys

import pytest
from conftest import wait_until
from helpers import make_config
from test_process_control import SCRIPT, finish

from gpu_task_scheduler import GPUTaskScheduler
from gpu_task_scheduler.cli.main import main


@pytest.fixture
def finished_sweep(in_tmp):
    root = in_tmp / "r"
    config = make_config(root, [{"a": [1, 2, 13], "code": [0]}, {"a": [4], "code": [3]}])
    config["command"] = ["sh", "-c", 'for i in 1 2 3; do echo "$0 line $i"; done; exit $1', "{a}", "{code}"]
    config["scheduler_config"]["ignored_keys_for_folder_name"] = ["code"]
    GPUTaskScheduler(config).start()
    return root


def logs(capsysbinary, *argv):
    code = main(["logs", *map(str, argv)])
    out, err = capsysbinary.readouterr()
    return code, out.decode(), err.decode()


def test_a_runs_log_by_name_prefix_or_index_and_its_last_lines(finished_sweep, capsysbinary):
    root = finished_sweep
    assert logs(capsysbinary, root, "a-1,")[:2] == (0, "1 line 1\n1 line 2\n1 line 3\n")
    assert logs(capsysbinary, root, "a-2")[1] == "2 line 1\n2 line 2\n2 line 3\n"  # a unique prefix
    assert logs(capsysbinary, root, "3")[1] == "4 line 1\n4 line 2\n4 line 3\n"  # run index 3
    assert logs(capsysbinary, root, "a-13,", "-n", "2")[1] == "13 line 2\n13 line 3\n"
    assert logs(capsysbinary, root, "a-13,", "-n", "0")[1] == ""
    code, _, err = logs(capsysbinary, root, "a-1")  # a-1, and a-13,
    assert code == 2 and "'a-1' names 2 runs: a-1,, a-13,; give more of the name" in err
    code, _, err = logs(capsysbinary, root, "b-")
    assert code == 2 and "no run is named 'b-'" in err


def test_the_failed_runs_last_lines(finished_sweep, capsysbinary):
    code, out, _ = logs(capsysbinary, finished_sweep, "--failed", "-n", "1")
    assert code == 0 and out == "==> a-4,: failed (the command failed with exit code 3) <==\n4 line 3\n"


def test_following_a_live_run_prints_what_it_adds_and_ends_with_it(in_tmp):
    root, flag = in_tmp / "r", in_tmp / "go"
    config = make_config(root, [{"a": [1]}])
    config["command"] = ["sh", "-c", f'echo one; while [ ! -e "{flag}" ]; do sleep 0.02; done; echo two']
    sweep = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, json.dumps(config), "-"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    wait_until(
        lambda: (root / "a-1," / "worker.log").exists() and b"one" in (root / "a-1," / "worker.log").read_bytes(),
        message="the run's first line",
    )
    follower = subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler", "logs", str(root), "a-1,", "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    first = follower.stdout.readline()
    flag.write_text("")
    rest, err = follower.communicate(timeout=30)
    assert (first + rest).decode() == "one\ntwo\n" and follower.returncode == 0, err
    assert finish(sweep).count("Sweep summary") == 1 and sweep.returncode == 0


def test_logs_without_a_run_or_log_file_are_clear_errors(finished_sweep, capsysbinary, in_tmp):
    code, _, err = logs(capsysbinary, finished_sweep)
    assert code == 2 and "give a run" in err
    root = in_tmp / "nolog"
    config = make_config(root, [{"a": [1]}], log_file=None)
    config["command"] = ["true"]
    GPUTaskScheduler(config).start()
    code, _, err = logs(capsysbinary, root, "a-1,")
    assert code == 1 and "keep no log (log_file is null" in err


@pytest.mark.parametrize(
    "data, whole, last_two",
    [
        (b"a\nb\nc\n", b"a\nb\nc\n", b"b\nc\n"),  # nothing rewritten
        (b"epoch 1\n 10%\r 50%\r100%\ndone\n", b"epoch 1\n100%\ndone\n", b"100%\ndone\n"),  # a progress bar
        (b"one\r\ntwo\r\n", b"one\ntwo\n", b"one\ntwo\n"),  # CRLF ends a line
        (b"loading 100%\rok\n", b"okading 100%\n", b"okading 100%\n"),  # a shorter text leaves the rest
        (b" 1/3\r 2/3\r", b" 2/3", b" 2/3"),  # a bar still running: its state now
        ("\u00e9t\u00e9 10%\r\u00e9t\u00e9 20%\n".encode(), *["\u00e9t\u00e9 20%\n".encode()] * 2),
        (b"\xff\xfe 1\r\xff 2\n", b"\xff 21\n", b"\xff 21\n"),  # not UTF-8: byte for byte
    ],
    ids=["plain", "tqdm", "crlf", "shorter", "running", "utf-8", "not-utf-8"],
)
def test_a_line_rewritten_by_carriage_returns_is_shown_as_a_terminal_leaves_it(data, whole, last_two):
    from gpu_task_scheduler.records.logtext import last_lines, shown

    assert shown(data) == whole and last_lines(data, 2) == last_two and last_lines(data, 0) == b""


def test_logs_show_a_progress_bars_last_state_and_count_the_lines_a_terminal_shows(in_tmp, capsysbinary):
    """tqdm's updates of one epoch are one line of the terminal: ``gts logs -n 2`` gives the last two
    lines as they stood, the whole log likewise, and so do the failed runs' tails and the web view."""
    from gpu_task_scheduler.web.data import run_log

    root = in_tmp / "r"
    config = make_config(root, [{"code": [3]}])
    bars = "for e in 1 2 3; do printf 'epoch %s' $e; for p in 10 50 100; do printf '\\r epoch %s %3d%%' $e $p; done"
    bars += "; echo; done"
    config["command"] = ["sh", "-c", bars + "; exit $0", "{code}"]
    GPUTaskScheduler(config).start()
    assert logs(capsysbinary, root, "code-3,", "-n", "2")[1] == " epoch 2 100%\n epoch 3 100%\n"
    assert logs(capsysbinary, root, "code-3,")[1].count("\n") == 3 and "10%" not in logs(capsysbinary, root, "0")[1]
    assert logs(capsysbinary, root, "--failed", "-n", "1")[1].endswith("<==\n epoch 3 100%\n")
    assert run_log(str(root), "code-3,")["log"].splitlines()[-3:] == [" epoch 1 100%", " epoch 2 100%", " epoch 3 100%"]
