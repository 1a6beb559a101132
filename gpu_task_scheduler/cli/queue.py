"""``gts queue``: shell commands from a stream, run on the GPUs as they arrive.

Compatible with simple-gpu-scheduler: one command per line, run through the
shell with ``CUDA_VISIBLE_DEVICES`` set to the slot's GPUs. A thread reads the
stream and hands lines over through a small bounded buffer, so a fifo or
``tail -f`` can keep feeding it and a million lines never sit in memory; the
scheduler wakes when a line arrives. Each command's output goes to
``<log dir>/<job>/worker.log``.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

from ..engine.hooks import NOT_READY
from ..gpu_task import GPUTask
from ..sweep.expand import RunSpec, Sweep
from ..sweep.naming import short_hash

_EOF = object()


class ShellLineTask(GPUTask):
    """Runs ``config["command"]`` through the shell, as simple-gpu-scheduler does.

    ``shell_command`` makes the scheduler start the shell directly instead of
    a Python runner (a few milliseconds instead of a Python start per line);
    ``main()`` is the same thing, for running the task by hand.
    """

    @property
    def shell_command(self) -> str:
        return self._config["command"]

    def main(self) -> Any:
        completed = subprocess.run(self._config["command"], shell=True, stdin=subprocess.DEVNULL)
        if completed.returncode != 0:
            from ..sweep.commands import CommandFailed

            code = completed.returncode if completed.returncode > 0 else 128 - completed.returncode
            raise CommandFailed(code, f"the command failed with exit code {completed.returncode}")
        return None


class QueueSweep(Sweep):
    """A sweep whose runs are the lines of a stream."""

    def __init__(self, config: Any, stream: IO[str], *, buffer: int = 64) -> None:
        super().__init__(config)
        self._stream = stream
        self._lines: queue.Queue[Any] = queue.Queue(maxsize=buffer)
        self._wake: Callable[[], None] = lambda: None
        self._reader: threading.Thread | None = None

    def __len__(self) -> int:
        raise TypeError("a queue has no length until its input ends")

    def start_reading(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._reader = threading.Thread(target=self._read, name="gts-queue-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for line in self._stream:
                command = line.strip()
                if command and not command.startswith("#"):
                    self._lines.put(command)  # blocks while the buffer is full: reading stays lazy
                    self._wake()
        finally:
            self._lines.put(_EOF)
            self._wake()

    def runs(self, foreign: Callable[[str, str], bool] | None = None) -> Iterator[RunSpec]:
        """The lines as runs; their names are unique by index, so ``foreign`` is not needed."""
        root = self.options.result_root_folder
        index = 0
        while True:
            try:
                command = self._lines.get_nowait()
            except queue.Empty:
                yield NOT_READY
                continue
            if command is _EOF:
                return
            name = f"job-{index:06d}-{short_hash(command)}"
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
            )
            index += 1
