"""``max_parallel`` across several job arrays: each array's throttle (``%N``), and holds.

Slurm throttles each array on its own (``--array=0-99%4``: 4 of its tasks at a
time); a sweep has several arrays once retries and later stages are submitted
as they become ready, and together they must not run more than
``max_parallel`` runs. Slurm has no limit across jobs short of an accounting
QOS, so the driver shares the budget out, oldest array first (the sweep's
order): an array is submitted with what is free (held when nothing is), and
held arrays are released, and throttles raised, as budget frees up.

A running array's throttle is never lowered (a held one's is set as it is
released: none of its tasks ran yet): Slurm's count of an array's running tasks can
run high after one of its tasks was requeued and cancelled, and a lowered
throttle then starts nothing more. So an array that still has tasks to start
counts as using all of its throttle, and one that has none as using what it
runs; budget is handed out only from what is left, so the throttles never add
up to more than ``max_parallel``, however late the driver sees states.
"""

from __future__ import annotations

from ...recordclass import Record


class Array(Record):
    job: str
    running: int  # tasks running now (as last seen)
    pending: int  # tasks still to start
    throttle: int  # its current %N
    held: bool

    @property
    def share(self) -> int:
        """How much of the budget it may use, as it stands."""
        if self.held or self.pending == 0:
            return self.running  # nothing more of it can start
        return max(self.running, self.throttle)


class Change(Record):
    job: str
    throttle: int | None = None  # set its %N to this
    held: bool | None = None  # release (False) its pending tasks


def free(arrays: list[Array], budget: int) -> int:
    """What no array may use now."""
    return max(0, budget - sum(array.share for array in arrays))


def changes(arrays: list[Array], budget: int) -> list[Change]:
    """Raises and releases that hand out the free budget, oldest array first."""
    left = free(arrays, budget)
    out: list[Change] = []
    for array in arrays:
        if left <= 0:
            break
        if array.pending == 0:
            continue
        if array.held:
            give = min(array.pending, left)
            throttle = array.running + give
            out.append(Change(array.job, throttle=None if throttle == array.throttle else throttle, held=False))
        else:
            give = min(array.running + array.pending - array.share, left)
            if give <= 0:
                continue
            out.append(Change(array.job, throttle=array.share + give))
        left -= give
    return out
