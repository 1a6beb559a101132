"""Worker slots: what the ``gpu`` entry of ``scheduler_config`` means.

Each entry of ``gpu`` is one slot, i.e. one run at a time:

* ``"0"`` or ``0``: one GPU by index; ``"GPU-8f1c..."`` / ``"MIG-..."``: by UUID;
* ``["1", "2"]`` (or the original's ``"1,2"``): a group of GPUs for one run;
* ``"cpu"``: a slot with no GPU at all (``CUDA_VISIBLE_DEVICES`` empty), so
  sweeps run on laptops and CI. List it several times for several CPU slots.

``"gpu": "all"`` means one slot per GPU that NVML sees (and an inherited
``CUDA_VISIBLE_DEVICES`` allows). Listing the same GPU twice gives two slots
sharing it, as in the original.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from types import ModuleType

from ..errors import ConfigError, GTSError, NoGpuError
from ..recordclass import Record
from .nvml import GpuMonitor, NvmlUnavailable, visible_ids

logger = logging.getLogger("gpu_task_scheduler")

CPU = "cpu"
ALL = "all"
_GPU_ID = re.compile(r"^([0-9]+|GPU-[0-9A-Fa-f][0-9A-Fa-f-]*|MIG-[0-9A-Za-z][0-9A-Za-z/-]*)$")
_ALLOWED = (
    'a GPU index ("0" or 0), a GPU or MIG UUID ("GPU-...", "MIG-..."), '
    'a list of those for a GPU group (["1", "2"]), or "cpu"'
)


class Slot(Record):
    """One place where one run executes at a time."""

    name: str  # "gpu0", "gpu1,2", "cpu0": the name the scheduler log uses
    gpu_ids: tuple[str, ...]  # empty for a CPU slot

    @property
    def is_cpu(self) -> bool:
        return not self.gpu_ids

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.gpu_ids)

    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": self.cuda_visible_devices}


def gpu_ids(slots: Sequence[Slot]) -> list[str]:
    """Every GPU the slots use, once each, sorted.

    >>> gpu_ids([Slot("gpu1,0", ("1", "0")), Slot("gpu0", ("0",)), Slot("cpu0", ())])
    ['0', '1']
    """
    return sorted({gpu for slot in slots for gpu in slot.gpu_ids})


def _gpu_id(value: object, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{where} is {value!r} ({type(value).__name__}); expected {_ALLOWED}")
    text = str(value).strip()
    if isinstance(value, int) and value < 0 or not _GPU_ID.match(text):
        raise ConfigError(f"{where} is {value!r}, which is not a GPU id; expected {_ALLOWED}")
    return text


def _entry_ids(entry: object, where: str) -> tuple[str, ...]:
    if isinstance(entry, str) and entry.strip().lower() == CPU:
        return ()
    if isinstance(entry, str) and "," in entry:  # the original passed "1,2" through as a group
        entry = entry.split(",")
    if isinstance(entry, (list, tuple)):
        if not entry:
            raise ConfigError(f"{where} is an empty GPU group; expected {_ALLOWED}")
        ids = tuple(_gpu_id(item, f"{where}[{i}]") for i, item in enumerate(entry))
        if len(set(ids)) != len(ids):
            raise ConfigError(f"{where} lists the same GPU twice in one group: {list(entry)!r}")
        return ids
    return (_gpu_id(entry, where),)


def normalize_gpu_entries(value: object) -> str | list[str]:
    """The ``gpu`` list as the original's ``get_all_scheduler_config()`` shows it.

    >>> normalize_gpu_entries(["0", ["1", "2"], 3, "cpu"])
    ['0', '1,2', '3', 'cpu']
    """
    slots = parse_slots(value)
    if slots is None:
        return ALL
    return [CPU if slot.is_cpu else slot.cuda_visible_devices for slot in slots]


def parse_slots(value: object) -> list[Slot] | None:
    """Validate ``scheduler_config['gpu']`` and turn it into slots.

    >>> [s.name for s in parse_slots(["0", ["1", "2"], "cpu", "cpu"])]
    ['gpu0', 'gpu1,2', 'cpu0', 'cpu1']
    """
    where = "scheduler_config['gpu']"
    if isinstance(value, str) and value.strip().lower() == ALL:
        return None  # resolved against the machine when the sweep starts
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigError(f'{where} must be "all" or a list of slots such as ["0", "1"] or ["cpu"]; got {value!r}')
    if len(value) == 0:
        raise ConfigError(f'{where} is empty; list at least one slot, e.g. ["0"] or ["cpu"]')
    slots: list[Slot] = []
    cpu_count = 0
    for index, entry in enumerate(value):
        ids = _entry_ids(entry, f"{where}[{index}]")
        if ids:
            slots.append(Slot(name="gpu" + ",".join(ids), gpu_ids=ids))
        else:
            slots.append(Slot(name=f"cpu{cpu_count}", gpu_ids=()))
            cpu_count += 1
    return slots


def resolve_slots(
    slots: Sequence[Slot] | None,
    *,
    gpu_count: int | None,
    visible: list[str] | None,
    cpu_fallback: int = 0,
    why_no_gpu: str = "",
    visible_text: str | None = None,
) -> list[Slot]:
    """The slots a sweep runs on, on this machine.

    ``slots`` is the parsed config (None for ``"all"``), ``gpu_count`` what NVML
    sees (None without NVML) and ``visible`` an inherited
    ``CUDA_VISIBLE_DEVICES`` (None when unset). Index ids in the config count
    within the visible GPUs, as CUDA would count them. ``visible_text``: the inherited
    variable as it was given, for messages (``-1`` hides every GPU; it is named as written).

    >>> [s.name for s in resolve_slots(None, gpu_count=4, visible=["2", "3"])]
    ['gpu2', 'gpu3']
    >>> [s.cuda_visible_devices for s in resolve_slots(parse_slots(["1", "0"]), gpu_count=4, visible=["2", "3"])]
    ['3', '2']
    """
    given = ",".join(visible or []) if visible_text is None else visible_text
    if slots is None:
        ids = visible if visible is not None else [str(i) for i in range(gpu_count or 0)]
        if not ids:
            reason = why_no_gpu or (
                f"the inherited CUDA_VISIBLE_DEVICES={given!r} hides every GPU" if visible == [] else "NVML sees no GPU"
            )
            if cpu_fallback > 0:
                logger.warning(
                    'gpu is "all" but no GPU is available (%s); running on %d CPU slot(s)', reason, cpu_fallback
                )
                return [Slot(name=f"cpu{i}", gpu_ids=()) for i in range(cpu_fallback)]
            raise NoGpuError(
                f'gpu is "all" but no GPU is available ({reason}). List GPUs explicitly, use "gpu": ["cpu"], '
                'or set "cpu_fallback" to a number of CPU slots to use when no GPU is found.',
                reason,
            )
        return [Slot(name=f"gpu{gpu_id}", gpu_ids=(gpu_id,)) for gpu_id in ids]
    if visible is None:
        return list(slots)
    resolved = []
    for slot in slots:
        ids = []
        for gpu_id in slot.gpu_ids:
            if gpu_id.isascii() and gpu_id.isdigit():
                if int(gpu_id) >= len(visible):
                    raise GTSError(
                        f"gpu {gpu_id} is not visible: the inherited CUDA_VISIBLE_DEVICES="
                        f"{given!r} allows {len(visible)} GPU(s), numbered from 0"
                    )
                gpu_id = visible[int(gpu_id)]
            ids.append(gpu_id)
        resolved.append(Slot(name="gpu" + ",".join(ids), gpu_ids=tuple(ids)) if ids else slot)
    return resolved


_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE = r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$"  # compiled at its first use (re's cache)


def parse_memory(value: object, where: str) -> int:
    """Bytes from an int or a string such as ``"10GB"``, ``"10 GiB"``, ``"512MiB"``.

    >>> parse_memory("1.5GiB", "x"), parse_memory("10GB", "x"), parse_memory(2048, "x")
    (1610612736, 10000000000, 2048)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f'{where} must be a memory size such as 10000000000, "10GB" or "9.5GiB"; got {value!r}')
    if isinstance(value, (int, float)):
        try:
            number, unit = float(value), ""
        except OverflowError:  # an int past a float's range (YAML holds one): no memory is that large
            raise ConfigError(f"{where} must be a memory size >= 0 within a float's range; got {value!r:.40}") from None
    else:
        match = re.match(_SIZE, value)
        if not match or match.group(2).lower() not in _UNITS:
            raise ConfigError(f'{where} is {value!r}, not a memory size; use e.g. "10GB", "9.5GiB" or "512MiB"')
        number, unit = float(match.group(1)), match.group(2).lower()
    if not number >= 0 or number == float("inf"):
        raise ConfigError(f"{where} must be a memory size >= 0; got {value!r}")
    return int(number * _UNITS[unit])


