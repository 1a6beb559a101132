"""``gts gpus``: the machine's GPUs as a user wants to see them before starting a sweep.

For each GPU: memory (total, used, free), utilisation, the memory that sweeps
on this machine have reserved for runs that have not allocated it yet, and
every process holding memory, each with its user and, for a sweep's run, the
sweep it belongs to. Then the sweeps themselves, from the shared reservation
records (``gpu/shared.py``). Read-only: nothing is written anywhere.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

from ..gpu.devices import format_memory, open_monitor
from ..gpu.shared import SharedReservations, process_user
from ..results import escape_controls


def machine_gpus(nvml: ModuleType | None = None, directory: str | None = None) -> dict[str, Any]:
    """The report as plain data (what ``--json`` prints); a machine without NVML gives
    ``"gpus": []`` and why in ``"problem"``."""
    shared = SharedReservations(os.getcwd(), directory, publishing=False)
    try:
        sweeps = shared.others()
    finally:
        shared.close()
    monitor, why = open_monitor(nvml)
    report: dict[str, Any] = {"gpus": [], "sweeps": [], "reservations_dir": shared.directory, "problem": None}
    if monitor is None:
        report["problem"] = why
        states = []
    else:
        try:
            states = monitor.all()
        except Exception as error:  # an NVMLError
            report["problem"] = f"NVML could not read the GPUs: {error}"
            states = []
        finally:
            monitor.close()
    groups: dict[int, Any] = {}
    for publisher in sweeps:
        for held in publisher.reservations:
            groups[held.pgid] = (publisher, held)
    allocated: dict[tuple[str, int], int] = {}
    for state in states:
        processes = []
        for process in state.processes:
            try:
                pgid: int | None = os.getpgid(process.pid)
            except OSError:
                pgid = None
            owner = groups.get(pgid) if pgid is not None else None
            if pgid is not None:
                allocated[(state.uuid, pgid)] = allocated.get((state.uuid, pgid), 0) + (process.used_memory or 0)
            processes.append(
                {
                    "pid": process.pid,
                    "user": process_user(process.pid),
                    "used_memory": process.used_memory,
                    "sweep": None
                    if owner is None
                    else {"root": owner[0].root, "pid": owner[0].pid, "run": owner[1].run},
                }
            )
        report["gpus"].append(
            {
                "index": state.index,
                "uuid": state.uuid,
                "name": state.name,
                "memory_total": state.total_memory,
                "memory_used": state.used_memory,
                "memory_free": state.free_memory,
                "utilization": state.utilization,
                "processes": processes,
            }
        )
    for gpu in report["gpus"]:
        gpu["reserved_not_allocated"] = sum(
            max(0, held.reserved - allocated.get((gpu["uuid"], held.pgid), 0))
            for publisher in sweeps
            for held in publisher.reservations
            if held.gpu_uuid == gpu["uuid"]
        )
    for publisher in sweeps:
        report["sweeps"].append(
            {
                "pid": publisher.pid,
                "user": publisher.user,
                "root": publisher.root,
                "reservations": [
                    {
                        "gpu_uuid": held.gpu_uuid,
                        "run": held.run,
                        "reserved": held.reserved,
                        "allocated": allocated.get((held.gpu_uuid, held.pgid), 0),
                    }
                    for held in publisher.reservations
                ],
            }
        )
    return report


def format_gpus(report: dict[str, Any]) -> str:
    """The report for people; control characters are always made visible (the sweep records
    are other users' text)."""
    clean = escape_controls
    lines = []
    if report["problem"]:
        lines.append(f"no GPU could be read: {report['problem']}")
    for gpu in report["gpus"]:
        utilization = "?" if gpu["utilization"] is None else f"{gpu['utilization']}%"
        lines.append(f"GPU {gpu['index'] if gpu['index'] is not None else '-'}  {gpu['name']}  {gpu['uuid']}")
        lines.append(
            f"  memory {format_memory(gpu['memory_total'])} total, {format_memory(gpu['memory_used'])} used, "
            f"{format_memory(gpu['memory_free'])} free; utilisation {utilization}"
        )
        if gpu["reserved_not_allocated"]:
            lines.append(f"  reserved by sweeps, not allocated yet: {format_memory(gpu['reserved_not_allocated'])}")
        for process in gpu["processes"]:
            sweep = process["sweep"]
            whose = (
                f"run {clean(sweep['run'])} of the sweep in {clean(sweep['root'])} (scheduler pid {sweep['pid']})"
                if sweep
                else "not a sweep's run"
            )
            lines.append(
                f"  pid {process['pid']:<8} {clean(process['user']):<12} "
                f"{format_memory(process['used_memory']):>10}  {whose}"
            )
        if not gpu["processes"]:
            lines.append("  no processes")
    if report["sweeps"]:
        lines.append("Sweeps on this machine:")
        for sweep in report["sweeps"]:
            held = sweep["reservations"]
            lines.append(
                f"  scheduler pid {sweep['pid']} ({clean(sweep['user'])}) in {clean(sweep['root'])}: "
                f"{len(held)} reservation(s)"
            )
            for entry in held:
                lines.append(
                    f"    {clean(entry['run']) or '(starting)'}: {format_memory(entry['reserved'])} reserved on "
                    f"{clean(entry['gpu_uuid'])}, {format_memory(entry['allocated'])} allocated"
                )
    else:
        lines.append(f"No sweep on this machine shares its GPU reservations (records in {report['reservations_dir']}).")
    return "\n".join(lines)
