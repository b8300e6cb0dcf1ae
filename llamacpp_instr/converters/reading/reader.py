"""Streaming NDJSON reader for session logs: plain or gzip, tolerant of damage, strict on request.

A log that was cut short (crash, Ctrl-C during a write, disk full) is still worth converting: the
reader yields every record it can parse and reports, with line numbers, what it skipped. With
``strict=True`` the first problem is an error instead.

Invalid UTF-8 inside a line (a token piece cut mid-character, say) never costs the line: it is read
with each bad sequence replaced by U+FFFD, and counted (also with ``strict=True``).

A rotated log (``--max-bytes``, or logrotate) is read as one: given its base name (``serve.log``,
when ``serve.log.1`` is beside it) or a glob (``'serve.log*'``), the reader reads every file of the
series, oldest first (``log_files``); each file starts with its own ``session_start``, which the
session fold takes as the same session going on.
"""

from __future__ import annotations

import glob
import gzip
import io
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.contract.schema import RECORD_TYPES_V1, SCHEMA_VERSIONS

GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class ReadReport:
    """What the reader saw: counts, and each skipped line with its reason."""

    lines: int = 0
    records: int = 0
    # bytes of the lines read (as stored, decompressed): what a batch of records took to hold
    bytes: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)
    unknown_types: Counter[str] = field(default_factory=Counter)
    # lines read only after replacing invalid UTF-8 with U+FFFD
    replaced_utf8: int = 0

    def summary(self, limit: int = 10) -> str:
        """One line for stderr, e.g. ``skipped 2 of 40 lines: 7 (invalid JSON), 9 (truncated last
        line); 1 line read with invalid UTF-8 replaced by U+FFFD``; empty if nothing to report."""
        parts = []
        if self.skipped:
            shown = ", ".join(f"{n} ({why})" for n, why in self.skipped[:limit])
            more = f", and {len(self.skipped) - limit} more" if len(self.skipped) > limit else ""
            parts.append(f"skipped {len(self.skipped)} of {self.lines} lines: {shown}{more}")
        if self.replaced_utf8:
            n = self.replaced_utf8
            parts.append(
                f"{n} line{'' if n == 1 else 's'} read with invalid UTF-8 replaced by U+FFFD"
            )
        return "; ".join(parts)


def open_log(path: Path | str) -> IO[bytes]:
    """Open a log for binary reading, transparently un-gzipping it (detected by magic bytes)."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"log file not found: {p}")
    if p.is_dir():
        raise UserError(f"log path is a directory: {p}")
    try:
        raw = p.open("rb")
    except OSError as exc:
        raise UserError(f"cannot read log {p}: {exc.strerror}") from None
    if raw.peek(2)[:2] == GZIP_MAGIC if isinstance(raw, io.BufferedReader) else False:
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


_ROTATED = re.compile(r"\.(\d+)(\.gz)?$")
_GLOB = re.compile(r"[*?\[]")


def _first_ts(path: Path) -> int | None:
    """The ``ts`` of a log file's first record (its start), or None if it has none."""
    try:
        with open_log(path) as f:
            line = f.readline()
        return int(parse_line(line)[0]["ts"])
    except (
        UserError,
        OSError,
        EOFError,
        gzip.BadGzipFile,
        BadLine,
        KeyError,
        TypeError,
        ValueError,
    ):
        return None


def log_files(path: Path | str) -> list[Path]:
    """The files a log argument names, in the order to read them: a glob (``'serve.log*'``), or a
    file with rotated ones beside it (``serve.log`` and ``serve.log.1``, ``serve.log.2.gz``...):
    the whole series, oldest first; else the file itself. A series is ordered by when each file
    began (its first record), files without one by name: numbered files, the highest first."""
    p = Path(path)
    starts: dict[Path, int | None] = {}  # each file's first ts, read once
    if p.exists() or not _GLOB.search(str(path)):
        rotated = [
            q
            for q in p.parent.glob(glob.escape(p.name) + ".*")
            if _ROTATED.fullmatch(q.name[len(p.name) :]) and q.is_file()
        ]
        if not p.is_file() or not rotated:
            return [p]
        files = rotated + [p]
    else:
        # (a glob also matches what was made of the log, such as its .pftrace: only logs count)
        starts = {Path(x): _first_ts(Path(x)) for x in sorted(glob.glob(str(path)))}
        files = [q for q, t in starts.items() if t is not None]
        if not files:
            raise UserError(f"no log file matches {path}")

    def by_name(q: Path) -> tuple[int, str]:
        m = _ROTATED.search(q.name)
        return (-int(m.group(1)) if m else 0, q.name)

    named = sorted(files, key=by_name)
    starts = {q: starts[q] if q in starts else _first_ts(q) for q in named}
    if all(t is not None for t in starts.values()):
        return sorted(named, key=lambda q: starts[q] or 0)  # stable: name order on a tie
    return named


