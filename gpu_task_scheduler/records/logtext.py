"""A run's log as a terminal shows it, for ``gts logs``, the failure summaries and the web view.

A progress bar (tqdm's, a download's percentage) rewrites its line with carriage returns: a log
keeps every state of it, an epoch's worth of updates on one line. A terminal shows the last: a
``\\r`` goes back to the line's start and what follows writes over what is there (a shorter text
leaves the end of a longer one, as on the screen). Lines are counted by ``\\n`` only, so that
``-n 5`` is the last five lines the terminal would show, and ``\\r\\n`` ends a line as ``\\n`` does.
What is not UTF-8 is kept byte for byte; other control characters are left as they are.
"""

from __future__ import annotations


def shown(data: bytes) -> bytes:
    """``data`` with each of its lines as a terminal leaves it."""
    if b"\r" not in data:
        return data
    return b"\n".join(_line(line) if b"\r" in line else line for line in data.split(b"\n"))


def _line(line: bytes) -> bytes:
    text = ""
    for piece in line.decode("utf-8", "surrogateescape").split("\r"):
        text = piece + text[len(piece) :]
    return text.encode("utf-8", "surrogateescape")


def last_lines(data: bytes, lines: int) -> bytes:
    """The last ``lines`` lines of ``data`` as a terminal shows them, each with its ``\\n`` (the
    last without one where ``data`` does not end with one)."""
    if lines <= 0:
        return b""
    parts = shown(data).split(b"\n")
    end = parts.pop()  # after the last newline: empty when data ends with one
    whole = [part + b"\n" for part in parts] + ([end] if end else [])
    return b"".join(whole[-lines:])
