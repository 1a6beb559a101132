"""``scheduler_config: {budget: {gpu_hours: N}}``: no new run starts once the sweep spent N GPU-hours.

What a sweep spent is what its root's ledger recorded for every attempt of
every run, in this start and all before it (``runs.gpu_seconds``), plus what
the runs running now accrued since (gpu/usage.py). It is asked before each
start, so the budget is overshot by at most what the runs already running
spend until they end; those finish (a run cut off mid-training would waste
what it spent).

Across a kill -9 the ledger keeps each running run's GPU-seconds up to the
last look (every ``gpu_poll_interval`` while runs hold GPUs). A run the kill
left running gets a moment to end by itself (records/ledger/lock.py: NATURAL_END)
before the next start stops it; what it spends after that last look is not
recorded. So a kill, like the end of the budget, may overshoot it by what the
runs running then spend.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger("gpu_task_scheduler")


class BudgetWatch:
    """Whether the budget is spent: ``spent_before`` GPU-seconds recorded when the sweep started,
    and ``spent_since()`` accrued by this scheduler since."""

    def __init__(self, gpu_hours: float, spent_before: float, spent_since: Callable[[], float]) -> None:
        self.limit = gpu_hours * 3600.0
        self._before, self._since = spent_before, spent_since

    def spent(self) -> float:
        """GPU-seconds spent so far."""
        return self._before + self._since()

    def exhausted(self) -> str | None:
        """Why no run may start now (the budget is spent), in words; None while it may."""
        spent = self.spent()
        if spent < self.limit:
            return None
        return f"the budget of {hours(self.limit)} GPU-hours is spent ({hours(spent)} GPU-hours)"


def hours(seconds: float) -> str:
    """GPU-seconds as GPU-hours, to the precision a budget is read at.

    >>> hours(180000.0), hours(90.0), hours(0.36)
    ('50', '0.025', '0.0001')
    """
    return f"{seconds / 3600:.4g}"
