"""This test process as a run of a sweep, for the framework callbacks' tests: the environment the
scheduler gives a run, and the scheduler's word (pause or stop at a step) written where it would
write it, so that the real ``report()`` raises ``Paused`` or ``Pruned`` there."""

import importlib
import json
import os
import sys

import pytest

from gpu_task_scheduler import reporting

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Each process of a framework test trains on one thread: two runs (or a run and the other pytest
# worker) share 2 cores, and a tiny model gains nothing from more.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def framework(name, needs=None):
    """The example ``examples/integrations/<name>.py``, imported when a test first needs it (not when
    tests are collected: importing Lightning, Keras or Transformers takes seconds); skipped where its
    framework is not installed."""
    if name == "keras":
        os.environ.setdefault("KERAS_BACKEND", "torch")  # Keras 3 on PyTorch, where TensorFlow is not installed
    pytest.importorskip(needs or name, reason="the integrations extra: pip install -e '.[integrations]'")
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    return importlib.import_module(f"examples.integrations.{name}")


class RunSide:
    def __init__(self, folder, monkeypatch):
        self.folder, self._monkeypatch = str(folder), monkeypatch
        self.attempt = 0
        self.real_report = reporting.report
        self.clear()

    def clear(self):
        """Outside a sweep: a script run by hand."""
        for name in (
            reporting.METRICS_ENV,
            reporting.PRUNE_ENV,
            reporting.PAUSE_ENV,
            reporting.CHECKPOINT_ENV,
            reporting.RESUME_ENV,
            reporting.RUNGS_ENV,
            reporting.JUDGED_ENV,
        ):
            self._monkeypatch.delenv(name, raising=False)
        self._reset()

    def attempt_at(self, *, resume=None, pause_at=None, prune_at=None):
        """The next attempt of the run: it goes on from ``resume`` (a step) or starts afresh, and is
        paused (or stopped early) when it reports ``pause_at`` (``prune_at``)."""
        self.attempt += 1
        self._reset()
        env = {
            reporting.METRICS_ENV: self.metrics(self.attempt),
            reporting.PRUNE_ENV: os.path.join(self.folder, f"pruned-{self.attempt}"),
            reporting.PAUSE_ENV: os.path.join(self.folder, f"pause-{self.attempt}"),
            reporting.CHECKPOINT_ENV: os.path.join(self.folder, "checkpoint"),
            reporting.RESUME_ENV: "" if resume is None else str(resume),
        }
        for name, value in env.items():
            self._monkeypatch.setenv(name, value)
        real = self.real_report

        def report(step, **metrics):
            if step == pause_at:
                self._write(env[reporting.PAUSE_ENV], f"paused at rung {step}")
            if step == prune_at:
                self._write(env[reporting.PRUNE_ENV], f"pruned at step {step}")
            real(step, **metrics)

        self._monkeypatch.setattr(reporting, "report", report)

    def metrics(self, attempt):
        return os.path.join(self.folder, f"metrics-{attempt}.jsonl")

    def lines(self, attempt=None):
        """The lines reported by one attempt (the last by default), without their times (``@time``)."""
        try:
            with open(self.metrics(attempt or self.attempt)) as handle:
                return [{k: v for k, v in json.loads(line).items() if k != "@time"} for line in handle]
        except FileNotFoundError:
            return []

    def steps(self, attempt=None):
        return [line["step"] for line in self.lines(attempt)]

    def _reset(self):
        for name in ("_waits", "_passed", "_pruned", "_paused"):
            self._monkeypatch.setattr(reporting, name, None)

    @staticmethod
    def _write(path, text):
        with open(path, "w") as handle:
            handle.write(text)
