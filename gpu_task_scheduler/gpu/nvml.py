"""What the GPUs hold right now, read through the NVML Python bindings.

Everything NVML is behind :class:`GpuMonitor`, built from a module with the
``pynvml`` interface: the real bindings (the ``nvidia-ml-py`` distribution) by
default, or a fake with the same function names, exception classes and return
shapes in tests. Nothing else in the package calls NVML.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterable
from types import ModuleType
from typing import Any, NamedTuple

from ..finite import ascii_int
from ..recordclass import Record, field

logger = logging.getLogger("gpu_task_scheduler")


class GpuProcess(NamedTuple):
    pid: int
    used_memory: int | None  # bytes; None where NVML cannot tell (e.g. Windows WDDM)


class GpuState(Record):
    """One GPU (or MIG instance) as NVML sees it at one moment."""

    index: int | None  # NVML index (PCI bus order); None for a MIG instance
    uuid: str
    name: str
    total_memory: int
    free_memory: int
    used_memory: int
    utilization: int | None  # percent of time a kernel ran in the last sample period
    processes: tuple[GpuProcess, ...] = field(default=())


class NvmlUnavailable(Exception):
    """NVML cannot be used here (no driver, no GPU, no bindings); ``str()`` says why."""


BINDINGS_ENV = "GTS_NVML_MODULE"


def bindings() -> ModuleType:
    """The NVML bindings: ``pynvml`` (from ``nvidia-ml-py``), or the module that ``GTS_NVML_MODULE`` names.

    The variable exists for test suites (this one's fake NVML, or a user's) that run
    the scheduler in child processes, where no module can be passed in.
    """
    name = os.environ.get(BINDINGS_ENV) or "pynvml"
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise NvmlUnavailable(f"the NVML bindings ({name}) cannot be imported: {error}") from None


def _library_missing() -> bool:
    """Whether the real bindings would only fail to find the NVIDIA driver's library.

    They look for it at ``nvmlInit()`` (on Linux, ``libnvidia-ml.so.1``), after an import that
    costs 9 ms; a machine without NVIDIA's driver is told the same (their very words) at once.
    """
    if (os.environ.get(BINDINGS_ENV) or "pynvml") != "pynvml" or "pynvml" in sys.modules:
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:  # ctypes' own loader, without the ctypes package's 1.2 ms of classes (as ctypes.CDLL loads it)
        from _ctypes import dlopen
    except ImportError:
        from ctypes import CDLL as dlopen  # type: ignore[assignment]
    try:
        dlopen("libnvidia-ml.so.1")  # the bindings' own load; loaded once, it stays for them
    except OSError:
        return True
    return False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# What NVML says where a machine has no NVIDIA GPU to use: no driver library, or no driver loaded.
_NO_GPU = {
    "NVML Shared Library Not Found": "no NVIDIA driver is installed",
    "Driver Not Loaded": "no NVIDIA driver is loaded",
}


def _unavailable(said: str) -> str:
    """Why NVML cannot be used, in plain words on a machine without NVIDIA GPUs."""
    if said in _NO_GPU:
        return f"no NVIDIA GPUs here ({said}: {_NO_GPU[said]})"
    return f"NVML could not start: {said}"


class GpuMonitor:
    """Reads GPU state through a ``pynvml``-like module."""

    def __init__(self, module: ModuleType | None = None) -> None:
        if module is None:
            if _library_missing():
                raise NvmlUnavailable(_unavailable("NVML Shared Library Not Found"))
            module = bindings()
        self._no_processes: set[str] = set()
        self._no_energy: set[str] = set()  # GPUs without an energy counter (before Volta, MIG instances)
        nvml: Any = module  # the bindings ship no type information
        self._nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            raise NvmlUnavailable(_unavailable(str(error))) from None
        self._handles: dict[str, Any] = {}

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass

    def __enter__(self) -> GpuMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def count(self) -> int:
        return int(self._nvml.nvmlDeviceGetCount())

    def _handle(self, gpu_id: str) -> Any:
        handle = self._handles.get(gpu_id)
        if handle is None:
            nvml = self._nvml
            index = ascii_int(gpu_id)
            if index is not None:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            else:
                handle = nvml.nvmlDeviceGetHandleByUUID(gpu_id)
            self._handles[gpu_id] = handle
        return handle

    def state(self, gpu_id: str) -> GpuState:
        """The state of one GPU, by NVML index (``"0"``) or UUID."""
        nvml = self._nvml
        handle = self._handle(gpu_id)
        before = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            utilization: int | None = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml.NVMLError:  # not supported on MIG instances
            utilization = None
        try:
            processes = tuple(
                GpuProcess(pid=int(p.pid), used_memory=None if p.usedGpuMemory is None else int(p.usedGpuMemory))
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            )
        except nvml.NVMLError as error:
            processes = ()
            if gpu_id not in self._no_processes:  # say it once per GPU: memory packing then sees no run's usage
                self._no_processes.add(gpu_id)
                logger.warning(
                    "cannot read the processes on GPU %s through NVML (%s): runs' memory use cannot be "
                    "measured there, and other users' processes are not told apart",
                    gpu_id,
                    error,
                )
        # NVML gives no snapshot of memory and processes together. A run that allocates
        # between two reads would be counted as allocated (its reservation released) while
        # the free memory read earlier does not show it yet: memory over-committed. So the
        # memory is read on both sides of the process list and the lower free memory kept;
        # any change in between then errs on the safe side (counted twice, never not at all).
        after = nvml.nvmlDeviceGetMemoryInfo(handle)
        memory = after if int(after.free) <= int(before.free) else before
        return GpuState(
            index=ascii_int(gpu_id),
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            total_memory=int(memory.total),
            free_memory=int(memory.free),
            used_memory=int(memory.used),
            utilization=utilization,
            processes=processes,
        )

    def energy(self, gpu_id: str) -> int | None:
        """The GPU's energy counter: millijoules since the driver loaded, or None where it has none."""
        if gpu_id in self._no_energy:
            return None
        nvml = self._nvml
        try:
            return int(nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle(gpu_id)))
        except (nvml.NVMLError, AttributeError):  # not supported there, or bindings older than the call
            self._no_energy.add(gpu_id)
            return None

    def snapshot(self, gpu_ids: Iterable[str]) -> dict[str, GpuState]:
        return {gpu_id: self.state(gpu_id) for gpu_id in gpu_ids}

    def all(self) -> list[GpuState]:
        return [self.state(str(index)) for index in range(self.count())]


def visible_ids(environ: dict[str, str] | None = None) -> list[str] | None:
    """The GPUs an inherited ``CUDA_VISIBLE_DEVICES`` allows, or None when it is unset.

    >>> visible_ids({"CUDA_VISIBLE_DEVICES": "2, 3"})
    ['2', '3']
    >>> visible_ids({})
    """
    value = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    ids = [item.strip() for item in value.split(",") if item.strip()]
    # CUDA stops at the first invalid entry (e.g. "-1" hides every GPU).
    valid = []
    for item in ids:
        if not ((item.isascii() and item.isdigit()) or item.startswith(("GPU-", "MIG-"))):
            break
        valid.append(item)
    return valid
