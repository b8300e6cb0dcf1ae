"""Compute records: ``Compute``, its timed ops always columns, decoded op by op
(``decode_compute``) or in bulk (``decode_compute_bulk``); ``OpTiming``, the lazy per-op view."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .columns import LayerSpan, PackedOps, layer_spans, pack_ops
from .fields import nonneg, opt_int
from .graphs import Graph, Node
from .placement import Placement, placement


@dataclass
class OpTiming:
    """One executed op of one compute: absolute start (ns) and duration."""

    node: Node
    start: int
    dur: int
    fused: list[Node] = field(default_factory=list)
    thread_done: list[int] | None = None  # ns from start until each worker thread finished
    stats: tuple[Any, ...] | None = None  # (min, max, mean, std, n_nan, n_inf), verbose


_NO_OPS = np.zeros(0, np.int64)
_NO_OPS.flags.writeable = False


@dataclass(eq=False)
class Compute:
    """One compute (ubatch) of a step. Its timed ops are columns, in log order: ``op_node`` (the
    graph node position of each), ``op_start`` (absolute, ns), ``op_dur`` (ns), int64 arrays
    (object arrays of Python ints in the rare record with a value beyond 64 bits), with
    ``op_fused`` (op position -> fused node positions), and from verbose logs ``op_threads`` (per
    op, ns from its start until each worker thread finished, or None) and ``op_stats`` (op
    position -> tensor statistics). ``unpack``/``op_at``/``ops`` are the lazy per-op view for
    the few places that want ``OpTiming`` objects. The columns and ``op_fused`` are read-only:
    computes of the same graph may share them."""

    step: int
    ubatch: int | None  # (None in a log that did not say)
    graph: Graph | None
    start: int
    dur: int
    n_tokens: int
    n_threads: int
    status: int
    layers: Sequence[LayerSpan]  # a ``LayerRows`` when the rows were well-formed
    op_node: Any = field(default_factory=lambda: _NO_OPS)
    op_start: Any = field(default_factory=lambda: _NO_OPS)
    op_dur: Any = field(default_factory=lambda: _NO_OPS)
    op_fused: dict[int, list[int]] = field(default_factory=dict)
    op_threads: list[list[int] | None] | None = None  # None: the record had no thread timings
    op_stats: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    # where it ran (splits, copies, device-timed stretches, remote graphs), if the record says
    place: Placement | None = None
    # per layer span, the device that timed it (-1: the CPU backend's); None: all the CPU backend's
    layer_device: Any = None

    @property
    def n_ops(self) -> int:
        return len(self.op_node)

    @property
    def per_op(self) -> bool:
        """Whether the bulk trace writers leave this compute's ops to the per-op view: thread
        timings or tensor statistics (verbose logs), or a value beyond 64 bits."""
        return (
            self.op_threads is not None
            or bool(self.op_stats)
            or self.op_start.dtype == object
            or self.op_dur.dtype == object
        )

    @property
    def op_time(self) -> int:
        """The sum of its ops' durations (ns), exact."""
        d = self.op_dur
        # durations are below 2**62 each: exact in int64 while the (float) total stays small
        if d.dtype != object and (len(d) < 2 or float(d.sum(dtype=np.float64)) < 2.0**62):
            return int(d.sum())
        return sum(d.tolist())

    def op_at(self, k: int) -> OpTiming:
        """The ``k``-th timed op alone."""
        assert self.graph is not None
        nodes = self.graph.nodes
        threads = self.op_threads
        return OpTiming(
            node=nodes[int(self.op_node[k])],
            start=int(self.op_start[k]),
            dur=int(self.op_dur[k]),
            fused=[nodes[j] for j in self.op_fused.get(k, ())],
            thread_done=threads[k] if threads is not None else None,
            stats=self.op_stats.get(k),
        )

    def unpack(self) -> list[OpTiming]:
        """Every timed op as an ``OpTiming``, in log order."""
        if not len(self.op_node):
            return []
        assert self.graph is not None
        nodes = self.graph.nodes
        fused, stats = self.op_fused, self.op_stats
        threads = self.op_threads
        return [
            OpTiming(
                node=nodes[i],
                start=s,
                dur=d,
                fused=[nodes[j] for j in fused.get(k, ())],
                thread_done=threads[k] if threads is not None else None,
                stats=stats.get(k),
            )
            for k, (i, s, d) in enumerate(
                zip(
                    self.op_node.tolist(), self.op_start.tolist(), self.op_dur.tolist(), strict=True
                )
            )
        ]

    @property
    def ops(self) -> list[OpTiming]:
        """``unpack()``, made anew on each read."""
        return self.unpack()


def op_time_by_label(c: Compute) -> dict[str, int]:
    """A compute's op time (ns) per op label (``Node.label``), labels in order of first op."""
    out: dict[str, int] = {}
    if c.graph is None:
        return out
    nodes = c.graph.nodes
    for i, dur in zip(c.op_node.tolist(), c.op_dur.tolist(), strict=True):
        label = nodes[i].label
        out[label] = out.get(label, 0) + dur
    return out


