"""gpu_task_scheduler: config-driven hyperparameter sweeps over your GPUs."""
from .config_manager import ConfigManager
from .errors import ConfigError, GTSError, LedgerError, RunsFailedError, SchedulerBusyError, TaskClassError
from .gpu_task import GPUTask
from .gpu_task_scheduler import GPUTaskScheduler
from .lazy import lazy_import
from .ledger import Ledger, RunRecord, RunStatus
from .summary import RunOutcome, SweepSummary
from .sweep import RunSpec, Sweep

__version__ = "0.1.0"

__all__ = [
    "ConfigError", "ConfigManager", "GPUTask", "GPUTaskScheduler", "GTSError", "Ledger", "LedgerError",
    "RunOutcome", "RunRecord", "RunSpec", "RunStatus", "RunsFailedError", "SchedulerBusyError", "Sweep",
    "SweepSummary", "TaskClassError", "lazy_import",
]
