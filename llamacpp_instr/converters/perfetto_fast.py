"""Perfetto writer: the trace the reference writer (tests/reference/perfetto_writer.py, one
protobuf object per packet) writes, encoded by hand many times faster (bench/convert.py).
``tests/test_perfetto_fast.py`` decodes both and compares them packet by packet.

The layout's items (``trace_layout.layout_bulk``: each compute's slice, layer slices and packed
op slices as one ``ComputeBatch``) are gathered into batches, one per step, and encoded a flush
(``FLUSH_ROWS`` packets) at a time. The jobs live in their own modules:

* ``protowire``: varints and length-delimited fields, every tag named;
* ``perfetto_packets``: packet framing, track descriptors, interning (event names, arg names,
  categories and, in compressed traces, string values), compressed bundles;
* ``perfetto_ops``: what does not depend on timing, encoded once per graph node (and fused
  variant) and track: an op begin packet's name, category, track and static args
  (``op_static_args``); per op only the two timestamps and the rates (GFLOP/s, GB/s and, with
  the machine's peaks, the roof fraction; rounded as ``op_rates`` rounds:
  ``rounding.round3``) are new;
* ``perfetto_templates``: a compute seen again (so every generation step) written from the
  template of its previous packets, new timestamps and rates in place;
* ``perfetto_bulk``: anything else, sorted and encoded row by row in bulk with numpy;
* ``sinks.BundleSink``: big traces (from ``AUTO_COMPRESS`` bytes on) as zlib-compressed bundles
  (``TracePacket.compressed_packets``, as Perfetto's tracing service writes them with
  compression on), deflated by ISA-L or zlib on worker threads while the next packets are
  encoded. Smaller traces stay plain packets with inline strings, which any protobuf reader can
  parse.

The order is the reference's: each step's events by (timestamp, rank, depth tiebreak), then in the
order the layout made them; tracks where the layout yields them.

The writer leaves process-wide settings alone; ``instr to-perfetto`` tunes the garbage collector
and the thread switch interval for the whole command (``commands/to_perfetto.py``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from operator import attrgetter
from typing import IO, Any

from .decode import Graph, LayerSpan
from .perfetto_ops import NodeTable, OpStore
from .perfetto_packets import FLAGS_FIRST, SEQ, Interner, compressed_packet, packet, track_body
from .perfetto_templates import Batch, Block, Template, TemplateEncoder
from .protowire import (
    DA_NAME_IID,
    I64_END,
    TE_CATEGORIES,
    TE_DOUBLE_COUNTER_VALUE,
    TE_FLOW_IDS,
    TE_NAME_IID,
    TE_TERMINATING_FLOW_IDS,
    TE_TRACK_UUID,
    TE_TYPE,
    TRACK_EVENT,
    TYPE_COUNTER,
    TYPE_SLICE_BEGIN,
    TYPE_SLICE_END,
    ld,
    varint,
)
from .sinks import BundleSink
from .trace_layout import RATE_NAMES, BulkItem, ComputeBatch, OpBatch, Sample, Slice, Track

AUTO_COMPRESS = 8 << 20  # plain packets for traces smaller than this (bytes), else compressed
CHUNK = 1 << 20  # uncompressed bytes per compressed bundle
FLUSH_ROWS = 32768  # encode this many buffered packets at a time (at step boundaries)
ZLIB_THREADS = 2  # compressing threads (zlib releases the GIL): bundles stay in order

_LAYER_KEY = attrgetter("layer", "n_ops")


class Writer(TemplateEncoder):
    """Items in, packets out (see the module doc)."""

    def __init__(self, out: IO[bytes], compress: bool | None) -> None:
        self.sink = BundleSink(
            out,
            compress,
            compressed_packet,
            auto=AUTO_COMPRESS,
            chunk=CHUNK,
            threads=ZLIB_THREADS,
        )
        self.compact = compress is True  # interned string values: only in compressed traces
        self.interner = Interner()
        self.store = OpStore()
        self.first = True
        self.packets = 0
        self.templated = 0  # blocks encoded from a template
        self.end_ids: dict[int, int] = {}  # track -> end id
        self.e_body: list[bytes] = []  # per end id: the END packet's track event field
        self._end_matrix()
        self.layers_s: dict[tuple[int, int, int], bytes] = {}  # (track, layer, n_ops) -> S
        self.compute_s: dict[tuple[Any, ...], bytes] = {}  # (track, name, *args) -> S
        self.tables: dict[tuple[int, int], tuple[Graph, NodeTable]] = {}
        self.templates: dict[tuple[Any, ...], Template | int] = {}
        self.template_bytes = 0
        self.cur = Batch()
        self.done: list[Batch] = []
        self.done_rows = 0
        # the rates' annotations (``RATE_NAMES``), [double][name_iid] so that they never end in a
        # zero byte; set up with the first op table that shows them (the names are interned then)
        self.d_tails: list[bytes] = []
        self.d_lens = [0] * (len(RATE_NAMES) + 1)  # the D part's length, by number of rates

    def rates_setup(self, k: int) -> None:
        """Intern the names of the first ``k`` rates, the first time a table shows them."""
        while len(self.d_tails) < k:
            name = RATE_NAMES[len(self.d_tails)]
            self.d_tails.append(DA_NAME_IID + varint(self.interner.arg(name)))
            self.d_lens[len(self.d_tails)] = sum(2 + 9 + len(t) for t in self.d_tails)

    def write(self, items: Iterable[BulkItem]) -> None:
        try:
            for it in items:
                if isinstance(it, Slice):
                    self.add_slice(it)
                elif isinstance(it, ComputeBatch):
                    self.add_compute(it)
                elif isinstance(it, Sample):
                    self.add_sample(it)
                elif isinstance(it, Track):
                    self.track(it)
            self.finish()
        finally:
            self.sink.shutdown()

    # -- items

    def track(self, t: Track) -> None:
        if self.done:
            self.flush()
        flags = FLAGS_FIRST if self.first else b""
        self.first = False
        self.sink.write(packet(SEQ + flags + track_body(t)))
        self.packets += 1

    def end_id(self, track: int) -> int:
        e = self.end_ids.get(track)
        if e is None:
            e = self.end_ids[track] = len(self.e_body)
            self.e_body.append(
                ld(TRACK_EVENT, TE_TRACK_UUID + varint(track) + TE_TYPE + varint(TYPE_SLICE_END))
            )
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
        te = TE_TRACK_UUID + varint(it.track) + TE_TYPE + varint(TYPE_SLICE_BEGIN)
        te += TE_NAME_IID + varint(i.name(it.name))
        te += ld(TE_CATEGORIES, it.category.encode()) + i.args(it.args)
        if it.flows_out or it.flows_in:  # flow_ids, terminating_flow_ids: fixed64 each
            te += b"".join(TE_FLOW_IDS + struct.pack("<Q", f) for f in it.flows_out)
            te += b"".join(TE_TERMINATING_FLOW_IDS + struct.pack("<Q", f) for f in it.flows_in)
        return ld(TRACK_EVENT, te)

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
        are kept as a block, which a template may encode (see ``Template``); its layers' rows are
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
        b.blocks.append(Block(seq0, i0, g0 if group is not None else -1, cb, key))

    def layer_s(self, track: int, lay: LayerSpan) -> bytes:
        lk = (track, lay.layer, lay.n_ops)
        s = self.layers_s.get(lk)
        if s is None:
            args = {"layer": lay.layer, "n_ops": lay.n_ops}
            s = self.layers_s[lk] = self.slice_begin(
                Slice(track, f"layer {lay.layer}", 0, 0, 2, "layer", args)
            )
        return s

    def _expand(self, batches: list[Batch]) -> None:
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
        te = TE_TRACK_UUID + varint(it.track) + TE_TYPE + varint(TYPE_COUNTER)
        te += TE_DOUBLE_COUNTER_VALUE + struct.pack("<d", it.value)
        b = self.cur
        b.small.append((it.ts, 2, 0, b.seq, ld(TRACK_EVENT, te), -1))
        b.seq += 1
        b.rows += 1

    def add_ops(self, ob: OpBatch) -> None:
        c = ob.compute
        assert c.graph is not None
        key = (id(c.graph), ob.track)
        entry = self.tables.get(key)
        if entry is None or entry[0] is not c.graph:
            entry = self.tables[key] = (c.graph, NodeTable(self, c.graph, ob.track, ob.roof))
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
        self.cur = Batch()
        if self.done_rows >= FLUSH_ROWS:
            self.flush()

    def finish(self) -> None:
        if self.cur:
            self.done.append(self.cur)
            self.cur = Batch()
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
            if any(r[1] >= I64_END for r in small):
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


def write_perfetto_fast(
    items: Iterable[BulkItem], out: IO[bytes], *, compress: bool | None = None
) -> int:
    """Write the items of ``layout_bulk`` as a Perfetto trace to ``out``, the same
    trace the reference writer writes; returns the number of packets (not counting
    compressed bundles). ``compress``: True or False, or None to compress traces from
    ``AUTO_COMPRESS`` bytes on."""
    w = Writer(out, compress)
    w.write(items)
    return w.packets
