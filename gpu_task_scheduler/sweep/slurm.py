"""``scheduler_config["slurm"]``: the options of the Slurm backend (``backend: slurm``), checked.

Every option that becomes an ``sbatch`` argument is checked here to be what
Slurm takes, so that a typo is a ConfigError before anything is submitted, not
a sweep of rejected jobs; ``extra`` passes raw ``sbatch`` arguments through
(as arguments, never through a shell).
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, unknown_key_message
from ..recordclass import Record

# What sbatch --time takes: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_MEMORY = re.compile(r"^\d+[KMGT]?$")
_NAME = re.compile(r"^[A-Za-z0-9_.,:+@-]+$")  # partition, account, qos: no spaces, no shell characters
_JOB_NAME = re.compile(r"^[A-Za-z0-9_.:+@-]+$")


class PoolOptions(Record):
    """``slurm: {pool: {...}}``: the sweep's runs go to a few allocations of whole nodes, where an agent
    per node runs them as a local sweep would (``backends/slurm/pool.py``), not one array task each."""

    nodes: int = 1  # nodes per allocation
    allocations: int = 1  # allocation jobs at once
    time: str | None = None  # each allocation's time limit (sbatch --time); None: the partition's
    time_seconds: float | None = None
    gpus_per_node: int = 0  # GPUs each allocation asks for on each node (--gres=gpu:N); 0: none
    slots_per_node: int | None = None  # runs at once on a node without GPUs (None: its CPUs' worth, at most 8)
    idle_exit: float = 30.0  # seconds an agent with nothing to run waits for more before its node is let go
    # Whole nodes (--exclusive, all their memory: backends/slurm/shape.py); False: the CPUs, memory
    # and GPUs of the slots it fills, on nodes shared with other jobs.
    exclusive: bool = True


class SlurmOptions(Record):
    partition: str | None = None
    max_parallel: int | None = None  # runs at once across the sweep (the arrays' throttles); None: as Slurm allows
    time: str | None = None  # per run, as sbatch --time takes it
    time_seconds: float | None = None
    gpus_per_run: int | None = None  # None: the slot size of the sweep's "gpu" entry (1 for "all")
    cpus_per_run: int | None = None
    mem: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    setup: tuple[str, ...] = ()  # shell lines before the run (module load ...)
    extra: tuple[str, ...] = ()  # raw sbatch arguments
    max_queued: int = 1000  # attempts handed to Slurm at once (queued or running)
    poll_interval: float = 5.0  # seconds between two looks at squeue (slurmctld is shared: at most twice a second)
    job_name: str = "gts"
    # Seconds Slurm may run a job (an array task, a pool's allocation) before its supervisor or agents
    # say they started: after that its batch step counts as lost, and the job is given up.
    start_timeout: float = 300.0
    pool: PoolOptions | None = None  # None: one array task per run


def parse_time(value: Any) -> float:
    """Seconds of an sbatch ``--time`` value (an int is minutes); raises ValueError."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) > 0:
        return 60.0 * int(value)
    match = _TIME.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError("a Slurm time: minutes, 'MM:SS', 'HH:MM:SS' or 'D-HH:MM:SS'")
    days, first, second, third = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        seconds = int(days) * 86400 + int(first) * 3600 + int(second or 0) * 60 + int(third or 0)
    elif third is not None:  # HH:MM:SS
        seconds = int(first) * 3600 + int(second) * 60 + int(third)
    elif second is not None:  # MM:SS
        seconds = int(first) * 60 + int(second)
    else:  # minutes
        seconds = int(first) * 60
    if seconds <= 0:
        raise ValueError("a Slurm time longer than 0")
    return float(seconds)


def parse_slurm_options(raw: Any) -> SlurmOptions:
    """The checked options; raises ConfigError naming the key."""
    if raw is None:
        return SlurmOptions()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"scheduler_config['slurm'] must be a dict of Slurm options; got {raw!r}")
    fields = {name for name in SlurmOptions._fields if name != "time_seconds"}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            raise ConfigError(unknown_key_message("scheduler_config['slurm']", key, sorted(fields)))
        problem = _problem(key, value)
        if problem is not None:
            raise ConfigError(f"scheduler_config['slurm'][{key!r}] must be {problem}; got {value!r}")
        if value is None:
            continue
        if key in ("setup", "extra"):
            value = (value,) if isinstance(value, str) else tuple(value)
        elif key in ("poll_interval", "start_timeout"):
            value = float(value)
        elif key == "time":
            values["time_seconds"] = parse_time(value)
            value = str(value)
        elif key == "pool":
            value = _parse_pool(value)
        values[key] = value
    return SlurmOptions(**values)


