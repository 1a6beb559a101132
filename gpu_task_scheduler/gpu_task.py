"""The base class of a user's task (import path of the original kept)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class GPUTask:
    """Subclass this and implement :meth:`main`.

    The scheduler creates one instance per run, ``Task(config, work_dir)``,
    calls :meth:`required_env` once the run folder exists, and then calls
    :meth:`main` in a fresh process whose ``CUDA_VISIBLE_DEVICES`` names the
    run's GPUs, with the launcher's working directory as the current
    directory. Attributes set in ``__init__`` or ``required_env`` reach
    ``main()`` (the instance is pickled across). Whatever ``main()`` returns
    (a dict of metrics, typically) is recorded as the run's result.
    """

    def __init__(self, config: dict[str, Any], work_dir: str) -> None:
        self._config = config
        self._work_dir = work_dir

    @property
    def config(self) -> dict[str, Any]:
        """The run's merged config (``global_config`` updated with its test values)."""
        return self._config

    @property
    def work_dir(self) -> str:
        """The run's result folder."""
        return self._work_dir

    @property
    def dependencies(self) -> list[str]:
        """In a config with stages: the result folders of the runs of earlier stages this run
        waited for (each succeeded), in the sweep's order; empty otherwise."""
        return list(self.__dict__.get("_gts_dependencies", ()))

    @property
    def checkpoint_dir(self) -> str | None:
        """The run's checkpoint folder (``GTS_CHECKPOINT_DIR``): it lasts across the run's attempts,
        so that one that goes on after an interruption or a failure finds what the one before saved
        (an attempt that starts afresh finds it empty). None outside a sweep."""
        import os

        return os.environ.get("GTS_CHECKPOINT_DIR") or None

    @property
    def resume_step(self) -> float | None:
        """The step this attempt goes on from (``GTS_RESUME_STEP``): the last step an earlier attempt
        of this run reported, or None on a fresh start. The protocol: save your checkpoint, then
        report that step; on resume, load it and train from the step after. A run that ignores it
        starts again from step 0: correct, only dearer."""
        import os

        text = os.environ.get("GTS_RESUME_STEP", "")
        if not text:
            return None
        step: float
        try:
            step = int(text)
        except ValueError:
            try:
                step = float(text)
            except ValueError:
                return None
        # nan, inf or a negative step is none a scheduler gives: a fresh start
        return step if 0 <= step < float("inf") else None

    def report(self, step: float, **metrics: float) -> None:
        """Record metrics at ``step`` as the run trains (see ``gpu_task_scheduler.reporting``):
        ``gts status`` and ``gts results`` show the latest of each. Raises
        ``gpu_task_scheduler.Pruned`` when the sweep's ``early_stop`` rule stopped this run."""
        from .reporting import report

        report(step, **metrics)

    def required_env(self) -> Mapping[str, str]:
        """Extra environment variables for the run's process."""
        return {}

    def main(self) -> Any:
        """The run itself. Raise (or exit non-zero) to mark the run failed."""
        raise NotImplementedError(f"{type(self).__name__} must implement main()")
