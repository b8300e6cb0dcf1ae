"""Memory in the reports: the summary's Memory section (per device and purpose the size at start,
the peak and when, KV cells used against allocated, RSS, failed allocations) and the comparison
of two runs' footprints, per device and purpose."""

from __future__ import annotations

from typing import Any

from ..analysis.frames import SessionFrames
from ..session.memory import (
    cache_kinds,
    device_name,
    device_names,
    failure_line,
    footprint,
    kv_use,
    purpose_order,
    rss_peak,
    usage,
)
from .report import Column, Fact, Section, Table


def _first_step_ts(f: SessionFrames) -> int | None:
    return int(f.steps["t_start"].min()) if len(f.steps) else None


def section(f: SessionFrames) -> tuple[Section | None, dict[str, Any]]:
    """The summary's Memory section (None for a log without memory records)."""
    info = f.info
    if not info.allocations and not info.memory_failures:
        return None, {}
    names = device_names(info)
    t0 = info.start_ts
    rows = [
        {
            "device": device_name(info, u.device, names),
            "purpose": u.purpose,
            "at_start": u.at_start,
            "peak": u.peak,
            "peak_at_s": max(0, u.peak_ts - t0) / 1e9,
            "at_end": u.at_end,
        }
        for u in usage(info, _first_step_ts(f))
    ]
    tables = [
        Table(
            "memory",
            "Memory per device and purpose (backend buffers)",
            [
                Column("device", "device"),
                Column("purpose", "purpose"),
                Column("at_start", "at start", "bytes"),
                Column("peak", "peak", "bytes"),
                Column("peak_at_s", "peak at (s)", "f3"),
                Column("at_end", "at end", "bytes"),
            ],
            rows,
            note="At start: live when the first step began; peak at: seconds from the session's "
            "start (a buffer made before the session counts from its start).",
        )
    ]
    kv = kv_use(getattr(f, "step_memory", []), cache_kinds(info))
    kv_rows = [
        {
            "cache": k.cache,
            "kind": k.kind,
            "peak_used": k.peak_used,
            "cells": k.allocated,
            "use": k.peak_used / k.allocated if k.allocated else None,
        }
        for k in kv
    ]
    if kv_rows:
        tables.append(
            Table(
                "kv_cache",
                "KV cache cells",
                [
                    Column("cache", "cache", "int"),
                    Column("kind", "kind"),
                    Column("peak_used", "most cells used", "int"),
                    Column("cells", "cells allocated", "int"),
                    Column("use", "use", "pct"),
                ],
                kv_rows,
            )
        )
    facts = []
    peak = rss_peak(getattr(f, "step_memory", []))
    if peak is not None:
        facts += [
            Fact("peak RSS", peak.rss, "bytes"),
            Fact("  of it file-backed (mapped weights)", peak.rss_file, "bytes"),
            Fact("  of it anonymous", peak.rss_anon, "bytes"),
        ]
    facts += [Fact("allocation failed", failure_line(x)) for x in info.memory_failures]
    data = {
        "memory": rows,
        "kv_cache": kv_rows,
        "rss_peak": (
            {"rss": peak.rss, "rss_file": peak.rss_file, "rss_anon": peak.rss_anon}
            if peak is not None
            else None
        ),
        "memory_failures": info.memory_failures,
    }
    return Section("Memory", facts=facts, tables=tables), data


def footprint_rows(a: SessionFrames, b: SessionFrames) -> list[dict[str, Any]]:
    """Both runs' peak bytes per device and purpose, with each device's total: one table for
    "Q4_K_M vs Q8_0 at 8k context" ([] unless both logs recorded their buffers)."""
    if not a.info.allocations or not b.info.allocations:
        return []
    fa, fb = footprint(a.info), footprint(b.info)
    na, nb = device_names(a.info), device_names(b.info)
    # devices are matched by name: the same index may be another device on another machine
    by_name: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
    for fp, names, side in ((fa, na, 0), (fb, nb, 1)):
        for dev, purposes in fp.items():
            entry = by_name.setdefault(names.get(dev, f"device {dev}"), ({}, {}))
            entry[side].update(purposes)
    rows = []
    for name in sorted(by_name):
        pa, pb = by_name[name]
        for p in purpose_order(set(pa) | set(pb)):
            va, vb = pa.get(p, 0), pb.get(p, 0)
            rows.append(
                {"device": name, "purpose": p, "a": va, "b": vb, "ratio": vb / va if va else None}
            )
        ta, tb = sum(pa.values()), sum(pb.values())
        rows.append(
            {"device": name, "purpose": "total", "a": ta, "b": tb, "ratio": tb / ta if ta else None}
        )
    return rows


def footprint_table(rows: list[dict[str, Any]]) -> Table:
    return Table(
        "footprint",
        "Footprint per device and purpose (peak bytes of backend buffers)",
        [
            Column("device", "device"),
            Column("purpose", "purpose"),
            Column("a", "A", "bytes"),
            Column("b", "B", "bytes"),
            Column("ratio", "B/A", "ratio"),
        ],
        rows,
    )
