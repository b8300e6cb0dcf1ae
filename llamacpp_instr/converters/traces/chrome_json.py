"""Chrome trace-event JSON writer (chrome://tracing and other legacy viewers), streamed.

Same layout as the Perfetto writer: processes and named threads via metadata events, slices as
complete ("X") events, counters as "C" events. Timestamps are microseconds (floats keep the ns).

Tracks, slices and samples are written one event at a time; each compute of
``trace_layout.layout_bulk`` comes as a ``ComputeBatch`` (its layer slices, and the op slices of
a packed compute as one ``OpBatch``), written in bulk. What does not depend on timing
(name, track, the static args of ``trace_layout.op_static_args``) is rendered once per graph node
and track; per op only the four numbers (ts, dur, GFLOP/s, GB/s) are formatted, by orjson from
numpy arrays, thousands of ops at a time, and the parts are joined into one write. Big outputs
are written by a helper thread, so that the kernel's copying overlaps the formatting.

The events are exactly those of the per-event path: the same keys in the same order and the same
values (the floats are the ones Python computes, formatted by the same orjson code), so the bytes
are identical too (tests/test_chrome_json.py compares them with the per-event reference writer's).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import IO, Any

import numpy as np
import orjson

from ..reading.decode.columns import LayerSpan
from ..reading.decode.graphs import Graph
from ..session.machine_peaks import Roof
from .items import ComputeBatch, Item, OpBatch, Sample, Slice, Track
from .op_args import OpVariants, op_rates, op_rates_bulk, op_static_args
from .rounding import EXACT, exact_float
from .sinks import ThreadedWriter

_NUMPY = orjson.OPT_SERIALIZE_NUMPY
# the flows a slice of each category starts or ends (name, category); others: the KV cache's
_FLOW_KINDS = {c: ("launch", "device_flow") for c in ("split", "busy", "remote")}


def _dumps(v: Any) -> bytes:
    try:
        return orjson.dumps(v)
    except TypeError:  # an integer beyond 64 bits (a damaged log): the stdlib writes any size
        return json.dumps(v).encode()


def _pairs(a: np.ndarray, b: np.ndarray, sep: bytes) -> list[bytes]:
    """``b"<a[k]><sep><b[k]>"`` for each k, the floats as orjson writes them."""
    pairs = np.empty((len(a), 2))
    pairs[:, 0] = a
    pairs[:, 1] = b
    text = orjson.dumps(pairs, option=_NUMPY)[2:-2]  # a,b],[a,b],[ ... a,b
    return text.replace(b",", sep).split(b"]" + sep + b"[")


def _floats(a: np.ndarray) -> list[bytes]:
    """Each float as orjson writes it."""
    return orjson.dumps(np.asarray(a, dtype=np.float64), option=_NUMPY)[1:-1].split(b",")


class _OpTable:
    """One graph's op events on one track: per row (a node, or a node with fused nodes) the
    rendered parts that do not depend on timing, and its estimated FLOPs and bytes; the rows of
    a compute's ops from ``variants.ids``. With a ``roof``, its rows' least times at the roofs
    (``ideal``), for the roof fraction."""

    def __init__(self, graph: Graph, pid: int, tid: int, roof: Roof | None) -> None:
        self.graph = graph
        self.pid, self.tid = pid, tid
        self.roof = roof
        self.ideal: list[float | None] = []
        self.head: list[bytes] = []  # ',\n{"ph":"X", ... ,"ts":'
        self.mid: list[bytes] = []  # ',"args":{...static head...,"gflop_per_s":'
        self.tail: list[bytes] = []  # ',...static tail...}}'
        self.flops: list[int] = []
        self.nbytes: list[int] = []
        self.variants = OpVariants(len(graph.nodes), self.row)
        self._arrays: tuple[Any, ...] | None = None

    def row(self, i: int, fused: tuple[int, ...]) -> int:
        """A new row: node ``i`` with the nodes ``fused`` into it."""
        nodes = self.graph.nodes
        node = nodes[i]
        head, n_flops, n_bytes, tail, ideal = op_static_args(
            node, [nodes[j] for j in fused], self.graph, self.roof
        )
        start = {"ph": "X", "name": node.label, "cat": "op", "pid": self.pid, "tid": self.tid}
        self.head.append(b",\n" + _dumps(start)[:-1] + b',"ts":')
        self.mid.append(b',"args":' + _dumps(head)[:-1] + b',"gflop_per_s":')
        self.tail.append((b"," + _dumps(tail)[1:-1] if tail else b"") + b"}}")
        self.flops.append(n_flops)
        self.nbytes.append(n_bytes)
        self.ideal.append(ideal)
        self._arrays = None
        return len(self.head) - 1

    def arrays(self) -> tuple[Any, ...]:
        if self._arrays is None:
            objs = []
            for parts in (self.head, self.mid, self.tail):
                a = np.empty(len(parts), dtype=object)
                a[:] = parts
                objs.append(a)
            exact = np.array(
                [
                    0 <= f <= EXACT and 0 <= b <= EXACT
                    for f, b in zip(self.flops, self.nbytes, strict=True)
                ]
            )
            flops = np.array(
                [exact_float(f) if ok else 0.0 for f, ok in zip(self.flops, exact, strict=True)]
            )
            nbytes = np.array(
                [exact_float(b) if ok else 0.0 for b, ok in zip(self.nbytes, exact, strict=True)]
            )
            ideal = np.array([0.0 if v is None else v for v in self.ideal])
            roofed = np.array([v is not None for v in self.ideal], dtype=bool)
            self._arrays = (*objs, flops, nbytes, exact, ideal, roofed)
        return self._arrays


class _Writer:
    def __init__(self, out: IO[bytes]) -> None:
        self.out = ThreadedWriter(out, name="chrome-json-writer")
        self.n = 0
        self.tracks: dict[int, Track] = {}
        self.tids: dict[int, int] = {}
        self.tables: dict[tuple[Graph, int], _OpTable] = {}
        self.layer_cache: dict[tuple[Any, ...], tuple[bytes, bytes]] = {}
        self.pending: list[bytes | _Group] = []  # op events to format, and what follows them
        self.pending_ops = 0
        self.started = False  # written the first event

    BATCH = 1 << 14  # op events formatted together

    def write(self, data: bytes, events: int) -> None:
        """``data``: events, each starting with ",\\n" (after the op events queued, if any)."""
        if not events:
            return
        self.n += events
        if self.pending:
            self.pending.append(data)
        else:
            self._out(data)

    def _out(self, data: bytes) -> None:
        if not self.started:
            data = b"[\n" + data[2:]
            self.started = True
        self.out.write(data)

    def emit(self, ev: dict[str, object]) -> None:
        self.write(b",\n" + _dumps(ev), 1)

    def item(self, it: Item | OpBatch | ComputeBatch) -> None:
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
        """Flow events (v1: start ``s``, end ``f``) bound to the slice: at its middle, where no
        other slice of its track begins or ends. A split's flow is its launch on a device
        (``trace_devices``); an op's, the KV cache's."""
        name, cat = _FLOW_KINDS.get(it.category, ("KV cache", "kv_flow"))
        head = {"name": name, "cat": cat, "pid": tr.pid, "tid": self.tids[it.track]}
        ts = (it.ts + it.dur / 2) / 1000
        for f in it.flows_out:
            self.emit({"ph": "s", **head, "id": f, "ts": ts})
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
            head = b",\n" + _dumps(ev)[:-1] + b',"ts":'
            parts = self.layer_cache[key] = (head, b',"args":' + _dumps(args) + b"}")
        return parts

    def layer_slice(self, it: Slice) -> bool:
        """A layer slice from its cached parts; False if its args cannot be a cache key."""
        try:
            head, tail = self._layer_parts(it.track, it.name, it.args)
        except TypeError:
            return False
        ts, dur = _dumps(it.ts / 1000), _dumps(it.dur / 1000)
        self.write(head + ts + b',"dur":' + dur + tail, 1)
        return True

    def layers(self, track: int, spans: Sequence[LayerSpan]) -> None:
        """The layer slices of a compute (as ``trace_layout`` makes them), formatted in bulk."""
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
                _dumps(a / 1000) + b',"dur":' + _dumps(b / 1000)
                for a, b in zip(start, dur, strict=True)
            ]
        else:
            times = _pairs(np.array(start) / 1000, np.array(dur) / 1000, b',"dur":')
        out = [b""] * (3 * len(spans))
        out[0::3] = [p[0] for p in parts]
        out[1::3] = times
        out[2::3] = [p[1] for p in parts]
        self.write(b"".join(out), len(spans))

    def ops(self, ob: OpBatch) -> None:
        """The op events of a packed compute, in its order: queued, and formatted in bulk with
        those of the next computes (``flush``)."""
        c = ob.compute
        graph = c.graph
        assert graph is not None
        key = (graph, ob.track)
        table = self.tables.get(key)
        if table is None:
            table = self.tables[key] = _OpTable(
                graph, self.tracks[ob.track].pid, self.tids[ob.track], ob.roof
            )
        node = np.asarray(c.op_node, dtype=np.int64)
        start = np.asarray(c.op_start, dtype=np.int64)
        dur = np.asarray(c.op_dur, dtype=np.int64)
        rows = table.variants.ids(node, c.op_fused)
        if ob.keep is not None:
            keep = ob.keep
            rows, start, dur = rows[keep], start[keep], dur[keep]
        m = len(rows)
        if not m:
            return
        self.pending.append(_Group(table, rows, start, dur))
        self.pending_ops += m
        self.n += m
        if self.pending_ops >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        """Format the queued op events, all at once, and write them with what came between."""
        pending, self.pending, self.pending_ops = self.pending, [], 0
        groups = [g for g in pending if isinstance(g, _Group)]
        tabs = [g.table.arrays() for g in groups]
        rows = [g.rows for g in groups]

        def cat(k: int) -> np.ndarray:
            return np.concatenate([t[k][r] for t, r in zip(tabs, rows, strict=True)])

        start = np.concatenate([g.start for g in groups])
        dur = np.concatenate([g.dur for g in groups])
        # the timestamps and durations in microseconds: int / 1000 as Python divides
        ts_us = start / 1000
        dur_us = dur / 1000
        for k in np.flatnonzero((start >= EXACT) | (dur >= EXACT)).tolist():
            ts_us[k] = int(start[k]) / 1000
            dur_us[k] = int(dur[k]) / 1000
        # the rates, as op_rates gives them
        ends = np.cumsum([len(r) for r in rows])

        def one(k: int) -> tuple[float, ...]:
            j = int(np.searchsorted(ends, k, side="right"))
            r = int(rows[j][k - (int(ends[j - 1]) if j else 0)])
            t = groups[j].table
            return op_rates(t.flops[r], t.nbytes[r], int(dur[k]), t.ideal[r])

        roofed = cat(7)
        ideal = cat(6) if roofed.any() else None
        g, bw, *fr = op_rates_bulk(cat(3), cat(4), cat(5), dur, ideal, roofed, one)
        m = len(start)
        parts = np.empty((m, 5), dtype=object)
        parts[:, 0] = cat(0)
        parts[:, 1] = _pairs(ts_us, dur_us, b',"dur":')
        parts[:, 2] = cat(1)
        parts[:, 3] = _pairs(g, bw, b',"gb_per_s":')
        if fr:
            parts[roofed, 3] += np.array(
                [b',"roof_fraction":' + f for f in _floats(fr[0][roofed])], dtype=object
            )
        parts[:, 4] = cat(2)
        events = parts.ravel().tolist()
        out: list[bytes] = []
        o = 0
        for seg in pending:
            if isinstance(seg, _Group):
                e = o + 5 * len(seg.rows)
                out += events[o:e]
                o = e
            else:
                out.append(seg)
        self._out(b"".join(out))


class _Group:
    """Queued op events: a table's rows, with their start and duration."""

    __slots__ = ("table", "rows", "start", "dur")

    def __init__(
        self, table: _OpTable, rows: np.ndarray, start: np.ndarray, dur: np.ndarray
    ) -> None:
        self.table, self.rows, self.start, self.dur = table, rows, start, dur


def write_chrome_json(items: Iterable[Item | OpBatch | ComputeBatch], out: IO[bytes]) -> int:
    """Write the items as a JSON array of trace events; returns the number of events.

    ``items`` is a ``trace_layout.layout_bulk`` stream: op slices come per compute, as
    ``OpBatch`` items, and each compute's layer slices in a ``ComputeBatch``; plain slices are
    written one by one."""
    w = _Writer(out)
    ok = False
    try:
        for it in items:
            w.item(it)
        if w.pending:
            w.flush()
        ok = True
    finally:
        w.out.close(ok)
    out.write(b"\n]\n" if w.n else b"[]\n")
    return w.n
