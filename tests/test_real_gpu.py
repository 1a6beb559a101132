"""The real NVML path on a real GPU: discovery, memory, per-process usage, runs pinned by
``CUDA_VISIBLE_DEVICES``, memory packing and out-of-memory recognition with PyTorch.

Every other GPU test uses the fake NVML; these run only where NVML finds a GPU and PyTorch can
use it (all are skipped elsewhere, e.g. in CI), and they never change a GPU's settings.
"""

import subprocess
import sys
import textwrap
import time

import gts_gpu_tasks as tasks
import pytest
from conftest import wait_until
from helpers import ledger_rows, make_config

from gpu_task_scheduler import GPUTaskScheduler
from gpu_task_scheduler.gpu.nvml import GpuMonitor, NvmlUnavailable

GIB = 2**30


try:
    import pynvml  # the real bindings (the rest of the suite uses the fake: see conftest.py)
except ImportError:
    pynvml = None


def _real_gpus():
    try:
        with GpuMonitor(pynvml) as monitor:
            return monitor.all()
    except NvmlUnavailable:
        return []


GPUS = _real_gpus() if pynvml is not None else []


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


TORCH_CUDA = bool(GPUS) and _torch_cuda()  # torch is imported only where there is a GPU

pytestmark = pytest.mark.skipif(not GPUS, reason="no GPU that NVML can see")
needs_torch = pytest.mark.skipif(not TORCH_CUDA, reason="PyTorch with CUDA is not installed")


def test_discovery_and_memory_through_real_nvml():
    first = GPUS[0]
    assert first.index == 0 and first.uuid.startswith("GPU-") and first.name
    assert first.total_memory > 0 and 0 <= first.free_memory <= first.total_memory
    assert first.used_memory <= first.total_memory
    with GpuMonitor(pynvml) as monitor:
        by_uuid = monitor.state(first.uuid)
    assert (by_uuid.uuid, by_uuid.name, by_uuid.total_memory) == (first.uuid, first.name, first.total_memory)
    for gpu in GPUS:
        print(
            f"gpu {gpu.index}: {gpu.name} {gpu.uuid} total {gpu.total_memory / GIB:.1f} GiB, "
            f"free {gpu.free_memory / GIB:.1f} GiB, utilisation {gpu.utilization} %, {len(gpu.processes)} processes"
        )


@needs_torch
def test_a_process_holding_memory_is_seen_with_its_pid_and_usage():
    holder = textwrap.dedent(
        """
        import sys, torch
        block = torch.ones(3 * 2**30, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        print("ready", flush=True)
        sys.stdin.read()
        """
    )
    child = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with GpuMonitor(pynvml) as monitor:
            state = monitor.state("0")
        usage = {process.pid: process.used_memory for process in state.processes}
        print(f"processes on gpu 0: {usage}; free {state.free_memory / GIB:.1f} GiB")
        assert child.pid in usage, f"NVML does not list pid {child.pid} (pid namespace?): {usage}"
        assert usage[child.pid] is None or usage[child.pid] >= 3 * GIB
        assert state.used_memory >= 3 * GIB
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    with GpuMonitor(pynvml) as monitor:
        wait_until(lambda: child.pid not in {p.pid for p in monitor.state("0").processes}, message="memory released")


@needs_torch
def test_runs_packed_on_one_gpu_by_memory_see_only_their_gpu(in_tmp):
    marks = in_tmp / "marks"
    marks.mkdir()
    root = in_tmp / "r"
    config = make_config(
        root,
        [{"i": [0, 1, 2, 3]}],
        slots=("0",),
        global_config={"alloc_gib": 2, "together": 4, "marks": str(marks)},
        max_runs_per_gpu=4,
        gpu_memory="4GiB",
        gpu_poll_interval=0.2,
    )
    summary = GPUTaskScheduler(config, tasks.TorchTask, nvml=pynvml).start()
    assert summary.ok and len(summary.succeeded) == 4
    results = [outcome.result for outcome in summary.succeeded]
    assert {r["held_together"] for r in results} == {4}  # all four held their memory on the GPU at once
    assert {(r["visible"], r["devices"], r["uuid"]) for r in results} == {("0", 1, GPUS[0].uuid)}
    assert {r["sum"] for r in results} == {1024}
    peaks = [row["gpu_memory_peak"] for row in ledger_rows(root).values()]
    print(f"peaks seen by the scheduler (GiB): {[round(p / GIB, 2) if p else None for p in peaks]}")
    # 2 GiB of data plus the CUDA context, measured per process while the runs held it.
    assert all(p is not None and 2 * GIB <= p < 4 * GIB for p in peaks)


@needs_torch
def test_a_gpu_named_by_uuid_is_the_one_the_run_sees(in_tmp):
    marks = in_tmp / "marks"
    marks.mkdir()
    config = make_config(
        in_tmp / "r", [{"i": [0]}], slots=(GPUS[-1].uuid,), global_config={"alloc_gib": 1, "marks": str(marks)}
    )
    (outcome,) = GPUTaskScheduler(config, tasks.TorchTask, nvml=pynvml).start().succeeded
    assert outcome.result["visible"] == GPUS[-1].uuid and outcome.result["uuid"] == GPUS[-1].uuid
    assert outcome.result["devices"] == 1


