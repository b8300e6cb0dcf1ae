"""Fast Perfetto writer: the same trace as ``perfetto_writer.write_perfetto``, encoded by hand.

``perfetto_writer`` builds a protobuf object per packet (clear, and the reference); this module
writes the same content (tracks, slices, nesting, args, counters, packet order) many times faster
(bench/convert.py). ``tests/test_perfetto_fast.py`` decodes both and compares them packet by
packet.

* ``iter_events_packed`` reads a log like ``session.iter_events`` but keeps a well-formed compute
  record's ops as int64 columns (a ``PackedCompute``) instead of an ``OpTiming`` each; anything
  else (a value int() cannot read into 64 bits, a node outside the graph, verbose thread timings)
  goes to the per-op reader unchanged, and tensor stats unpack the columns they attach to.
* ``trace_layout.layout_bulk(..., compute_batches=True)`` yields each compute's slice, layer slices
  and packed op slices as one ``ComputeBatch``.
* ``write_perfetto_fast`` encodes the packets itself (varints, length-delimited fields). What does
  not depend on timing is encoded once and kept as bytes: per graph node (and fused variant) and
  track, an op begin packet's name, category, track and static args (``op_static_args``); per layer
  and track, a layer's; per track, an end packet's. Per op only the two timestamps and the two
  rates (GFLOP/s, GB/s, rounded as ``op_rates`` rounds) are new, written with numpy for thousands
  of packets at a time. A compute seen again (same graph, ops, layers and args, so every
  generation step) is written from a template, its previous packets with new timestamps and rates
  in place, once its rows are checked to sort as the template's. Anything else is sorted and
  encoded row by row in bulk. Event names and arg names are interned as the reference interns them;
  the first packet of each flush defines the names that are new.
* Big traces (from ``AUTO_COMPRESS`` bytes on) are written as zlib-compressed bundles of packets
  (``TracePacket.compressed_packets``, as Perfetto's tracing service writes them with compression
  on; trace processor and the UI inflate them), deflated by ISA-L (``isal``, which writes the
  zlib format ~4x faster than zlib at level 1) or else by zlib, on worker threads while the next
  packets are encoded; their op args' string values and category are interned too
  (``string_value_iid``, ``category_iids``), which trace processor resolves to the same strings.
  Smaller traces stay plain packets with inline strings, which any protobuf reader can parse.

The order is the reference's: each step's events by (timestamp, rank, depth tiebreak), then in the
order the layout made them (``perfetto_writer._ordered``); tracks where the layout yields them.
"""

from __future__ import annotations

import gc
import os
import struct
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from operator import attrgetter
from pathlib import Path
from typing import IO, Any

import numpy as np

try:  # ISA-L's deflate: the same zlib streams, about 4x faster at level 1 (bench/convert.py)
    from isal.isal_zlib import compress as _deflate
except ImportError:  # a platform without isal wheels: the standard library's
    from zlib import compress as _deflate  # type: ignore[assignment]

from . import prefetch
from .prefetch import PackedOps, pack_ops
from .reader import ReadReport
from .session import (
    MALFORMED,
    Event,
    Graph,
    LayerSpan,
    SessionEnded,
    _apply,
    _close,
    _SessionState,
    skip_malformed,
)
from .trace_layout import (
    BulkItem,
    ComputeBatch,
    OpBatch,
    OpVariants,
    PackedCompute,
    Sample,
    Slice,
    Track,
    op_rates,
    op_static_args,
)

SEQ_ID = 1729  # as perfetto_writer
AUTO_COMPRESS = 8 << 20  # plain packets for traces smaller than this (bytes), else compressed
CHUNK = 1 << 20  # uncompressed bytes per compressed bundle
FLUSH_ROWS = 32768  # encode this many buffered packets at a time (at step boundaries)
ZLIB_LEVEL = 1
TEMPLATE_BYTES = 64 << 20  # templates kept, at most (then forgotten, and learnt again)
ZLIB_THREADS = 2  # compressing threads (zlib releases the GIL): bundles stay in order

_U64 = (1 << 64) - 1
_I64_MIN, _I64_END = -(1 << 63), 1 << 63
_EXACT = 1 << 53  # ints up to this convert to float64 exactly

# ------------------------------------------------------------------------------ reading


def iter_events_packed(
    path: Path | str, *, strict: bool = False, report: ReadReport | None = None
) -> Iterator[Event]:
    """``session.iter_events``, with the ops of well-formed computes kept as columns."""
    rep = report if report is not None else ReadReport()
    states: dict[str, _SessionState] = {}
    last_fused: dict[int, Any] = {}
    for n, rec in prefetch.records(path, strict=strict, report=rep):
        try:
            rtype = rec["type"]
            if rtype == "compute":
                if _apply_packed(rec, states, last_fused):
                    continue
                if isinstance(rec.get("ops"), PackedOps):
                    rec["ops"] = rec["ops"].to_list()  # as read, for the per-op reader
            elif rtype == "tensor_stats":
                _unpack_step(rec, states)
            yield from _apply(rec, states)
        except MALFORMED as exc:
            skip_malformed(path, n, rec, exc, strict, rep)
    for state in states.values():
        yield from _close(state, state.info.last_ts)
        yield SessionEnded(state.info)


_LAYER_KEY = attrgetter("layer", "n_ops")


def _pack_ops(
    rec: dict[str, Any], states: dict[str, _SessionState], last_fused: dict[int, Any]
) -> Any:
    """``(step, graph, node, start, dur, fused)`` for a compute record the per-op reader would
    accept with all its ops and no thread timings; None when anything is unusual (the per-op
    reader then decides). ``last_fused``: per graph, the fused ops of its last compute."""
    try:
        state = states.get(str(rec["sid"]))
        if state is None:
            return None
        step = state.open_steps.get((int(rec["ctx"]), int(rec["step"])))
        graph = state.graphs.get((int(rec["ctx"]), int(rec["graph"])))
        ops = rec.get("ops")
        t0 = rec["t_start"]
        if step is None or graph is None or rec.get("threads"):
            return None
        if type(t0) is not int or not 0 <= t0 < 1 << 62:
            return None
        last = last_fused.get(id(graph))
        if last is not None and last[0] is not graph:
            last = None
        packed = ops if isinstance(ops, PackedOps) else pack_ops(ops, last and last[1])
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
            if last is not None and (last[1] is fused or last[1] == fused):
                fused = last[1]  # one dict for the graph's computes: the writers compare by id
            else:
                last_fused[id(graph)] = (graph, fused)
        node, off, dur = packed.arr
        return step, graph, node, t0 + off, dur, fused
    except Exception:  # noqa: BLE001 - whatever it is, the per-op reader reports it
        return None


