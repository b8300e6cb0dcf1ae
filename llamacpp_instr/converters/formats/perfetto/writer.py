"""The Perfetto writer: the layout's items in, the trace's packets out (see the package doc).

The items (``layout.layout_bulk``: each compute's slice, layer slices and packed op slices as
one ``ComputeBatch``) become rows of a ``Batch``, one per step; every ``FLUSH_ROWS`` rows, at a
step boundary, the finished batches go to the flushes (``flushes.Flushes``), which encode them
from templates where they can, else with the general encoder, and hand the bytes to the sink.
The writer owns the state that both share: the sequence (``Sequence``: first packet, interned
strings), the fields of slices and counters (``EventFields``), and the op variants (``OpStore``,
``RateFields``, ``NodeTables``).

The writer leaves process-wide settings alone; ``instr to-perfetto`` tunes the garbage collector
and the thread switch interval for the whole command (``commands/to_perfetto.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter
from typing import IO, Any

from ...reading import prefetch
from ...traces.items import BulkItem, ComputeBatch, OpBatch, Sample, Slice, SliceRows, Track
from ...traces.sinks import BundleSink
from .batch import Batch, Block
from .begins import Begins
from .events import EventFields
from .flushes import Flushes
from .ops import NodeTables, OpStore, RateFields
from .packets import SEQ, Sequence, compressed_packet, packet, track_body
from .protowire import fixed64_ok
from .segments import add_segs

AUTO_COMPRESS = 8 << 20  # plain packets for traces smaller than this (bytes), else compressed
CHUNK = 1 << 20  # uncompressed bytes per compressed bundle
FLUSH_ROWS = 32768  # encode this many buffered packets at a time (at step boundaries)
ZLIB_THREADS = 2  # compressing threads at most (zlib releases the GIL): bundles stay in order

_LAYER_KEY = itemgetter(0, 3)  # a ``LayerSpan``'s layer and n_ops (a tuple: by index, in C)
# slices whose begins are encoded as they come (computes and a device's part of one: their
# template's key, and kept by ``EventFields.begin``; steps: one per batch, their many args of
# mixed types cost more by columns); the others wait (``begins``)
_NOW = frozenset(("compute", "device", "step"))


class Writer:
    """Items in, packets out (see the module doc)."""

    def __init__(self, out: IO[bytes], compress: bool | None) -> None:
        self.sink = BundleSink(
            out,
            compress,
            compressed_packet,
            auto=AUTO_COMPRESS,
            chunk=CHUNK,
            threads=zlib_threads(),
        )
        self.seq = Sequence()
        self.events = EventFields(self.seq.interner)
        self.store = OpStore()
        self.fields = RateFields(self.seq.interner)
        # interned string values: only in compressed traces
        self.tables = NodeTables(self.store, self.fields, self.seq.interner, compress is True)
        self.begins = Begins(self.seq.interner)
        self.flushes = Flushes(
            self.sink, self.seq, self.events, self.store, self.fields, self.tables, self.begins
        )
        self.cur = Batch()
        self.done: list[Batch] = []
        self.done_rows = 0

    def write(self, items: Iterable[BulkItem]) -> None:
        try:
            for it in items:
                if isinstance(it, Slice):
                    self.add_slice(it)
                elif isinstance(it, ComputeBatch):
                    self.add_compute(it)
                elif isinstance(it, SliceRows):
                    self.add_rows(it)
                elif isinstance(it, Sample):
                    self.add_sample(it)
                elif isinstance(it, Track):
                    self.track(it)
            self.finish()
        finally:
            self.sink.shutdown()

    # -- items

    def track(self, t: Track) -> None:
        self.flush(drain=True)  # (what came before it is written before it)
        self.flushes.packet(packet(SEQ + self.seq.track_flags() + track_body(t)))

    def add_slice(self, it: Slice) -> None:
        b = self.cur
        d, cat = it.depth, it.category
        if not d and cat == "step" and b:
            self.close_batch()
            b = self.cur
        seq, small, ev = b.seq, b.small, self.events
        ts, dur, track, fo, fi = it.ts, it.dur, it.track, it.flows_out, it.flows_in
        if cat in _NOW or ((fo or fi) and not (fixed64_ok(fo) and fixed64_ok(fi))):
            small.append((ts, 1, d, seq, ev.begin(it), -1))
        else:  # encoded with the others at the flush (``begins``)
            self.begins.note(small, len(small), track, it.name, cat, it.args, fo, fi)
            small.append((ts, 1, d, seq, b"", -1))
        small.append((ts + dur, 0 if dur else 2, -d, seq + 1, b"", ev.end_id(track)))
        b.seq = seq + 2
        b.rows += 2

    def add_rows(self, rows: SliceRows) -> None:
        """As ``add_slice`` for each of ``rows`` (their tracks described first: the descriptors
        come out at once, the rows at the flush, as they would one by one)."""
        for _, t in rows.tracks:
            self.track(t)
        add_segs(self.cur, rows, self.begins, self.events)

    def add_compute(self, cb: ComputeBatch) -> None:
        """As ``add_slice`` for the compute's slice and each layer's, then ``add_ops``: the rows
        are kept as a block, which a template may encode (see ``templates``); its layers' rows
        are made only if the general encoder needs them (``expand_layers``)."""
        cs = cb.slice
        track = cs.track
        self.add_slice(cs)  # (depth 1: never closes the batch)
        b = self.cur
        i0, seq0 = len(b.small) - 2, b.seq - 2
        head = b.small[i0][4]  # the compute slice's S (its name and args)
        n_l = len(cb.layers)
        b.seq += 2 * n_l
        b.rows += 2 * n_l
        ops_key = self.add_ops(cb.ops) if cb.ops is not None else None
        key = (
            track,
            # a slice whose begin waits for the flush (``begins``): its S is not made yet, and
            # what makes it goes in the key (else a compute of the same graph on another ubatch
            # would be written from this one's template, with this one's name and args)
            head or (cs.name, cs.category, *cs.args.items()),
            tuple(map(_LAYER_KEY, cb.layers)),
            b"" if ops_key is None else ops_key,
        )
        group = len(b.groups) - 1 if ops_key is not None else -1
        b.blocks.append(Block(seq0, i0, group, cb, key))

    def add_sample(self, it: Sample) -> None:
        b = self.cur
        b.small.append((it.ts, 2, 0, b.seq, self.events.sample(it), -1))
        b.seq += 1
        b.rows += 1

    def add_ops(self, ob: OpBatch) -> Any:
        """The ops' group of rows, and what names their gids (``NodeTable.kept``; None: no
        group)."""
        c = ob.compute
        assert c.graph is not None
        keep = ob.keep
        gids, ops_key = self.tables.kept(c.graph, ob.track, ob.roof, c.op_node, c.op_fused, keep)
        start, dur = (c.op_start, c.op_dur) if keep is None else (c.op_start[keep], c.op_dur[keep])
        m = len(gids)
        if not m:
            return None
        b = self.cur
        b.groups.append((b.seq, gids, start, dur, self.events.end_id(ob.track)))
        b.seq += 2 * m
        b.rows += 2 * m
        return ops_key

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
        self.flush(drain=True)
        self.sink.close()

    def flush(self, drain: bool = False) -> None:
        """Hand the finished batches to the flushes (``Flushes.flush``; ``drain``: write the
        deferred ones too)."""
        batches, self.done, self.done_rows = self.done, [], 0
        self.flushes.flush(batches, drain)


def zlib_threads() -> int:
    """Compressing threads for this machine: the cores beyond the two that this process and the
    forked log reader keep busy (a compressed trace is of a log big enough to fork for), at least
    one and at most ``ZLIB_THREADS``. On 2 cores one thread was 4-43 ms faster than two
    (to-perfetto on 200k-1M-op logs, CPU, RPC and Vulkan, 7 interleaved rounds)."""
    return max(1, min(ZLIB_THREADS, prefetch.cores() - 2))


def write_perfetto_fast(
    items: Iterable[BulkItem], out: IO[bytes], *, compress: bool | None = None
) -> int:
    """Write the items of ``layout_bulk`` as a Perfetto trace to ``out``; returns the number of
    packets (not counting compressed bundles). ``compress``: True or False, or None to compress traces from
    ``AUTO_COMPRESS`` bytes on."""
    w = Writer(out, compress)
    w.write(items)
    return w.flushes.packets
