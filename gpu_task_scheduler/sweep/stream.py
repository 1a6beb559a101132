"""A sweep whose runs are the lines of a stream: ``gts queue``.

Compatible with simple-gpu-scheduler: one shell command per line (blank lines
and ``#`` comments skipped), each a run of its own named ``job-NNNNNN-<hash>``,
run by ``backends/local/tasks.py``'s ``ShellLineTask``. A thread reads the
stream and hands lines over through a small bounded buffer, so a fifo or
``tail -f`` can keep feeding it and a million lines never sit in memory;
``runs()`` yields :data:`NOT_READY` while no line is waiting, and the engine
sleeps until the reader wakes it.

The two threads meet once per half a buffer, not once per line: the reader
wakes the engine only when the engine found the buffer empty, and the engine
wakes the reader only when it has taken half of a full buffer (each wake-up is
a hand-over of the interpreter lock, which in a queue of short runs cost more
than reading the line).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import IO, Any

from ..digest import sha256_hex
from .expand import Sweep
from .naming import short_hash
from .spec import NOT_READY, Foreign, RunSpec, params_text

_EOF = object()


class StreamSweep(Sweep):
    """A sweep whose runs are the lines of a stream."""

    def __init__(self, config: Any, stream: IO[str], *, buffer: int = 64) -> None:
        super().__init__(config)
        self._stream = stream
        self._lines: deque[Any] = deque()  # at most `buffer` lines, then _EOF
        self._size, self._refill_at = buffer, (buffer - 1) // 2  # the reader refills from half empty
        self._changed = threading.Condition()  # guards _lines and _hungry; the reader waits on it while full
        self._hungry = False  # runs() found no line: the next line wakes the engine
        self._wake: Callable[[], None] = lambda: None
        self._reader: threading.Thread | None = None

    def __len__(self) -> int:
        raise TypeError("a queue has no length until its input ends")

    def record(self) -> str | None:
        return None  # its runs are its input's lines: nothing to run again from a record

    def follow(self, wake: Callable[[], None]) -> None:
        """Start reading the stream; ``wake()`` is called after each line, and at its end."""
        self._wake = wake
        self._reader = threading.Thread(target=self._read, name="gts-queue-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for line in self._stream:
                command = line.strip()
                if command and not command.startswith("#"):
                    self._hand_over(command)
        finally:
            self._hand_over(_EOF)

    def _hand_over(self, item: Any) -> None:
        with self._changed:
            while item is not _EOF and len(self._lines) >= self._size:  # full: reading stays lazy
                self._changed.wait()
            self._lines.append(item)
            wake, self._hungry = self._hungry or item is _EOF, False
        if wake:
            self._wake()

    def _take(self) -> Any:
        """The next line (or _EOF); None, and the next one wakes the engine, if none is waiting."""
        with self._changed:
            if not self._lines:
                self._hungry = True
                return None
            item = self._lines.popleft()
            if len(self._lines) == self._refill_at:
                self._changed.notify()  # a reader waiting for room (it waits only while full) refills
            return item

    def runs(self, foreign: Foreign | None = None) -> Iterator[RunSpec]:
        """The lines as runs, each named by its command (``job-<hash>``; the k-th repeat of a
        command in the stream ``job-<hash>-k``), not by its line number: ``--resume`` finds a job
        that succeeded wherever its line is now. Names are unique by construction, so ``foreign``
        is not needed. A command seen once costs one small int in memory (to know a repeat)."""
        root = self.options.result_root_folder
        index = 0
        seen: set[int] = set()
        repeats: dict[int, int] = {}
        while True:
            command = self._take()
            if command is None:
                yield NOT_READY
                continue
            if command is _EOF:
                return
            # 64 bits: distinct commands of a stream of millions never share a name (32 bits would).
            digest = sha256_hex(command)[:16]
            key = int(digest, 16)
            if key in seen:
                repeats[key] = repeats.get(key, 1) + 1
                name = f"job-{digest}-{repeats[key]}"
            else:
                seen.add(key)
                name = f"job-{digest}"
            yield RunSpec(
                index=index,
                block=0,
                test_config={"command": command},
                config={"command": command},
                test_config_string=name,
                name=name,
                work_dir=os.path.join(root, name),
                config_hash=short_hash(command),
                duplicate=False,
                params=params_text({"command": command}),
            )
            index += 1
