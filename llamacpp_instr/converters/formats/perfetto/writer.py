"""The Perfetto writer: the layout's items in, the trace's packets out (see the package doc).

The items (``layout.layout_bulk``: each compute's slice, layer slices and packed op slices as
one ``ComputeBatch``) become rows of a ``Batch``, one per step; a flush (``FLUSH_ROWS`` rows, at
step boundaries) encodes the batches from templates where it can (``TemplateSet``), else with the
general encoder (``BulkEncoder``), and hands the bytes to the sink (a few flushes may wait to
have their slice begins encoded together: ``Writer.flush``). The writer owns the state
they share: the sequence (``Sequence``: first packet, interned strings), the fields of slices and
counters (``EventFields``), and the op variants (``OpStore``, ``RateFields``, ``NodeTables``).

The writer leaves process-wide settings alone; ``instr to-perfetto`` tunes the garbage collector
and the thread switch interval for the whole command (``commands/to_perfetto.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter
from typing import IO, Any

from ...reading import prefetch
from ...traces.items import BulkItem, ComputeBatch, OpBatch, Sample, Slice, SliceRows, Track
from ...traces.sinks import BundleSink, Data
from .batch import Batch, Block
from .begins import Begins
from .bulk import BulkEncoder
from .events import EventFields
from .ops import NodeTables, OpStore, RateFields
from .packets import SEQ, Interner, Sequence, compressed_packet, packet, track_body
from .protowire import I64_END, fixed64_ok
from .segments import add_segs, materialize
from .templates import TemplateSet

AUTO_COMPRESS = 8 << 20  # plain packets for traces smaller than this (bytes), else compressed
CHUNK = 1 << 20  # uncompressed bytes per compressed bundle
FLUSH_ROWS = 32768  # encode this many buffered packets at a time (at step boundaries)
# flushes whose encoding may wait for the next ones (``Writer.flush``): their slice begins are
# encoded together, in groups this many times bigger (fewer numpy calls per slice)
DEFER_FLUSHES = 4
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
        self.templates = TemplateSet(self.store, self.fields, self.events, self.seq)
        self.encoder = BulkEncoder(self.store, self.fields, self.events, self.seq)
        self.begins = Begins(self.seq.interner)
        self.packets = 0
        self.cur = Batch()
        self.done: list[Batch] = []
        self.done_rows = 0
        # flushes not yet encoded: their batches, and how many of the interner's pending
        # definitions were interned before their boundary (what their head would carry)
        self.deferred: list[tuple[list[Batch], int]] = []
        self.known_layers: set[tuple[Any, ...]] = set()  # (``interns_nothing``)

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
        self.sink.write(packet(SEQ + self.seq.track_flags() + track_body(t)))
        self.packets += 1

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
        """Encode and write the finished batches, or defer them (``DEFER_FLUSHES``) where that
        leaves every byte as it is: the same writes, in the same order, each flush's head with
        the strings interned before its boundary (``_drain``). Only once the sink's compression
        is decided (a write may turn it on, and the node tables restart, which changes what
        later items intern), if encoding them interns nothing (``interns_nothing``) and there
        are begins to encode (``Begins.pending``). ``drain``: write the deferred ones too."""
        batches, self.done, self.done_rows = self.done, [], 0
        c = self.sink.compress
        if (
            self.begins.pending  # (else no gain: a CPU log's flushes have no begins to encode)
            and any(batches)
            and (c is False or (c and self.tables.compact))
            and interns_nothing(batches, self.seq.interner, self.known_layers)
        ):
            self.deferred.append((batches, len(self.seq.interner.pending)))
            if len(self.deferred) < DEFER_FLUSHES and not drain:
                return
            batches = []
        self._drain()
        if any(batches):
            self.begins.encode()
            self._encode(batches)

    def _drain(self) -> None:
        """Encode and write the deferred flushes, in order, their begins all at once."""
        if not self.deferred:
            return
        deferred, self.deferred = self.deferred, []
        self.begins.encode()
        it = self.seq.interner
        (pending, it.pending), at = (it.pending, []), 0
        for batches, upto in deferred:  # each head: what was interned before its boundary
            # (and anything the encoding before interned, which ``interns_nothing`` rules out)
            it.pending = it.pending + pending[at:upto]
            at = upto
            self._encode(batches)
        it.pending = it.pending + pending[at:]

    def _encode(self, batches: list[Batch]) -> None:
        """One flush's packets (its begins encoded), written at once."""
        data: Data | None = self.templates.encode(batches)
        if data is None:
            for b in batches:
                materialize(b, self.events)
            expand_layers(batches, self.events)
            small = [(k, *r) for k, b in enumerate(batches) for r in b.small]
            if any(r[1] >= I64_END for r in small):
                data = self.encoder.encode_rows(batches)
            else:
                data = self.encoder.encode(batches, small)
            self.templates.learn(batches)
        self.packets += sum(b.rows for b in batches)
        self.sink.write(data)
        if self.sink.compress and not self.tables.compact:  # auto mode turned to compression
            self.tables.restart(compact=True)  # new tables intern their string values
            self.templates.clear()


def zlib_threads() -> int:
    """Compressing threads for this machine: the cores beyond the two that this process and the
    forked log reader keep busy (a compressed trace is of a log big enough to fork for), at least
    one and at most ``ZLIB_THREADS``. On 2 cores one thread was 4-43 ms faster than two
    (to-perfetto on 200k-1M-op logs, CPU, RPC and Vulkan, 7 interleaved rounds)."""
    return max(1, min(ZLIB_THREADS, prefetch.cores() - 2))


def expand_layers(batches: list[Batch], ev: EventFields) -> None:
    """Give the blocks' layers their small rows (for the general encoder)."""
    for b in batches:
        for bl in b.blocks:
            track = bl.cb.slice.track
            end = ev.end_id(track)
            seq = bl.seq0 + 2
            for lay in bl.cb.layers:
                ts, dur = lay.start, lay.dur
                b.small.append((ts, 1, 2, seq, ev.layer_begin(track, lay), -1))
                b.small.append((ts + dur, 0 if dur else 2, -2, seq + 1, b"", end))
                seq += 2


def interns_nothing(batches: list[Batch], it: Interner, known: set[Any]) -> bool:
    """Whether encoding ``batches`` interns nothing (if it did, the strings' ids would follow
    the later items' instead of coming before them, were it deferred). What it may intern: the
    names of layer slices (``EventFields.layer_begin``, for the general encoder or a new
    template); all else is interned as the items come. ``known``: the blocks' layers (``Block``
    keys' third part) found interned, not looked up again (the interner never forgets)."""
    for b in batches:
        for bl in b.blocks:
            lays = bl.key[2]  # ((layer, n_ops), ...)
            if not lays or lays in known:
                continue
            if "layer" not in it.arg_names or "n_ops" not in it.arg_names:
                return False
            if any(f"layer {layer}" not in it.names for layer, _ in lays):
                return False
            known.add(lays)
    return True


def write_perfetto_fast(
    items: Iterable[BulkItem], out: IO[bytes], *, compress: bool | None = None
) -> int:
    """Write the items of ``layout_bulk`` as a Perfetto trace to ``out``; returns the number of
    packets (not counting compressed bundles). ``compress``: True or False, or None to compress traces from
    ``AUTO_COMPRESS`` bytes on."""
    w = Writer(out, compress)
    w.write(items)
    return w.packets
