"""What a replay reads of a server's log, in one pass and within bounds: one session's ``request``
records (decoded and checked as every reader decodes them), in the order they arrived, the part a
replay takes (the first N, a window of time), and each device's peak memory, as the memory reports
define it (``memory_timeline.footprint``: each device's peak bytes per purpose, summed).

A log is foreign bytes: a session of more than ``REQUESTS_MAX`` requests, or whose bodies take more
than ``BODIES_MAX`` bytes, is refused in one line (``--first N`` keeps only N, whatever the log
holds)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError

from ..reading.decode.fields import MALFORMED
from ..reading.decode.sessions import request_record
from ..reading.reader import ReadReport, iter_records
from .fold import Fold
from .memory_timeline import device_names, footprint

# the requests of one session a replay holds, at most, and the bytes of their bodies
REQUESTS_MAX = 100_000
BODIES_MAX = 1 << 30
# the records a session's peak memory is folded from
_MEMORY_TYPES = frozenset({"session_start", "memory_alloc", "memory_free", "session_end"})


@dataclass(frozen=True)
class Selection:
    """The part of a session a replay takes: its requests from ``window`` (seconds from its first
    request's arrival: start, end), then the first ``first`` of those; ``sid``: the session (default:
    the last one with requests)."""

    first: int | None = None
    window: tuple[float, float] | None = None
    sid: str | None = None


@dataclass
class Served:
    """One session of a server's log: its requests (the selection's, by arrival), how many it held
    in all and how many were malformed, and its peak bytes per device name."""

    sid: str | None
    requests: list[dict[str, Any]]
    total: int = 0
    malformed: int = 0
    peaks: dict[str, int] = field(default_factory=dict)


def parse_window(text: str) -> tuple[float, float]:
    """``START:END`` (seconds, END empty for no end) -> (start, end)."""
    start, sep, end = text.partition(":")
    try:
        lo = float(start or 0)
        hi = float(end) if end else float("inf")
    except ValueError:
        lo = hi = float("nan")
    if not sep or not 0 <= lo < hi:
        raise UserError(f"--window {text!r}: give START:END in seconds, START below END")
    return lo, hi


class _Held:
    """One session's requests as read: all of them, or with ``first`` only the first that many by
    arrival (a heap of the latest of them on top); with ``until_ns``, the end of a window from the
    first arrival, those past it are let go once too many are held (the first arrival only moves
    earlier, so one past the window's end stays past it)."""

    def __init__(self, sid: str, first: int | None, until_ns: float | None, path: Path) -> None:
        self.sid, self.first, self.until_ns, self.path = sid, first, until_ns, path
        self.heap: list[tuple[int, int, dict[str, Any]]] = []
        self.total = self.malformed = self.body_bytes = 0
        self.t0: int | None = None

    def add(self, rec: dict[str, Any]) -> None:
        self.total += 1
        try:
            r = request_record(rec)
        except MALFORMED:
            self.malformed += 1
            return
        t = r["t_arrive"]
        self.t0 = t if self.t0 is None else min(self.t0, t)
        item = (-t, -self.total, r)
        if self.first is None or len(self.heap) < self.first:
            heapq.heappush(self.heap, item)
        elif item[:2] > self.heap[0][:2]:  # arrived before the latest held
            self.body_bytes -= len(heapq.heapreplace(self.heap, item)[2].get("body", b""))
        else:
            return
        self.body_bytes += len(r.get("body", b""))
        if len(self.heap) > REQUESTS_MAX or self.body_bytes > BODIES_MAX:
            self._let_go()

    def _let_go(self) -> None:
        """Hold only the requests within the window's end, down to 90 % of the bounds (so that
        this runs once per tenth of them at most), else a one-line error."""
        if self.until_ns is not None and self.t0 is not None:
            end = self.t0 + self.until_ns
            self.heap = [x for x in self.heap if -x[0] <= end]
            heapq.heapify(self.heap)
            self.body_bytes = sum(len(x[2].get("body", b"")) for x in self.heap)
            if len(self.heap) <= 0.9 * REQUESTS_MAX and self.body_bytes <= 0.9 * BODIES_MAX:
                return
        many = len(self.heap) / REQUESTS_MAX >= self.body_bytes / BODIES_MAX  # (the nearer bound)
        what = f"{REQUESTS_MAX:,} requests" if many else "1 GiB of bodies"
        raise UserError(
            f"{self.path}: session {self.sid} holds over {what} to replay: replay part of it "
            "(--first N, or a shorter --window)"
        )

    def requests(self) -> list[dict[str, Any]]:
        return [r for _, _, r in sorted(self.heap, reverse=True)]


def _select(requests: list[dict[str, Any]], sel: Selection) -> list[dict[str, Any]]:
    """The window's requests (from the session's first arrival), then the first N of them."""
    if sel.window is not None and requests:
        t0 = requests[0]["t_arrive"]
        lo, hi = sel.window
        requests = [r for r in requests if lo <= (r["t_arrive"] - t0) / 1e9 <= hi]
    return requests if sel.first is None else requests[: sel.first]


class _Peaks:
    """Each session's peak memory per device, from its memory records folded as the reports fold
    them (the other records are never handed in)."""

    def __init__(self) -> None:
        self.fold = Fold(packed=False)
        self.infos: dict[str, Any] = {}

    def add(self, rec: dict[str, Any]) -> None:
        if rec["type"] in _MEMORY_TYPES:
            try:
                self.infos.update((e.session.sid, e.session) for e in self.fold.add(rec))
            except MALFORMED:
                pass  # (a malformed memory record: the reports skip it too)

    def of(self, sid: str | None) -> dict[str, int]:
        self.infos.update((e.session.sid, e.session) for e in self.fold.close())
        info = self.infos.get(sid) if sid is not None else None
        if info is None:
            return {}
        names = device_names(info)
        # a device's purposes' peaks summed, as the comparison of two runs' footprints totals them
        return {
            names.get(dev, f"device {dev}"): sum(purposes.values())
            for dev, purposes in sorted(footprint(info).items())
        }


def read_served(
    path: Path, sel: Selection = Selection(), report: ReadReport | None = None
) -> Served:
    """The session's requests a replay takes (``sel``) and its peak memory per device, read in one
    pass; a log without requests is a one-line error."""
    held: dict[str, _Held] = {}
    peaks = _Peaks()
    # the window is from the session's first request: with one, every request up to its end is
    # held until the first is known
    first = sel.first if sel.window is None else None
    until_ns = sel.window[1] * 1e9 if sel.window is not None else None
    last_sid: str | None = None
    for _, rec in iter_records(path, report=report):
        sid = str(rec.get("sid"))
        if sel.sid is not None and sid != sel.sid:
            continue
        if rec["type"] == "request":
            if sid not in held:
                held.clear()  # (the last session with requests is the one replayed)
                held[sid] = _Held(sid, first, until_ns, path)
            held[sid].add(rec)
            last_sid = sid
        else:
            peaks.add(rec)
    if last_sid is None:
        where = f"session {sel.sid} of {path}" if sel.sid is not None else str(path)
        raise UserError(
            f"{where}: no request records (a server's log: instr exec llama-server ...)"
        )
    h = held[last_sid]
    return Served(last_sid, _select(h.requests(), sel), h.total, h.malformed, peaks.of(last_sid))


def read_replayed(path: Path) -> Served:
    """A replay's own log: its request records that carry a ``traceparent`` (each replayed request
    carries its own; malformed ones left out) and its peak memory per device."""
    out: list[dict[str, Any]] = []
    peaks = _Peaks()
    sid: str | None = None
    for _, rec in iter_records(path):
        if rec["type"] == "request" and isinstance(rec.get("traceparent"), str):
            try:
                out.append(request_record(rec))
            except MALFORMED:
                continue
        else:
            sid = str(rec.get("sid")) if rec["type"] == "session_start" else sid
            peaks.add(rec)
    return Served(sid, out, len(out), 0, peaks.of(sid))