def _apply_packed(
    rec: dict[str, Any], states: dict[str, _SessionState], last_fused: dict[int, Any]
) -> bool:
    packed = _pack_ops(rec, states, last_fused)
    if packed is None:
        return False
    step, graph, node, start, dur, fused = packed
    n = len(step.computes)
    for _ in _apply(dict(rec, ops=[]), states):  # the compute without its ops; yields nothing
        pass
    if len(step.computes) == n + 1 and step.computes[-1].graph is graph:
        c = step.computes[-1]
        step.computes[-1] = PackedCompute(
            **vars(c), op_node=node, op_start=start, op_dur=dur, op_fused=fused
        )
    return True


def _unpack_step(rec: dict[str, Any], states: dict[str, _SessionState]) -> None:
    """Tensor stats attach to OpTiming objects: give the step's packed computes theirs."""
    try:
        state = states.get(str(rec["sid"]))
        step = state.open_steps.get((int(rec["ctx"]), int(rec["step"]))) if state else None
    except Exception:  # noqa: BLE001 - the per-op reader reports it
        return
    if step is not None:
        step.computes = [c.unpacked() if isinstance(c, PackedCompute) else c for c in step.computes]


# ------------------------------------------------------------------------------ encoding


def _varint(v: int) -> bytes:
    """A varint; negative values (int64 fields) in two's complement, as protobuf writes them."""
    if 0 <= v < 0x80:
        return _SMALL[v]
    if not _I64_MIN <= v <= _U64:
        raise ValueError(f"Value out of range: {v}")  # as the protobuf library says
    v &= _U64
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


_SMALL = [bytes([i]) for i in range(0x80)]


