"""Following a session log while another process writes it: the records as their lines are
appended, each line read as every reader reads it (``reader.parse_line``).

``tail`` is the one follower: it waits for the file to appear, holds a partial last line until it
completes, skips a damaged line as the converters skip it, and follows the log into the file that
replaces it (rotated, or reopened after logrotate) once the old one is read to its end.
``instr follow`` and ``instr run --live`` follow one session (``to_session_end``); the exporters
(``instr follow --prometheus``, ``instr export --otlp --follow``) follow every run a program
appends, the rotated files before it first (``follow_log``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from llamacpp_instr.contract.errors import UserError

from .reader import BadLine, ReadReport, iter_records, log_files, parse_line

POLL = 0.05  # seconds between looks at a file that has not grown


def tail(
    path: Path,
    *,
    wait: float = 30.0,
    stop: Callable[[], bool] | None = None,
    offset: int = 0,
    to_session_end: bool = False,
    poll: float = POLL,
) -> Iterator[dict[str, Any]]:
    """Records of ``path`` as they are written, from byte ``offset`` (from the start where the
    file is shorter: another file), until ``stop()`` says so at the end of the file (never while
    records are waiting to be read) or, with ``to_session_end``, after a ``session_end``.
    ``wait``: seconds for ``path`` to appear; a one-line UserError after that."""
    t0 = time.monotonic()
    while not path.exists():
        if stop and stop():
            return
        if time.monotonic() - t0 >= wait:
            waited = f" (waited {wait:.0f} s)" if wait > 0 else ""
            raise UserError(f"log file not found: {path}{waited}")
        time.sleep(poll)
    if path.is_dir():
        raise UserError(f"log path is a directory: {path}")
    f = _open(path)
    if offset and os.fstat(f.fileno()).st_size >= offset:
        f.seek(offset)
    try:
        pending = b""
        moved = False
        while True:
            chunk = f.readline()
            if not chunk:
                if moved:
                    # the old file is read to its end (its writer finished it before moving
                    # it): on into the new one
                    f.close()
                    f, pending, moved = _open(path), b"", False
                    continue
                moved = file_moved(path, f)
                if moved:
                    continue  # once more to the end: what was written just before the move
                if stop and stop():
                    return
                time.sleep(poll)
                continue
            pending += chunk
            if not pending.endswith(b"\n"):
                continue  # the writer is mid-line: wait for the rest
            line, pending = pending, b""
            if not line.strip():
                continue
            try:
                rec, _ = parse_line(line)
            except BadLine:
                continue  # a damaged line: skipped, as the converters skip it
            yield rec
            if to_session_end and rec.get("type") == "session_end":
                return
    finally:
        f.close()


def follow_log(
    path: Path,
    *,
    wait: float,
    stop: Callable[[], bool] | None = None,
    offset: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Every record of the log at ``path`` as it is written, until ``stop()`` says so at the end
    of the file: first the rotated files beside it (``LOG.2``, ``LOG.1``: ``reader.log_files``),
    read whole, then ``path`` itself, ``tail``-ed across rotations and reopens.

    It does not return at a ``session_end``: a log is appended to by every run of its program, and
    an exporter serves them all. ``offset``: begin at that byte of ``path``, its rotated files
    skipped (a program started beside the exporter appends to what was there), unless ``path``
    is shorter (another file). ``wait``: seconds for ``path`` to appear; UserError after that.
    """
    if offset is None:
        for f in _older_files(path):
            try:
                for _, rec in iter_records(f, report=ReadReport()):
                    yield rec
            except UserError:
                continue  # an empty or unreadable rotated file: nothing in it to count
    yield from tail(path, wait=wait, stop=stop, offset=offset or 0)


def file_moved(path: Path, f: IO[bytes]) -> bool:
    """Is another file at ``path`` than the one open (rotated, or reopened after logrotate)?"""
    try:
        now = os.stat(path)
    except OSError:
        return False  # moved away, the new one not created yet
    opened = os.fstat(f.fileno())
    return (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino)


def _older_files(path: Path) -> list[Path]:
    """The files of ``path``'s rotated series written before it, oldest first; none when it has
    no series (or does not exist yet)."""
    if not path.is_file():
        return []
    return [f for f in log_files(path) if f != path]


def _open(path: Path) -> IO[bytes]:
    try:
        return path.open("rb")
    except OSError as exc:
        raise UserError(f"cannot read log {path}: {exc.strerror}") from None
