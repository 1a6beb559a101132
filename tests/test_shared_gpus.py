"""Several sweeps on one machine: GPU reservations shared through gpu/shared.py, on the fake NVML."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import fake_nvml
import gts_test_tasks as tasks
import pytest
from conftest import wait_until
from fake_nvml import write_state
from helpers import ledger_rows, make_config
from test_process_control import SCRIPT, finish

from gpu_task_scheduler import GPUTaskScheduler
from gpu_task_scheduler.gpu.shared import STARTING, Held, SharedReservations, _start_ticks

GB = 10**9


@pytest.fixture
def one_gpu(in_tmp, monkeypatch):
    path = in_tmp / "nvml.json"
    monkeypatch.setenv(fake_nvml.ENV, str(path))
    write_state(str(path), [{"name": "Fake H100 80GB", "total": 80 * GB}])
    return path


def sweep_config(root, ooms, *, runs, share=True, delay=1.5, hold=1.0, barrier=None):
    """Runs of 20 GB that load for ``delay`` seconds before they allocate: three fit on the GPU."""
    return make_config(
        root,
        [{"i": list(range(runs))}],
        slots=("0",),
        global_config={"alloc_gb": 20, "delay": delay, "hold": hold, "ooms": str(ooms), "barrier": barrier},
        gpu_memory="20GB",
        max_runs_per_gpu=8,
        max_oom_retries=0,
        gpu_poll_interval=0.2,
        share_gpu_reservations=share,
    )


def start_sweep(config):
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, json.dumps(config), "DelayedAllocTask"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def most_at_once(stop):
    """A thread noting the most runs that held memory on GPU 0 at one moment."""
    seen = [0]

    def watch():
        while not stop.is_set():
            with fake_nvml._locked() as state:
                held = sum(1 for p in state["gpus"][0]["processes"] if fake_nvml._alive(p["pid"]))
            seen[0] = max(seen[0], held)
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, seen


@pytest.mark.parametrize("sweeps", [2, 3])
def test_sweeps_started_together_share_one_gpu_without_running_out_of_memory(one_gpu, in_tmp, sweeps):
    ooms = in_tmp / "ooms"
    stop = threading.Event()
    watcher, seen = most_at_once(stop)
    processes = [start_sweep(sweep_config(in_tmp / f"r{n}", ooms, runs=4)) for n in range(sweeps)]
    outputs = [finish(p, timeout=120) for p in processes]
    stop.set()
    watcher.join()
    assert not ooms.exists(), ooms.read_text()
    assert [p.returncode for p in processes] == [0] * sweeps, outputs
    assert seen[0] == 3  # the GPU was kept full: never more than fit, and as many as fit
    assert any("reserved by other sweeps" in (in_tmp / f"r{n}" / "scheduler.log").read_text() for n in range(sweeps))


def test_without_sharing_the_same_sweeps_run_out_of_memory(one_gpu, in_tmp):
    """The control for the test above: what each scheduler's own reservations do not prevent."""
    ooms, barrier = in_tmp / "ooms", in_tmp / "barrier"
    roots = [in_tmp / f"r{n}" for n in range(2)]
    processes = [start_sweep(sweep_config(r, ooms, runs=3, share=False, delay=0, barrier=str(barrier))) for r in roots]
    # Each scheduler sees the whole GPU free and starts its three runs; only then do they allocate.
    wait_until(
        lambda: all((r / f"i-{i}," / "started").exists() for r in roots for i in range(3)),
        timeout=60,
        message="both sweeps' runs to start",
    )
    barrier.write_text("")
    for process in processes:
        finish(process, timeout=120)
    assert ooms.exists() and len(ooms.read_text().splitlines()) >= 2


def test_a_sweep_killed_with_sigkill_blocks_no_other(one_gpu, in_tmp, own_reservations_dir):
    ooms = in_tmp / "ooms"
    first = start_sweep(sweep_config(in_tmp / "a", ooms, runs=3, delay=60))
    wait_until(lambda: _published_runs(own_reservations_dir) == 3, message="the first sweep's reservations")
    first.send_signal(signal.SIGKILL)
    finish(first)
    began = time.monotonic()
    second = start_sweep(sweep_config(in_tmp / "b", ooms, runs=3, delay=0.1, hold=0.1))
    output = finish(second, timeout=60)
    assert second.returncode == 0, output
    assert time.monotonic() - began < 10  # no wait for the dead sweep's reservations
    assert "reserved by other sweeps" not in (in_tmp / "b" / "scheduler.log").read_text()
    assert not [n for n in os.listdir(own_reservations_dir) if n.endswith(".json")]  # its file was cleaned up


def _published_runs(folder):
    total = 0
    for name in os.listdir(folder) if folder.exists() else []:
        if name.endswith(".json"):
            with open(folder / name) as handle:
                total += sum(1 for r in json.load(handle)["reservations"] if r["pgid"] != STARTING)
    return total


# --- the record is everyone's input ------------------------------------------------------------


