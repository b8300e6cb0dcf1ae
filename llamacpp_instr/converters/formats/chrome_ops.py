"""The op events of the Chrome JSON writer, in bulk: per graph and track, what does not depend on
timing rendered once per node (``OpTable``); per op only the four numbers (ts, dur, GFLOP/s,
GB/s) formatted, by orjson from numpy arrays, thousands of ops at a time (``OpQueue``)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

from ..reading.decode.graphs import Graph
from ..session.machine_peaks import Roof
from ..traces.items import OpBatch
from ..traces.op_args import OpVariants, op_rates, op_rates_bulk, op_static_args
from ..traces.rounding import EXACT, exact_float

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def dumps(v: Any) -> bytes:
    try:
        return orjson.dumps(v)
    except TypeError:  # an integer beyond 64 bits (a damaged log): the stdlib writes any size
        return json.dumps(v).encode()


def pairs(a: np.ndarray, b: np.ndarray, sep: bytes) -> list[bytes]:
    """``b"<a[k]><sep><b[k]>"`` for each k, the floats as orjson writes them."""
    pairs = np.empty((len(a), 2))
    pairs[:, 0] = a
    pairs[:, 1] = b
    text = orjson.dumps(pairs, option=_NUMPY)[2:-2]  # a,b],[a,b],[ ... a,b
    return text.replace(b",", sep).split(b"]" + sep + b"[")


def floats(a: np.ndarray) -> list[bytes]:
    """Each float as orjson writes it."""
    return orjson.dumps(np.asarray(a, dtype=np.float64), option=_NUMPY)[1:-1].split(b",")


class OpTable:
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
        self.variants = OpVariants(len(graph.nodes), self.rows)
        self._arrays: tuple[Any, ...] | None = None

    def rows(self, variants: list[tuple[int, tuple[int, ...]]]) -> list[int]:
        """New rows for ``variants`` (``OpVariants``' builder), in order."""
        return [self.row(i, fused) for i, fused in variants]

    def row(self, i: int, fused: tuple[int, ...]) -> int:
        """A new row: node ``i`` with the nodes ``fused`` into it."""
        nodes = self.graph.nodes
        node = nodes[i]
        head, n_flops, n_bytes, tail, ideal = op_static_args(
            node, [nodes[j] for j in fused], self.graph, self.roof
        )
        start = {"ph": "X", "name": node.label, "cat": "op", "pid": self.pid, "tid": self.tid}
        self.head.append(b",\n" + dumps(start)[:-1] + b',"ts":')
        self.mid.append(b',"args":' + dumps(head)[:-1] + b',"gflop_per_s":')
        self.tail.append((b"," + dumps(tail)[1:-1] if tail else b"") + b"}}")
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


class Group:
    """Queued op events: a table's rows, with their start and duration."""

    __slots__ = ("table", "rows", "start", "dur")

    def __init__(
        self, table: OpTable, rows: np.ndarray, start: np.ndarray, dur: np.ndarray
    ) -> None:
        self.table, self.rows, self.start, self.dur = table, rows, start, dur


class OpQueue:
    """Op events queued, to be formatted together, thousands at a time (``flush``: when ``full``,
    and at the end); the events written meanwhile wait behind them, in order, in ``pending``."""

    BATCH = 1 << 14  # op events formatted together

    def __init__(self) -> None:
        self.tables: dict[tuple[Graph, int], OpTable] = {}
        self.pending: list[bytes | Group] = []  # op events to format, and what follows them
        self.pending_ops = 0

    def add(self, ob: OpBatch, pid: int, tid: int) -> int:
        """Queue the op events of a packed compute, in its order, on the track of ``pid`` and
        ``tid``; returns how many."""
        c = ob.compute
        graph = c.graph
        assert graph is not None
        key = (graph, ob.track)
        table = self.tables.get(key)
        if table is None:
            table = self.tables[key] = OpTable(graph, pid, tid, ob.roof)
        node = np.asarray(c.op_node, dtype=np.int64)
        start = np.asarray(c.op_start, dtype=np.int64)
        dur = np.asarray(c.op_dur, dtype=np.int64)
        rows = table.variants.ids(node, c.op_fused)
        if ob.keep is not None:
            keep = ob.keep
            rows, start, dur = rows[keep], start[keep], dur[keep]
        m = len(rows)
        if not m:
            return 0
        self.pending.append(Group(table, rows, start, dur))
        self.pending_ops += m
        return m

    def full(self) -> bool:
        return self.pending_ops >= self.BATCH

    def flush(self) -> bytes:
        """The queued op events formatted, all at once, with what came between them."""
        pending, self.pending, self.pending_ops = self.pending, [], 0
        groups = [g for g in pending if isinstance(g, Group)]
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
        parts[:, 1] = pairs(ts_us, dur_us, b',"dur":')
        parts[:, 2] = cat(1)
        parts[:, 3] = pairs(g, bw, b',"gb_per_s":')
        if fr:
            parts[roofed, 3] += np.array(
                [b',"roof_fraction":' + f for f in floats(fr[0][roofed])], dtype=object
            )
        parts[:, 4] = cat(2)
        events = parts.ravel().tolist()
        out: list[bytes] = []
        o = 0
        for seg in pending:
            if isinstance(seg, Group):
                e = o + 5 * len(seg.rows)
                out += events[o:e]
                o = e
            else:
                out.append(seg)
        return b"".join(out)
