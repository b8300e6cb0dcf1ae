"""Memory records: every backend buffer (``memory_alloc``, ``memory_free``), every allocation that
failed (``memory_alloc_failed``), and a step's memory figures (``step_end.memory``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .fields import as_dict, nonneg, opt_int


@dataclass
class Allocation:
    """One backend buffer: where its memory is, what it is for, when it was made and freed."""

    id: int
    ts: int
    device: int  # index into session_start.machine.devices (-1: unknown)
    buffer_type: str
    bytes: int
    purpose: str
    cache: int | None = None  # the KV cache (or recurrent state) it belongs to
    cache_kind: str | None = None  # "full" or "swa"
    ctx: int | None = None
    step: int | None = None  # the step whose graph grew a compute buffer
    graph: int | None = None
    freed: int | None = None  # ts of its memory_free, None while live


@dataclass
class StepMemory:
    """A step's memory figures: RSS (file-backed and anonymous), each KV cache's cells used and
    allocated, and each device's free memory as ggml reported it (None: not read, an RPC device)."""

    rss: int
    rss_file: int
    rss_anon: int
    kv: list[tuple[int, int, int]] = field(default_factory=list)  # cache, used, allocated
    free: list[int | None] = field(default_factory=list)


def allocation(rec: dict[str, Any]) -> Allocation:
    kind = rec.get("cache_kind")
    return Allocation(
        id=nonneg(rec["id"]),
        ts=nonneg(rec["ts"]),
        device=int(rec["device"]),
        buffer_type=str(rec["buffer_type"]),
        bytes=nonneg(rec["bytes"]),
        purpose=str(rec["purpose"]),
        cache=opt_int(rec.get("cache")),
        cache_kind=str(kind) if kind is not None else None,
        ctx=opt_int(rec.get("ctx")),
        step=opt_int(rec.get("step")),
        graph=opt_int(rec.get("graph")),
    )


def failure(rec: dict[str, Any]) -> dict[str, Any]:
    """A memory_alloc_failed record's fields (its ``held`` bytes per purpose as ints)."""
    out = {k: v for k, v in rec.items() if k not in ("type", "sid")}
    out["held"] = {str(k): nonneg(v) for k, v in as_dict(rec.get("held")).items()}
    out["bytes"] = nonneg(rec["bytes"])
    out["free"] = nonneg(rec["free"])
    return out


def step_memory(rec: dict[str, Any]) -> StepMemory | None:
    """step_end's memory member (None in logs from before it was recorded)."""
    m = rec.get("memory")
    if not isinstance(m, dict):
        return None
    kv = m.get("kv") or []
    free = m.get("free") or []
    return StepMemory(
        rss=int(m["rss"]),
        rss_file=int(m["rss_file"]),
        rss_anon=int(m["rss_anon"]),
        kv=[(int(c), int(u), int(n)) for c, u, n in kv],
        free=[None if f is None else int(f) for f in free],
    )
