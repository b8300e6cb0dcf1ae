"""A Perfetto writer's flushes (``writer.Writer``): its finished batches encoded and written.

A flush's batches are encoded from templates where they can be (``TemplateSet``), else with the
general encoder (``BulkEncoder``), and the bytes go to the sink, in order; a few flushes may wait
to have their slice begins encoded together (``Flushes.flush``). What reaches the sink is counted
here (``packets``): the writer's track descriptors come through ``packet``.
"""

from __future__ import annotations

from typing import Any

from ...traces.sinks import BundleSink, Data
from .batch import Batch
from .begins import Begins
from .bulk import BulkEncoder
from .events import EventFields
from .ops import NodeTables, OpStore, RateFields
from .packets import Interner, Sequence
from .protowire import I64_END
from .segments import materialize
from .templates import TemplateSet

# flushes whose encoding may wait for the next ones (``Flushes.flush``): their slice begins are
# encoded together, in groups this many times bigger (fewer numpy calls per slice)
DEFER_FLUSHES = 4


class Flushes:
    """The batches of each flush encoded and written, some deferred (see the module doc); the
    templates and the general encoder, and the packets written so far."""

    def __init__(
        self,
        sink: BundleSink,
        seq: Sequence,
        events: EventFields,
        store: OpStore,
        fields: RateFields,
        tables: NodeTables,
        begins: Begins,
    ) -> None:
        self.sink = sink
        self.seq = seq
        self.events = events
        self.tables = tables
        self.begins = begins
        self.templates = TemplateSet(store, fields, events, seq)
        self.encoder = BulkEncoder(store, fields, events, seq)
        self.packets = 0
        # flushes not yet encoded: their batches, and how many of the interner's pending
        # definitions were interned before their boundary (what their head would carry)
        self.deferred: list[tuple[list[Batch], int]] = []
        self.known_layers: set[tuple[Any, ...]] = set()  # (``interns_nothing``)

    def packet(self, data: bytes) -> None:
        """One packet (a track descriptor), written as it comes."""
        self.sink.write(data)
        self.packets += 1

    def flush(self, batches: list[Batch], drain: bool = False) -> None:
        """Encode and write ``batches`` (a flush's), or defer them (``DEFER_FLUSHES``) where that
        leaves every byte as it is: the same writes, in the same order, each flush's head with
        the strings interned before its boundary (``_drain``). Only once the sink's compression
        is decided (a write may turn it on, and the node tables restart, which changes what
        later items intern), if encoding them interns nothing (``interns_nothing``) and there
        are begins to encode (``Begins.pending``). ``drain``: write the deferred ones too."""
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
