"""Streaming NDJSON reader for session logs: plain or gzip, tolerant of damage, strict on request.

A log that was cut short (crash, Ctrl-C during a write, disk full) is still worth converting: the
reader yields every record it can parse and reports, with line numbers, what it skipped. With
``strict=True`` the first problem is an error instead.

Invalid UTF-8 inside a line (a token piece cut mid-character, say) never costs the line: it is read
with each bad sequence replaced by U+FFFD, and counted (also with ``strict=True``).
"""

from __future__ import annotations

import gzip
import io
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from .errors import UserError
from .schema import RECORD_TYPES_V1, SCHEMA_VERSIONS

GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class ReadReport:
    """What the reader saw: counts, and each skipped line with its reason."""

    lines: int = 0
    records: int = 0
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


def upgrade(record: dict[str, Any], schema_version: int) -> dict[str, Any]:
    """Bring a record of an older schema version to the current shape (v1 is current)."""
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
    reader of logs reads its lines through here (``iter_records``, ``follow.tail_records``)."""
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
    """Yield ``(line_number, record)`` for every valid record, in file order.

    Skipped: blank lines are ignored silently; the lines ``parse_line`` refuses (invalid JSON,
    non-object lines, records without a ``type``, unknown record types, a truncated last line)
    are counted in ``report`` (or raise ``UserError`` with ``strict``). A line that is invalid only
    as UTF-8 is read with U+FFFD for each bad sequence and counted in ``report.replaced_utf8``,
    strict or not.
    """
    rep = report if report is not None else ReadReport()
    version = 1

    def skip(n: int, why: str) -> None:
        if strict:
            raise UserError(f"{path}: line {n}: {why}")
        rep.skipped.append((n, why))

    with open_log(path) as f:
        try:
            for n, line in enumerate(f, start=1):
                rep.lines = n
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
            if strict or rep.records == 0:
                raise UserError(f"cannot read log {path}: {exc}") from None
            rep.skipped.append((rep.lines + 1, f"unreadable from here ({exc})"))
    if rep.records == 0:
        if rep.lines == 0:
            raise UserError(f"empty log: {path}")
        raise UserError(f"no session records in {path} (not a llamacpp-instr log?)")