def _ld(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field."""
    return tag + _varint(len(payload)) + payload


def _value(v: Any) -> bytes:
    """A DebugAnnotation value, as perfetto_writer._set_value chooses it."""
    if isinstance(v, bool):
        return b"\x10\x01" if v else b"\x10\x00"
    if isinstance(v, int) and _I64_MIN <= v < _I64_END:
        return b"\x20" + _varint(v)
    if isinstance(v, float):
        return b"\x29" + struct.pack("<d", v)
    return _ld(b"\x32", ("null" if v is None else str(v)).encode())


_SEQ = b"\x50" + _varint(SEQ_ID)  # trusted_packet_sequence_id
_FLAGS_NEEDS = b"\x68\x02"  # sequence_flags = SEQ_NEEDS_INCREMENTAL_STATE
_FLAGS_FIRST_EVENT = b"\x68\x03"  # ... | SEQ_INCREMENTAL_STATE_CLEARED
_FLAGS_FIRST = b"\x68\x01"  # SEQ_INCREMENTAL_STATE_CLEARED


def _packet(body: bytes) -> bytes:
    return _ld(b"\x0a", body)


def _track_body(t: Track) -> bytes:
    d = b"\x08" + _varint(t.uuid) + _ld(b"\x12", t.name.encode())
    d += b"\x58\x03"  # child_ordering = EXPLICIT
    d += b"\x60" + _varint(max(-(2**31), min(t.order, 2**31 - 1)))  # sibling_order_rank
    if t.parent is None:
        proc = b"\x08" + _varint(t.pid) + _ld(b"\x32", t.name.encode())
        proc += b"".join(_ld(b"\x42", label.encode()) for label in t.labels)
        d += _ld(b"\x1a", proc)
    else:
        d += b"\x28" + _varint(t.parent)
        if t.kind == "counter":
            d += _ld(b"\x42", _ld(b"\x32", t.unit.encode()))
    return _ld(b"\xe2\x03", d)  # track_descriptor


_MEMO_TYPES = (int, str, bool, type(None))


class _Interner:
    """Interned event names, categories, debug annotation names and (compact mode) string values;
    ``pending`` holds the InternedData entries not written yet."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.arg_names: dict[str, int] = {}
        self.strings: dict[str, int] = {}
        self.categories: dict[str, int] = {}
        self.pending: list[bytes] = []
        # (compact, name, type, value) -> the annotation's bytes: steps repeat most of their args
        self.encoded: dict[tuple[Any, ...], bytes] = {}

    def _iid(self, table: dict[str, int], tag: bytes, s: str) -> int:
        iid = table.get(s)
        if iid is None:
            iid = table[s] = len(table) + 1
            self.pending.append(_ld(tag, b"\x08" + _varint(iid) + _ld(b"\x12", s.encode())))
        return iid

    def name(self, s: str) -> int:
        return self._iid(self.names, b"\x12", s)  # InternedData.event_names

    def arg(self, s: str) -> int:
        return self._iid(self.arg_names, b"\x1a", s)  # debug_annotation_names

    def string(self, s: str) -> int:
        return self._iid(self.strings, b"\xea\x01", s)  # debug_annotation_string_values

    def category(self, s: str) -> int:
        return self._iid(self.categories, b"\x0a", s)  # event_categories

    def args(self, args: dict[str, Any], compact: bool = False) -> bytes:
        """Debug annotations; ``compact`` interns string values (``string_value_iid``)."""
        out = []
        memo = self.encoded
        for k, v in args.items():
            # floats are not: 0.0 == -0.0, and NaN is never found
            key = (compact, k, type(v), v) if type(v) in _MEMO_TYPES else None
            b = memo.get(key) if key is not None else None
            if b is None:
                if compact and type(v) is str:
                    value = b"\x88\x01" + _varint(self.string(v))
                else:
                    value = _value(v)
                b = _ld(b"\x22", b"\x08" + _varint(self.arg(k)) + value)
                if key is not None:
                    if len(memo) >= 1 << 16:
                        memo.clear()
                    memo[key] = b
            out.append(b)
        return b"".join(out)

    def take(self) -> bytes:
        """The pending definitions as an ``interned_data`` field (empty if none)."""
        if not self.pending:
            return b""
        data = b"".join(self.pending)
        self.pending = []
        return _ld(b"\x62", data)


class _Store:
    """The static parts of op begin packets, a row (gid) per variant (graph, track, node, fused).

    An op begin packet is ``[0x0a LEN] S D T [timestamp, sequence id, flags]``: S the track event's
    tag and length and its fields up to ``est_bytes_moved``, D the two rates (per op), T the rest
    of the args (may be empty)."""

    def __init__(self) -> None:
        self.s: list[bytes] = []
        self.t: list[bytes] = []
        self.flops: list[int] = []
        self.nbytes: list[int] = []
        self.depth: list[int] = []
        self.n_arrays = 0
        self.cap = 1024
        self.a_s, self.a_t = np.zeros(1024, dtype=object), np.zeros(1024, dtype=object)
        self.a_slen, self.a_tlen = np.zeros(1024, dtype=np.int64), np.zeros(1024, dtype=np.int64)
        self.a_flops, self.a_nbytes = np.zeros(1024), np.zeros(1024)
        self.a_exact, self.a_depth = np.zeros(1024, dtype=bool), np.zeros(1024, dtype=np.int64)

    def add(self, s: bytes, t: bytes, flops: int, nbytes: int, depth: int) -> int:
        self.s.append(s)
        self.t.append(t)
        self.flops.append(flops)
        self.nbytes.append(nbytes)
        self.depth.append(depth)
        return len(self.s) - 1

    def arrays(self) -> _Store:
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
            self.cap = cap
        self.a_s[k:n] = self.s[k:n]
        self.a_t[k:n] = self.t[k:n]
        self.a_slen[k:n] = [len(x) for x in self.s[k:n]]
        self.a_tlen[k:n] = [len(x) for x in self.t[k:n]]
        fl, nb = self.flops[k:n], self.nbytes[k:n]
        self.a_exact[k:n] = [
            0 <= f <= _EXACT and 0 <= b <= _EXACT for f, b in zip(fl, nb, strict=True)
        ]
        self.a_flops[k:n] = [float(f) if 0 <= f <= _EXACT else 0.0 for f in fl]
        self.a_nbytes[k:n] = [float(b) if 0 <= b <= _EXACT else 0.0 for b in nb]
        self.a_depth[k:n] = self.depth[k:n]
        self.n_arrays = n
        return self


class _Nodes:
    """A graph's op variants on one track: gids, built on first use (``variants.ids``)."""

    def __init__(self, w: _Writer, graph: Graph, track: int) -> None:
        w.rates_setup()
        self.w = w
        self.graph = graph
        self.track = track
        self.compact = w.compact
        self.variants = OpVariants(len(graph.nodes), self.build)

    def build(self, i: int, fused: tuple[int, ...]) -> int:
        nodes = self.graph.nodes
        node = nodes[i]
        head, n_flops, n_bytes, tail = op_static_args(node, [nodes[j] for j in fused], self.graph)
        w = self.w
        it = w.interner
        c = self.compact
        te = b"\x58" + _varint(self.track) + b"\x48\x01" + b"\x50" + _varint(it.name(node.label))
        te += (b"\x18" + _varint(it.category("op"))) if c else b"\xb2\x01\x02op"
        te += it.args(head, c)
        t = it.args(tail, c)
        s = b"\x5a" + _varint(len(te) + w.d_len + len(t)) + te
        depth = 3 if node.layer is not None else 2
        return w.store.add(s, t, n_flops, n_bytes, depth)


class _Block:
    """A compute's rows in a batch: its slice's two (small rows ``i0``, ``i0 + 1``), its layers'
    (seq ``seq0 + 2`` on, as small rows only once ``_expand``ed) and its op group's (``group``,
    or -1); ``key`` says what a template for it must have been made from."""

    __slots__ = ("seq0", "i0", "group", "cb", "key")

    def __init__(
        self, seq0: int, i0: int, group: int, cb: ComputeBatch, key: tuple[Any, ...]
    ) -> None:
        self.seq0, self.i0, self.group, self.cb, self.key = seq0, i0, group, cb, key


class _Template:
    """A block's packets as bytes, for blocks of the same key whose rows sort in the same order
    (``perm``, over the candidate rows: compute begin and end, layer begins, layer ends, op begins,
    op ends) and whose timestamps are all ``nb`` bytes long as varints: only the timestamps
    (at ``ts_idx``) and the ops' rates (at ``rate_idx``) change."""

    def __init__(self) -> None:
        self.perm: Any = None
        self.static_ok: Any = None  # per adjacent pair: (rank, tie, seq) ordered when ts equal
        self.first: tuple[int, int, int] = (0, 0, 0)  # (rank, tie, seq - seq0) of the first row
        self.last: tuple[int, int, int] = (0, 0, 0)
        self.buf: Any = None
        self.nb = 0
        self.ts_idx: Any = None  # per row, the positions of its timestamp's bytes
        self.rate_idx: Any = None  # per op, the positions of its two rates' bytes


class _Batch:
    """The events of one reference batch (a step and what follows it), not yet sorted."""

    def __init__(self) -> None:
        # small rows: ts, rank, tie, seq, S (begin-like) or b"", end id (end rows) or -1
        self.small: list[tuple[int, int, int, int, bytes, int]] = []
        self.groups: list[tuple[int, Any, Any, Any, int]] = []  # seq0, gids, start, dur, end id
        self.blocks: list[_Block] = []  # computes' rows, for templates
        self.seq = 0
        self.rows = 0

    def __bool__(self) -> bool:
        return self.rows > 0


class _Sink:
    """Packets to ``out``: plain, or in zlib-compressed bundles made on worker threads (written
    in order). Undecided (``compress`` None), it holds the first ``AUTO_COMPRESS`` bytes."""

    def __init__(self, out: IO[bytes], compress: bool | None) -> None:
        self.out = out
        self.compress = compress
        self.parts: list[bytes] = []
        self.size = 0
        self.pool: ThreadPoolExecutor | None = None
        self.futures: list[Future[bytes]] = []

    def write(self, data: bytes) -> None:
        if self.compress is False:
            self.out.write(data)
            return
        self.parts.append(data)
        self.size += len(data)
        if self.compress is None and self.size >= AUTO_COMPRESS:
            self.compress = True
        if self.compress and self.size >= CHUNK:
            self._bundle()

    def _bundle(self) -> None:
        data = b"".join(self.parts)
        self.parts = []
        self.size = 0
        if self.pool is None:
            workers = max(1, min(ZLIB_THREADS, os.cpu_count() or 1))
            self.pool = ThreadPoolExecutor(workers, thread_name_prefix="pftrace-zlib")
        self.futures.append(self.pool.submit(_compressed_packet, data))
        while self.futures and (len(self.futures) > 4 or self.futures[0].done()):
            self.out.write(self.futures.pop(0).result())

    def close(self) -> None:
        if self.parts:
            if self.compress:
                self._bundle()
            else:
                self.out.write(b"".join(self.parts))
                self.parts = []
        for f in self.futures:
            self.out.write(f.result())
        self.futures = []


def _compressed_packet(data: bytes) -> bytes:
    z = _deflate(data, ZLIB_LEVEL)
    return _packet(_ld(b"\x92\x03", z))  # compressed_packets


_POST = _SEQ + _FLAGS_NEEDS  # after the timestamp, in every event packet


class _Writer:
    def __init__(self, out: IO[bytes], compress: bool | None) -> None:
        self.sink = _Sink(out, compress)
        self.compact = compress is True  # interned string values: only in compressed traces
        self.interner = _Interner()
        self.store = _Store()
        self.first = True
        self.packets = 0
        self.templated = 0  # blocks encoded from a template
        self.end_ids: dict[int, int] = {}  # track -> end id
        self.e_body: list[bytes] = []  # per end id: the END packet's track event field
        self._end_matrix()
        self.layers_s: dict[tuple[int, int, int], bytes] = {}  # (track, layer, n_ops) -> S
        self.compute_s: dict[tuple[Any, ...], bytes] = {}  # (track, name, *args) -> S
        self.tables: dict[tuple[int, int], tuple[Graph, _Nodes]] = {}
        self.templates: dict[tuple[Any, ...], _Template | int] = {}
        self.template_bytes = 0
        self.cur = _Batch()
        self.done: list[_Batch] = []
        self.done_rows = 0
        # the rates' annotations, [double][name_iid] so that they never end in a zero byte; set up
        # with the first op table (the names are interned then)
        self.d_tail_g = self.d_tail_b = b""
        self.d_len = 0

    def rates_setup(self) -> None:
        if not self.d_len:
            self.d_tail_g = b"\x08" + _varint(self.interner.arg("gflop_per_s"))
            self.d_tail_b = b"\x08" + _varint(self.interner.arg("gb_per_s"))
            self.d_len = 2 * (2 + 9) + len(self.d_tail_g) + len(self.d_tail_b)

    def write(self, items: Iterable[BulkItem]) -> None:
        # Whole steps become garbage at once and nothing here makes reference cycles: the cyclic
        # collector would only rescan them. The compressing thread needs the GIL between output
        # blocks: give it back sooner than the default 5 ms, or that thread idles waiting.
        gc_was = gc.isenabled()
        gc.disable()
        interval = sys.getswitchinterval()
        sys.setswitchinterval(min(interval, 0.0005))
        try:
            for it in items:
                if isinstance(it, Slice):
                    self.add_slice(it)
                elif isinstance(it, ComputeBatch):
                    self.add_compute(it)
                elif isinstance(it, OpBatch):
                    self.add_ops(it)
                elif isinstance(it, Sample):
                    self.add_sample(it)
                elif isinstance(it, Track):
                    self.track(it)
            self.finish()
        finally:
            if self.sink.pool is not None:
                self.sink.pool.shutdown(cancel_futures=True)
            sys.setswitchinterval(interval)
            if gc_was:
                gc.enable()

    # -- items

    def track(self, t: Track) -> None:
        if self.done:
            self.flush()
        flags = _FLAGS_FIRST if self.first else b""
        self.first = False
        self.sink.write(_packet(_SEQ + flags + _track_body(t)))
        self.packets += 1

    def end_id(self, track: int) -> int:
        e = self.end_ids.get(track)
        if e is None:
            e = self.end_ids[track] = len(self.e_body)
            self.e_body.append(_ld(b"\x5a", b"\x58" + _varint(track) + b"\x48\x02"))
        return e

    def slice_begin(self, it: Slice) -> bytes:
        if it.category == "compute":  # the same few args every step: cached
            key = (it.track, it.name, *it.args.values())
            s = self.compute_s.get(key)
            if s is None:
                if len(self.compute_s) > 4096:
                    self.compute_s.clear()
                s = self.compute_s[key] = self._slice_begin(it)
            return s
        return self._slice_begin(it)

    def _slice_begin(self, it: Slice) -> bytes:
        i = self.interner
        te = b"\x58" + _varint(it.track) + b"\x48\x01" + b"\x50" + _varint(i.name(it.name))
        te += _ld(b"\xb2\x01", it.category.encode()) + i.args(it.args)
        if it.flows_out or it.flows_in:  # flow_ids, terminating_flow_ids: fixed64 each
            te += b"".join(b"\xf9\x02" + struct.pack("<Q", f) for f in it.flows_out)
            te += b"".join(b"\x81\x03" + struct.pack("<Q", f) for f in it.flows_in)
        return _ld(b"\x5a", te)

    def add_slice(self, it: Slice) -> None:
        b = self.cur
        if it.depth == 0 and it.category == "step" and b:
            self.close_batch()
            b = self.cur
        seq = b.seq
        d = it.depth
        b.small.append((it.ts, 1, d, seq, self.slice_begin(it), -1))
        b.small.append(
            (it.ts + it.dur, 0 if it.dur else 2, -d, seq + 1, b"", self.end_id(it.track))
        )
        b.seq = seq + 2
        b.rows += 2

    def add_compute(self, cb: ComputeBatch) -> None:
        """As ``add_slice`` for the compute's slice and each layer's, then ``add_ops``: the rows
        are kept as a block, which a template may encode (see ``_Template``); its layers' rows are
        made only if the general encoder needs them (``_expand``)."""
        cs = cb.slice
        track = cs.track
        self.add_slice(cs)  # (depth 1: never closes the batch)
        b = self.cur
        i0, seq0 = len(b.small) - 2, b.seq - 2
        n_l = len(cb.layers)
        b.seq += 2 * n_l
        b.rows += 2 * n_l
        g0 = len(b.groups)
        if cb.ops is not None:
            self.add_ops(cb.ops)
        group = b.groups[g0] if len(b.groups) > g0 else None
        key = (
            track,
            b.small[i0][4],  # the compute slice's S (its args)
            tuple(map(_LAYER_KEY, cb.layers)),
            group[1].tobytes() if group is not None else b"",
        )
        b.blocks.append(_Block(seq0, i0, g0 if group is not None else -1, cb, key))

    def layer_s(self, track: int, lay: LayerSpan) -> bytes:
        lk = (track, lay.layer, lay.n_ops)
        s = self.layers_s.get(lk)
        if s is None:
            args = {"layer": lay.layer, "n_ops": lay.n_ops}
            s = self.layers_s[lk] = self.slice_begin(
                Slice(track, f"layer {lay.layer}", 0, 0, 2, "layer", args)
            )
        return s

    def _expand(self, batches: list[_Batch]) -> None:
        """Give the blocks' layers their small rows (for the general encoder)."""
        for b in batches:
            for bl in b.blocks:
                track = bl.cb.slice.track
                end = self.end_id(track)
                seq = bl.seq0 + 2
                for lay in bl.cb.layers:
                    ts, dur = lay.start, lay.dur
                    b.small.append((ts, 1, 2, seq, self.layer_s(track, lay), -1))
                    b.small.append((ts + dur, 0 if dur else 2, -2, seq + 1, b"", end))
                    seq += 2

    def add_sample(self, it: Sample) -> None:
        te = b"\x58" + _varint(it.track) + b"\x48\x04" + b"\xe1\x02" + struct.pack("<d", it.value)
        b = self.cur
        b.small.append((it.ts, 2, 0, b.seq, _ld(b"\x5a", te), -1))
        b.seq += 1
        b.rows += 1

    def add_ops(self, ob: OpBatch) -> None:
        c = ob.compute
        assert c.graph is not None
        key = (id(c.graph), ob.track)
        entry = self.tables.get(key)
        if entry is None or entry[0] is not c.graph:
            entry = self.tables[key] = (c.graph, _Nodes(self, c.graph, ob.track))
        gids = entry[1].variants.ids(c.op_node, c.op_fused)
        start, dur = c.op_start, c.op_dur
        if ob.keep is not None:
            keep = ob.keep
            gids, start, dur = gids[keep], start[keep], dur[keep]
        m = len(gids)
        if not m:
            return
        b = self.cur
        b.groups.append((b.seq, gids, start, dur, self.end_id(ob.track)))
        b.seq += 2 * m
        b.rows += 2 * m

    def close_batch(self) -> None:
        self.done.append(self.cur)
        self.done_rows += self.cur.rows
        self.cur = _Batch()
        if self.done_rows >= FLUSH_ROWS:
            self.flush()

    def finish(self) -> None:
        if self.cur:
            self.done.append(self.cur)
            self.cur = _Batch()
        if self.done:
            self.flush()
        self.sink.close()

    # -- encoding

    def flush(self) -> None:
        batches, self.done, self.done_rows = self.done, [], 0
        if not any(batches):
            return
        data = self._encode_units(batches)
        if data is None:
            self._expand(batches)
            small = [(k, *r) for k, b in enumerate(batches) for r in b.small]
            if any(r[1] >= _I64_END for r in small):
                self._flush_python(batches)
            else:
                data = self._encode(batches, small)
            self._learn(batches)
        if data is not None:
            self.sink.write(data)
        if self.sink.compress and not self.compact:  # auto mode turned to compression
            self.compact = True
            self.tables.clear()  # new tables intern their string values
            self.templates.clear()
            self.template_bytes = 0

    # -- templates

    def _candidates(self, b: _Batch, bl: _Block) -> Any:
        """A block's timestamps in candidate order (compute begin and end, layer begins, layer
        ends, op begins, op ends), with its ops' gids and durations and its number of layers:
        ``(ts, gids, dur, n_layers)``; None unless every duration is positive (templates are made
        for those only: an end's rank depends on it)."""
        cs = bl.cb.slice
        spans = bl.cb.layers
        n_l = len(spans)
        if cs.dur <= 0 or any(lay.dur <= 0 for lay in spans):
            return None
        l_start = np.array([lay.start for lay in spans], dtype=np.int64)
        l_end = l_start + np.array([lay.dur for lay in spans], dtype=np.int64)
        if bl.group >= 0:
            _, gids, start, dur, _ = b.groups[bl.group]
            if int(dur.min()) <= 0:
                return None
            end = start + dur
        else:
            gids = start = end = dur = np.zeros(0, dtype=np.int64)
        ts = np.concatenate(([cs.ts, cs.ts + cs.dur], l_start, l_end, start, end))
        return ts, gids, dur, n_l

    def _build_template(self, b: _Batch, bl: _Block) -> _Template | None:
        cand = self._candidates(b, bl)
        if cand is None:
            return None
        ts, gids, dur, n_l = cand
        m = len(gids)
        st = self.store.arrays()
        depth = st.a_depth[gids]
        ones, twos = np.ones(n_l, dtype=np.int64), np.full(n_l, 2, dtype=np.int64)
        rank = np.concatenate(([1, 0], ones, 0 * ones, np.ones(m, np.int64), np.zeros(m, np.int64)))
        tie = np.concatenate(([1, -1], twos, -twos, depth, -depth))
        ar_l, ar_m = np.arange(n_l, dtype=np.int64), np.arange(m, dtype=np.int64)
        seq = np.concatenate(([0, 1], 2 + 2 * ar_l, 3 + 2 * ar_l, 2 + 2 * n_l + 2 * ar_m))
        seq = np.concatenate((seq, 3 + 2 * n_l + 2 * ar_m))
        perm = np.lexsort((seq, tie, rank, ts))
        nbs = _varint_len(ts)
        nb = int(nbs[0])
        if int(nbs.min()) != nb or int(nbs.max()) != nb or len(ts) < 2:
            return None
        small = b.small
        e = self.e_body[small[bl.i0 + 1][5]]
        d0 = self._rate_bytes(np.zeros(1), np.zeros(1))[0]
        bodies = [small[bl.i0][4], e]
        track = bl.cb.slice.track
        bodies += [self.layer_s(track, lay) for lay in bl.cb.layers] + [e] * n_l
        gl = gids.tolist()
        bodies += [self.store.s[g] + d0 + self.store.t[g] for g in gl] + [e] * m
        lg = 9 + len(self.d_tail_g)
        out = bytearray()
        ts_off, g_off, b_off, rate_op = [], [], [], []
        op0 = 2 + 2 * n_l
        for r in perm.tolist():
            body = bodies[r]
            out += b"\x0a" + _varint(len(body) + 1 + nb + len(_POST))
            if op0 <= r < op0 + m:
                k = r - op0
                at = len(out) + len(self.store.s[gl[k]])
                g_off.append(at + 3)
                b_off.append(at + 2 + lg + 3)
                rate_op.append(k)
            out += body + b"\x40"
            ts_off.append(len(out))
            out += bytes(nb) + _POST
        tm = _Template()
        tm.perm = perm
        r_, t_, s_ = rank[perm], tie[perm], seq[perm]
        tm.static_ok = (r_[:-1] < r_[1:]) | (
            (r_[:-1] == r_[1:]) & ((t_[:-1] < t_[1:]) | ((t_[:-1] == t_[1:]) & (s_[:-1] < s_[1:])))
        )
        tm.first = (int(r_[0]), int(t_[0]), int(s_[0]))
        tm.last = (int(r_[-1]), int(t_[-1]), int(s_[-1]))
        tm.buf = np.frombuffer(bytes(out), dtype=np.uint8)
        tm.nb = nb
        tm.ts_idx = np.array(ts_off, dtype=np.int64)[:, None] + np.arange(nb)
        eight = np.arange(8)
        by_op = np.argsort(np.array(rate_op, dtype=np.int64))  # rows in op order
        tm.rate_idx = np.concatenate(
            (np.array(g_off)[by_op, None] + eight, np.array(b_off)[by_op, None] + eight), axis=1
        )
        return tm

    def _fill(self, tm: _Template, blocks: list[tuple[int, _Batch, _Block]]) -> Any:
        """The blocks' packets from their template, each ``(first key, last key, bytes)``, or
        None if the rows of one do not sort as the template's."""
        cands = [self._candidates(b, bl) for _, b, bl in blocks]
        if any(c is None for c in cands):
            return None
        ts = np.stack([c[0] for c in cands])[:, tm.perm]
        d = np.diff(ts, axis=1)
        if not ((d > 0) | ((d == 0) & tm.static_ok)).all():
            return None
        nb = tm.nb
        if int(ts[:, 0].min()) < (1 << (7 * (nb - 1)) if nb > 1 else 0):
            return None
        if int(ts[:, -1].max()) >= 1 << (7 * nb):
            return None
        bufs = np.tile(tm.buf, (len(blocks), 1))
        bufs[:, tm.ts_idx] = _varint_bytes(ts, nb)
        m = len(tm.rate_idx)
        if m:
            gids = np.concatenate([c[1] for c in cands])
            g, bw = self._rates(gids, np.concatenate([c[2] for c in cands]))
            rates = np.empty((len(gids), 2), dtype="<f8")
            rates[:, 0] = g
            rates[:, 1] = bw
            bufs[:, tm.rate_idx] = rates.view(np.uint8).reshape(len(blocks), m, 16)
        f, z = tm.first, tm.last
        out = []
        for j, (k, _, bl) in enumerate(blocks):
            seq0 = bl.seq0
            first = (k, int(ts[j, 0]), f[0], f[1], seq0 + f[2])
            last = (k, int(ts[j, -1]), z[0], z[1], seq0 + z[2])
            out.append((first, last, memoryview(bufs[j])))  # joined later: no copy here
        return out

    def _encode_units(self, batches: list[_Batch]) -> bytes | None:
        """The batches' packets with each compute from its template and the other rows one by
        one, or None if a compute has no template or its rows do not sort as the template's, or
        the computes' rows and the others interleave (the general encoder sorts those)."""
        units: list[tuple[Any, Any, Any]] = []  # (first key, last key, bytes or a buffer)
        singles: dict[tuple[int, ...], bytes] = {}  # the rows encoded one by one: key -> body
        by_template: dict[int, tuple[_Template, list[tuple[int, _Batch, _Block]]]] = {}
        rows = blocks = 0
        for k, b in enumerate(batches):
            covered = bytearray(len(b.small))
            groups = 0
            for bl in b.blocks:
                tm = self.templates.get(bl.key)
                if not isinstance(tm, _Template):
                    return None
                by_template.setdefault(id(tm), (tm, []))[1].append((k, b, bl))
                blocks += 1
                covered[bl.i0] = covered[bl.i0 + 1] = 1
                groups += bl.group >= 0
            if groups != len(b.groups):
                return None
            for i, (ts, rank, tie, seq, s_, e) in enumerate(b.small):
                if covered[i]:
                    continue
                if ts >= _I64_END:
                    return None
                key = (k, ts, rank, tie, seq)
                body = self.e_body[e] if e >= 0 else s_
                units.append((key, key, _packet(body + b"\x40" + _varint(ts) + _POST)))
                singles[key] = body
            rows += b.rows
        for tm, blist in by_template.values():
            filled = self._fill(tm, blist)
            if filled is None:
                return None
            units += filled
        units.sort(key=lambda u: u[0])
        for a, z in zip(units, units[1:], strict=False):
            if not a[1] < z[0]:
                return None
        if units and (self.first or self.interner.pending):
            # the first packet defines what the batches intern (and clears the state if first)
            key = units[0][0]
            if key not in singles:
                return None
            flags = _FLAGS_FIRST_EVENT if self.first else _FLAGS_NEEDS
            self.first = False
            body = singles[key] + b"\x40" + _varint(key[1]) + _SEQ + flags + self.interner.take()
            units[0] = (key, key, _packet(body))
        self.packets += rows
        self.templated += blocks
        return b"".join([u[2] for u in units])

    def _learn(self, batches: list[_Batch]) -> None:
        """Templates for the blocks seen more than once (a few tries each)."""
        if len(self.templates) > 4096 or self.template_bytes > TEMPLATE_BYTES:
            self.templates.clear()
            self.template_bytes = 0
        for b in batches:
            for bl in b.blocks:
                v = self.templates.get(bl.key, 0)
                if isinstance(v, _Template):
                    continue
                v += 1
                tm = self._build_template(b, bl) if 2 <= v <= 4 else None
                self.templates[bl.key] = tm if tm is not None else v
                if tm is not None:
                    self.template_bytes += len(tm.buf)

    def _encode(self, batches: list[_Batch], small: list[tuple[Any, ...]]) -> bytes:
        """The packets of the batches, sorted as the reference sorts them."""
        # every row: batch, ts, rank, tie, seq (the sort key); end id (end rows) or -1; gid (op
        # begin rows) or -1; index among the small rows or -1
        cols: dict[str, list[Any]] = {
            k: [] for k in ("batch", "ts", "rank", "tie", "seq", "end", "gid", "small")
        }
        ns = len(small)
        s_objs: list[bytes] = []
        if ns:
            columns = [list(c) for c in zip(*small, strict=True)]
            s_objs = columns.pop(5)  # (batch, ts, rank, tie, seq, S, end id)
            for k, v in zip(("batch", "ts", "rank", "tie", "seq", "end"), columns, strict=True):
                cols[k].append(np.array(v, dtype=np.int64))
            cols["gid"].append(np.full(ns, -1, dtype=np.int64))
            cols["small"].append(np.arange(ns, dtype=np.int64))
        store = self.store.arrays()
        groups = [(k, *g) for k, b in enumerate(batches) for g in b.groups]
        m = 0
        d_objs: Any = None
        if groups:
            sizes = np.array([len(g[2]) for g in groups], dtype=np.int64)
            m = int(sizes.sum())
            gid = np.concatenate([g[2] for g in groups])
            start = np.concatenate([g[3] for g in groups])
            dur = np.concatenate([g[4] for g in groups])
            first = np.cumsum(sizes) - sizes
            base = np.repeat(np.array([g[1] for g in groups], dtype=np.int64) - 2 * first, sizes)
            seq_b = base + 2 * np.arange(m, dtype=np.int64)
            kb_o = np.repeat(np.array([g[0] for g in groups], dtype=np.int64), sizes)
            end_o = np.repeat(np.array([g[5] for g in groups], dtype=np.int64), sizes)
            depth = store.a_depth[gid]
            none = np.full(m, -1, dtype=np.int64)
            # begin rows, then end rows
            cols["batch"] += [kb_o, kb_o]
            cols["ts"] += [start, start + dur]
            cols["rank"] += [np.ones(m, dtype=np.int64), np.where(dur > 0, 0, 2)]
            cols["tie"] += [depth, -depth]
            cols["seq"] += [seq_b, seq_b + 1]
            cols["end"] += [none, end_o]
            cols["gid"] += [gid, none]
            cols["small"] += [none, none]
            d_objs = self._rate_objects(gid, dur)
        a = {k: np.concatenate(v) for k, v in cols.items()}
        order = np.lexsort((a["seq"], a["tie"], a["rank"], a["ts"], a["batch"]))
        ts = a["ts"][order]
        end = a["end"][order]
        gid = a["gid"][order]
        sm = a["small"][order]
        n = len(order)
        is_e = end >= 0
        is_op = gid >= 0
        is_sm = sm >= 0
        # which op begin (in the order the rates were computed) each sorted row is
        op_pos = np.full(2 * m + ns, -1, dtype=np.int64)
        op_pos[ns : ns + m] = np.arange(m, dtype=np.int64)
        op_pos = op_pos[order]
        if len(self.e_body) != self.e_count:
            self._end_matrix()
        e_len = self.e_lens
        g_safe = np.where(is_op, gid, 0)
        t_len = np.where(is_op, store.a_tlen[g_safe], 0)
        sm_len = np.array([len(x) for x in s_objs], dtype=np.int64) if ns else np.zeros(1, np.int64)
        body = np.where(
            is_e,
            e_len[np.where(is_e, end, 0)],
            np.where(
                is_op, store.a_slen[g_safe] + self.d_len + t_len, sm_len[np.where(is_sm, sm, 0)]
            ),
        )
        nb_ts = _varint_len(ts)
        plen = body + 1 + nb_ts + len(_POST)  # the packet's length
        glue = self._glue(ts, nb_ts, plen, is_e, end)
        # pieces: [0x0a LEN (END body)] of row 0, then per row S D T (begin-like rows) and glue
        has_t = is_op & (t_len > 0)
        cnt = 1 + np.where(is_e, 0, 1) + is_op + has_t
        off = np.cumsum(cnt) - cnt + 1
        pieces = np.empty(int(cnt.sum()) + 1, dtype=object)
        pieces[0] = b"\x0a" + _varint(int(plen[0])) + (self.e_body[end[0]] if is_e[0] else b"")
        if m:
            s_rows = np.flatnonzero(is_op)
            pieces[off[s_rows]] = store.a_s[gid[s_rows]]
            pieces[off[s_rows] + 1] = d_objs[op_pos[s_rows]]
            t_rows = np.flatnonzero(has_t)
            pieces[off[t_rows] + 2] = store.a_t[gid[t_rows]]
        if ns:
            sm_rows = np.flatnonzero(is_sm & ~is_e)
            objs = np.empty(ns, dtype=object)
            objs[:] = s_objs
            pieces[off[sm_rows]] = objs[sm[sm_rows]]
        pieces[off + cnt - 1] = glue
        if self.interner.pending or self.first:
            # the first packet defines what the batch interns (and clears the state if first)
            row0 = pieces[1 : off[0] + cnt[0] - 1].tolist()
            post = 1 + int(nb_ts[0]) + len(_POST)
            flags = _FLAGS_FIRST_EVENT if self.first else _FLAGS_NEEDS
            self.first = False
            content = (self.e_body[end[0]] if is_e[0] else b"".join(row0)) + b"\x40"
            content += _varint(int(ts[0])) + _SEQ + flags + self.interner.take()
            pieces[0] = _packet(content) + glue[0][post:]
            pieces[1 : off[0] + cnt[0]] = b""
        self.packets += n
        return b"".join(pieces.tolist())

    def _end_matrix(self) -> None:
        bodies = self.e_body or [b""]  # (a row to index when there are no end rows)
        mat = np.zeros((len(bodies), max(1, *map(len, bodies))), dtype=np.uint8)
        for k, b in enumerate(bodies):
            mat[k, : len(b)] = np.frombuffer(b, dtype=np.uint8)
        self.e_mat = mat
        self.e_lens = np.array([len(b) for b in bodies], dtype=np.int64)
        self.e_count = len(self.e_body)

    def _glue(self, ts: Any, nb_ts: Any, plen: Any, is_e: Any, end: Any) -> Any:
        """Per row: what follows its S D T (or END body) up to the next row's: its timestamp,
        sequence id and flags, then the next packet's tag and length, and its END body if it is
        an end row. The last byte is never zero (a flag's, a length's, a track event's)."""
        n = len(ts)
        nxt = (np.append(plen[1:], 0), np.append(is_e[1:], False), np.append(end[1:], 0))
        if int(nb_ts.min()) == int(nb_ts.max()):  # all timestamps as long: one layout
            out = np.empty(n, dtype=object)
            out[:] = self._glue_rows(int(nb_ts[0]), ts, *nxt)
            return out
        out = np.empty(n, dtype=object)
        for v in sorted(set(nb_ts.ravel().tolist())):
            rows = np.flatnonzero(nb_ts == v)
            out[rows] = self._glue_rows(v, ts[rows], *(x[rows] for x in nxt))
        return out

    def _glue_rows(self, v: int, ts: Any, nxt_len: Any, nxt_e: Any, nxt_end: Any) -> list[bytes]:
        """``_glue`` for rows whose timestamps are all ``v`` bytes long."""
        lnb = _varint_len(nxt_len)
        c = 1 + v + len(_POST)  # where the next packet's tag goes
        e_rows = np.flatnonzero(nxt_e)
        ew = self.e_mat.shape[1] if len(e_rows) else 0
        width = c + 1 + int(lnb.max()) + ew
        mat = np.zeros((len(ts), width), dtype=np.uint8)
        mat[:, 0] = 0x40
        mat[:, 1 : 1 + v] = _varint_bytes(ts, v)
        mat[:, 1 + v : c] = np.frombuffer(_POST, dtype=np.uint8)
        mat[:, c] = np.where(nxt_len > 0, 0x0A, 0)  # none after the flush's last row
        for j in range(int(lnb.max())):
            byte = (nxt_len >> (7 * j)) & 0x7F
            mat[:, c + 1 + j] = np.where(lnb > j, byte | np.where(lnb - 1 > j, 0x80, 0), 0)
        if len(e_rows):  # an end packet's length is one byte, then its body
            mat[e_rows, c + 2 : c + 2 + ew] = self.e_mat[nxt_end[e_rows]]
        out: list[bytes] = mat.view(f"S{width}").ravel().tolist()
        return out

    def _rates(self, gid: Any, dur: Any) -> tuple[Any, Any]:
        """Each op's (GFLOP/s, GB/s), exactly as ``op_rates`` gives them."""
        store = self.store.arrays()
        pos = dur > 0
        d = np.where(pos, dur, 1).astype(np.float64)
        g = _round3(np.where(pos, store.a_flops[gid] / d, 0.0))
        bw = _round3(np.where(pos, store.a_nbytes[gid] / d, 0.0))
        bad = np.isnan(g) | np.isnan(bw) | ~store.a_exact[gid] | (dur > _EXACT)
        if bad.any():
            for k in np.flatnonzero(bad).tolist():
                r, du = int(gid[k]), int(dur[k])
                g[k], bw[k] = op_rates(self.store.flops[r], self.store.nbytes[r], du)
        return g, bw

    def _rate_objects(self, gid: Any, dur: Any) -> Any:
        """The D part of each op begin packet (its two rates), as bytes objects."""
        objs = np.empty(len(gid), dtype=object)
        objs[:] = self._rate_bytes(*self._rates(gid, dur))
        return objs

    def _rate_bytes(self, g: Any, bw: Any) -> list[bytes]:
        m = len(g)
        tg, tb = self.d_tail_g, self.d_tail_b
        lg, lb = 9 + len(tg), 9 + len(tb)
        width = 2 + lg + 2 + lb
        mat = np.empty((m, width), dtype=np.uint8)
        mat[:, 0] = 0x22
        mat[:, 1] = lg
        mat[:, 2] = 0x29
        mat[:, 3:11] = g.astype("<f8").view(np.uint8).reshape(m, 8)
        mat[:, 11 : 11 + len(tg)] = np.frombuffer(tg, dtype=np.uint8)
        o = 2 + lg
        mat[:, o] = 0x22
        mat[:, o + 1] = lb
        mat[:, o + 2] = 0x29
        mat[:, o + 3 : o + 11] = bw.astype("<f8").view(np.uint8).reshape(m, 8)
        mat[:, o + 11 :] = np.frombuffer(tb, dtype=np.uint8)
        # the last byte is a name iid's (never zero): the fixed-width view keeps every byte
        out: list[bytes] = mat.view(f"S{width}").ravel().tolist()
        return out

    def _flush_python(self, batches: list[_Batch]) -> None:
        """Timestamps beyond int64 (a damaged log): sort and encode row by row."""
        rows: list[tuple[int, int, int, int, int, bytes]] = []
        st = self.store
        for k, batch in enumerate(batches):
            for ts, rank, tie, seq, s, e in batch.small:
                rows.append((k, ts, rank, tie, seq, self.e_body[e] if e >= 0 else s))
            for seq0, gids, start, dur, e in batch.groups:
                for j, (r, s0, du) in enumerate(
                    zip(gids.tolist(), start.tolist(), dur.tolist(), strict=True)
                ):
                    g, bw = op_rates(st.flops[r], st.nbytes[r], du)
                    d = self._rate_bytes(np.array([g]), np.array([bw]))[0]
                    depth = st.depth[r]
                    seq = seq0 + 2 * j
                    rows.append((k, s0, 1, depth, seq, st.s[r] + d + st.t[r]))
                    rows.append((k, s0 + du, 0 if du else 2, -depth, seq + 1, self.e_body[e]))
        rows.sort(key=lambda e: e[:5])
        out = []
        for _, ts, _, _, _, body in rows:
            flags = _FLAGS_NEEDS
            extra = b""
            if self.first or self.interner.pending:
                flags = _FLAGS_FIRST_EVENT if self.first else _FLAGS_NEEDS
                self.first = False
                extra = self.interner.take()
            out.append(_packet(body + b"\x40" + _varint(ts) + _SEQ + flags + extra))
        self.sink.write(b"".join(out))
        self.packets += len(rows)


def _round3(x: Any) -> Any:
    """``round(v, 3)`` of each value, exactly as Python rounds; NaN where a value needs Python's
    decimal rounding (within float error of a rounding boundary, or too large)."""
    p = x * 1000.0
    y = np.rint(p) / 1000.0
    # fl(x*1000) is within |p|*2**-53 of the exact product: p's rounding direction is the exact
    # one unless p is that close to a half-integer
    margin = np.abs(p - np.floor(p) - 0.5)
    unsafe = (margin <= np.abs(p) * 2.0**-51) | (np.abs(p) >= 2.0**50)
    return np.where(unsafe, np.nan, y)


def _varint_bytes(x: Any, nb: int) -> Any:
    """Non-negative int64s as varints all ``nb`` bytes long: an array of ``x.shape + (nb,)``."""
    out = np.empty(x.shape + (nb,), dtype=np.uint8)
    if nb <= 8:  # in two uint32 halves of 28 bits: much faster than int64 shifts
        lo, hi = (x & 0xFFFFFFF).astype(np.uint32), (x >> 28).astype(np.uint32)
        parts = [(lo, 7 * j) for j in range(4)] + [(hi, 7 * j) for j in range(4)]
    else:
        parts = [(x, 7 * j) for j in range(nb)]
    for j in range(nb):
        part, shift = parts[j]
        byte = (part >> shift) & 0x7F
        out[..., j] = byte | 0x80 if j < nb - 1 else byte
    return out


def _varint_len(x: Any) -> Any:
    nb = np.ones(len(x), dtype=np.int64)
    for k in range(1, 10):
        big = x >= (1 << (7 * k))
        if not big.any():
            break
        nb += big
    return nb


def write_perfetto_fast(
    items: Iterable[BulkItem], out: IO[bytes], *, compress: bool | None = None
) -> int:
    """Write the items (``layout`` or ``layout_bulk``) as a Perfetto trace to ``out``, the same
    trace ``perfetto_writer.write_perfetto`` writes; returns the number of packets (not counting
    compressed bundles). ``compress``: True or False, or None to compress traces from
    ``AUTO_COMPRESS`` bytes on."""
    w = _Writer(out, compress)
    w.write(items)
    return w.packets
