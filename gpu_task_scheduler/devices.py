"""Worker slots: what the ``gpu`` entry of ``scheduler_config`` means.

Each entry of ``gpu`` is one slot, i.e. one run at a time:

* ``"0"`` or ``0``: one GPU by index; ``"GPU-8f1c..."`` / ``"MIG-..."``: by UUID;
* ``["1", "2"]`` (or the original's ``"1,2"``): a group of GPUs for one run;
* ``"cpu"``: a slot with no GPU at all (``CUDA_VISIBLE_DEVICES`` empty), so
  sweeps run on laptops and CI. List it several times for several CPU slots.

Listing the same GPU twice gives two slots sharing it, as in the original.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from .errors import ConfigError

CPU = "cpu"
_GPU_ID = re.compile(r"^(\d+|GPU-[0-9A-Fa-f][0-9A-Fa-f-]*|MIG-[0-9A-Za-z][0-9A-Za-z/-]*)$")
_ALLOWED = (
    'a GPU index ("0" or 0), a GPU or MIG UUID ("GPU-...", "MIG-..."), '
    'a list of those for a GPU group (["1", "2"]), or "cpu"'
)


@dataclass(frozen=True)
class Slot:
    """One place where one run executes at a time."""

    name: str  # "gpu0", "gpu1,2", "cpu0": the name the scheduler log uses
    gpu_ids: Tuple[str, ...]  # empty for a CPU slot

    @property
    def is_cpu(self) -> bool:
        return not self.gpu_ids

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.gpu_ids)

    def env(self) -> Dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": self.cuda_visible_devices}


def _gpu_id(value: object, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{where} is {value!r} ({type(value).__name__}); expected {_ALLOWED}")
    text = str(value).strip()
    if isinstance(value, int) and value < 0 or not _GPU_ID.match(text):
        raise ConfigError(f"{where} is {value!r}, which is not a GPU id; expected {_ALLOWED}")
    return text


def _entry_ids(entry: object, where: str) -> Tuple[str, ...]:
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


def normalize_gpu_entries(value: object) -> List[str]:
    """The ``gpu`` list as the original's ``get_all_scheduler_config()`` shows it.

    >>> normalize_gpu_entries(["0", ["1", "2"], 3, "cpu"])
    ['0', '1,2', '3', 'cpu']
    """
    return [CPU if slot.is_cpu else slot.cuda_visible_devices for slot in parse_slots(value)]


def parse_slots(value: object) -> List[Slot]:
    """Validate ``scheduler_config['gpu']`` and turn it into slots.

    >>> [s.name for s in parse_slots(["0", ["1", "2"], "cpu", "cpu"])]
    ['gpu0', 'gpu1,2', 'cpu0', 'cpu1']
    """
    where = "scheduler_config['gpu']"
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigError(
            f"{where} must be a list of slots such as [\"0\", \"1\"] or [\"cpu\"]; got {value!r}"
        )
    if len(value) == 0:
        raise ConfigError(f"{where} is empty; list at least one slot, e.g. [\"0\"] or [\"cpu\"]")
    slots: List[Slot] = []
    cpu_count = 0
    for index, entry in enumerate(value):
        ids = _entry_ids(entry, f"{where}[{index}]")
        if ids:
            slots.append(Slot(name="gpu" + ",".join(ids), gpu_ids=ids))
        else:
            slots.append(Slot(name=f"cpu{cpu_count}", gpu_ids=()))
            cpu_count += 1
    return slots
