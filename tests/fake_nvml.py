"""A fake of the ``pynvml`` module: same function names, exception classes and
return shapes, over a GPU table the tests control.

The table lives in a JSON file named by ``GTS_FAKE_NVML`` so that the
scheduler (in the test process) and the runs (child processes) share it: a run
"allocates" GPU memory with :func:`allocate`, and the memory shows up as a
compute process of that pid until the process exits, as with real NVML.
"""

import fcntl
import json
import os
import time
from contextlib import contextmanager
from types import SimpleNamespace

GiB = 1 << 30
ENV = "GTS_FAKE_NVML"


class NVMLError(Exception):
    def __init__(self, value=999, message="Unknown Error"):
        super().__init__(message)
        self.value = value


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self):
        super().__init__(12, "NVML Shared Library Not Found")


class NVMLError_InvalidArgument(NVMLError):
    def __init__(self):
        super().__init__(2, "Invalid Argument")


class NVMLError_NotFound(NVMLError):
    def __init__(self):
        super().__init__(6, "Not Found")


class NVMLError_NotSupported(NVMLError):
    def __init__(self):
        super().__init__(3, "Not Supported")


class NVMLError_Uninitialized(NVMLError):
    def __init__(self):
        super().__init__(1, "Uninitialized")


def write_state(path, gpus, *, library_missing=False):
    """gpus: [{"name", "total", "uuid"?, "utilization"?, "power"?, "processes": [{"pid", "used"}]}].
    ``power``: the watts the GPU draws, steadily (its energy counter grows by that); None: a GPU
    without an energy counter."""
    for index, gpu in enumerate(gpus):
        gpu.setdefault("uuid", f"GPU-{index:08d}-0000-4000-8000-000000000000")
        gpu.setdefault("utilization", 0)
        gpu.setdefault("processes", [])
        gpu.setdefault("power", 100.0)
        gpu.setdefault("energy_since", time.time())
    with open(path, "w") as handle:
        json.dump({"gpus": gpus, "library_missing": library_missing}, handle)


@contextmanager
def _locked(write=False):
    path = os.environ[ENV]
    with open(path, "r+" if write else "r") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if write else fcntl.LOCK_SH)
        state = json.load(handle)
        yield state
        if write:
            handle.seek(0)
            handle.truncate()
            json.dump(state, handle)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def allocate(gpu_id, used, *, strict=False):
    """Called in a run: this process now uses ``used`` bytes on GPU ``gpu_id`` (index or UUID).
    ``strict``: as CUDA does, refuse (return False) what does not fit in the GPU's free memory."""
    with _locked(write=True) as state:
        gpu = _find(state, gpu_id)
        others = [p for p in gpu["processes"] if p["pid"] != os.getpid()]
        if strict and sum(p["used"] or 0 for p in others if _alive(p["pid"])) + used > gpu["total"]:
            return False
        gpu["processes"] = [*others, {"pid": os.getpid(), "used": used}]
        return True


def set_gpu(index, **changes):
    """Called in a test: change a GPU (e.g. another user's process appears)."""
    with _locked(write=True) as state:
        state["gpus"][index].update(changes)


def _find(state, gpu_id):
    gpu_id = str(gpu_id)
    for index, gpu in enumerate(state["gpus"]):
        if gpu_id == str(index) or gpu_id == gpu["uuid"]:
            return gpu
    raise NVMLError_NotFound()


_initialized = [0]


def nvmlInit():
    if ENV not in os.environ:  # no table: a machine without NVML (the default for every test)
        raise NVMLError_LibraryNotFound()
    with _locked() as state:
        if state.get("library_missing"):
            raise NVMLError_LibraryNotFound()
    _initialized[0] += 1


def nvmlShutdown():
    if not _initialized[0]:
        raise NVMLError_Uninitialized()
    _initialized[0] -= 1


def _check():
    if not _initialized[0]:
        raise NVMLError_Uninitialized()


def nvmlDeviceGetCount():
    _check()
    with _locked() as state:
        return len(state["gpus"])


def nvmlDeviceGetHandleByIndex(index):
    _check()
    with _locked() as state:
        if not 0 <= int(index) < len(state["gpus"]):
            raise NVMLError_InvalidArgument()
        return SimpleNamespace(uuid=state["gpus"][int(index)]["uuid"])


def nvmlDeviceGetHandleByUUID(uuid):
    _check()
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    with _locked() as state:
        return SimpleNamespace(uuid=_find(state, uuid)["uuid"])


def _gpu(handle):
    _check()
    with _locked() as state:
        return _find(state, handle.uuid)


def nvmlDeviceGetUUID(handle):
    return _gpu(handle)["uuid"]


def nvmlDeviceGetName(handle):
    return _gpu(handle)["name"]


def nvmlDeviceGetIndex(handle):
    with _locked() as state:
        return [g["uuid"] for g in state["gpus"]].index(handle.uuid)


def _live_processes(gpu):
    return [p for p in gpu["processes"] if _alive(p["pid"])]


def nvmlDeviceGetComputeRunningProcesses(handle):
    return [
        SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used"], gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
        for p in _live_processes(_gpu(handle))
    ]


def nvmlDeviceGetMemoryInfo(handle, version=None):
    gpu = _gpu(handle)
    used = min(gpu["total"], sum(p["used"] or 0 for p in _live_processes(gpu)))
    return SimpleNamespace(total=gpu["total"], free=gpu["total"] - used, used=used)


def nvmlDeviceGetUtilizationRates(handle):
    return SimpleNamespace(gpu=_gpu(handle)["utilization"], memory=0)


def nvmlDeviceGetTotalEnergyConsumption(handle):
    """Millijoules since the "driver loaded" (the table was written), at the GPU's steady power."""
    gpu = _gpu(handle)
    if gpu.get("power") is None:
        raise NVMLError_NotSupported()
    return int((time.time() - gpu["energy_since"]) * gpu["power"] * 1000)
