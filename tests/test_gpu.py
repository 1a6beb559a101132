"""GPU awareness against a fake NVML: discovery, packing by memory, sharing, OOM recovery."""

import os
import random
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
from test_process_control import finish, launch

from gpu_task_scheduler import ConfigManager, GPUTaskScheduler, GTSError
from gpu_task_scheduler.gpu.capacity import Capacity, Placement
from gpu_task_scheduler.gpu.devices import Slot
from gpu_task_scheduler.gpu.host import HostProbe
from gpu_task_scheduler.gpu.nvml import GpuMonitor, GpuProcess, GpuState, NvmlUnavailable
from gpu_task_scheduler.gpu.placement import WHOLE_GPU, Reservation, SlotView, book, choose
from gpu_task_scheduler.sweep.options import parse_scheduler_config

GB = 10**9


@pytest.fixture
def gpus(in_tmp, monkeypatch):
    """Two fake 80 GB GPUs; returns a function to rewrite the table."""
    path = in_tmp / "nvml.json"
    monkeypatch.setenv(fake_nvml.ENV, str(path))

    def set_up(*specs, library_missing=False):
        write_state(str(path), [dict(spec) for spec in specs], library_missing=library_missing)

    set_up({"name": "Fake H100 80GB", "total": 80 * GB}, {"name": "Fake H100 80GB", "total": 80 * GB})
    return set_up


def run(config, task=tasks.FakeGpuTask):
    return GPUTaskScheduler(config, task, nvml=fake_nvml).start()


def by_gpu(summary):
    result = {}
    for outcome in summary.succeeded:
        result.setdefault(outcome.result["gpu"], []).append(outcome.result["sharing"])
    return result


# --- discovery ---------------------------------------------------------------------


def test_monitor_reads_the_fake_like_nvml(gpus):
    with GpuMonitor(fake_nvml) as monitor:
        assert monitor.count() == 2
        state = monitor.state("1")
        assert (state.index, state.name, state.total_memory, state.free_memory, state.used_memory) == (
            1,
            "Fake H100 80GB",
            80 * GB,
            80 * GB,
            0,
        )
        assert monitor.state(state.uuid).uuid == state.uuid


def test_missing_nvml_library_is_a_clear_message(gpus):
    gpus({"name": "x", "total": GB}, library_missing=True)
    with pytest.raises(NvmlUnavailable, match=r"^no NVIDIA GPUs here \(NVML Shared Library Not Found: no NVIDIA"):
        GpuMonitor(fake_nvml)


