"""Memory in the reports: the summary's Memory section (per device and purpose the size at start,
the peak and when, KV cells used against allocated, RSS, failed allocations) and the comparison
of two runs' footprints, per device and purpose."""

from __future__ import annotations

import re
from typing import Any

from ..analysis.frames import SessionFrames
from ..session.memory_timeline import (
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


def _buffer_rows(f: SessionFrames) -> list[dict[str, Any]]:
    """Per device and purpose, the bytes of its backend buffers at start, at peak and at end."""
    info = f.info
    names = device_names(info)
    t0 = info.start_ts
    return [
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


def _buffer_table(rows: list[dict[str, Any]]) -> Table:
    return Table(
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


def _kv_rows(f: SessionFrames) -> list[dict[str, Any]]:
    """Per KV cache, the most cells used and the cells allocated."""
    kv = kv_use(getattr(f, "step_memory", []), cache_kinds(f.info))
    return [
        {
            "cache": k.cache,
            "kind": k.kind,
            "peak_used": k.peak_used,
            "cells": k.allocated,
            "use": k.peak_used / k.allocated if k.allocated else None,
        }
        for k in kv
    ]


def _kv_table(rows: list[dict[str, Any]]) -> Table:
    return Table(
        "kv_cache",
        "KV cache cells",
        [
            Column("cache", "cache", "int"),
            Column("kind", "kind"),
            Column("peak_used", "most cells used", "int"),
            Column("cells", "cells allocated", "int"),
            Column("use", "use", "pct"),
        ],
        rows,
    )


def section(f: SessionFrames) -> tuple[Section | None, dict[str, Any]]:
    """The summary's Memory section (None for a log without memory records)."""
    info = f.info
    if not info.allocations and not info.memory_failures:
        return None, {}
    rows, kv_rows = _buffer_rows(f), _kv_rows(f)
    tables = [_buffer_table(rows), *([_kv_table(kv_rows)] if kv_rows else [])]
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


# llama.cpp's expert tensors (common/common.h LLM_FFN_EXPS_REGEX): ffn_{up,down,gate,gate_up}_exps
# and the _chexps of the architectures that have them
_EXPS = re.compile(r"\.(ffn_(?:up|down|gate|gate_up)_(?:ch|)exps)")


def buffer_devices(f: SessionFrames) -> dict[str, str]:
    """A buffer (type) name -> the name of the device whose memory it takes, from the buffers the
    log recorded (``memory_alloc``); without them, a device of that very name, or the CPU for a
    ``CPU...`` buffer."""
    info = f.info
    names = device_names(info)
    out: dict[str, str] = {}
    for a in info.allocations.values():
        if a.buffer_type not in out and a.device >= 0:
            out[a.buffer_type] = device_name(info, a.device, names)
    return out


def expert_tensors(f: SessionFrames) -> list[dict[str, Any]]:
    """Each MoE expert tensor of the weight inventory: its layer, name, part, type, bytes, the
    buffer that holds it and that buffer's device ([] for a model without experts)."""
    devices = buffer_devices(f)
    known = set(device_names(f.info).values())
    rows = []
    for w in f.info.weights or []:
        m = _EXPS.search(str(w.get("name", "")))
        if m is None:
            continue
        buffer = str(w.get("buffer", "none"))
        device = devices.get(buffer) or (
            buffer if buffer in known else "CPU" if buffer.startswith("CPU") else "unknown"
        )
        rows.append(
            {
                "layer": w.get("layer"),
                "name": w.get("name"),
                "part": m.group(1),
                "type": w.get("type"),
                "bytes": int(w.get("bytes", 0)),
                "buffer": buffer,
                "device": device,
            }
        )
    return rows


def _part_order(part: str) -> tuple[int, str]:
    order = ("ffn_gate_up", "ffn_gate", "ffn_up", "ffn_down")
    base = part.rsplit("_", 1)[0]
    return (order.index(base) if base in order else len(order), part)


def experts_section(f: SessionFrames) -> tuple[Section | None, dict[str, Any]]:
    """The summary's "Where the experts live": per layer, the expert tensors each buffer (and
    device) holds and their bytes; the bytes per device as facts (None without experts)."""
    tensors = expert_tensors(f)
    if not tensors:
        return None, {}
    groups: dict[tuple[Any, str, str], list[dict[str, Any]]] = {}
    for t in tensors:
        groups.setdefault((t["layer"], t["buffer"], t["device"]), []).append(t)
    rows = [
        {
            "layer": layer,
            "tensors": ", ".join(sorted((t["part"] for t in ts), key=_part_order)),
            "buffer": buffer,
            "device": device,
            "bytes": sum(t["bytes"] for t in ts),
        }
        for (layer, buffer, device), ts in sorted(
            groups.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1])
        )
    ]
    per_device: dict[str, int] = {}
    for t in tensors:
        per_device[t["device"]] = per_device.get(t["device"], 0) + t["bytes"]
    facts = [Fact(f"expert weights on {dev}", n, "bytes") for dev, n in sorted(per_device.items())]
    table = Table(
        "experts_placement",
        "Expert tensors per layer: the buffer that holds them and its device",
        [
            Column("layer", "layer", "int"),
            Column("tensors", "tensors"),
            Column("buffer", "buffer"),
            Column("device", "device"),
            Column("bytes", "bytes", "bytes"),
        ],
        rows,
        note="From the weight inventory (session_start.weights); -ot/--override-tensor and "
        "--n-cpu-moe choose these buffers.",
    )
    data = {"experts_placement": tensors, "expert_bytes_per_device": per_device}
    return Section("Where the experts live", facts=facts, tables=[table]), data
