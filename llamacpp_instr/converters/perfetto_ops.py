"""The parts of op begin packets that do not depend on timing, kept once per op variant.

``NodeTable`` gives each (graph, track, node, fused nodes) a row (gid) of ``OpStore``, built on
first use from ``trace_layout.op_static_args``; per op only its timestamps and rates are new.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .peaks import Roof
from .protowire import (
    TE_CATEGORIES,
    TE_CATEGORY_IIDS,
    TE_NAME_IID,
    TE_TRACK_UUID,
    TE_TYPE,
    TRACK_EVENT,
    TYPE_SLICE_BEGIN,
    ld,
    varint,
)
from .rounding import EXACT, exact_float
from .session import Graph
from .trace_layout import OpVariants, op_static_args

if TYPE_CHECKING:
    from .perfetto_fast import Writer


class OpStore:
    """The static parts of op begin packets, a row (gid) per variant (graph, track, node, fused).

    An op begin packet is ``[TRACE_PACKET LEN] S D T [timestamp, sequence id, flags]``: S the track event's
    tag and length and its fields up to ``est_bytes_moved``, D the rates (per op: two, or three
    where the op has a roof, ``ideal`` its least time at the roofs), T the rest of the args (may
    be empty)."""

    def __init__(self) -> None:
        self.s: list[bytes] = []
        self.t: list[bytes] = []
        self.flops: list[int] = []
        self.nbytes: list[int] = []
        self.depth: list[int] = []
        self.ideal: list[float | None] = []
        self.dlen: list[int] = []
        self.n_arrays = 0
        self.cap = 1024
        self.a_s, self.a_t = np.zeros(1024, dtype=object), np.zeros(1024, dtype=object)
        self.a_slen, self.a_tlen = np.zeros(1024, dtype=np.int64), np.zeros(1024, dtype=np.int64)
        self.a_flops, self.a_nbytes = np.zeros(1024), np.zeros(1024)
        self.a_exact, self.a_depth = np.zeros(1024, dtype=bool), np.zeros(1024, dtype=np.int64)
        self.a_ideal, self.a_roofed = np.zeros(1024), np.zeros(1024, dtype=bool)
        self.a_dlen = np.zeros(1024, dtype=np.int64)

    def add(
        self,
        s: bytes,
        t: bytes,
        flops: int,
        nbytes: int,
        depth: int,
        ideal: float | None,
        dlen: int,
    ) -> int:
        self.s.append(s)
        self.t.append(t)
        self.flops.append(flops)
        self.nbytes.append(nbytes)
        self.depth.append(depth)
        self.ideal.append(ideal)
        self.dlen.append(dlen)
        return len(self.s) - 1

    def arrays(self) -> OpStore:
        """Bring the numpy columns (``a_*``) up to date; grown by doubling."""
        n, k = len(self.s), self.n_arrays
        if n == k:
            return self
        if n > self.cap:
            cap = max(1024, 2 * n)

            def grow(a: Any, dtype: Any) -> Any:
                b = np.zeros(cap, dtype=dtype)
                b[:k] = a[:k]
                return b

            self.a_s, self.a_t = grow(self.a_s, object), grow(self.a_t, object)
            self.a_slen, self.a_tlen = grow(self.a_slen, np.int64), grow(self.a_tlen, np.int64)
            self.a_flops, self.a_nbytes = grow(self.a_flops, float), grow(self.a_nbytes, float)
            self.a_exact, self.a_depth = grow(self.a_exact, bool), grow(self.a_depth, np.int64)
            self.a_ideal, self.a_roofed = grow(self.a_ideal, float), grow(self.a_roofed, bool)
            self.a_dlen = grow(self.a_dlen, np.int64)
            self.cap = cap
        self.a_s[k:n] = self.s[k:n]
        self.a_t[k:n] = self.t[k:n]
        self.a_slen[k:n] = [len(x) for x in self.s[k:n]]
        self.a_tlen[k:n] = [len(x) for x in self.t[k:n]]
        fl, nb = self.flops[k:n], self.nbytes[k:n]
        self.a_exact[k:n] = [
            0 <= f <= EXACT and 0 <= b <= EXACT for f, b in zip(fl, nb, strict=True)
        ]
        self.a_flops[k:n] = list(map(exact_float, fl))
        self.a_nbytes[k:n] = list(map(exact_float, nb))
        self.a_depth[k:n] = self.depth[k:n]
        ideal = self.ideal[k:n]
        self.a_ideal[k:n] = [0.0 if v is None else v for v in ideal]
        self.a_roofed[k:n] = [v is not None for v in ideal]
        self.a_dlen[k:n] = self.dlen[k:n]
        self.n_arrays = n
        return self


class NodeTable:
    """A graph's op variants on one track: gids, built on first use (``variants.ids``)."""

    def __init__(self, w: Writer, graph: Graph, track: int, roof: Roof | None) -> None:
        w.rates_setup(3 if roof is not None else 2)
        self.w = w
        self.graph = graph
        self.track = track
        self.roof = roof
        self.compact = w.compact
        self.variants = OpVariants(len(graph.nodes), self.build)

    def build(self, i: int, fused: tuple[int, ...]) -> int:
        nodes = self.graph.nodes
        node = nodes[i]
        head, n_flops, n_bytes, tail, ideal = op_static_args(
            node, [nodes[j] for j in fused], self.graph, self.roof
        )
        w = self.w
        it = w.interner
        c = self.compact
        te = TE_TRACK_UUID + varint(self.track) + TE_TYPE + varint(TYPE_SLICE_BEGIN)
        te += TE_NAME_IID + varint(it.name(node.label))
        te += (TE_CATEGORY_IIDS + varint(it.category("op"))) if c else ld(TE_CATEGORIES, b"op")
        te += it.args(head, c)
        t = it.args(tail, c)
        d_len = w.d_lens[2 if ideal is None else 3]
        s = TRACK_EVENT + varint(len(te) + d_len + len(t)) + te
        depth = 3 if node.layer is not None else 2
        return w.store.add(s, t, n_flops, n_bytes, depth, ideal, d_len)
