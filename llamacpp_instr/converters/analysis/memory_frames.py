"""The memory tables of ``load_session``: ``allocations`` (every backend buffer: where, what for,
when made and freed) and ``memory`` (each step's resident memory, KV cells and free memory)."""

from __future__ import annotations

import pandas as pd

from ..reading.decode.memory import StepMemory
from ..reading.decode.sessions import SessionInfo
from ..session.memory_timeline import device_names

ALLOCATION_COLS = [
    "id", "ts", "freed", "device", "device_name", "buffer_type", "purpose", "bytes", "cache",
    "cache_kind", "ctx", "step", "graph",
]  # fmt: skip


def allocations_frame(info: SessionInfo) -> pd.DataFrame:
    """One row per buffer, in the order made; ``freed`` is <NA> while it lives."""
    names = device_names(info)
    rows = [
        {
            "id": a.id, "ts": a.ts, "freed": a.freed, "device": a.device,
            "device_name": names.get(a.device, ""), "buffer_type": a.buffer_type,
            "purpose": a.purpose, "bytes": a.bytes, "cache": a.cache, "cache_kind": a.cache_kind,
            "ctx": a.ctx, "step": a.step, "graph": a.graph,
        }  # fmt: skip
        for a in info.allocations.values()
    ]
    df = pd.DataFrame(rows, columns=ALLOCATION_COLS)
    for c in ("freed", "cache", "ctx", "step", "graph"):
        df[c] = df[c].astype("Int64")
    for c in ("ts", "device", "bytes", "id"):
        df[c] = df[c].astype("int64")
    return df


def memory_frame(rows: list[tuple[int, int, int, StepMemory]], info: SessionInfo) -> pd.DataFrame:
    """One row per step that recorded its memory (``rows``: step, ctx, end ts, figures): rss,
    rss_file, rss_anon; ``kv{C}_used`` and ``kv{C}_cells`` per KV cache C; ``free_{device}`` per
    device (<NA> where not read)."""
    names = device_names(info)
    out = []
    for step, ctx, ts, m in rows:
        row: dict[str, object] = {
            "step": step, "ctx": ctx, "ts": ts,
            "rss": m.rss, "rss_file": m.rss_file, "rss_anon": m.rss_anon,
        }  # fmt: skip
        for cache, used, cells in m.kv:
            row[f"kv{cache}_used"] = used
            row[f"kv{cache}_cells"] = cells
        for i, free in enumerate(m.free):
            row[f"free_{names.get(i, str(i))}"] = free
        out.append(row)
    df = pd.DataFrame(out)
    for c in df.columns:
        if c.startswith("free_") or c.startswith("kv"):
            df[c] = df[c].astype("Int64")
    return df