@needs_torch
def test_pytorch_out_of_memory_is_recognised(in_tmp):
    need = 4 * GPUS[0].total_memory / GIB  # cudaMalloc refuses at once: nothing is allocated
    config = make_config(in_tmp / "r", [{"i": [0]}], slots=("0",), global_config={"alloc_gib": need}, max_oom_retries=0)
    (failed,) = GPUTaskScheduler(config, tasks.OutOfMemoryTask, nvml=pynvml).start().failed
    assert failed.cause.startswith("GPU out of memory"), failed.cause


@needs_torch
@pytest.mark.parametrize("prewarm", [True, False])
def test_short_pytorch_runs_warm_or_fresh_leave_no_memory_held(in_tmp, prewarm):
    import statistics

    import gts_torch_module

    config = make_config(in_tmp / "r", [{"i": list(range(8))}], slots=("0",), global_config={"alloc_gib": 1})
    config["scheduler_config"]["prewarm"] = prewarm
    summary = GPUTaskScheduler(config, gts_torch_module.ShortTorchTask, nvml=pynvml).start()
    assert summary.ok and len(summary.succeeded) == 8
    runs = sorted((o.result for o in summary.succeeded), key=lambda r: r["started"])
    assert {r["sum"] for r in runs} == {1024} and len({r["pid"] for r in runs}) == 8
    gaps = [later["started"] - earlier["ended"] for earlier, later in zip(runs, runs[1:], strict=False)]
    relaunch = []
    for _ in range(3):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        relaunch.append(time.perf_counter() - began)
    print(
        f"prewarm={prewarm}: median idle gap between short PyTorch runs {statistics.median(gaps) * 1000:.0f} ms, "
        f"gaps {[round(g * 1000) for g in gaps]}; a fresh `python -c 'import torch'`: "
        f"{statistics.median(relaunch) * 1000:.0f} ms"
    )
    # Pre-warmed, every run after the first began importing torch while the one before it still
    # ran; fresh, only once the one before it had ended (one slot: runs follow each other). When
    # the import finished depends on how long it takes against how long a run takes: on an H100
    # machine whose `import torch` took 5 s, every other 1 s run waited for its runner's import.
    overlapped = [later["import_began"] < earlier["ended"] for earlier, later in zip(runs, runs[1:], strict=False)]
    assert overlapped == [prewarm] * 7, overlapped
    with GpuMonitor(pynvml) as monitor:  # no run's process holds GPU memory once the sweep is over
        held = {p.pid for p in monitor.state(GPUS[0].uuid).processes}
    assert not held & {r["pid"] for r in runs}


@needs_torch
def test_runs_packed_on_a_real_gpu_cost_its_busy_time_and_share_its_energy(in_tmp):
    """Two runs packed on one real GPU: their GPU-seconds add up to its busy time within 5 %, the
    one that holds more memory gets more of it, and NVML's energy counter gives each run joules at
    a draw a GPU can have."""
    marks = in_tmp / "marks"
    marks.mkdir()
    root = in_tmp / "r"
    config = make_config(
        root,
        [{"alloc_gib": [6, 2]}],
        slots=("0",),
        global_config={"together": 2, "hold": 3.0, "marks": str(marks)},
        max_runs_per_gpu=2,
        gpu_memory="8GiB",
        gpu_poll_interval=0.2,
    )
    summary = GPUTaskScheduler(config, tasks.TorchTask, nvml=pynvml).start()
    assert summary.ok and {o.result["held_together"] for o in summary.succeeded} == {2}
    rows = ledger_rows(root)
    intervals = sorted((row["started_at"], row["ended_at"]) for row in rows.values())
    busy = max(end for _, end in intervals) - intervals[0][0]  # they overlap: one busy stretch
    seconds = {name: row["gpu_seconds"] for name, row in rows.items()}
    joules = {name: row["energy"] for name, row in rows.items()}
    print(f"busy {busy:.2f} s; GPU-seconds {seconds}; joules {joules}")
    assert sum(seconds.values()) == pytest.approx(busy, rel=0.05)
    assert seconds["alloc_gib-6,"] > seconds["alloc_gib-2,"]
    if all(value is None for value in joules.values()):
        pytest.skip(f"{GPUS[0].name} has no energy counter")
    watts = sum(joules.values()) / sum(seconds.values())
    assert 10 < watts < 2000, watts


@needs_torch
def test_a_gpu_hour_budget_stops_a_real_sweep_after_the_run_that_spent_it(in_tmp):
    marks = in_tmp / "marks"
    marks.mkdir()
    config = make_config(
        in_tmp / "r",
        [{"i": [0, 1, 2]}],
        slots=("0",),
        global_config={"alloc_gib": 1, "hold": 1.5, "marks": str(marks)},
        budget={"gpu_hours": 1.0 / 3600},  # one GPU-second: the first run spends it
    )
    summary = GPUTaskScheduler(config, tasks.TorchTask, nvml=pynvml).start()
    assert len(summary.succeeded) == 1 and len(summary.not_started) == 2
    assert summary.budget_spent and summary.exit_code == 0
    (row,) = [row for row in ledger_rows(in_tmp / "r").values() if row["gpu_seconds"]]
    assert row["gpu_seconds"] >= 1.5