def format_size(size: int) -> str:
    """Bytes for people, in the unit that fits (a disk's use: from bytes to TiB).

    >>> format_size(512), format_size(16384), format_size(3 * 2**30)
    ('512 B', '16.0 KiB', '3.0 GiB')
    """
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}"
    return f"{size} B"


def format_memory(size: int | None) -> str:
    """Bytes for people.

    >>> format_memory(10 * 2**30)
    '10.0 GiB'
    """
    if size is None:
        return "unknown"
    return f"{size / (1 << 30):.1f} GiB"


def open_monitor(nvml: ModuleType | None = None) -> tuple[GpuMonitor | None, str]:
    """A monitor over the NVML bindings (``nvml``, else the real ones), or None and why not."""
    try:
        return GpuMonitor(nvml), ""
    except NvmlUnavailable as error:
        return None, str(error)


def discover_slots(
    slots: Sequence[Slot] | None,
    *,
    cpu_fallback: int,
    monitor: GpuMonitor | None,
    why_no_monitor: str = "",
    environ: Mapping[str, str] | None = None,
) -> list[Slot]:
    """The config's slots resolved on this machine (``"all"``: the GPUs ``monitor`` counts; an
    inherited ``CUDA_VISIBLE_DEVICES`` renumbers ids). Without a monitor, ``"all"`` is an error
    naming ``why_no_monitor``, unless ``cpu_fallback`` CPU slots stand in."""
    count, why = None, why_no_monitor
    if slots is None and monitor is not None:
        try:
            count = monitor.count()
        except Exception as error:  # the bindings' NVMLError
            why = f"NVML could not count the GPUs: {error}"
    environ = dict(os.environ if environ is None else environ)
    visible = visible_ids(environ)
    return resolve_slots(
        slots,
        gpu_count=count,
        visible=visible,
        cpu_fallback=cpu_fallback,
        why_no_gpu=why,
        visible_text=environ.get("CUDA_VISIBLE_DEVICES"),
    )
