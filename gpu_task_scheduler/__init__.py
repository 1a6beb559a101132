"""gpu_task_scheduler: config-driven hyperparameter sweeps over your GPUs.

The public names below are imported on first use (PEP 562), so that a run's
process, which only needs the runner, starts without loading the scheduler,
SQLite, YAML or the NVML bindings.
"""

import importlib
from typing import TYPE_CHECKING, Any

from .version import __version__ as __version__  # written in version.py alone (setup.py reads it)

_EXPORTS = {
    "ConfigManager": "config_manager",
    "ConfigError": "errors",
    "GTSError": "errors",
    "LedgerError": "errors",
    "RunsFailedError": "errors",
    "SchedulerBusyError": "errors",
    "TaskClassError": "errors",
    "GPUTask": "gpu_task",
    "GPUTaskScheduler": "gpu_task_scheduler",
    "lazy_import": "lazy",
    "report": "reporting",
    "Pruned": "reporting",
    "Paused": "reporting",
    "random_state": "randomness",
    "set_random_state": "randomness",
    "Ledger": "records.ledger",
    "RunRecord": "records.ledger.record",
    "RunStatus": "records.status",
    "RunOutcome": "engine.summary",
    "SweepSummary": "engine.summary",
    "RunSpec": "sweep.expand",
    "Sweep": "sweep.expand",
}
__all__ = [
    "ConfigError",
    "ConfigManager",
    "GPUTask",
    "GPUTaskScheduler",
    "GTSError",
    "Ledger",
    "LedgerError",
    "Paused",
    "Pruned",
    "RunOutcome",
    "RunRecord",
    "RunSpec",
    "RunStatus",
    "RunsFailedError",
    "SchedulerBusyError",
    "Sweep",
    "SweepSummary",
    "TaskClassError",
    "lazy_import",
    "random_state",
    "report",
    "set_random_state",
]  # written out, so that type checkers see what is exported


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpu_task_scheduler' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(list(globals()) + __all__)


if TYPE_CHECKING:  # pragma: no cover  (for type checkers and IDEs; at run time __getattr__ imports)
    from .config_manager import ConfigManager  # noqa: F401
    from .engine.summary import RunOutcome, SweepSummary  # noqa: F401
    from .errors import ConfigError, GTSError, LedgerError, RunsFailedError, SchedulerBusyError, TaskClassError  # noqa: F401
    from .gpu_task import GPUTask  # noqa: F401
    from .gpu_task_scheduler import GPUTaskScheduler  # noqa: F401
    from .lazy import lazy_import  # noqa: F401
    from .randomness import random_state, set_random_state  # noqa: F401
    from .records.ledger import Ledger  # noqa: F401
    from .records.ledger.record import RunRecord  # noqa: F401
    from .records.status import RunStatus  # noqa: F401
    from .reporting import Paused, Pruned, report  # noqa: F401
    from .sweep.expand import RunSpec, Sweep  # noqa: F401
