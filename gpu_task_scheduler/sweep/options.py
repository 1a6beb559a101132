"""``scheduler_config``: every key, its default, its check, and the typed options it becomes.

:func:`parse_scheduler_config` validates the dict once, completely, and
returns a frozen :class:`SchedulerOptions`: sizes are bytes (``"10GiB"`` is
parsed here, nowhere else), seconds are floats, the ``gpu`` entry is slots.
What the user wrote stays available, with defaults filled in, as
:meth:`SchedulerOptions.as_dict` (the original's ``get_all_scheduler_config()``).
"""

from __future__ import annotations

import copy
import numbers
import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, did_you_mean, unknown_key_message
from ..finite import finite_number
from ..gpu.devices import Slot, normalize_gpu_entries, parse_memory, parse_slots
from ..layout import log_name_problem
from ..recordclass import Record, field

if TYPE_CHECKING:
    from .slurm import SlurmOptions


def _bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else "a bool (true or false)"


def _prewarm(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, Mapping) and set(value) <= {"imports"}:
        imports = value.get("imports", [])
        if isinstance(imports, list) and all(isinstance(name, str) and _MODULE.fullmatch(name) for name in imports):
            return None
    return "a bool (true or false) or {imports: [module, ...]} (what the warm process imports from the start)"


_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else "a string"


def _key_name(value: Any) -> str | None:
    return None if isinstance(value, str) and value else "a non-empty string (a config key)"


def _path(value: Any) -> str | None:
    ok = isinstance(value, (str, os.PathLike)) and isinstance(os.fspath(value), str)
    ok = ok and bool(os.fspath(value)) and "\0" not in os.fspath(value)
    return None if ok else "a non-empty path (without NUL characters)"


