"""Op begin packets: the parts that do not depend on timing, kept once per op variant, and the
rates that do.

An op begin packet is ``[TRACE_PACKET LEN] S D T [timestamp, sequence id, flags]``: S the track
event's tag and length and its fields up to ``est_bytes_moved``, D the rates, T the rest of the
args (may be empty).

* ``OpStore``: S and T of each op variant (graph, track, node, fused nodes), a row (gid) each,
  with what its rates are computed from; ``rates`` gives many ops' rates at once;
* ``RateFields``: D, the rates' debug annotations (GFLOP/s, GB/s and, with the machine's peaks,
  the roof fraction; rounded as ``op_rates`` rounds: ``rounding.round3``);
* ``NodeTables``: the gids of the ops a part of a compute keeps on a track, a row built on
  first use for each variant kept there (``NodeTable``), from the parts that are the same on
  every track (``StaticSet``: from ``op_args.op_static_args``, made for the whole compute in the
  order that interns their strings).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...reading.decode.graphs import Graph
from ...session.machine_peaks import Roof
from ...traces.op_args import RATE_NAMES, op_rates, op_rates_bulk, op_static_args
from ...traces.rounding import EXACT, exact_float
from .packets import Interner
from .protowire import (
    DA_DOUBLE_VALUE,
    DA_NAME_IID,
    TE_CATEGORIES,
    TE_CATEGORY_IIDS,
    TE_DEBUG_ANNOTATIONS,
    TE_NAME_IID,
    TE_TRACK_UUID,
    TE_TYPE,
    TRACK_EVENT,
    TYPE_SLICE_BEGIN,
    ld,
    varint,
)

Variant = tuple[int, tuple[int, ...]]  # a node index and the nodes fused into it
# a variant's S after its track (name, category, head args), T, FLOPs, bytes, depth, ideal, D's
# length, and the length of its track event after the track (S's rest, D and T)
Static = tuple[bytes, bytes, int, int, int, float | None, int, int]
# what ``op_static_args`` gives: head args, FLOPs, bytes, tail args, ideal
StaticArgs = tuple[dict[str, Any], int, int, dict[str, Any], float | None]


class OpStore:
    """The static parts of op begin packets, a row (gid) per variant (graph, track, node, fused):
    S, T, the length of its D (two rates, or three where the op has a roof), and what its rates
    are computed from (FLOPs, bytes, ``ideal``: its least time at the roofs); ``arrays`` gives
    them as numpy columns."""

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

    def add_many(self, s: list[bytes], statics: list[Static]) -> list[int]:
        """Rows for variants with these S parts and the rest of their ``Static`` parts (T,
        FLOPs, bytes, depth, ideal, D's length), in order; their gids."""
        n = len(self.s)
        _, t, flops, nbytes, depth, ideal, dlen, _ = zip(*statics, strict=True)
        self.s += s
        self.t += t
        self.flops += flops
        self.nbytes += nbytes
        self.depth += depth
        self.ideal += ideal
        self.dlen += dlen
        return list(range(n, len(self.s)))

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

    def rates(self, gid: Any, dur: Any) -> list[Any]:
        """The rates of ops ``gid`` lasting ``dur`` (``op_rates_bulk``): GFLOP/s, GB/s and, if an
        op here has a roof, a third array: the roof fraction (0 for the ops without one)."""
        st = self.arrays()
        roofed = st.a_roofed[gid]

        def one(k: int) -> tuple[float, ...]:
            r = int(gid[k])
            return op_rates(st.flops[r], st.nbytes[r], int(dur[k]), st.ideal[r])

        ideal = st.a_ideal[gid] if roofed.any() else None
        return op_rates_bulk(
            st.a_flops[gid], st.a_nbytes[gid], st.a_exact[gid], dur, ideal, roofed, one
        )


class RateFields:
    """D, the rates' debug annotations: ``[double][name_iid]`` per rate (``RATE_NAMES`` in order),
    so that a D part never ends in a zero byte; a rate's name is interned the first time a table
    shows it (``setup``)."""

    def __init__(self, interner: Interner) -> None:
        self.interner = interner
        self.tails: list[bytes] = []  # per rate: its annotation after the double
        self.lens = [0] * (len(RATE_NAMES) + 1)  # the D part's length, by number of rates

    def setup(self, k: int) -> None:
        """Intern the names of the first ``k`` rates, the first time a table shows them."""
        while len(self.tails) < k:
            name = RATE_NAMES[len(self.tails)]
            self.tails.append(DA_NAME_IID + varint(self.interner.arg(name)))
            self.lens[len(self.tails)] = sum(2 + 9 + len(t) for t in self.tails)

    def offsets(self, k: int) -> Any:
        """Where each of ``k`` rates' doubles sits in a D part."""
        return np.cumsum([3] + [2 + 9 + len(t) for t in self.tails[: k - 1]])

    def encode(self, rates: list[Any]) -> list[bytes]:
        """The D parts of ops with these rates (one array per rate, ``RATE_NAMES`` in order)."""
        m, k = len(rates[0]), len(rates)
        width = self.lens[k]
        mat = np.empty((m, width), dtype=np.uint8)
        o = 0
        for v, tail in zip(rates, self.tails, strict=False):
            n = 9 + len(tail)
            mat[:, o] = TE_DEBUG_ANNOTATIONS[0]
            mat[:, o + 1] = n
            mat[:, o + 2] = DA_DOUBLE_VALUE[0]
            mat[:, o + 3 : o + 11] = np.asarray(v).astype("<f8").view(np.uint8).reshape(m, 8)
            mat[:, o + 11 : o + 2 + n] = np.frombuffer(tail, dtype=np.uint8)
            o += 2 + n
        # the last byte is a name iid's (never zero): the fixed-width view keeps every byte
        out: list[bytes] = mat.view(f"S{width}").ravel().tolist()
        return out


class NodeTables:
    """The gids of each graph's ops on each track (``kept``), a ``NodeTable`` per (graph, track)
    made on first use, and the parts of each variant that do not name its track, a
    ``StaticSet`` per graph and roof. ``compact`` (compressed traces) interns the args' string
    values."""

    def __init__(self, store: OpStore, fields: RateFields, interner: Interner, compact: bool):
        self.store = store
        self.fields = fields
        self.interner = interner
        self.compact = compact
        self.tables: dict[tuple[Graph, int], NodeTable] = {}
        # per graph and roof: each variant's parts that do not name its track; a graph split
        # between devices has a table per device track, all of them sharing these
        self.statics: dict[tuple[Graph, int], StaticSet] = {}
        # per graph and roof: each variant's ``op_static_args``, kept over ``restart`` (they
        # depend on the graph alone; the statics on how strings are interned)
        self.args: dict[tuple[Graph, int], tuple[Roof | None, dict[Variant, StaticArgs]]] = {}
        self.shapes = 0  # the number of compute shapes named so far (``NodeTable.kept``)
        # the last compute's node indices and their bytes: its parts (one per device) come in a
        # row, the same array each time (kept, so that its id stays its own)
        self.node: tuple[Any, bytes] = (None, b"")

    def kept(
        self, graph: Graph, track: int, roof: Roof | None, node: Any, fused: Any, keep: Any
    ) -> tuple[Any, Any]:
        """The gids of the ops ``node`` (with their ``fused`` nodes) of ``graph`` that ``keep``
        keeps on ``track`` (``OpBatch.keep``), and what names them in a block's key (see
        ``NodeTable.kept``)."""
        table = self.tables.get((graph, track))
        if table is None:
            table = self.tables[(graph, track)] = NodeTable(self, graph, track, roof)
        last = self.node
        if last[0] is not node:
            last = self.node = (node, node.tobytes())
        return table.kept(node, last[1], fused, keep)

    def restart(self, compact: bool) -> None:
        """Forget every table: new ones intern string values if ``compact``."""
        self.compact = compact
        self.tables.clear()
        self.statics.clear()


class StaticSet:
    """A graph's op variants' parts that are the same on every track (``Static``), for one roof,
    made in the order the tracks first show them (``prime``): that order interns their
    strings."""

    def __init__(self, tables: NodeTables, graph: Graph, roof: Roof | None) -> None:
        self.tables = tables
        self.graph = graph
        self.roof = roof
        self.compact = tables.compact
        key = (graph, id(roof))  # (the roof is kept with its id: the id stays its own)
        if key not in tables.args:
            tables.args[key] = (roof, {})
        self.args = tables.args[key][1]
        self.statics: dict[Variant, Static] = {}
        self.last: tuple[Any, bytes] | None = None  # the last compute primed: fused, node bytes

    def prime(self, node: Any, key: bytes, fused: dict[int, list[int]]) -> None:
        """Make the statics of every variant of a compute (``node``, its bytes ``key``, its
        ``fused`` nodes by op position) not made yet: plain nodes first (by index), then fused
        ones (by op position), as building all of them on a track would (``OpVariants``), even
        where a track keeps only some (each part of a compute primes all of it: the first
        interns, in the order a whole compute's build did)."""
        last = self.last
        if last is not None and last[1] == key and (last[0] is fused or last[0] == fused):
            return
        statics = self.statics
        for i in sorted(set(node.tolist())):
            if (i, ()) not in statics:
                statics[(i, ())] = self.static(i, ())
        if fused:
            nodes = node.tolist()
            for v in dict.fromkeys((nodes[k], tuple(f)) for k, f in fused.items()):
                if v not in statics:
                    statics[v] = self.static(*v)
        self.last = (fused, key)

    def static(self, i: int, fused: tuple[int, ...]) -> Static:
        """Variant ``(i, fused)``'s parts that are the same on every track."""
        nodes = self.graph.nodes
        node = nodes[i]
        args = self.args.get((i, fused))
        if args is None:
            args = self.args[(i, fused)] = op_static_args(
                node, [nodes[j] for j in fused], self.graph, self.roof
            )
        head, n_flops, n_bytes, tail, ideal = args
        tables = self.tables
        it = tables.interner
        c = self.compact
        te = TE_NAME_IID + varint(it.name(node.label))
        te += (TE_CATEGORY_IIDS + varint(it.category("op"))) if c else ld(TE_CATEGORIES, b"op")
        te += it.args(head, c)
        t = it.args(tail, c)
        d_len = tables.fields.lens[2 if ideal is None else 3]
        depth = 3 if node.layer is not None else 2
        return te, t, n_flops, n_bytes, depth, ideal, d_len, len(te) + d_len + len(t)


class NodeTable:
    """A graph's op variants on one track: a row (gid) for each that a part of a compute on the
    track keeps, built on first use (``kept``); a device's part of a compute keeps only its
    ops, so the rows of the others are never made on its track."""

    def __init__(self, tables: NodeTables, graph: Graph, track: int, roof: Roof | None) -> None:
        tables.fields.setup(3 if roof is not None else 2)
        self.tables = tables
        key = (graph, id(roof))
        st = tables.statics.get(key)
        if st is None:
            st = tables.statics[key] = StaticSet(tables, graph, roof)
        self.statics = st
        # what every S of this track starts its track event with
        self.prefix = TE_TRACK_UUID + varint(track) + TE_TYPE + varint(TYPE_SLICE_BEGIN)
        self.node_id = np.full(len(graph.nodes), -1, dtype=np.int64)
        self.fused_id: dict[Variant, int] = {}
        self.shapes: dict[tuple[bytes, tuple[tuple[int, tuple[int, ...]], ...]], int] = {}
        # the last call's fused ops, node bytes, what it kept, and its answer
        self.last: tuple[Any, bytes, Any, Any, Any] | None = None

    def kept(self, node: Any, key: bytes, fused: dict[int, list[int]], keep: Any) -> Any:
        """The gids of a compute's ops (``node``, its bytes ``key``, its ``fused`` nodes by op
        position) that ``keep`` keeps (None, a slice or a mask), and what names them in a
        block's key: their bytes where ``keep`` is None or a mask, else the compute's shape on
        this track (a number, the same for the same nodes and fused nodes) and the slice. The
        answer is shared (callers do not change it); a generation step repeats the last one."""
        is_mask = keep is not None and not isinstance(keep, slice)
        want = keep.tobytes() if is_mask else keep
        last = self.last
        if (
            last is not None
            and last[1] == key
            and (last[0] is fused or last[0] == fused)
            and last[2] == want
        ):
            return last[3], last[4]
        self.statics.prime(node, key, fused)
        kept = node if keep is None else node[keep]
        ids = self.node_id[kept]
        todo = ids < 0
        pos: list[int] = []  # the kept ops with fused nodes, by position in the compute
        if fused:
            at = np.full(len(node), -1, dtype=np.int64)  # each op's position among the kept
            at[slice(None) if keep is None else keep] = np.arange(len(kept))
            pos = [k for k in fused if at[k] >= 0]
            todo[at[pos]] = False  # (their plain variants are not theirs: no rows for them)
        if todo.any():
            new = sorted(set(kept[todo].tolist()))  # (np.unique would import numpy.ma)
            self.node_id[new] = self.build([(i, ()) for i in new])
            ids = self.node_id[kept]
        if pos:
            nodes = node.tolist()
            variants = [(nodes[k], tuple(fused[k])) for k in pos]
            known = self.fused_id
            new_v = [v for v in dict.fromkeys(variants) if v not in known]
            if new_v:
                known.update(zip(new_v, self.build(new_v), strict=True))
            ids[at[pos]] = [known[v] for v in variants]
        if keep is None or is_mask:
            name: Any = ids.tobytes()
        else:
            shape = (key, tuple(sorted((k, tuple(f)) for k, f in fused.items())))
            n = self.shapes.get(shape)
            if n is None:
                n = self.shapes[shape] = self.tables.shapes
                self.tables.shapes += 1
            name = (n, keep.start, keep.stop, keep.step)
        self.last = (fused, key, want, ids, name)
        return ids, name

    def build(self, variants: list[Variant]) -> list[int]:
        """New rows for these variants on this track, in order (their statics primed)."""
        statics = self.statics.statics
        sts = [statics[v] for v in variants]
        prefix = self.prefix
        n = len(prefix)
        s = [b"".join((TRACK_EVENT, varint(n + st[7]), prefix, st[0])) for st in sts]
        return self.tables.store.add_many(s, sts)
