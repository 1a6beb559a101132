"""What a run reports as it trains: its metrics file, read tolerantly and within bounds.

A run appends one JSON object per line to ``<run>/.gts/metrics.jsonl`` (the
environment variable ``GTS_METRICS_FILE`` names it; ``gpu_task_scheduler.report``
and ``GPUTask.report`` write it for Python code), each with a ``step``::

    {"step": 12, "loss": 0.231, "acc": 0.91}

The file is written by the run, so it is as hostile as anything else under
the result root. :class:`MetricsReader` reads what is new since its last
read, at most ``MAX_READ`` bytes at a time, through ``open_regular`` (never a
link, never blocking on a FIFO), and skips every line that is not such an
object: not JSON, no numeric ``step``, a step lower than the one before, a
value that is not a finite number, a step that is none (``finite.step_problem``: below 0 or above
2**53), a line over ``MAX_LINE`` bytes. It keeps
only a summary per metric (its last value and step, its lowest and highest),
for at most ``MAX_METRICS`` metrics, so neither a long run nor a malicious
one can fill the scheduler's memory. The first bad line is remembered, in
words, so that the scheduler can say so once per run.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from ..finite import step_problem
from ..reporting import TIME_KEY
from .paths import RunPaths, UnsafePathError, open_regular

MAX_LINE = 64 << 10  # bytes of one line; a longer one is skipped
MAX_READ = 4 << 20  # bytes read in one call
MAX_METRICS = 100  # metric names kept per run
# A line's time outside these (2000-01-01 and 2200-01-01 UTC) is none: a step's time is then left to
# the reader. 1e-300 was taken for 1970 and 99999999999.9 for the year 5138, in the exports too.
MIN_TIME, MAX_TIME = 946684800.0, 7258118400.0


def plausible_time(stamp: float) -> bool:
    """Whether ``stamp`` (seconds since the epoch) can be when a step was reported.

    >>> [plausible_time(t) for t in (1764432000.5, 0, -5, 1e-300, 99999999999.9)]
    [True, False, False, False, False]
    """
    return MIN_TIME < stamp < MAX_TIME


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_line(line: bytes) -> tuple[float, dict[str, float]] | str:
    """``(step, metrics)`` of one line, or why it is skipped. Its time (``@time``) is no metric.

    >>> parse_line(b'{"step": 3, "loss": 0.5}')
    (3, {'loss': 0.5})
    >>> parse_line(b'{"step": 3, "loss": 0.5, "@time": 1764432000.5}')
    (3, {'loss': 0.5})
    >>> parse_line(b'{"loss": 0.5}')
    'it has no numeric "step"'
    >>> parse_line(b'{"step": 1, "loss": "low"}')
    "its value of 'loss' is not a finite number"
    >>> parse_line(b'{"step": 1e300, "loss": 0.5}')
    'its step is no step: it is above 2**53'
    """
    parsed = parse_timed(line)
    return parsed if isinstance(parsed, str) else parsed[:2]


def parse_timed(line: bytes) -> tuple[float, dict[str, float], float | None] | str:
    """:func:`parse_line`, and when the line was reported: its ``@time``, where it is a number of
    seconds since the epoch (a line without one, or with one that is no such number, is as good a
    line; its time is None).

    >>> parse_timed(b'{"step": 3, "loss": 0.5, "@time": 1764432000.5}')
    (3, {'loss': 0.5}, 1764432000.5)
    >>> parse_timed(b'{"step": 3, "loss": 0.5, "@time": "noon"}')
    (3, {'loss': 0.5}, None)
    """
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return "it is not JSON"
    if not isinstance(record, dict):
        return "it is not a JSON object"
    stamp = record.pop(TIME_KEY, None)
    step = record.pop("step", None)
    if not _number(step):
        return 'it has no numeric "step"'
    problem = step_problem(step)
    if problem is not None:
        return f"its step is no step: {problem}"
    for key, value in record.items():
        if not _number(value):
            return f"its value of {key!r} is not a finite number"
    return step, record, float(stamp) if _number(stamp) and plausible_time(stamp) else None


class MetricsReader:
    """The summary of one attempt's metrics file, read incrementally."""

    def __init__(self, path: str, *, keep_points: bool = False) -> None:
        """``keep_points``: also keep every good line as ``(step, metrics)`` in :attr:`points` (a
        curve, for plots and ``results.curves()``)."""
        self.path = path
        self.points: list[tuple[float, dict[str, float]]] | None = [] if keep_points else None
        self.offset = 0
        self.summary: dict[str, dict[str, float]] = {}  # name -> {"last", "step", "min", "max"}
        self.last_step: float | None = None
        self.lines = 0  # good lines read
        self.problem: str | None = None  # the first bad line, in words
        self._partial = b""
        self._skipping = False  # inside a line over MAX_LINE: skip to its end
        self._line_number = 0

    def read(self, limit: int = MAX_READ) -> int:
        """Read what the run appended since the last call (at most ``limit`` bytes); how many
        good lines that gave. A missing file is no line yet; a link or a FIFO is a problem."""
        try:
            fd = open_regular(self.path)
        except FileNotFoundError:
            return 0
        except OSError as error:
            strerror = error.strerror if isinstance(error, UnsafePathError) else str(error)
            self._note(f"the metrics file is not read: {strerror}")
            return 0
        try:
            if os.fstat(fd).st_size < self.offset:  # replaced by a shorter file: start again
                self.offset, self._partial, self._skipping = 0, b"", False
            os.lseek(fd, self.offset, os.SEEK_SET)
            data = os.read(fd, limit)
        finally:
            os.close(fd)
        self.offset += len(data)
        before = self.lines
        *complete, self._partial = (self._partial + data).split(b"\n")
        for line in complete:
            self._line(line)
        if len(self._partial) > MAX_LINE:
            self._line_number += 1
            self._note(f"line {self._line_number} is over {MAX_LINE // 1024} KiB")
            self._partial, self._skipping = b"", True
        return self.lines - before

    def _line(self, line: bytes) -> None:
        if self._skipping:  # the end of a line that was too long
            self._skipping = False
            return
        self._line_number += 1
        if not line.strip():
            return
        if len(line) > MAX_LINE:
            self._note(f"line {self._line_number} is over {MAX_LINE // 1024} KiB")
            return
        parsed = parse_line(line)
        if isinstance(parsed, str):
            self._note(f"line {self._line_number} is skipped: {parsed}")
            return
        step, metrics = parsed
        if self.last_step is not None and step < self.last_step:
            self._note(f"line {self._line_number} is skipped: its step {step:g} goes back from {self.last_step:g}")
            return
        self.last_step = step
        self.lines += 1
        if self.points is not None:
            self.points.append((step, metrics))
        for name, value in metrics.items():
            kept = self.summary.get(name)
            if kept is None:
                if len(self.summary) >= MAX_METRICS:
                    self._note(f"more than {MAX_METRICS} metrics: {name!r} and later ones are not kept")
                    continue
                self.summary[name] = {"last": value, "step": step, "min": value, "max": value}
            else:
                kept.update(last=value, step=step, min=min(kept["min"], value), max=max(kept["max"], value))

    def _note(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem

    def summary_json(self) -> str | None:
        """The summary as the ledger keeps it (None when nothing was reported)."""
        return json.dumps(self.summary, sort_keys=True) if self.summary else None


def read_all(path: str, *, limit: int = 64 << 20, keep_points: bool = False) -> MetricsReader:
    """A reader that has read the whole file (at most ``limit`` bytes)."""
    reader = MetricsReader(path, keep_points=keep_points)
    while reader.offset < limit:
        before = reader.offset
        reader.read(min(MAX_READ, limit - reader.offset))
        if reader.offset == before:
            break
    return reader


def latest(path: str) -> tuple[float, dict[str, float]] | None:
    """The last good line of a metrics file, read from its end (at most two lines' worth): what
    ``gts status --watch`` shows of a running run, every second, at a bounded cost."""
    try:
        fd = open_regular(path)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - 2 * MAX_LINE), os.SEEK_SET)
        data = os.read(fd, 2 * MAX_LINE)
    finally:
        os.close(fd)
    for line in reversed(data.split(b"\n")[1 if size > 2 * MAX_LINE else 0 :]):
        parsed = parse_line(line) if line.strip() else "empty"
        if not isinstance(parsed, str):
            return parsed
    return None