def _parse_pool(raw: Any) -> PoolOptions:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"scheduler_config['slurm']['pool'] must be a dict (nodes, allocations, time); got {raw!r}")
    fields = {name for name in PoolOptions._fields if name != "time_seconds"}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            raise ConfigError(unknown_key_message("scheduler_config['slurm']['pool']", key, sorted(fields)))
        if value is None:
            continue
        if key in ("nodes", "allocations", "slots_per_node"):
            ok = _int(value) and value >= 1
            problem = None if ok else "an integer >= 1"
        elif key == "gpus_per_node":
            problem = None if _int(value) and value >= 0 else "an integer >= 0"
        elif key == "exclusive":
            problem = None if isinstance(value, bool) else "true (whole nodes) or false (shared nodes)"
        elif key == "idle_exit":
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 <= float(value) <= 86400
            problem = None if ok else "seconds between 0 and 86400"
            value = float(value) if ok else value
        else:  # time
            try:
                values["time_seconds"] = parse_time(value)
                problem, value = None, str(value)
            except ValueError as error:
                problem = str(error)
        if problem is not None:
            raise ConfigError(f"scheduler_config['slurm']['pool'][{key!r}] must be {problem}; got {value!r}")
        values[key] = value
    return PoolOptions(**values)


def _problem(key: str, value: Any) -> str | None:
    if value is None:
        return None if key not in ("max_queued", "poll_interval", "job_name") else "given (not null)"
    if key in ("partition", "account", "qos"):
        return None if isinstance(value, str) and _NAME.match(value) else "a Slurm name (letters, digits, _.,:+@-)"
    if key == "constraint":
        ok = isinstance(value, str) and value.strip() and "\n" not in value and "\0" not in value
        return None if ok else "a Slurm constraint (e.g. 'a100|h100')"
    if key == "job_name":
        # No comma: the live arrays are found with squeue --name=, which splits at commas (then the
        # next start would not see them, and submit their runs again).
        return None if isinstance(value, str) and _JOB_NAME.match(value) else "a job name (letters, digits, _.:+@-)"
    if key in ("max_parallel", "cpus_per_run", "max_queued"):
        return None if _int(value) and value >= 1 else "an integer >= 1"
    if key == "gpus_per_run":
        return None if _int(value) and value >= 0 else "an integer >= 0"
    if key == "time":
        try:
            parse_time(value)
        except ValueError as error:
            return str(error)
        return None
    if key == "mem":
        return None if isinstance(value, str) and _MEMORY.match(value) else "a Slurm memory size ('16G', '4000M')"
    if key in ("setup", "extra"):
        lines = [value] if isinstance(value, str) else value
        ok = isinstance(lines, (list, tuple)) and all(isinstance(line, str) and "\0" not in line for line in lines)
        if ok and key == "extra":
            return next(filter(None, map(_own_flag_problem, lines)), None)
        return None if ok else "a string or a list of strings"
    if key == "poll_interval":
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and 0.5 <= float(value) <= 3600
        return None if ok else "seconds between 0.5 and 3600"
    if key == "start_timeout":
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and 5 <= float(value) <= 86400
        return None if ok else "seconds between 5 and 86400"
    return None


# sbatch flags the backend sets itself: one in `extra` would override it (sbatch takes the last), and
# the backend would lose track of its arrays (a renamed array is not found again: its runs are
# submitted twice) or of their output, folder or hold. Short forms too, and the unique prefixes of
# the long ones that sbatch's option parser accepts (--job=x).
_OWN_FLAGS = {
    "job-name": "J",
    "array": "a",
    "output": "o",
    "open-mode": "",
    "chdir": "D",
    "hold": "H",
    "parsable": "",
    "wrap": "",
    "signal": "",
}
# Flags that have a key of their own, which the backend also uses (placement, time limits).
_KEYED_FLAGS = {
    "partition": ("p", "partition"),
    "account": ("A", "account"),
    "qos": ("q", "qos"),
    "constraint": ("C", "constraint"),
    "mem": ("", "mem"),
    "time": ("t", "time"),
    "gres": ("", "gpus_per_run"),
    "cpus-per-task": ("c", "cpus_per_run"),
}


def _own_flag_problem(argument: str) -> str | None:
    """Why ``argument`` of ``extra`` is refused (a flag the backend sets), or None.

    >>> _own_flag_problem("--exclusive") is None
    True
    >>> _own_flag_problem("--job=mine")
    'sbatch arguments other than --job-name (the backend sets it itself)'
    >>> _own_flag_problem("-p gpu")
    "sbatch arguments other than --partition (use scheduler_config['slurm']['partition'])"
    """
    text = argument.strip()
    if text.startswith("--"):
        name = text[2:].split("=", 1)[0].split(None, 1)[0] if len(text) > 2 else ""
        matches = [flag for flag in (*_OWN_FLAGS, *_KEYED_FLAGS) if name and flag.startswith(name)]
        exact = [flag for flag in matches if flag == name]
        flag = exact[0] if exact else (matches[0] if len(matches) == 1 else None)
    elif text.startswith("-") and len(text) > 1:
        short = text[1]
        shorts = {v: k for k, v in _OWN_FLAGS.items() if v} | {v[0]: k for k, v in _KEYED_FLAGS.items() if v[0]}
        flag = shorts.get(short)
    else:
        flag = None
    if flag is None:
        return None
    if flag in _KEYED_FLAGS:
        return f"sbatch arguments other than --{flag} (use scheduler_config['slurm'][{_KEYED_FLAGS[flag][1]!r}])"
    return f"sbatch arguments other than --{flag} (the backend sets it itself)"


def _int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
