"""The per-event Chrome JSON writer ``write_chrome_json`` was before it wrote in bulk: one
``orjson.dumps`` per event, from the per-op layout (``reference.layout``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import IO

import orjson

from llamacpp_instr.converters.traces.items import Item, Sample, Slice, Track


def reference_write_chrome_json(items: Iterable[Item], out: IO[bytes]) -> int:
    """The per-event writer ``write_chrome_json`` was before it wrote in bulk."""
    tracks: dict[int, Track] = {}
    tids: dict[int, int] = {}
    n = 0

    def emit(ev: dict[str, object]) -> None:
        nonlocal n
        out.write(b",\n" if n else b"[\n")
        try:
            out.write(orjson.dumps(ev))
        except TypeError:
            out.write(json.dumps(ev).encode())
        n += 1

    for it in items:
        if isinstance(it, Track):
            tracks[it.uuid] = it
            if it.parent is None:
                emit({"ph": "M", "name": "process_name", "pid": it.pid, "args": {"name": it.name}})
                emit(
                    {
                        "ph": "M",
                        "name": "process_sort_index",
                        "pid": it.pid,
                        "args": {"sort_index": it.order},
                    }
                )
                if it.labels:
                    labels = ", ".join(it.labels)
                    emit(
                        {
                            "ph": "M",
                            "name": "process_labels",
                            "pid": it.pid,
                            "args": {"labels": labels},
                        }
                    )
            elif it.kind == "slices":
                tid = tids[it.uuid] = len(tids) + 1
                emit(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": it.pid,
                        "tid": tid,
                        "args": {"name": it.name},
                    }
                )
                emit(
                    {
                        "ph": "M",
                        "name": "thread_sort_index",
                        "pid": it.pid,
                        "tid": tid,
                        "args": {"sort_index": it.order},
                    }
                )
        elif isinstance(it, Slice):
            tr = tracks[it.track]
            emit(
                {
                    "ph": "X",
                    "name": it.name,
                    "cat": it.category,
                    "pid": tr.pid,
                    "tid": tids[it.track],
                    "ts": it.ts / 1000,
                    "dur": it.dur / 1000,
                    "args": it.args,
                }
            )
            # flows at the slice's middle: a split's launch on a device, an encode's embeddings
            # through the decode steps that carry them, or the KV cache's
            launch = it.category in ("split", "busy", "remote")
            name, cat = ("launch", "device_flow") if launch else ("KV cache", "kv_flow")
            ph = "s"
            if it.category == "step":
                name, cat = "embeddings", "media_flow"
                ph = "s" if it.args.get("kind") == "encode" else "t"
            mid = (it.ts + it.dur / 2) / 1000
            for f in it.flows_out:
                emit({"ph": ph, "name": name, "cat": cat, "pid": tr.pid, "tid": tids[it.track],
                      "id": f, "ts": mid})  # fmt: skip
            for f in it.flows_in:
                emit({"ph": "f", "bp": "e", "name": name, "cat": cat, "pid": tr.pid,
                      "tid": tids[it.track], "id": f, "ts": mid})  # fmt: skip
        elif isinstance(it, Sample):
            tr = tracks[it.track]
            emit(
                {
                    "ph": "C",
                    "name": tr.name,
                    "pid": tr.pid,
                    "ts": it.ts / 1000,
                    "args": {tr.unit or "value": it.value},
                }
            )
    out.write(b"\n]\n" if n else b"[]\n")
    return n
