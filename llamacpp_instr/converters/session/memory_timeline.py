"""Memory over a session, defined once for every report, table and trace: the backend buffers live
at each moment per device and purpose (from ``memory_alloc`` / ``memory_free``), their size at the
start, peak and end, and each step's resident memory and KV cells (``step_end.memory``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from llamacpp_instr.contract.schema import MEMORY_PURPOSES
from llamacpp_instr.contract.units import fmt_bytes

from ..reading.decode.memory import StepMemory
from ..reading.decode.sessions import SessionInfo


@dataclass(frozen=True)
class Change:
    """A buffer made (``delta`` > 0) or freed, on one device for one purpose."""

    ts: int
    device: int
    purpose: str
    delta: int
    id: int


@dataclass
class Usage:
    """One device and purpose over the session, in bytes."""

    device: int
    purpose: str
    at_start: int  # live when the first step began (everything set up by then)
    peak: int
    peak_ts: int
    at_end: int


def device_names(info: SessionInfo) -> dict[int, str]:
    """ggml's device index -> its name (session_start.machine.devices)."""
    names: dict[int, str] = {}
    for d in info.machine.get("devices", []) or []:
        if isinstance(d, dict) and "index" in d:
            names[int(d["index"])] = str(d.get("name", d["index"]))
    return names


def device_name(info: SessionInfo, device: int, names: dict[int, str] | None = None) -> str:
    names = device_names(info) if names is None else names
    return names.get(device, f"device {device}")


def changes(info: SessionInfo) -> list[Change]:
    """Every buffer made and freed, in time order (a buffer made before the session began is made
    at its own time, before the session's start)."""
    out: list[Change] = []
    for a in info.allocations.values():
        out.append(Change(a.ts, a.device, a.purpose, a.bytes, a.id))
        if a.freed is not None:
            out.append(Change(a.freed, a.device, a.purpose, -a.bytes, a.id))
    out.sort(key=lambda c: (c.ts, c.delta < 0, c.id))
    return out


def purpose_order(purposes: Iterable[str]) -> list[str]:
    known = [p for p in MEMORY_PURPOSES if p in purposes]
    return known + sorted(set(purposes) - set(known))


def usage(info: SessionInfo, first_step_ts: int | None) -> list[Usage]:
    """Per device and purpose: the bytes live when the first step began (the session's start when
    it has no step), the peak and when it was reached, and the bytes live at the end."""
    start_ts = first_step_ts if first_step_ts is not None else info.start_ts
    live: dict[tuple[int, str], int] = defaultdict(int)
    at_start: dict[tuple[int, str], int] = {}
    peak: dict[tuple[int, str], tuple[int, int]] = {}
    started = False
    for c in changes(info):
        if not started and c.ts > start_ts:
            at_start = dict(live)
            started = True
        key = (c.device, c.purpose)
        live[key] += c.delta
        if live[key] > peak.get(key, (-1, 0))[0]:
            peak[key] = (live[key], c.ts)
    if not started:
        at_start = dict(live)
    order = purpose_order({p for _, p in peak})
    keys = sorted(peak, key=lambda k: (k[0], order.index(k[1])))
    return [
        Usage(d, p, at_start.get((d, p), 0), peak[(d, p)][0], peak[(d, p)][1], live[(d, p)])
        for d, p in keys
    ]


def footprint(info: SessionInfo) -> dict[int, dict[str, int]]:
    """Each device's peak bytes per purpose: what the run needed there."""
    out: dict[int, dict[str, int]] = defaultdict(dict)
    for u in usage(info, None):
        out[u.device][u.purpose] = u.peak
    return dict(out)


def cache_kinds(info: SessionInfo) -> dict[int, str]:
    """KV cache id -> its kind ("full" or "swa"), from its buffers."""
    return {
        a.cache: a.cache_kind or ""
        for a in info.allocations.values()
        if a.cache is not None and a.purpose in ("kv_cache", "recurrent")
    }


@dataclass
class CacheUse:
    cache: int
    kind: str
    peak_used: int
    allocated: int


def kv_use(memories: Iterable[StepMemory | None], kinds: dict[int, str]) -> list[CacheUse]:
    """Each KV cache's most cells used in any step against the cells it has."""
    seen: dict[int, CacheUse] = {}
    for m in memories:
        if m is None:
            continue
        for cache, used, size in m.kv:
            u = seen.setdefault(cache, CacheUse(cache, kinds.get(cache, ""), 0, size))
            u.peak_used = max(u.peak_used, used)
            u.allocated = size
    return [seen[c] for c in sorted(seen)]


def rss_peak(memories: Iterable[StepMemory | None]) -> StepMemory | None:
    """The step memory with the most resident bytes."""
    best: StepMemory | None = None
    for m in memories:
        if m is not None and m.rss >= 0 and (best is None or m.rss > best.rss):
            best = m
    return best


def failure_line(f: dict[str, Any]) -> str:
    """One line for a memory_alloc_failed: where, what it was for, what was free and held there."""
    device = f.get("device_name") or f"device {f.get('device')}"
    budget = f.get("budget")
    where = f"{device} (budget {fmt_bytes(int(budget))})" if budget is not None else device
    asked, free = int(f.get("bytes", 0)), int(f.get("free", 0))
    held = {k: int(v) for k, v in (f.get("held") or {}).items() if int(v) > 0}
    line = f"out of memory on {where}: {f.get('purpose', 'other')} needed {fmt_bytes(asked)}, "
    line += f"{fmt_bytes(free)} free"
    if held:
        line += " (held: " + ", ".join(f"{k} {fmt_bytes(held[k])}" for k in sorted(held)) + ")"
    if asked > free:
        line += f", short by {fmt_bytes(asked - free)}"
    return line