@pytest.fixture
def sleeper():
    """A live process of ours standing in for another scheduler (its pid and start time)."""
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def _record(process, **changes):
    record = {
        "version": 1,
        "host": os.uname().nodename,
        "pid": process.pid,
        "start": changes.pop("start", None) or _start_ticks(process.pid)[0],
        "uid": os.getuid(),
        "user": "someone",
        "root": "/elsewhere",
        "reservations": [{"gpu_uuid": "GPU-x", "reserved": 5 * GB, "pgid": os.getpgid(0), "run": "a-1,"}],
    }
    record.update(changes)
    return record


def test_another_schedulers_live_record_is_read(in_tmp, sleeper):
    shared = SharedReservations(str(in_tmp / "r"), directory=str(in_tmp / "d"))
    ticks = _start_ticks(os.getpid())[0]
    (in_tmp / "d" / "other.json").write_text(json.dumps(_record(sleeper)))
    (publisher,) = shared.others()
    assert publisher.pid == sleeper.pid and publisher.reservations == (Held("GPU-x", 5 * GB, os.getpgid(0), "a-1,"),)
    shared.publish([Held("GPU-y", GB, STARTING, "b-2,")])
    assert sorted(os.listdir(in_tmp / "d")) == sorted(["other.json", f"{os.getuid()}-{os.getpid()}-{ticks}.json"])
    shared.close()
    assert sorted(os.listdir(in_tmp / "d")) == ["other.json"]


@pytest.mark.parametrize(
    "plant",
    ["garbage", "wrong-types", "other-uid", "dead", "reused-pid", "other-host", "gone-group", "link", "fifo", "huge"],
)
def test_a_damaged_or_hostile_record_is_ignored_with_at_most_one_warning(in_tmp, sleeper, plant, caplog):
    folder = in_tmp / "d"
    shared = SharedReservations(str(in_tmp / "r"), directory=str(folder))
    target = folder / "x.json"
    outside = in_tmp / "outside.json"
    outside.write_text(json.dumps(_record(sleeper)))
    if plant == "garbage":
        target.write_bytes(b"\x00{not json")
    elif plant == "wrong-types":
        target.write_text(json.dumps(_record(sleeper, reservations=[{"gpu_uuid": 1, "reserved": "x"}])))
    elif plant == "other-uid":
        target.write_text(json.dumps(_record(sleeper, uid=os.getuid() + 1)))
    elif plant == "dead":
        target.write_text(json.dumps(_record(sleeper, pid=2**22 + 7)))
    elif plant == "reused-pid":
        target.write_text(json.dumps(_record(sleeper, start=1)))
    elif plant == "other-host":
        target.write_text(json.dumps(_record(sleeper, host="elsewhere")))
    elif plant == "gone-group":
        record = _record(sleeper)
        record["reservations"][0]["pgid"] = 2**22 + 9
        target.write_text(json.dumps(record))
    elif plant == "link":
        target.symlink_to(outside)
    elif plant == "fifo":
        os.mkfifo(target)
    elif plant == "huge":
        target.write_text(json.dumps(_record(sleeper, root="x" * (1 << 20))))
    for _ in range(2):
        found = shared.others()
        assert found == [] or (plant == "gone-group" and found[0].reservations == ())
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) <= 1
    assert outside.exists()
    shared.close()


def test_a_stale_record_of_our_own_user_is_removed(in_tmp):
    folder = in_tmp / "d"
    shared = SharedReservations(str(in_tmp / "r"), directory=str(folder))
    process = subprocess.Popen(["true"])
    process.wait()
    stale = folder / "stale.json"
    stale.write_text(json.dumps(_record(process, start=1)))
    assert shared.others() == [] and not stale.exists()
    shared.close()


def test_a_linked_directory_is_not_used(in_tmp, caplog):
    (in_tmp / "real").mkdir()
    (in_tmp / "d").symlink_to(in_tmp / "real")
    shared = SharedReservations(str(in_tmp / "r"), directory=str(in_tmp / "d"))
    assert shared.problem is not None and "not shared" in caplog.text
    shared.publish([Held("GPU-y", GB, STARTING, "b-2,")])
    assert shared.others() == [] and os.listdir(in_tmp / "real") == []
    shared.close()


# --- memory a run leaves held --------------------------------------------------------------------

DAEMONIZING = """
import os, sys, time
daemon, pidfile, gpu = int(sys.argv[1]), sys.argv[2], os.environ["CUDA_VISIBLE_DEVICES"]
if daemon:  # a server that leaves the run: its own session, a clean environment, init as its parent
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            env = {"PYTHONPATH": os.environ["PYTHONPATH"], "GTS_FAKE_NVML": os.environ["GTS_FAKE_NVML"]}
            code = "import fake_nvml, os, sys, time; fake_nvml.allocate(sys.argv[1], 10**10); "
            code += "open(sys.argv[2] + '.tmp', 'w').write(str(os.getpid())); "
            code += "os.rename(sys.argv[2] + '.tmp', sys.argv[2]); "
            code += "time.sleep(120)"
            os.execve(sys.executable, [sys.executable, "-c", code, gpu, pidfile], env)
        deadline = time.monotonic() + 30
        while not os.path.exists(pidfile) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(1.0)  # the scheduler's polls see the server while it is still the run's descendant
        os._exit(0)
    os.waitpid(middle, 0)
"""