def _optional(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    def optional(value: Any) -> str | None:
        problem = check(value)
        return None if value is None or problem is None else f"{problem} or null"

    return optional


def _int_at_least(minimum: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= minimum
        return None if ok else f"an integer >= {minimum}"

    return check


# The longest wait any option may ask for: a year. Beyond it a timeout is a typo, and the clocks'
# waits overflow (a thread's wait takes at most threading.TIMEOUT_MAX, about 292 years).
MAX_SECONDS = 365 * 24 * 3600


def _seconds(allow_zero: bool) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = (
            finite_number(value)
            and (float(value) >= 0 if allow_zero else float(value) > 0)
            and float(value) <= MAX_SECONDS
        )
        bound = ">= 0" if allow_zero else "> 0"
        return None if ok else f"a number of seconds {bound} and at most {MAX_SECONDS} (a year)"

    return check


def _string_list(value: Any) -> str | None:
    ok = isinstance(value, (list, tuple)) and all(isinstance(item, str) and item for item in value)
    return None if ok else "a list of non-empty strings"


def _memory(value: Any) -> str | None:
    try:
        parse_memory(value, "")
    except ConfigError:
        return 'a memory size such as 10000000000, "10GB" or "9.5GiB"'
    return None


def _one_of(*choices: Any) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices else "one of " + ", ".join(repr(c) for c in choices)

    return check


def _fraction(value: Any) -> str | None:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < float(value) <= 1
    return None if ok else "a fraction in (0, 1]"


def _percent(value: Any) -> str | None:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < float(value) <= 100
    return None if ok else "a percentage in (0, 100]"


def _non_negative(value: Any) -> str | None:
    ok = finite_number(value) and float(value) >= 0
    return None if ok else "a number >= 0"


PLACEMENTS = ("first_fit", "round_robin", "random", "most_free")
BUDGET_KEYS = ("gpu_hours",)


def _budget(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value:
        return "null or a dict of limits, e.g. {gpu_hours: 50} (the GPU-hours the sweep may spend)"
    for key, limit in value.items():
        if key not in BUDGET_KEYS:
            guess = did_you_mean(str(key), BUDGET_KEYS)[:-1]  # "; did you mean 'gpu_hours'" or ""
            return f"a dict of limits: {', '.join(BUDGET_KEYS)} ({key!r} is none of them{guess})"
        if not finite_number(limit) or float(limit) <= 0:
            return f"a dict of limits whose {key} is a number > 0"
    return None


CHECKPOINT_KEYS = ("max_disk",)


def _checkpoints(value: Any) -> str | None:
    what = 'null or a dict such as {max_disk: "200GB"} (the disk the sweep\'s checkpoints may use)'
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value:
        return what
    for key, limit in value.items():
        if key not in CHECKPOINT_KEYS:
            guess = did_you_mean(str(key), CHECKPOINT_KEYS)[:-1]
            return f"{what}: {key!r} is no key of it{guess}"
        if _memory(limit) is not None or parse_memory(limit, key) <= 0:
            return f'{what}, whose max_disk is a size above 0 such as 200000000000, "200GB" or "186GiB"'
    return None


class Checkpoints(Record):
    """``checkpoints``: what the sweep's checkpoints may take. ``max_disk``: bytes of disk that the
    population's checkpoints and snapshots may take (engine/pauses.py): no snapshot past it."""

    max_disk: int | None = None


class Budget(Record):
    """``budget``: what the sweep may spend; it starts no new run once one limit is reached."""

    gpu_hours: float | None = None


def _command_option(value: Any) -> str | None:
    ok = (isinstance(value, str) and value.strip()) or (
        isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value)
    )
    return None if ok else "a command: a list of arguments or a string"


_EMAIL_KEYS = {
    "attach_report",
    "host",
    "port",
    "sender",
    "recipients",
    "starttls",
    "ssl",
    "ca_file",
    "allow_insecure_auth",
    "username_env",
    "password_env",
    "subject",
}


def _email_option(value: Any) -> str | None:
    problem = (
        "a dict with host, sender, recipients (a list) and optionally port, starttls or ssl (true/false), "
        "ca_file, allow_insecure_auth, username_env, password_env, subject"
    )
    if (
        not isinstance(value, Mapping)
        or not {"host", "sender", "recipients"} <= set(value)
        or not set(value) <= _EMAIL_KEYS
    ):
        return problem
    recipients = value["recipients"]
    if not isinstance(recipients, (list, tuple)) or not recipients or not all(isinstance(r, str) for r in recipients):
        return problem
    if not isinstance(value.get("port", 25), int) or isinstance(value.get("port", 25), bool):
        return problem
    if not all(
        isinstance(value.get(key, False), bool) for key in ("starttls", "ssl", "allow_insecure_auth", "attach_report")
    ):
        return problem
    if value.get("starttls") and value.get("ssl"):
        return problem + " (starttls and ssl together: choose one)"
    if value.get("ca_file") is not None and not isinstance(value.get("ca_file"), str):
        return problem
    return None


# key -> (default factory, check). Defaults match the original GPUTaskScheduler.
SCHEDULER_KEYS: dict[str, tuple[Callable[[], Any], Callable[[Any], str | None]]] = {
    "force_rerun": (lambda: False, _bool),
    "result_root_folder": (lambda: os.path.abspath("results/"), _path),
    "temp_folder": (lambda: os.path.abspath("temp/"), _path),
    "test_config_string_indicator": (lambda: "-", _text),
    "test_config_string_separator": (lambda: ",", _text),
    "test_config_string_inst_separator": (lambda: "+", _text),
    "log_file": (lambda: "worker.log", log_name_problem),
    "scheduler_log_file_path": (lambda: "scheduler.log", _optional(_path)),
    "config_string_value_maxlen": (lambda: 30, _optional(_int_at_least(1))),
    "ignored_keys_for_folder_name": (lambda: [], _string_list),
    "ignored_characters_for_folder_name": (lambda: [" ", "[", "]"], _string_list),
    # Beyond the original.
    "skip_existing_folders": (lambda: False, _bool),
    "max_retries": (lambda: 0, _int_at_least(0)),
    "timeout": (lambda: None, _optional(_seconds(allow_zero=False))),
    "grace_period": (lambda: 10.0, _seconds(allow_zero=True)),
    "prewarm": (lambda: True, _prewarm),
    "on_config_change": (lambda: "stop", _one_of("stop", "rerun", "keep")),
    # GPU awareness (see gpu/placement.py).
    "max_runs_per_gpu": (lambda: 1, _int_at_least(1)),
    "gpu_memory": (lambda: None, _optional(_memory)),
    "gpu_memory_key": (lambda: "gpu_memory", _key_name),
    "learn_gpu_memory": (lambda: "max", _one_of("max", "mean", None)),
    "memory_margin": (lambda: "512MiB", _memory),
    "min_free_gpu_memory": (lambda: None, _optional(_memory)),
    "placement": (lambda: "first_fit", _one_of(*PLACEMENTS)),
    "busy_memory_fraction": (lambda: None, _optional(_fraction)),
    "busy_utilization": (lambda: None, _optional(_percent)),
    "max_oom_retries": (lambda: 2, _int_at_least(0)),
    "gpu_poll_interval": (lambda: 2.0, _seconds(allow_zero=False)),
    "share_gpu_reservations": (lambda: True, _bool),
    "idle_holder_after": (lambda: 600.0, _seconds(allow_zero=True)),
    "cpu_fallback": (lambda: 0, _int_at_least(0)),
    "max_host_cpu_percent": (lambda: None, _optional(_percent)),
    "min_host_free_memory": (lambda: None, _optional(_memory)),
    "budget": (lambda: None, _budget),
    "checkpoints": (lambda: None, _checkpoints),
    # Where runs run (see backends/ray/, backends/slurm/): this machine, a Ray cluster, a Slurm cluster.
    "backend": (lambda: "local", _one_of("local", "ray", "slurm")),
    "ray_address": (lambda: None, _optional(_text)),
    "ray_cpus_per_run": (lambda: 0, _non_negative),
    "ray_local_gpus": (lambda: None, _optional(_int_at_least(0))),
    "node_failure_retries": (lambda: 3, _int_at_least(0)),
    "lease_interval": (lambda: 1.0, _seconds(allow_zero=False)),
    "slurm": (lambda: None, _optional(lambda value: None if isinstance(value, Mapping) else "a dict of Slurm options")),
    # Notifications when the sweep ends (see reports/notify.py).
    "notify_command": (lambda: None, _optional(_command_option)),
    "notify_email": (lambda: None, _optional(_email_option)),
}


class SchedulerOptions(Record):
    """``scheduler_config`` after validation, every default filled in; sizes in bytes."""

    slots: tuple[Slot, ...] | None  # None for "gpu": "all", resolved against the machine when the sweep starts
    force_rerun: bool
    result_root_folder: str
    temp_folder: str
    test_config_string_indicator: str
    test_config_string_separator: str
    test_config_string_inst_separator: str
    log_file: str | None
    scheduler_log_file_path: str | None
    config_string_value_maxlen: int | None
    ignored_keys_for_folder_name: list[str]
    ignored_characters_for_folder_name: list[str]
    skip_existing_folders: bool
    max_retries: int
    timeout: float | None
    grace_period: float
    # fork Python runs (GPUTask runs, Python commands) from a warm process (backends/local/zygote.py);
    # False: every run starts cold
    prewarm: bool
    warm_imports: tuple[str, ...]  # what that warm process imports from the start (prewarm: {imports: [...]})
    on_config_change: str  # a succeeded run whose config changed since: "stop", "rerun" or "keep"
    max_runs_per_gpu: int
    gpu_memory: int | None
    gpu_memory_key: str
    learn_gpu_memory: str | None
    memory_margin: int
    min_free_gpu_memory: int | None  # what a GPU must have available for a run whose need is not known yet
    placement: str
    busy_memory_fraction: float | None
    busy_utilization: float | None
    max_oom_retries: int
    gpu_poll_interval: float
    share_gpu_reservations: bool  # publish and honour reservations machine-wide (gpu/shared.py)
    idle_holder_after: float  # a process holding GPU memory this long at 0 % utilisation is named
    cpu_fallback: int
    max_host_cpu_percent: float | None
    min_host_free_memory: int | None
    budget: Budget | None  # what the sweep may spend (engine/budget.py); None: no limit
    checkpoints: Checkpoints | None  # what its checkpoints may take (checkpoints: {max_disk}); None: no limit
    backend: str  # "local" (this machine's GPUs), "ray" or "slurm"
    ray_address: str | None  # an existing cluster ("auto", "HOST:PORT"); None: a Ray instance of our own
    ray_cpus_per_run: float  # CPUs each run's Ray task asks for
    ray_local_gpus: int | None  # GPUs a Ray instance of our own declares (None: as Ray detects them)
    node_failure_retries: int  # a run whose machine went away runs again elsewhere, this many times
    lease_interval: float  # how often a run on another machine renews its lease (records/lease.py)
    slurm: SlurmOptions | None  # backend slurm's (sweep/slurm.py); None with another backend and no slurm section
    notify_command: str | list[str] | None
    notify_email: Mapping[str, Any] | None
    given: Mapping[str, Any] = field(repr=False, compare=False)  # as written, defaults added

    def as_dict(self) -> dict[str, Any]:
        """The options as the user wrote them (``"10GiB"`` stays a string), with every default."""
        return copy.deepcopy(dict(self.given))

    def memory_need(self, config: Mapping[str, Any]) -> int | None:
        """The GPU memory a run declares (its ``gpu_memory_key``, else ``gpu_memory``), in bytes, or None."""
        if self.gpu_memory_key in config:
            return parse_memory(config[self.gpu_memory_key], self.gpu_memory_key)
        return self.gpu_memory


_SIZES = ("gpu_memory", "memory_margin", "min_free_gpu_memory", "min_host_free_memory")
_SECONDS = ("timeout", "grace_period", "gpu_poll_interval", "idle_holder_after")


def parse_scheduler_config(raw: Any) -> SchedulerOptions:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"scheduler_config must be a dict; got {type(raw).__name__} {raw!r}")
    for key in raw:
        if key != "gpu" and key not in SCHEDULER_KEYS:
            raise ConfigError(unknown_key_message("scheduler_config", key, ["gpu", *SCHEDULER_KEYS]))
    if "gpu" not in raw:
        if raw.get("backend") != "slurm":
            raise ConfigError(
                'could not find gpu in scheduler_config; add e.g. "gpu": ["0", "1"] (this machine\'s GPUs 0 and 1), '
                '"gpu": "all" (every GPU here; on a cluster: one GPU per run) or "gpu": ["cpu"]'
            )
        raw = {**raw, "gpu": "all"}  # on a Slurm cluster the GPUs are the cluster's: one per run
    parsed = parse_slots(raw["gpu"])
    given: dict[str, Any] = {"gpu": normalize_gpu_entries(raw["gpu"])}
    for key, (default, check) in SCHEDULER_KEYS.items():
        if key not in raw:
            given[key] = default()
            continue
        value = raw[key]
        problem = check(value)
        if problem is not None:
            raise ConfigError(f"scheduler_config[{key!r}] must be {problem}; got {value!r} ({type(value).__name__})")
        given[key] = os.fspath(value) if isinstance(value, os.PathLike) else copy.deepcopy(value)
    # What the result root and the log name must be to hold records (a folder, a path SQLite can
    # open, a log outside the records' folder) is checked where the root is opened
    # (records/paths.py: check_root), not here: the config layer knows nothing of the storage.
    typed = {key: copy.deepcopy(value) for key, value in given.items() if key != "gpu"}
    for key in _SIZES:
        typed[key] = None if typed[key] is None else parse_memory(typed[key], key)
    for key in _SECONDS:
        typed[key] = None if typed[key] is None else float(typed[key])
    if isinstance(typed["prewarm"], Mapping):
        typed["warm_imports"] = tuple(typed["prewarm"].get("imports", ()))
        typed["prewarm"] = True
    else:
        typed["warm_imports"] = ()
    if typed["checkpoints"] is not None:
        typed["checkpoints"] = Checkpoints(max_disk=parse_memory(typed["checkpoints"]["max_disk"], "max_disk"))
    if typed["budget"] is not None:
        typed["budget"] = Budget(**{key: float(limit) for key, limit in typed["budget"].items()})
    if typed["slurm"] is not None or typed["backend"] == "slurm":  # else not imported: 1.5 ms of a start
        from .slurm import parse_slurm_options

        typed["slurm"] = parse_slurm_options(typed["slurm"])
    return SchedulerOptions(slots=None if parsed is None else tuple(parsed), given=given, **typed)