def _real_bindings_message():
    """What the real bindings (nvidia-ml-py) say at nvmlInit() on this machine, in a fresh process."""
    code = (
        "import pynvml\n"
        "try:\n    pynvml.nvmlInit()\nexcept pynvml.NVMLError as error:\n    print(error)\n"
        "else:\n    print('started')\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "GTS_NVML_MODULE"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60).stdout


def test_without_nvidias_library_the_monitor_says_what_the_bindings_say_without_importing_them(monkeypatch):
    """The driver's library is looked for before the bindings' 9 ms import; the message is theirs."""
    pytest.importorskip("pynvml")
    said = _real_bindings_message().strip()
    if said == "started":
        pytest.skip("this machine has NVIDIA's driver: the bindings start")
    monkeypatch.delenv("GTS_NVML_MODULE")
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    with pytest.raises(NvmlUnavailable) as raised:
        GpuMonitor()
    assert str(raised.value) == f"no NVIDIA GPUs here ({said}: no NVIDIA driver is installed)"
    assert "pynvml" not in sys.modules


def test_all_means_every_visible_gpu(gpus, in_tmp, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = make_config(in_tmp / "r", [{"i": [0, 1]}], slots=(), alloc_gb=1)
    config["scheduler_config"]["gpu"] = "all"
    config["global_config"] = {"alloc_gb": 1, "hold": 0}
    del config["scheduler_config"]["alloc_gb"]
    assert ConfigManager(config).get_all_scheduler_config()["gpu"] == "all"
    summary = run(config)
    assert sorted(o.slot for o in summary.succeeded) == ["gpu0", "gpu1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    summary = run({**config, "scheduler_config": {**config["scheduler_config"], "force_rerun": True}})
    assert sorted(o.result["gpu"] for o in summary.succeeded) == ["1", "1"]


def test_inherited_cuda_visible_devices_renumbers_explicit_ids(gpus, in_tmp, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    summary = run(make_config(in_tmp / "r", [{"i": [0]}], slots=("0",), global_config={"alloc_gb": 1, "hold": 0}))
    assert summary.succeeded[0].result["gpu"] == "1" and summary.succeeded[0].slot == "gpu1"
    with pytest.raises(GTSError, match="gpu 1 is not visible: the inherited CUDA_VISIBLE_DEVICES='1'"):
        run(make_config(in_tmp / "r2", [{"i": [0]}], slots=("1",), global_config={"alloc_gb": 1}))


def test_all_without_nvml_fails_clearly_or_falls_back_to_cpu(gpus, in_tmp, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus({"name": "x", "total": GB}, library_missing=True)
    config = make_config(in_tmp / "r", [{"i": [0, 1]}])
    config["scheduler_config"]["gpu"] = "all"
    with pytest.raises(GTSError, match='gpu is "all" but no GPU is available .*NVML Shared Library Not Found'):
        GPUTaskScheduler(config, tasks.RecordTask, nvml=fake_nvml).start()
    assert not (in_tmp / "r").exists()
    config["scheduler_config"]["cpu_fallback"] = 2
    summary = GPUTaskScheduler(config, tasks.RecordTask, nvml=fake_nvml).start()
    assert sorted(o.slot for o in summary.succeeded) == ["cpu0", "cpu1"]
    assert {o.result["env"]["CUDA_VISIBLE_DEVICES"] for o in summary.succeeded} == {""}


def test_explicit_gpus_without_nvml_run_one_per_slot(gpus, in_tmp):
    gpus({"name": "x", "total": GB}, library_missing=True)
    summary = GPUTaskScheduler(
        make_config(in_tmp / "r", [{"i": [0, 1]}], slots=("0",), max_runs_per_gpu=4), tasks.RecordTask, nvml=fake_nvml
    ).start()
    assert summary.ok and [o.result["env"]["CUDA_VISIBLE_DEVICES"] for o in summary.succeeded] == ["0", "0"]


# --- packing by memory -----------------------------------------------------------------


def release_when_running(barrier, counts, timeout=60.0):
    """A thread that creates ``barrier`` once the fake GPUs show at least ``counts[gpu]`` of our
    runs at once (the runs hold their memory until then), or after ``timeout`` so that a
    scheduler that never gets there fails the test's assertions instead of hanging it."""

    def ours(gpu):
        return sum(1 for p in gpu["processes"] if p["pid"] > 1 and fake_nvml._alive(p["pid"]))

    def watch():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with fake_nvml._locked() as state:
                if all(ours(state["gpus"][int(gpu)]) >= count for gpu, count in counts.items()):
                    break
            time.sleep(0.01)
        open(barrier, "w").close()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def packing_config(root, runs=20, *, barrier, **options):
    # The first wave holds its memory until all of its runs run side by side (see release_when_running).
    return make_config(
        root,
        [{"i": list(range(runs))}],
        slots=("0", "1"),
        global_config={"alloc_gb": 10, "hold": 0, "barrier": barrier},
        gpu_memory="10GB",
        max_runs_per_gpu=8,
        gpu_poll_interval=0.2,
        **options,
    )


@pytest.mark.parametrize("margin, expected", [(None, {"0": 7, "1": 1}), ("0", {"0": 8, "1": 2})])
def test_twenty_10gb_runs_on_two_80gb_gpus_one_shared(gpus, in_tmp, margin, expected):
    gpus({"name": "A", "total": 80 * GB}, {"name": "B", "total": 80 * GB, "processes": [{"pid": 1, "used": 60 * GB}]})
    options = {} if margin is None else {"memory_margin": margin}
    root = in_tmp / "r"
    barrier = str(in_tmp / "barrier")
    watcher = release_when_running(barrier, expected)
    summary = run(packing_config(root, barrier=barrier, **options))
    watcher.join()
    assert len(summary.succeeded) == 20 and summary.ok
    sharing = by_gpu(summary)
    assert {gpu: max(counts) for gpu, counts in sharing.items()} == expected
    rows = ledger_rows(root)
    assert sorted({row["slot"] for row in rows.values()}) == ["gpu0", "gpu1"]
    peaks = [row["gpu_memory_peak"] for row in rows.values()]
    # A run is measured when a poll (every 0.2 s) finds it holding memory; these hold it for as long as
    # the barrier takes, which can be shorter than a poll on a fast machine (measuring is tested below).
    assert 10 * GB in peaks and set(peaks) <= {10 * GB, None}
    print(
        f"margin {margin or 'default 512MiB'}: at most {expected} runs at once; "
        f"runs per GPU {{gpu: len}} = { {gpu: len(c) for gpu, c in sharing.items()} }"
    )


def test_a_run_that_can_never_fit_fails_at_once(gpus, in_tmp):
    summary = run(
        make_config(
            in_tmp / "r",
            [{"gpu_memory": ["100GB", "1GB"]}],
            slots=("0",),
            global_config={"alloc_gb": 1, "hold": 0},
            max_runs_per_gpu=2,
        )
    )
    (failed,) = summary.failed
    assert "needs 93.1 GiB per GPU, more than any GPU here can give" in failed.cause
    assert len(summary.succeeded) == 1


def test_unknown_needs_run_alone_until_an_estimate_is_learned(gpus, in_tmp):
    gpus({"name": "A", "total": 80 * GB})
    barrier = str(in_tmp / "barrier")
    watcher = release_when_running(barrier, {"0": 2})
    # The first run holds its memory for a few polls (0.1 s apart) so that its need is learned; the
    # others then hold theirs until two of them have run side by side.
    blocks = [{"i": [0], "hold": [0.6]}, {"i": [1, 2, 3, 4], "barrier": [barrier]}]
    summary = run(
        make_config(
            in_tmp / "r",
            blocks,
            slots=("0",),
            max_runs_per_gpu=4,
            gpu_poll_interval=0.1,
            global_config={"alloc_gb": 30, "hold": 0},
            ignored_keys_for_folder_name=["barrier", "hold"],
        )
    )
    watcher.join()
    sharing = [o.result["sharing"] for o in sorted(summary.succeeded, key=lambda o: o.name)]
    assert sharing[0] == 1  # nothing known yet: the first run has the GPU to itself
    assert max(sharing) == 2  # then 30 GB each: two fit in 80 GB, three do not


def test_busy_gpus_are_avoided_and_used_once_free(gpus, in_tmp):
    gpus({"name": "A", "total": 80 * GB, "processes": [{"pid": 1, "used": 70 * GB}]}, {"name": "B", "total": 80 * GB})
    root = in_tmp / "r"
    config = make_config(
        root,
        # The other user's process leaves once the scheduler said GPU 0 is busy (under load, it left
        # before the next run was placed, and nothing was busy to say: a loaded CI run).
        [{"i": [0], "clear_foreign": [0], "clear_when_said": ["gpu0 busy"]}, {"i": [1, 2, 3]}],
        slots=("0", "1"),
        global_config={"alloc_gb": 1, "hold": 0.5},
        busy_memory_fraction=0.5,
        gpu_poll_interval=0.1,
        ignored_keys_for_folder_name=["clear_foreign", "clear_when_said"],
    )
    summary = run(config)
    assert summary.ok
    gpu_of = {o.name: o.result["gpu"] for o in summary.succeeded}
    assert gpu_of["i-0,"] == "1"  # GPU 0 was busy with another user's 70 GB
    assert "0" in [gpu_of[f"i-{i},"] for i in (1, 2, 3)]  # ... and was used once they left
    log = (root / "scheduler.log").read_text()
    assert "gpu0 busy (gpu 0: other users' processes use 65.2 GiB of 74.5 GiB" in log


def test_a_user_process_appearing_makes_a_gpu_busy(gpus, in_tmp):
    root = in_tmp / "r"
    config = make_config(
        root,
        [{"i": [0], "add_foreign": [1]}, {"i": [1, 2]}],
        slots=("1", "0"),
        global_config={"alloc_gb": 1, "hold": 0.3},
        busy_memory_fraction=0.5,
        gpu_poll_interval=0.1,
        ignored_keys_for_folder_name=["add_foreign"],
    )
    summary = run(config)
    gpu_of = {o.name: o.result["gpu"] for o in summary.succeeded}
    assert gpu_of["i-0,"] == "1" and gpu_of["i-1,"] == "0"
    assert gpu_of["i-2,"] == "0"  # GPU 1 is now taken by someone else


def test_out_of_memory_runs_are_retried_later_with_a_bound(gpus, in_tmp):
    root = in_tmp / "r"
    config = make_config(
        root,
        [{"i": [0], "oom_until": [1]}, {"i": [1], "oom_until": [9]}, {"i": [2, 3]}],
        slots=("0",),
        global_config={"alloc_gb": 10, "hold": 0.1},
        gpu_memory="10GB",
        max_runs_per_gpu=1,
        max_oom_retries=2,
        ignored_keys_for_folder_name=["oom_until"],
    )
    summary = run(config)
    outcomes = summary.outcomes
    assert outcomes["i-0,"].status.value == "succeeded" and outcomes["i-0,"].attempts == 2
    assert outcomes["i-1,"].status.value == "failed" and outcomes["i-1,"].attempts == 3
    assert outcomes["i-1,"].cause.startswith("GPU out of memory (PyTorch)")
    rows = ledger_rows(root)
    assert rows["i-1,"]["attempts"] == 3 and rows["i-1,"]["cause"].startswith("GPU out of memory (PyTorch)")
    # Retried later: after the runs that had not started yet.
    assert rows["i-0,"]["started_at"] > rows["i-3,"]["started_at"]
    log = (root / "scheduler.log").read_text()
    assert "i-0, ran out of GPU memory; it will run again later, reserving 14.0 GiB (out-of-memory retry 1 of 2)" in log


def test_waiting_for_the_host_is_shown_and_ctrl_c_still_works(gpus, in_tmp):
    root = in_tmp / "r"
    scheduler = launch(make_config(root, [{"a": [1]}], min_host_free_memory="1000TB"), "RecordTask")
    wait_until(
        lambda: (
            (root / "scheduler.log").exists()
            and "waiting to start a-1,: host has" in (root / "scheduler.log").read_text()
        ),
        message="the wait to be logged",
    )
    scheduler.send_signal(signal.SIGINT)
    finish(scheduler)
    assert scheduler.returncode == -signal.SIGINT and not (root / "a-1,").exists()


# --- placement, pure ----------------------------------------------------------------------


def state(gpu_id, total, free, processes=()):
    return GpuState(
        index=int(gpu_id),
        uuid=f"GPU-{gpu_id}",
        name="g",
        total_memory=total,
        free_memory=free,
        used_memory=total - free,
        utilization=0,
        processes=tuple(processes),
    )


def test_reservations_are_not_double_booked_until_allocated():
    runs = [Reservation(gpu_ids=("0",), pgid=100, reserved=10 * GB), Reservation(("0",), 200, 10 * GB)]
    pgids = {1000: 100, 2000: 200}.get
    # Neither run has allocated yet: both reservations count against the free memory.
    books, _ = book({"0": state("0", 80 * GB, 80 * GB)}, runs, 0, pgids)
    assert books["0"].available == 60 * GB and books["0"].ours == 2
    # One has allocated 10 GB (now used, no longer pending); the other 4 GB of its 10.
    processes = [GpuProcess(1000, 10 * GB), GpuProcess(2000, 4 * GB), GpuProcess(3000, 5 * GB)]
    books, used = book({"0": state("0", 80 * GB, 61 * GB, processes)}, runs, GB, pgids)
    assert books["0"].available == 61 * GB - 6 * GB - GB
    assert books["0"].foreign_used == 5 * GB and used == {100: {"0": 10 * GB}, 200: {"0": 4 * GB}}


def views(*available, running=0, capacity=4):
    return [
        SlotView(
            index=i,
            slot=Slot(f"gpu{i}", (str(i),)),
            running=running,
            capacity=capacity,
            available=a,
            ours_on_gpus=running,
            busy=None,
        )
        for i, a in enumerate(available)
    ]


def test_placement_policies():
    slots = views(5 * GB, 30 * GB, 20 * GB, 1 * GB)
    assert choose(slots, 10 * GB, "first_fit").index == 1
    assert choose(slots, 10 * GB, "most_free").index == 1
    assert choose(slots, 2 * GB, "most_free").index == 1
    assert [choose(slots, 2 * GB, "round_robin", last=last).index for last in (-1, 0, 1, 2)] == [0, 1, 2, 0]
    rng = random.Random(3)
    assert {choose(slots, 10 * GB, "random", rng=rng).index for _ in range(50)} == {1, 2}
    assert choose(slots, 40 * GB, "first_fit") is None
    assert choose(views(None, None), 10 * GB, "first_fit").index == 0  # no NVML: capacity only
    assert choose(views(80 * GB, running=1), WHOLE_GPU, "first_fit") is None
    assert choose(views(80 * GB, running=4, capacity=4), None, "first_fit") is None


@pytest.mark.parametrize("policy", ["first_fit", "round_robin"])
def test_placement_without_nvml_follows_the_counts_of_our_runs(policy):
    """Without NVML a slot's view is kept per count of our runs: each placement sees the counts
    as they are now, and one with every slot full says nothing (the normal case)."""
    options = parse_scheduler_config({"gpu": ["0", "1", "2"], "placement": policy})
    slots = [Slot(f"gpu{i}", (str(i),)) for i in range(3)]
    capacity = Capacity(options, slots=slots)
    try:
        chosen = []
        for pgid in (100, 101, 102):
            placement = capacity.place(f"run{pgid}", None)
            chosen.append(placement.view.index)
            assert placement.view.running == 0
            capacity.take(placement.view.index, pgid, None)
        assert chosen == [0, 1, 2]
        assert capacity.place("run103", None) == Placement()  # full: no view, no waiting words
        assert [view.running for view in capacity.views()] == [1, 1, 1]
        capacity.release(1, 101)
        placement = capacity.place("run103", None)
        assert placement.view.index == 1 and placement.view.running == 0
        assert [view.running for view in capacity.views()] == [1, 0, 1]
    finally:
        capacity.close()


def test_host_probe_reads_proc():
    files = {"/proc/stat": "cpu  100 0 100 800 0 0 0 0 0 0\n", "/proc/meminfo": "MemAvailable:    2048 kB\n"}
    probe = HostProbe(read=lambda path: files[path])
    assert probe.cpu_percent() is None and probe.available_memory() == 2048 * 1024
    files["/proc/stat"] = "cpu  150 0 150 900 0 0 0 0 0 0\n"
    assert probe.cpu_percent() == 50.0


def test_gpus_by_uuid(gpus, in_tmp):
    uuid = "GPU-00000001-0000-4000-8000-000000000000"
    barrier = str(in_tmp / "barrier")
    watcher = release_when_running(barrier, {"1": 2})
    summary = run(
        make_config(
            in_tmp / "r",
            [{"i": [0, 1]}],
            slots=(uuid,),
            max_runs_per_gpu=2,
            gpu_memory="10GB",
            global_config={"alloc_gb": 10, "hold": 0, "barrier": barrier},
        )
    )
    watcher.join()
    assert [o.result["gpu"] for o in summary.succeeded] == [uuid, uuid]
    assert [o.slot for o in summary.succeeded] == [f"gpu{uuid}"] * 2
    assert max(o.result["sharing"] for o in summary.succeeded) == 2


def test_peaks_are_measured_while_runs_are_active(gpus, in_tmp):
    root = in_tmp / "r"
    run(
        make_config(
            root, [{"i": [0, 1]}], slots=("0", "1"), global_config={"alloc_gb": 3, "hold": 0.8}, gpu_poll_interval=0.1
        )
    )
    assert {row["gpu_memory_peak"] for row in ledger_rows(root).values()} == {3 * GB}


def test_a_listed_gpu_that_does_not_exist_is_named_with_those_that_do(gpus, in_tmp):
    gpus({"name": "GPU-A", "total": 80 * GB}, {"name": "GPU-B", "total": 40 * GB})
    with pytest.raises(GTSError) as raised:
        GPUTaskScheduler(
            make_config(in_tmp / "r", [{"i": [0]}], slots=("0", "7")), tasks.RecordTask, nvml=fake_nvml
        ).start()
    message = str(raised.value)
    assert message.startswith("GPU 7 does not exist on this machine; the GPUs NVML sees: 0: GPU-A")
    assert "Invalid Argument" not in message
    assert "0: GPU-A, " in message and "1: GPU-B, " in message
    assert not (in_tmp / "r").exists()


def test_listed_gpus_without_nvml_are_run_with_one_warning(gpus, in_tmp, caplog):
    gpus({"name": "x", "total": GB}, library_missing=True)
    config = make_config(in_tmp / "r", [{"i": [0, 1]}], slots=("0", "1"), scheduler_log_file_path=None)
    summary = GPUTaskScheduler(config, tasks.RecordTask, nvml=fake_nvml).start()
    assert summary.ok
    # A warning, so that the Python API shows it even where the application configured no logging.
    warnings = [r for r in caplog.records if "could not be checked" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    assert warnings[0].getMessage().startswith("GPU 0, 1 could not be checked")


def test_a_run_allocating_while_the_gpu_is_read_is_never_counted_twice_as_free(gpus):
    """The interleaving behind an over-commit seen under load: the run allocates between the
    read of free memory and the read of the process list, so the process list already shows
    the allocation (the run's reservation is released) while the free memory does not."""

    class Racing:
        def __getattr__(self, name):
            return getattr(fake_nvml, name)

        @staticmethod
        def nvmlDeviceGetComputeRunningProcesses(handle):
            fake_nvml.allocate("0", 10 * GB)  # the run allocates just now
            return fake_nvml.nvmlDeviceGetComputeRunningProcesses(handle)

    run_group = 4242
    reservation = Reservation(gpu_ids=("0",), pgid=run_group, reserved=10 * GB)
    with GpuMonitor(Racing()) as monitor:
        states = monitor.snapshot(["0"])
    books, used = book(states, [reservation], 0, lambda pid: run_group if pid == os.getpid() else None)
    assert books["0"].available == 70 * GB  # 80 GB less the run's 10 GB, counted once
    assert used == {run_group: {"0": 10 * GB}}


OOM_MESSAGES = [
    ("PyTorch", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)"),
    ("PyTorch", "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB"),
    (
        "TensorFlow",
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor "
        "with shape[8192,8192] and type float on /job:localhost/replica:0/task:0/device:GPU:0",
    ),
    ("TensorFlow", "2026-11-22 10:00:00 W tensorflow/core/framework/op_kernel.cc] OOM when allocating tensor"),
    (
        "JAX",
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
        "17179869184 bytes.",
    ),
    ("CUDA", "CUDA error: cudaErrorMemoryAllocation: out of memory"),
    ("CUDA", "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"),
    ("CUDA", "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    ("CUDA", "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
]


@pytest.mark.parametrize("framework,message", OOM_MESSAGES, ids=[f"{f}-{i}" for i, (f, _) in enumerate(OOM_MESSAGES)])
def test_out_of_memory_messages_of_every_framework_are_recognised(framework, message):
    from gpu_task_scheduler.gpu.oom import detect_oom

    assert detect_oom(f"step 10: loss 0.3\nTraceback (most recent call last):\n{message}\n") == framework


@pytest.mark.parametrize(
    "message",
    ["MemoryError", "ValueError: out of range", "Killed", "host out of memory?", "resource exhausted (disk quota)"],
)
def test_other_failures_are_not_taken_for_gpu_out_of_memory(message):
    from gpu_task_scheduler.gpu.oom import detect_oom

    assert detect_oom(message) is None


def test_a_gpu_busy_with_other_users_work_is_left_alone_by_utilisation(gpus, in_tmp):
    gpus({"name": "A", "total": 80 * GB, "utilization": 95}, {"name": "B", "total": 80 * GB, "utilization": 0})
    root = in_tmp / "r"
    config = make_config(
        root,
        [{"i": [0, 1, 2]}],
        slots=("0", "1"),
        global_config={"alloc_gb": 1, "hold": 0},
        busy_utilization=50,
        gpu_poll_interval=0.1,
    )
    summary = run(config)
    assert summary.ok and {o.result["gpu"] for o in summary.succeeded} == {"1"}
    assert "busy_utilization 50" in (root / "scheduler.log").read_text()


def test_utilisation_of_our_own_runs_does_not_make_a_gpu_busy():
    from gpu_task_scheduler.gpu.placement import GpuBook, busy_reason

    state = GpuState(
        index=0,
        uuid="GPU-0",
        name="A",
        total_memory=80 * GB,
        free_memory=70 * GB,
        used_memory=10 * GB,
        utilization=99,
        processes=(),
    )
    assert busy_reason(GpuBook(state, 70 * GB, 0, ours=1), memory_fraction=None, utilization=50) is None
    assert "utilisation is 99%" in busy_reason(GpuBook(state, 70 * GB, 0, ours=0), memory_fraction=None, utilization=50)
    assert busy_reason(GpuBook(state, 70 * GB, 0, ours=0), memory_fraction=None, utilization=None) is None


def test_process_information_that_cannot_be_read_is_warned_about_once(gpus, caplog):
    class NoProcesses:
        def __getattr__(self, name):
            return getattr(fake_nvml, name)

        @staticmethod
        def nvmlDeviceGetComputeRunningProcesses(handle):
            raise fake_nvml.NVMLError(3, "Not Supported")

    with GpuMonitor(NoProcesses()) as monitor:
        for _ in range(3):
            assert monitor.state("0").processes == ()
    warnings = [r for r in caplog.records if "cannot read the processes on GPU 0" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
