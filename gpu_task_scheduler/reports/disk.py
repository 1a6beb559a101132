"""What population-based training's checkpoints take on disk, as ``gts status`` shows it: the
ledger's record of it (``records/checkpoints.DISK_META``, written by ``engine/pauses.py`` at each
snapshot and at the population's end), read as untrusted, and its line."""

from __future__ import annotations

import json
from typing import Any

from ..finite import finite_number
from ..gpu.devices import format_size


def checkpoint_disk(text: str | None) -> dict[str, Any] | None:
    """The ledger's record of the disk a population's checkpoints take (None: none, or changed by
    hand into something else)."""
    try:
        disk = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(disk, dict) or not all(finite_number(disk.get(key)) for key in ("bytes", "refused", "at")):
        return None
    limit = disk.get("max_disk")
    return {
        "bytes": int(disk["bytes"]),
        "max_disk": int(limit) if finite_number(limit) else None,
        "refused": int(disk["refused"]),
        "at": float(disk["at"]),
    }


def checkpoint_line(disk: dict[str, Any]) -> str:
    """``gts status``'s line of a population's checkpoint disk use."""
    line = f"  checkpoints: {format_size(disk['bytes'])} on disk (the population's, at its last snapshot or end)"
    if disk["max_disk"] is not None:
        line += f"; max_disk {format_size(disk['max_disk'])}"
    if disk["refused"]:
        line += f": {disk['refused']} snapshot(s) not taken for it (those members were offered to no one there)"
    return line
