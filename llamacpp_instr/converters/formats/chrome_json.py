"""Chrome trace-event JSON writer (chrome://tracing and other legacy viewers), streamed.

Same layout as the Perfetto writer: processes and named threads via metadata events, slices as
complete ("X") events, counters as "C" events. Timestamps are microseconds (floats keep the ns).

Tracks, slices and samples are written one event at a time; each compute of
``layout.layout_bulk`` comes as a ``ComputeBatch`` (its layer slices, and the op slices of
a packed compute as one ``OpBatch``), written in bulk. What does not depend on timing
(name, track, the static args of ``op_args.op_static_args``) is rendered once per graph node
and track; per op only the four numbers (ts, dur, GFLOP/s, GB/s) are formatted, by orjson from
numpy arrays, thousands of ops at a time (``chrome_ops``), and the parts are joined into one write. Big outputs
are written by a helper thread, so that the kernel's copying overlaps the formatting.

The events are exactly those of the per-event path: the same keys in the same order and the same
values (the floats are the ones Python computes, formatted by the same orjson code), so the bytes
are identical too (tests/test_chrome_json.py compares them with the per-event reference writer's).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import IO, Any

import numpy as np

from ..reading.decode.columns import LayerSpan
from ..traces.items import ComputeBatch, Item, OpBatch, Sample, Slice, SliceRows, Track
from ..traces.rounding import EXACT
from ..traces.sinks import ThreadedWriter
from .chrome_ops import OpQueue, dumps, pairs

# the flows a slice of each category starts or ends (name, category); others: the KV cache's
_FLOW_KINDS = {c: ("launch", "device_flow") for c in ("split", "busy", "remote")}
_FLOW_KINDS["speculation"] = ("draft to verify", "spec_flow")  # a request's draft, verified
# an encode's embeddings to the decode steps that carry them: it starts the flow, each of them a
# step of it (``Slice.carries``, v1's "t": the flow goes on through every step that carries the
# same medium slice)
_FLOW_KINDS["step"] = ("embeddings", "media_flow")


class _Writer:
    def __init__(self, out: IO[bytes]) -> None:
        self.out = ThreadedWriter(out, name="chrome-json-writer")
        self.n = 0
        self.tracks: dict[int, Track] = {}
        self.tids: dict[int, int] = {}
        self.layer_cache: dict[tuple[Any, ...], tuple[bytes, bytes]] = {}
        self.queue = OpQueue()  # op events to format, and what follows them
        self.started = False  # written the first event

    def write(self, data: bytes, events: int) -> None:
        """``data``: events, each starting with ",\\n" (after the op events queued, if any)."""
        if not events:
            return
        self.n += events
        if self.queue.pending:
            self.queue.pending.append(data)
        else:
            self._out(data)

    def _out(self, data: bytes) -> None:
        if not self.started:
            data = b"[\n" + data[2:]
            self.started = True
        self.out.write(data)

    def emit(self, ev: dict[str, object]) -> None:
        self.write(b",\n" + dumps(ev), 1)

    def item(self, it: Item | OpBatch | ComputeBatch | SliceRows) -> None:
        if isinstance(it, Slice):
            if it.category == "layer" and self.layer_slice(it):
                return
            tr = self.tracks[it.track]
            self.emit(
                {
                    "ph": "X",
                    "name": it.name,
                    "cat": it.category,
                    "pid": tr.pid,
                    "tid": self.tids[it.track],
                    "ts": it.ts / 1000,
                    "dur": it.dur / 1000,
                    "args": it.args,
                }
            )
            if it.flows_out or it.flows_in:
                self.flows(it, tr)
        elif isinstance(it, ComputeBatch):
            self.item(it.slice)
            self.layers(it.slice.track, it.layers)
            if it.ops is not None:
                self.ops(it.ops)
        elif isinstance(it, SliceRows):
            for x in it.items():
                self.item(x)
        elif isinstance(it, Sample):
            tr = self.tracks[it.track]
            self.emit(
                {
                    "ph": "C",
                    "name": tr.name,
                    "pid": tr.pid,
                    "ts": it.ts / 1000,
                    "args": {tr.unit or "value": it.value},
                }
            )
        elif isinstance(it, Track):
            self.track(it)

    def flows(self, it: Slice, tr: Track) -> None:
        """Flow events (v1: start ``s``, step ``t``, end ``f``) bound to the slice: at its
        middle, where no other slice of its track begins or ends. A split's flow is its launch on
        a device (``devices``); a step's, its medium's embeddings (from their encode); an op's,
        the KV cache's."""
        name, cat = _FLOW_KINDS.get(it.category, ("KV cache", "kv_flow"))
        head = {"name": name, "cat": cat, "pid": tr.pid, "tid": self.tids[it.track]}
        ts = (it.ts + it.dur / 2) / 1000
        ph = "t" if it.carries else "s"
        for f in it.flows_out:
            self.emit({"ph": ph, **head, "id": f, "ts": ts})
        for f in it.flows_in:
            self.emit({"ph": "f", "bp": "e", **head, "id": f, "ts": ts})

    def track(self, it: Track) -> None:
        self.tracks[it.uuid] = it
        if it.parent is None:
            self.emit({"ph": "M", "name": "process_name", "pid": it.pid, "args": {"name": it.name}})
            self.emit(
                {
                    "ph": "M",
                    "name": "process_sort_index",
                    "pid": it.pid,
                    "args": {"sort_index": it.order},
                }
            )
            if it.labels:
                labels = ", ".join(it.labels)
                self.emit(
                    {"ph": "M", "name": "process_labels", "pid": it.pid, "args": {"labels": labels}}
                )
        elif it.kind == "slices":
            tid = self.tids[it.uuid] = len(self.tids) + 1
            self.emit(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": it.pid,
                    "tid": tid,
                    "args": {"name": it.name},
                }
            )
            self.emit(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": it.pid,
                    "tid": tid,
                    "args": {"sort_index": it.order},
                }
            )

    def _layer_parts(self, track: int, name: str, args: dict[str, Any]) -> tuple[bytes, bytes]:
        """A layer slice's event around its ts and dur (the same for every step)."""
        key = (track, name, *args.items())
        parts = self.layer_cache.get(key)
        if parts is None:
            ev = {"ph": "X", "name": name, "cat": "layer", "pid": self.tracks[track].pid}
            ev["tid"] = self.tids[track]
            head = b",\n" + dumps(ev)[:-1] + b',"ts":'
            parts = self.layer_cache[key] = (head, b',"args":' + dumps(args) + b"}")
        return parts

    def layer_slice(self, it: Slice) -> bool:
        """A layer slice from its cached parts; False if its args cannot be a cache key."""
        try:
            head, tail = self._layer_parts(it.track, it.name, it.args)
        except TypeError:
            return False
        ts, dur = dumps(it.ts / 1000), dumps(it.dur / 1000)
        self.write(head + ts + b',"dur":' + dur + tail, 1)
        return True

    def layers(self, track: int, spans: Sequence[LayerSpan]) -> None:
        """The layer slices of a compute (as ``layout`` makes them), formatted in bulk."""
        if not spans:
            return
        parts = [
            self._layer_parts(track, f"layer {s.layer}", {"layer": s.layer, "n_ops": s.n_ops})
            for s in spans
        ]
        start = [s.start for s in spans]
        dur = [s.dur for s in spans]
        if max(max(start), max(dur)) >= EXACT:  # int / 1000 as Python divides, one by one
            times = [
                dumps(a / 1000) + b',"dur":' + dumps(b / 1000)
                for a, b in zip(start, dur, strict=True)
            ]
        else:
            times = pairs(np.array(start) / 1000, np.array(dur) / 1000, b',"dur":')
        out = [b""] * (3 * len(spans))
        out[0::3] = [p[0] for p in parts]
        out[1::3] = times
        out[2::3] = [p[1] for p in parts]
        self.write(b"".join(out), len(spans))

    def ops(self, ob: OpBatch) -> None:
        """The op events of a packed compute, in its order: queued, and formatted in bulk with
        those of the next computes (``flush``)."""
        self.n += self.queue.add(ob, self.tracks[ob.track].pid, self.tids[ob.track])
        if self.queue.full():
            self.flush()

    def flush(self) -> None:
        """Format the queued op events, all at once, and write them with what came between."""
        self._out(self.queue.flush())


def write_chrome_json(
    items: Iterable[Item | OpBatch | ComputeBatch | SliceRows], out: IO[bytes]
) -> int:
    """Write the items as a JSON array of trace events; returns the number of events.

    ``items`` is a ``layout.layout_bulk`` stream: op slices come per compute, as
    ``OpBatch`` items, and each compute's layer slices in a ``ComputeBatch``; plain slices are
    written one by one."""
    w = _Writer(out)
    ok = False
    try:
        for it in items:
            w.item(it)
        if w.queue.pending:
            w.flush()
        ok = True
    finally:
        w.out.close(ok)
    out.write(b"\n]\n" if w.n else b"[]\n")
    return w.n
