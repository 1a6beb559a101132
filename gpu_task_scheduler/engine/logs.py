"""The scheduler log: one format, the original's, on the console and in ``scheduler.log``.

The library never configures logging for the application: handlers go on this
package's logger for the duration of a sweep only, and the console handler is
added only when the application has not configured logging itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator, Sequence

from ..errors import GTSError

logger = logging.getLogger("gpu_task_scheduler")

FORMAT = "%(asctime)s %(levelname)s %(message)s"
DATE_FORMAT = "%a, %d %b %Y %H:%M:%S"


# Control characters but newline and tab: in a value (a run's name, a log tail), an ESC would drive
# the terminal that shows the log.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class ConsoleFormatter(logging.Formatter):
    r"""The log's format for a console: control characters shown as ``\x1b`` (scheduler.log keeps them).

    >>> ConsoleFormatter("%(message)s").format(logging.makeLogRecord({"msg": "a\x1b[2Jb\tc"}))
    'a\\x1b[2Jb\tc'
    """

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return _UNPRINTABLE.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), text)


def file_only(lines: Sequence[str]) -> None:
    """Lines for ``scheduler.log`` alone (the original's two lines for each skipped run; the
    console gets one count), in the log's format, written at once: a logging record each
    would cost more than deciding the run (100,000 skipped runs: seconds, not milliseconds)."""
    if not lines:
        return
    for handler in logger.handlers:
        if getattr(handler, "gts_scheduler_log", False):
            prefix = handler.format(logging.LogRecord(logger.name, logging.INFO, __file__, 0, "", None, None))
            text = "".join(f"{prefix}{line}\n" for line in lines)
            with contextlib.suppress(OSError, ValueError):  # as a handler does, a full disk loses lines, not the sweep
                handler.acquire()
                try:
                    handler.stream.write(text)  # type: ignore[attr-defined]
                    handler.flush()
                finally:
                    handler.release()


@contextlib.contextmanager
def scheduler_logging(path: str | None, console: logging.Handler | None = None) -> Iterator[None]:
    """The original's scheduler log: appended to ``path`` and shown on the console (``console``,
    else stderr unless the application set up logging). A level the application set on our
    logger is kept; otherwise INFO while the sweep runs."""
    handlers: list[logging.Handler] = []
    if path is not None:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            file_handler = logging.FileHandler(path, mode="a", encoding="utf-8")
            file_handler.gts_scheduler_log = True  # type: ignore[attr-defined]  # see file_only()
            handlers.append(file_handler)
        except OSError as error:
            raise GTSError(
                f"cannot write the scheduler log {path!r}: {error.strerror or error}; set "
                "scheduler_log_file_path to a writable file, or to null for the console only"
            ) from None
    if console is None and not logging.getLogger().handlers:
        console = logging.StreamHandler(sys.stderr)
    if console is not None:
        handlers.append(console)
    previous_level = logger.level
    if previous_level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    for handler in handlers:
        on_console = handler is console
        handler.setFormatter((ConsoleFormatter if on_console else logging.Formatter)(FORMAT, datefmt=DATE_FORMAT))
        logger.addHandler(handler)
    try:
        yield
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
            handler.close()
        logger.setLevel(previous_level)


def plain_console_logging() -> None:
    """For the ``gts`` command: the scheduler's lines on stderr, in the same format, unless
    logging is configured already."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format=FORMAT, datefmt=DATE_FORMAT, stream=sys.stderr)
        for handler in logging.getLogger().handlers:
            handler.setFormatter(ConsoleFormatter(FORMAT, datefmt=DATE_FORMAT))
