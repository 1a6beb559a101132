"""`gts status ROOT --watch` on a terminal (a pty), from another process than the running sweep."""

import json
import os
import pty
import select
import subprocess
import sys
import time

import fake_nvml
from conftest import wait_until
from fake_nvml import write_state
from helpers import make_config
from test_process_control import SCRIPT, finish

from gpu_task_scheduler import GPUTaskScheduler
from gpu_task_scheduler.cli.main import main


def read_until(fd, wanted, seen, timeout=30):
    """Read the terminal into ``seen`` (a bytearray) until ``wanted`` is in it."""
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        if time.monotonic() > deadline:
            raise AssertionError(f"{wanted!r} not shown in {timeout}s; the terminal had:\n{seen.decode()}")
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:  # the watcher ended: its end of the pty is closed
                raise AssertionError(f"{wanted!r} never shown; the terminal had:\n{seen.decode()}") from None
    return seen


def test_watch_redraws_the_running_sweep_and_ends_with_it(in_tmp, monkeypatch):
    path = in_tmp / "nvml.json"
    monkeypatch.setenv(fake_nvml.ENV, str(path))
    write_state(str(path), [{"name": "Fake H100 80GB", "total": 80 * 10**9}])
    root, barrier = in_tmp / "r", in_tmp / "barrier"
    config = make_config(
        root, [{"i": [0, 1]}], slots=("0",), global_config={"alloc_gb": 10, "hold": 0, "barrier": str(barrier)}
    )
    sweep = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, json.dumps(config), "FakeGpuTask"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    wait_until(lambda: (root / ".gts" / "ledger.sqlite3").exists(), message="the sweep to start")
    master, slave = pty.openpty()
    watcher = subprocess.Popen(
        [sys.executable, "-m", "gpu_task_scheduler", "status", str(root), "--watch"], stdout=slave, stderr=slave
    )
    os.close(slave)
    seen = bytearray()
    try:
        read_until(master, b"9.3 GiB GPU memory", seen)  # the run on gpu0, with what it holds
        assert b"gpu0" in seen and b"i-0," in seen and b"\x1b[H\x1b[2J" in seen  # redrawn in place
        barrier.write_text("")
        read_until(master, b"no scheduler is running on this root", seen)
        assert watcher.wait(timeout=30) == 0
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
        os.close(master)
        barrier.write_text("")
        output = finish(sweep)
    assert sweep.returncode == 0, output
    assert b"2 succeeded" in seen


def test_status_shows_the_failure_cause_and_the_gpu_memory_peak(in_tmp, capsys):
    root = in_tmp / "r"
    config = make_config(root, [{"a": [1, 2]}])
    config["command"] = ["sh", "-c", "exit $0", "{a}"]
    config["test_config"] = [{"a": [0, 4]}]
    GPUTaskScheduler(config).start()
    assert main(["status", str(root)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("name"))
    assert "gpu peak" in header and "cause" in header
    assert "the command failed with exit code 4" in out


def test_watch_names_the_machine_of_a_run_on_ray_instead_of_this_machines_gpu_memory():
    from gpu_task_scheduler.reports.status import watch_view

    run = {"status": "running", "slot": "gpu0", "name": "lr-0.1,", "duration": 5.0, "pid": 4242, "cause": None}
    report = {"root": "/r", "counts": {"running": 2}, "scheduler": {"running": True, "waiting": None}}
    report["runs"] = [{**run, "node": "10.0.0.7/3f2a9c1e"}, {**run, "slot": "gpu1", "name": "lr-0.2,", "node": None}]
    assert watch_view(report, {4242: 3 * 2**30}).splitlines()[1:] == [
        "  gpu0     lr-0.1,  0:00:05  on 10.0.0.7/3f2a9c1e",  # its pid 4242 is on that machine, not this one's
        "  gpu1     lr-0.2,  0:00:05  3.0 GiB GPU memory",
    ]


def test_status_and_its_json_show_the_latest_metrics_of_running_runs(in_tmp, capsys):
    """Not only --watch: a run's metrics reach the ledger at its end, so a running run's are read
    from the end of its own file. A dry run beside the sweep says that it runs."""
    root, go = in_tmp / "r", in_tmp / "go"
    config = make_config(root, [{"a": [1]}])
    config["command"] = [
        "sh",
        "-c",
        'echo "{{\\"step\\": 3, \\"loss\\": 0.25}}" >> "$GTS_METRICS_FILE"; while [ ! -e "$0" ]; do sleep 0.05; done',
        str(go),
    ]
    sweep = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, json.dumps(config), "-"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        wait_until(
            lambda: (
                (root / "a-1," / ".gts" / "metrics.jsonl").exists()
                and (root / "a-1," / ".gts" / "metrics.jsonl").read_text().endswith("\n")
            ),
            message="the run to report",
        )
        assert sweep.poll() is None
        assert main(["status", str(root)]) == 0
        out = capsys.readouterr().out
        row = next(line for line in out.splitlines() if line.startswith("a-1,"))
        assert "running" in row and "loss 0.25 @ step 3" in row, out
        assert main(["status", str(root), "--json"]) == 0
        (run,) = json.loads(capsys.readouterr().out)["runs"]
        assert run["status"] == "running" and run["metrics"] == {"loss": {"last": 0.25, "step": 3}}
        (in_tmp / "sweep.json").write_text(json.dumps(config))  # a dry run beside it says that it runs
        assert main(["run", str(in_tmp / "sweep.json"), "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert f"a scheduler is running on {root} now (pid {sweep.pid}" in out, out
        assert "a start is refused until it ends" in out
    finally:
        go.write_text("")
        output = finish(sweep)
    assert sweep.returncode == 0, output
