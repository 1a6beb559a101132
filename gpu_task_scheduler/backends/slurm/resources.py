"""What each task of a sweep's job arrays asks Slurm for: its partition, account, GPUs, CPUs, time
limit and the signal before it, from the sweep's options (``scheduler_config['slurm']``)."""

from __future__ import annotations

import math

from ...errors import GTSError
from ...sweep.options import SchedulerOptions
from ...sweep.slurm import SlurmOptions

SIGNAL_LEAD_MIN = 60.0  # Slurm sends --signal with a resolution of a minute


class Resources:
    def __init__(self, options: SchedulerOptions) -> None:
        self._o, self._s = options, options.slurm or SlurmOptions()

    def sbatch_args(self) -> list[str]:
        """The sbatch arguments every task of the sweep gets."""
        args = self.placement_args() + self.per_run_args()
        if self.time_seconds():
            args.append(f"--signal=B:TERM@{int(self.signal_lead())}")
        return args + list(self._s.extra)

    def placement_args(self) -> list[str]:
        """Where every job of the sweep goes: its partition, account, QOS, constraint and memory."""
        s = self._s
        args = [f"--partition={s.partition}"] if s.partition else []
        for flag, value in (("account", s.account), ("qos", s.qos), ("constraint", s.constraint), ("mem", s.mem)):
            if value:
                args.append(f"--{flag}={value}")
        return args

    def per_run_args(self) -> list[str]:
        args = []
        gpus = self.gpus_per_run()
        if gpus:
            args.append(f"--gres=gpu:{gpus}")
        if self._s.cpus_per_run:
            args.append(f"--cpus-per-task={self._s.cpus_per_run}")
        time_text = self.time_text()
        if time_text:
            args.append(f"--time={time_text}")
        return args

    def per_run(self) -> list[str]:
        return [arg.lstrip("-") for arg in self.per_run_args()]

    def gpus_per_run(self) -> int:
        if self._s.gpus_per_run is not None:
            return self._s.gpus_per_run
        slots = self._o.slots
        if slots is None:
            return 1
        sizes = {len(slot.gpu_ids) for slot in slots}
        if len(sizes) > 1:
            raise GTSError(
                "backend slurm: the sweep's slots have different numbers of GPUs; say how many each run "
                "gets with slurm: {gpus_per_run: N}"
            )
        return sizes.pop()

    def time_seconds(self) -> float | None:
        """Slurm's time limit per run: ``time``, or the sweep's timeout with room for its grace period."""
        if self._s.time_seconds is not None:
            return self._s.time_seconds
        if self._o.timeout is not None:
            return 60.0 * math.ceil((self._o.timeout + self._o.grace_period + 120.0) / 60.0)
        return None

    def time_text(self) -> str | None:
        if self._s.time is not None:
            return self._s.time
        seconds = self.time_seconds()
        return None if seconds is None else str(int(seconds // 60))

    def signal_lead(self) -> float:
        """How long before the time limit the supervisor hears of it: the grace period and a margin."""
        return max(SIGNAL_LEAD_MIN, math.ceil(self._o.grace_period + 30.0))
