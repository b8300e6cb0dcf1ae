"""A live session log as the operators' formats (``prometheus``, ``otlp``) read it: the series'
older files, then the file being written.

Everything those formats take from the rooms below is imported here and nowhere else.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.analysis.follow import file_moved
from llamacpp_instr.converters.reading.decode.fields import MALFORMED, VALUE_MAX, opt_count
from llamacpp_instr.converters.reading.decode.steps import step_seqs
from llamacpp_instr.converters.reading.reader import (
    BadLine,
    ReadReport,
    iter_records,
    log_files,
    parse_line,
)
from llamacpp_instr.converters.session.request_causes import MISS_REASONS, cache_reason
from llamacpp_instr.converters.session.requests import slot_window

__all__ = [
    "MALFORMED",
    "MISS_REASONS",
    "UserError",
    "VALUE_MAX",
    "cache_reason",
    "follow_log",
    "opt_count",
    "slot_window",
    "step_seqs",
]

POLL = 0.05  # seconds between looks at a file that has not grown


def follow_log(
    path: Path,
    *,
    wait: float,
    stop: Callable[[], bool] | None = None,
    offset: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Every record of the log at ``path`` as it is written, until ``stop()`` says so at the end
    of the file (never while records are waiting to be read): first the rotated files beside it
    (``LOG.2``, ``LOG.1``: ``reader.log_files``), read whole, then ``path`` itself, followed
    across rotations and reopens.

    Unlike ``follow.tail_records`` (``instr follow``'s view of one session) this does not return
    at a ``session_end``: a log is appended to by every run of its program, and an exporter serves
    them all. ``offset``: begin at that byte of ``path``, its rotated files skipped (a program
    started beside the exporter appends to what was there), unless ``path`` is shorter (another
    file). ``wait``: seconds for ``path`` to appear; UserError after that.
    """
    if offset is None:
        for f in _older_files(path):
            try:
                for _, rec in iter_records(f, report=ReadReport()):
                    yield rec
            except UserError:
                continue  # an empty or unreadable rotated file: nothing in it to count
    yield from _tail(path, wait=wait, stop=stop, offset=offset or 0)


def _older_files(path: Path) -> list[Path]:
    """The files of ``path``'s rotated series written before it, oldest first; none when it has
    no series (or does not exist yet)."""
    if not path.is_file():
        return []
    return [f for f in log_files(path) if f != path]


def _tail(
    path: Path, *, wait: float, stop: Callable[[], bool] | None, offset: int
) -> Iterator[dict[str, Any]]:
    t0 = time.monotonic()
    while not path.exists():
        if stop and stop():
            return
        if time.monotonic() - t0 >= wait:
            raise UserError(f"log file not found: {path}")
        time.sleep(POLL)
    if path.is_dir():
        raise UserError(f"log path is a directory: {path}")
    f = _open(path)
    if offset and os.fstat(f.fileno()).st_size >= offset:
        f.seek(offset)
    try:
        pending = b""
        while True:
            chunk = f.readline()
            if not chunk:
                if file_moved(path, f):
                    # rotated or reopened: the old file is read to its end (its writer finished
                    # it before moving it), on into the new one
                    f.close()
                    f, pending = _open(path), b""
                    continue
                if stop and stop():
                    return
                time.sleep(POLL)
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
    finally:
        f.close()


def _open(path: Path) -> IO[bytes]:
    try:
        return path.open("rb")
    except OSError as exc:
        raise UserError(f"cannot read log {path}: {exc.strerror}") from None