def upgrade(record: dict[str, Any], schema_version: int) -> dict[str, Any]:
    """Bring a record of an older schema version to the current shape (a v1 record is a v2
    record, and a v2 record a v3 one: each only adds a form of the graph record)."""
    return record


class BadLine(Exception):
    """A line that holds no record: ``why``, as the read report says it, and the record type it
    names when that type is unknown (a newer schema)."""

    def __init__(self, why: str, unknown_type: str | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.unknown_type = unknown_type


def _loads_replacing_utf8(line: bytes) -> Any:
    """``line`` parsed after replacing invalid UTF-8 with U+FFFD; None if it is valid UTF-8 (so its
    JSON error is not an encoding one) or still does not parse."""
    try:
        line.decode("utf-8")
        return None
    except UnicodeDecodeError:
        pass
    try:
        return orjson.loads(line.decode("utf-8", errors="replace").encode("utf-8"))
    except orjson.JSONDecodeError:
        return None


def parse_line(line: bytes, complete: bool = True) -> tuple[dict[str, Any], bool]:
    """The record on one line of a log, and whether it was read only after replacing invalid UTF-8
    with U+FFFD; ``BadLine`` if the line holds none: invalid JSON (a ``complete=False`` last line:
    truncated), not an object with a ``type``, or a record type this schema does not know. Every
    reader of logs reads its lines through here (``iter_records``, ``tail.tail``)."""
    replaced = False
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError:
        rec = _loads_replacing_utf8(line)
        if rec is None:
            raise BadLine("invalid JSON" if complete else "truncated last line") from None
        replaced = True
    if not isinstance(rec, dict) or not isinstance(rec.get("type"), str):
        raise BadLine("not a record object")
    if rec["type"] not in RECORD_TYPES_V1:
        raise BadLine(f"unknown record type {rec['type']!r}", rec["type"])
    return rec, replaced


def iter_records(
    path: Path | str, *, strict: bool = False, report: ReadReport | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, record)`` for every valid record, in file order (a rotated series:
    every file, oldest first, see ``log_files``; line numbers are each file's own).

    Skipped: blank lines are ignored silently; the lines ``parse_line`` refuses (invalid JSON,
    non-object lines, records without a ``type``, unknown record types, a truncated last line)
    are counted in ``report`` (or raise ``UserError`` with ``strict``). A line that is invalid only
    as UTF-8 is read with U+FFFD for each bad sequence and counted in ``report.replaced_utf8``,
    strict or not.
    """
    rep = report if report is not None else ReadReport()
    files = log_files(path)
    lines = 0
    for f in files:
        yield from _file_records(f, strict, rep, lines, f.name if len(files) > 1 else "")
        lines = rep.lines
    if rep.records == 0:
        if rep.lines == 0:
            raise UserError(f"empty log: {path}")
        raise UserError(f"no session records in {path} (not a llamacpp-instr log?)")


def _file_records(
    path: Path, strict: bool, rep: ReadReport, lines_before: int, name: str
) -> Iterator[tuple[int, dict[str, Any]]]:
    """One file's records (``name``: which file of a series, said with what is skipped)."""
    version = 1
    where = f" in {name}" if name else ""
    records_before = rep.records

    def skip(n: int, why: str) -> None:
        if strict:
            raise UserError(f"{path}: line {n}: {why}")
        rep.skipped.append((n, why + where))

    with open_log(path) as f:
        try:
            for n, line in enumerate(f, start=1):
                rep.lines = lines_before + n
                rep.bytes += len(line)
                if not line.strip():
                    continue
                try:
                    rec, replaced = parse_line(line, line.endswith(b"\n"))
                except BadLine as bad:
                    if bad.unknown_type is not None:
                        rep.unknown_types[bad.unknown_type] += 1
                    skip(n, bad.why)
                    continue
                if rec["type"] == "session_start":
                    version = rec.get("schema_version", 1)
                    if version not in SCHEMA_VERSIONS and strict:
                        raise UserError(f"{path}: line {n}: unsupported schema version {version}")
                rep.records += 1
                rep.replaced_utf8 += replaced
                yield n, upgrade(rec, version)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            if strict or rep.records == records_before:
                raise UserError(f"cannot read log {path}: {exc}") from None
            n = rep.lines - lines_before + 1
            rep.skipped.append((n, f"unreadable from here ({exc}){where}"))
