"""How a session's computes are laid out on a track: the compute's slice, its layer spans and its
op slices, in bulk (one ``ComputeBatch``) or one by one (ops with flows, and the ops of a compute
the bulk writers leave to the per-op view: ``op_slices``, with the worker threads' tracks of
verbose logs). ``layout.SessionLayout`` is one of these, and so, through it, is every device's
track."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..reading.decode.columns import LayerSpan
from ..reading.decode.computes import Compute, OpTiming
from ..reading.decode.graphs import Graph
from ..reading.decode.sessions import SessionInfo
from ..session.kv_flows import OpFlows
from ..session.machine_peaks import Roof
from .items import BulkItem, ComputeBatch, LayoutStats, OpBatch, Selection, Slice, Track
from .op_slices import OpSlices


class OpsLayout:
    """A session's compute, layer and op slices (those one by one: ``per_op``)."""

    def __init__(
        self, info: SessionInfo, process: Track, sel: Selection, roof: Roof | None
    ) -> None:
        self.info = info
        self.process = process
        self.pid = process.pid
        self.sel = sel
        self.roof = roof  # the roofs its ops' args are set against (None: no peaks known)
        self.layer_of: dict[Graph, Any] = {}  # each graph's nodes' layers
        self.per_op = OpSlices(info, process, sel, roof)  # the ops that come one by one

    def layers(self, graph: Graph) -> Any:
        """The layer of each of the graph's nodes as an array (-1: none)."""
        arr = self.layer_of.get(graph)
        if arr is None:
            arr = np.array([-1 if n.layer is None else n.layer for n in graph.nodes], np.int64)
            self.layer_of[graph] = arr
        return arr

    def compute_slice(self, c: Compute, track: int) -> Slice:
        return Slice(
            track,
            f"compute ubatch {c.ubatch}",
            c.start,
            c.dur,
            1,
            "compute",
            {
                "ubatch": c.ubatch,
                "graph": c.graph.id if c.graph else -1,
                "n_tokens": c.n_tokens,
                "n_threads": c.n_threads,
            },
        )

    def spans(self, spans: Sequence[LayerSpan], stats: LayoutStats) -> Sequence[LayerSpan]:
        """The layer spans the selection keeps (counted)."""
        if self.sel.layer is not None:
            spans = [lay for lay in spans if lay.layer == self.sel.layer]
        stats.layers += len(spans)
        return spans

    def compute(
        self, c: Compute, track: int, stats: LayoutStats, flows: OpFlows
    ) -> Iterator[BulkItem]:
        """A compute's slice, layer spans and ops (``part``)."""
        stats.computes += 1
        yield from self.compute_batch(self.compute_slice(c, track), c, c.layers, stats, flows)

    def compute_batch(
        self,
        head: Slice,
        c: Compute,
        spans: Sequence[LayerSpan],
        stats: LayoutStats,
        flows: OpFlows,
        mask: Any = None,
        run: slice | None = None,
    ) -> Iterator[BulkItem]:
        """``batch``'s ``ComputeBatch``, then its op slices (the per-op layout of the tests
        overrides this)."""
        cb, ops = self.batch(head, c, spans, stats, flows, mask, run)
        yield cb
        if ops:
            yield from self.per_op.op_list(ops, c, head.track, stats, flows)

    def batch(
        self,
        head: Slice,
        c: Compute,
        spans: Sequence[LayerSpan],
        stats: LayoutStats,
        flows: OpFlows,
        mask: Any = None,
        run: slice | None = None,
        n_mask: int = -1,
        per_op: bool | None = None,
    ) -> tuple[ComputeBatch, list[tuple[int, OpTiming]]]:
        """A ``ComputeBatch`` (``head``: the compute's slice, or a device's part of it; the layer
        ``spans`` and the compute's ops, those where ``mask`` when it is given, on its track, in
        bulk), and the ops whose slices follow it one by one (``OpSlices.op_list``): those with
        flows, and every op of a compute whose ops the bulk writers leave to the per-op view
        (``Compute.per_op``: thread timings, tensor statistics). ``mask`` may be read-only and
        shared (a device's ops, ``device_plan``); ``run``: the same ops as a slice, if they are
        contiguous (the writers then take them without copying the compute's columns);
        ``n_mask``: how many ops ``mask`` keeps, if known (-1: counted here); ``per_op``:
        ``c.per_op``, if known (a device step asks once for its parts). (A pair, not a
        generator: a device step makes a few of these, and the ops are nearly always none.)"""
        track = head.track
        spans = self.spans(spans, stats)
        batch: OpBatch | None = None
        ops: list[tuple[int, OpTiming]] = []
        if per_op is None:
            per_op = c.per_op
        if self.sel.ops and c.graph is not None and per_op:
            ops = [(k, op) for k, op in enumerate(c.unpack()) if mask is None or mask[k]]
        elif self.sel.ops and c.graph is not None:
            keep = mask  # (copied before it is written to)
            if self.sel.layer is not None:
                in_layer = self.layers(c.graph)[c.op_node] == self.sel.layer
                keep = in_layer if keep is None else keep & in_layer
            mine = sorted(k for k in flows if mask is None or mask[k]) if flows else []
            if mine:  # the ops with flows come one by one, as slices with their flows
                keep = np.ones(len(c.op_node), dtype=bool) if keep is None else keep.copy()
                keep[mine] = False
            if keep is None:
                n = len(c.op_node)
            elif keep is mask and n_mask >= 0:
                n = n_mask
            else:
                n = int(np.count_nonzero(keep))
            stats.ops += n
            if keep is mask and run is not None:
                keep = run
            if n:
                batch = OpBatch(track, c, keep, self.roof)
            if mine:
                ops = [(k, c.op_at(k)) for k in mine]
        return ComputeBatch(head, spans, batch), ops