CURVE_POINTS = 1000  # points of one run's curve that a view draws: more than a chart has pixels
CURVE_BYTES = 1 << 20  # a metrics file up to this size is read whole for a curve; a larger one is sampled
_WINDOW = 8 << 10  # bytes read at each place a large file is sampled (more, up to two lines, if a line is long)

Point = tuple[float, dict[str, float]]


def sample_curve(path: str, *, most: int = CURVE_POINTS, whole: int = CURVE_BYTES) -> list[Point]:
    """At most ``most`` good points of a metrics file, spread evenly over it, the last one always
    among them: a run's curve for a chart, at a cost bounded whatever the run wrote (a run that
    reported 3.5 M steps would otherwise cost a view a minute and a gigabyte).

    A file up to ``whole`` bytes is read whole and thinned to every k-th point. A larger one is
    read at ``most`` evenly spaced places, a few KiB each, taking the first good line after each
    place (and the last good line of the file): its steps only go up (a line whose step goes back
    from the one before is skipped, as :class:`MetricsReader` does), so the places give the curve's
    shape."""
    most = max(2, most)
    try:
        fd = open_regular(path)
    except OSError:
        return []
    try:
        size = os.fstat(fd).st_size
        if size <= whole:
            points = _points(os.pread(fd, size, 0).split(b"\n"))
            if len(points) > most:
                stride = -(-(len(points) - 1) // (most - 1))  # most - 1 of them, and the last
                points = points[:-1:stride] + points[-1:]
            return points
        found: list[Point] = []
        for place in range(most - 1):
            point = _first_after(fd, size * place // (most - 1), size)
            if point is not None and (not found or point[0] >= found[-1][0]):
                found.append(point)
        tail = os.pread(fd, 2 * MAX_LINE, max(0, size - 2 * MAX_LINE)).split(b"\n")[1:]
        last = _points(tail)[-1:]
        if last and (not found or last[0][0] >= found[-1][0]):
            found = [point for point in found if point[0] <= last[0][0]] + last
        return found
    finally:
        os.close(fd)


_ATTEMPT_METRICS = re.compile(r"attempt-([0-9]{1,9})-metrics\.jsonl")


def attempt_files(paths: RunPaths) -> list[str]:
    """The run's metrics files, its earliest attempt's first: those kept of earlier attempts
    (``.gts/logs/attempt-N-metrics.jsonl``, by N) and the current one."""
    try:
        names = os.listdir(paths.old_logs)
    except OSError:
        names = []
    kept = sorted((int(m[1]), name) for name in names if (m := _ATTEMPT_METRICS.fullmatch(name)))
    return [os.path.join(paths.old_logs, name) for _, name in kept] + [paths.metrics]


def stitch(attempts: list[list[Point]]) -> list[Point]:
    """One curve of a run's attempts (earliest first): each attempt's points before the first step
    of the attempts after it. An attempt that went on from a checkpoint continues the curve from
    there; one that started again from its first step replaces what came before."""
    curve: list[Point] = []
    for points in reversed(attempts):
        if curve:
            points = [point for point in points if point[0] < curve[0][0]]
        curve = points + curve
    return curve


def run_points(paths: RunPaths) -> list[Point]:
    """Every point the run reported, across its attempts (:func:`stitch`), each file read as
    :func:`read_all` reads it."""
    return stitch([read_all(path, keep_points=True).points or [] for path in attempt_files(paths)])


def run_times(paths: RunPaths, *, limit: int = 64 << 20) -> dict[float, float]:
    """When the run reported each step (the ``@time`` of its lines), across its attempts: a step an
    attempt after another reported again has the later time, as :func:`stitch` keeps its values. A
    step with no time is not in it (each file read up to ``limit`` bytes, as :func:`read_all`)."""
    times: dict[float, float] = {}
    for path in attempt_files(paths):
        try:
            fd = open_regular(path)
        except OSError:
            continue
        try:
            data = os.read(fd, limit)
        finally:
            os.close(fd)
        for line in data.split(b"\n"):
            if line.strip() and len(line) <= MAX_LINE:
                parsed = parse_timed(line)
                if not isinstance(parsed, str) and parsed[2] is not None:
                    times[parsed[0]] = parsed[2]
    return times


def run_summary(paths: RunPaths) -> str | None:
    """The ledger's summary of what the run reported (as :meth:`MetricsReader.summary_json`), across
    its attempts (:func:`stitch`): a resumed run's ``min`` and ``max`` are of its whole curve."""
    summary: dict[str, dict[str, float]] = {}
    for step, metrics in run_points(paths):
        for name, value in metrics.items():
            kept = summary.get(name)
            if kept is None:
                if len(summary) < MAX_METRICS:
                    summary[name] = {"last": value, "step": step, "min": value, "max": value}
            else:
                kept.update(last=value, step=step, min=min(kept["min"], value), max=max(kept["max"], value))
    return json.dumps(summary, sort_keys=True) if summary else None


def run_curve(paths: RunPaths, *, most: int = CURVE_POINTS) -> list[Point]:
    """:func:`sample_curve` of the run across its attempts (:func:`stitch`), at most ``most`` points."""
    curve = stitch([sample_curve(path, most=most) for path in attempt_files(paths)])
    if len(curve) > most:
        stride = -(-(len(curve) - 1) // (most - 1))
        curve = curve[:-1:stride] + curve[-1:]
    return curve


def _points(lines: list[bytes]) -> list[Point]:
    """The good points of ``lines``, a step that goes back skipped."""
    points: list[Point] = []
    for line in lines:
        if not line.strip() or len(line) > MAX_LINE:
            continue
        parsed = parse_line(line)
        if not isinstance(parsed, str) and (not points or parsed[0] >= points[-1][0]):
            points.append(parsed)
    return points


def _first_after(fd: int, offset: int, size: int) -> Point | None:
    """The first good line after ``offset`` whose step does not go back from the good line before
    it (at the file's start, the first good line). The line ``offset`` falls in is cut, so the
    line before the one taken must be read too: a line whose step goes back is skipped."""
    length = _WINDOW
    while True:
        data = os.pread(fd, length, offset)
        complete = data.split(b"\n")[1 if offset else 0 : -1]  # the first is cut (unless at 0), the last may be
        before: float | None = None if offset else -math.inf
        for line in complete:
            if line.strip() and len(line) <= MAX_LINE:
                parsed = parse_line(line)
                if isinstance(parsed, str):
                    continue
                if before is not None and parsed[0] >= before:
                    return parsed
                before = parsed[0]
        if length >= 2 * MAX_LINE or offset + length >= size:
            return None
        length *= 4  # long lines: fewer than two whole ones in the window yet


def shown_first(names: Iterable[str], declared: Sequence[str] = ()) -> list[str]:
    """Metric names in the order a short view shows them: those the config declares (its
    early_stop's, search's or pbt's), then losses, then the others; counters and timings (``epoch``,
    ``*_runtime``, ``*_per_second``, as the Hugging Face ``Trainer`` reports) last. Stable within each.

    >>> shown_first(["epoch", "eval_loss", "eval_runtime", "eval_accuracy"], ["eval_accuracy"])
    ['eval_accuracy', 'eval_loss', 'epoch', 'eval_runtime']
    """

    def rank(name: str) -> int:
        low = name.lower()
        if name in declared:
            return 0
        if "loss" in low:
            return 1
        if low in ("epoch", "step", "global_step") or low.endswith(("runtime", "per_second")):
            return 3
        return 2

    names = list(names)
    return sorted(names, key=lambda name: (rank(name), list(declared).index(name) if name in declared else 0))


def describe(summary: dict[str, Any], *, at_most: int = 3) -> str:
    """``loss 0.231 @ step 12, acc 0.91 @ step 12`` (the last values).

    >>> describe({"loss": {"last": 0.2314, "step": 12, "min": 0.2, "max": 2.0}})
    'loss 0.231 @ step 12'
    """
    parts = []
    for name in list(summary)[:at_most]:
        value = summary[name]
        if isinstance(value, dict) and _number(value.get("last")) and _number(value.get("step")):
            parts.append(f"{name} {value['last']:.3g} @ step {value['step']:g}")
    more = len(summary) - at_most
    return ", ".join(parts) + (f", +{more} more" if more > 0 else "")