def _column(values: list[int]) -> Any:
    """An int64 column; an object one for the rare value beyond 64 bits (kept as the log says)."""
    if not values:
        return _NO_OPS
    try:
        return np.array(values, np.int64)
    except OverflowError:
        return np.array(values, dtype=object)


def decode_compute(rec: dict[str, Any], graph: Graph | None, devices: bool = True) -> Compute:
    """A compute record, op by op (``decode_compute_bulk`` reads the well-formed ones in bulk).
    ``devices``: read where it ran (``placement``); a session on one device does not need it."""
    t0 = nonneg(rec["t_start"])
    node: list[int] = []
    start: list[int] = []
    dur: list[int] = []
    fused: dict[int, list[int]] = {}
    threads: Any = rec.get("threads")
    done: list[list[int] | None] | None = [] if threads else None
    for k, entry in enumerate(rec.get("ops", [])):
        i, off, d = int(entry[0]), nonneg(entry[1]), nonneg(entry[2])
        if graph is None or not 0 <= i < len(graph.nodes):
            continue
        if len(entry) > 3:
            f = [int(j) for j in entry[3] if 0 <= int(j) < len(graph.nodes)]
            if f:
                fused[len(node)] = f
        if done is not None:
            done.append([int(x) for x in threads[k]] if k < len(threads) else None)
        node.append(i)
        start.append(t0 + off)
        dur.append(d)
    return _compute(
        rec, graph, t0, _column(node), _column(start), _column(dur), fused, done, devices
    )


def decode_compute_bulk(
    rec: dict[str, Any],
    graph: Graph,
    fused_of: dict[Graph, dict[int, list[int]]],
    devices: bool = True,
) -> Compute | None:
    """A compute record of ``graph`` its ops read in bulk (``pack_ops``): the ``Compute`` that
    ``decode_compute`` makes of it, or None when anything about its ops is unusual (thread
    timings, an odd entry, a node outside the graph, a time beyond 2**62), which
    ``decode_compute`` then reads op by op. ``fused_of``: per graph, the fused ops of its last
    compute, which every generation step repeats: reused, not rebuilt, and one dict for the
    graph's computes (the writers tell variants apart by it)."""
    cols = _bulk_columns(rec, graph, fused_of)
    if cols is None:
        return None
    node, start, dur, fused = cols
    return _compute(rec, graph, rec["t_start"], node, start, dur, fused, None, devices)


def _bulk_columns(
    rec: dict[str, Any], graph: Graph, fused_of: dict[Graph, dict[int, list[int]]]
) -> tuple[Any, Any, Any, dict[int, list[int]]] | None:
    """``(node, start, dur, fused)`` of a compute record whose ops ``decode_compute`` would keep
    all, with no thread timings; None when anything is unusual."""
    try:
        t0 = rec["t_start"]
        if rec.get("threads") or type(t0) is not int or not 0 <= t0 < 1 << 62:
            return None
        last = fused_of.get(graph)
        ops = rec.get("ops")
        packed = ops if isinstance(ops, PackedOps) else pack_ops(ops, last)
        if packed is None:
            return None
        lo, hi = packed.lo, packed.hi
        n_nodes = len(graph.nodes)
        if min(lo) < 0 or hi[0] >= n_nodes or t0 + hi[1] + hi[2] >= 1 << 62:
            return None
        if packed.f_lo < 0 or packed.f_hi >= n_nodes:
            return None
        fused = packed.fused
        if fused:
            if last is not None and (last is fused or last == fused):
                fused = last  # one dict for the graph's computes: the writers compare by id
            else:
                fused_of[graph] = fused
        node, off, dur = packed.arr
        return node, t0 + off, dur, fused
    except Exception:  # noqa: BLE001 - whatever it is, the per-op reader reports it
        return None


def _compute(
    rec: dict[str, Any],
    graph: Graph | None,
    t0: int,
    node: Any,
    start: Any,
    dur: Any,
    fused: dict[int, list[int]],
    threads: list[list[int] | None] | None,
    devices: bool,
) -> Compute:
    """A compute record's ``Compute``, its ops already columns (where it ran: with ``devices``)."""
    layers, layer_device = layer_spans(rec["layers"], t0)
    return Compute(
        step=rec["step"],
        ubatch=opt_int(rec["ubatch"]),
        graph=graph,
        start=t0,
        dur=nonneg(rec["dur"]),
        n_tokens=int(rec["n_tokens"]),
        n_threads=int(rec.get("n_threads", 0)),
        status=int(rec.get("status", 0)),
        layers=layers,
        op_node=node,
        op_start=start,
        op_dur=dur,
        op_fused=fused,
        op_threads=threads,
        place=placement(rec, t0) if devices else None,
        layer_device=layer_device,
    )


def attach_stats(compute: Compute, rec: dict[str, Any]) -> None:
    """A tensor_stats record's rows, on the ops of the nodes they name."""
    by_node = {row[0]: tuple(row[1:]) for row in rec["stats"]}
    if compute.graph is None:
        return
    nodes = compute.graph.nodes
    for k, i in enumerate(compute.op_node.tolist()):
        stats = by_node.get(nodes[i].i)
        if stats is not None:
            compute.op_stats[k] = stats