def test_gpu_memory_a_run_leaves_held_is_reported_and_keeps_its_gpu_busy(one_gpu, in_tmp):
    script, pidfile, root = in_tmp / "daemonizing.py", in_tmp / "server.pid", in_tmp / "r"
    script.write_text(DAEMONIZING)
    config = make_config(root, [{"i": [0], "daemon": [1]}, {"i": [1], "daemon": [0]}], slots=("0",))
    config["scheduler_config"].update(gpu_poll_interval=0.1, ignored_keys_for_folder_name=["daemon"])
    config["command"] = [sys.executable, str(script), "{daemon}", str(pidfile)]
    scheduler = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, json.dumps(config), "-"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    server = None
    try:
        wait_until(lambda: "still held by pid" in _text(root / "scheduler.log"), message="the GPU to be held")
        server = int(pidfile.read_text())
        assert f"still hold GPU memory: pid {server} holds 9.3 GiB on gpu 0" in _text(root / "scheduler.log")
        assert not (root / "i-1,").exists()  # the next run waits for the GPU
        os.kill(server, signal.SIGKILL)
        killed_at = time.time()
        output = finish(scheduler, timeout=60)
    finally:
        if server is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server, signal.SIGKILL)
        if scheduler.poll() is None:
            scheduler.kill()
            scheduler.communicate()
    assert scheduler.returncode == 0, output
    rows = ledger_rows(root)
    assert (
        rows["i-0,"]["status"] == "succeeded" and rows["i-0,"]["gpu_leftover"] == f"pid {server} holds 9.3 GiB on gpu 0"
    )
    assert rows["i-1,"]["status"] == "succeeded" and rows["i-1,"]["started_at"] >= killed_at
    assert f"left GPU memory held: {root / 'i-0,'} (pid {server} holds 9.3 GiB on gpu 0)" in output


def _text(path):
    return path.read_text() if path.exists() else ""


def test_an_idle_process_holding_the_memory_a_run_waits_for_is_named(one_gpu, in_tmp, sleeper):
    fake_nvml.set_gpu(0, processes=[{"pid": sleeper.pid, "used": 70 * GB}], utilization=0)
    root = in_tmp / "r"
    config = make_config(
        root,
        [{"i": [0]}],
        slots=("0",),
        global_config={"alloc_gb": 1, "hold": 0},
        gpu_memory="20GB",
        gpu_poll_interval=0.05,
        idle_holder_after=0.2,
    )
    named = f"idle processes holding memory: pid {sleeper.pid} (root) has held 65.2 GiB on gpu 0 at 0% utilisation"

    def free_when_named():
        wait_until(lambda: named in _text(root / "scheduler.log"), message="the idle process to be named")
        fake_nvml.set_gpu(0, processes=[])

    clearing = threading.Thread(target=free_when_named)
    clearing.start()
    summary = GPUTaskScheduler(config, tasks.FakeGpuTask, nvml=fake_nvml).start()
    clearing.join()
    assert summary.ok and len(summary.succeeded) == 1
    log = _text(root / "scheduler.log")
    assert log.count(named) == 1  # said once, not at every poll


def test_gts_gpus_shows_memory_sweeps_reservations_and_other_users(
    one_gpu, in_tmp, sleeper, own_reservations_dir, capsys
):
    from gpu_task_scheduler.cli.main import main

    fake_nvml.set_gpu(0, processes=[{"pid": sleeper.pid, "used": 5 * GB}], utilization=7)
    root = in_tmp / "r"
    sweep = start_sweep(sweep_config(root, in_tmp / "ooms", runs=2, delay=60))
    try:
        wait_until(lambda: _published_runs(own_reservations_dir) == 2, message="the sweep's reservations")
        assert main(["gpus", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert main(["gpus"]) == 0
        text = capsys.readouterr().out
    finally:
        sweep.send_signal(signal.SIGTERM)
        finish(sweep)
    (gpu,) = report["gpus"]
    assert (gpu["memory_total"], gpu["memory_used"], gpu["utilization"]) == (80 * GB, 5 * GB, 7)
    assert gpu["reserved_not_allocated"] == 40 * GB
    assert gpu["processes"] == [{"pid": sleeper.pid, "user": "root", "used_memory": 5 * GB, "sweep": None}]
    (published,) = report["sweeps"]
    assert published["pid"] == sweep.pid and published["root"] == str(root)
    assert sorted(r["run"] for r in published["reservations"]) == ["i-0,", "i-1,"]
    assert "reserved by sweeps, not allocated yet: 37.3 GiB" in text
    assert f"pid {sleeper.pid}" in text and f"scheduler pid {sweep.pid} (root) in {root}: 2 reservation(s)" in text
