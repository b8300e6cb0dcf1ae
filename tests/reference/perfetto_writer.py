"""Perfetto protobuf writer: the trace layout as TrackEvent packets, streamed to the file.

One trusted packet sequence; the first packet clears incremental state; event names and debug
annotation names are interned (each defined once, in the first packet that uses it); track uuids
are deterministic; tracks carry explicit sibling ranks so the UI shows them in layout order.
Slices become BEGIN/END pairs; each step's events are sorted so that slices nest on their track.

This is the tests' reference: one protobuf object per packet (Perfetto's own classes), easy to
check, and slow (some 20,000 ops a second). ``instr to-perfetto`` uses
``perfetto.write_perfetto_fast``, which writes the same trace (tests/test_perfetto_bulk_matches_reference.py
compares the two) many times faster (bench/convert.py). It reads the per-op layout of
``reference.layout``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import IO, Any

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

from llamacpp_instr.converters.traces.items import Item, Sample, Slice, Track

SEQ_ID = 1729


class _Interner:
    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.arg_names: dict[str, int] = {}

    def name(self, s: str, interned: pb.InternedData) -> int:
        iid = self.names.get(s)
        if iid is None:
            iid = self.names[s] = len(self.names) + 1
            interned.event_names.add(iid=iid, name=s)
        return iid

    def arg(self, s: str, interned: pb.InternedData) -> int:
        iid = self.arg_names.get(s)
        if iid is None:
            iid = self.arg_names[s] = len(self.arg_names) + 1
            interned.debug_annotation_names.add(iid=iid, name=s)
        return iid


def _set_value(ann: pb.DebugAnnotation, v: Any) -> None:
    if isinstance(v, bool):
        ann.bool_value = v
    elif isinstance(v, int) and -(2**63) <= v < 2**63:
        ann.int_value = v
    elif isinstance(v, float):
        ann.double_value = v
    elif v is None:
        ann.string_value = "null"
    else:
        ann.string_value = str(v)


def _ordered(items: Iterable[Item]) -> Iterator[tuple[int, int, int, Item, bool]]:
    """Slices as (ts, rank, tiebreak, item, is_begin) sorted so BEGIN/END nest per track."""
    batch: list[tuple[int, int, int, Item, bool]] = []
    for it in items:
        if isinstance(it, Track):
            yield (0, -1, 0, it, True)  # described at once: before any event that uses it
        elif isinstance(it, Slice):
            if it.depth == 0 and it.category == "step" and batch:
                yield from sorted(batch, key=lambda e: e[:3])
                batch = []
            # at equal timestamps: ENDs first (inner before outer), then BEGINs (outer first);
            # a zero-length slice ends right after it begins
            batch.append((it.ts, 1, it.depth, it, True))
            batch.append((it.ts + it.dur, 0 if it.dur else 2, -it.depth, it, False))
        else:
            batch.append((it.ts, 2, 0, it, True))
    yield from sorted(batch, key=lambda e: e[:3])


def write_perfetto(items: Iterable[Item], out: IO[bytes]) -> int:
    """Write the items as a Perfetto trace to ``out``; returns the number of packets."""
    builder = StreamingTraceProtoBuilder(out)
    interner = _Interner()
    n = 0
    first = True
    for ts, _, _, it, begin in _ordered(items):
        p = builder.create_packet()
        p.trusted_packet_sequence_id = SEQ_ID
        if first:
            p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            first = False
        if isinstance(it, Track):
            d = p.track_descriptor
            d.uuid = it.uuid
            d.name = it.name
            d.child_ordering = pb.TrackDescriptor.EXPLICIT
            d.sibling_order_rank = max(-(2**31), min(it.order, 2**31 - 1))  # an int32 field
            if it.parent is None:
                d.process.pid = it.pid
                d.process.process_name = it.name
                d.process.process_labels.extend(it.labels)
            else:
                d.parent_uuid = it.parent
                if it.kind == "counter":
                    d.counter.unit_name = it.unit
        elif isinstance(it, Sample):
            p.timestamp = it.ts
            p.sequence_flags |= pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            e = p.track_event
            e.type = pb.TrackEvent.TYPE_COUNTER
            e.track_uuid = it.track
            e.double_counter_value = it.value
        else:
            assert isinstance(it, Slice)
            p.timestamp = ts
            p.sequence_flags |= pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            e = p.track_event
            e.track_uuid = it.track
            if begin:
                e.type = pb.TrackEvent.TYPE_SLICE_BEGIN
                e.name_iid = interner.name(it.name, p.interned_data)
                e.categories.append(it.category)
                for k, v in it.args.items():
                    ann = e.debug_annotations.add()
                    ann.name_iid = interner.arg(k, p.interned_data)
                    _set_value(ann, v)
                e.flow_ids.extend(it.flows_out)
                e.terminating_flow_ids.extend(it.flows_in)
            else:
                e.type = pb.TrackEvent.TYPE_SLICE_END
        builder.write_packet(p)
        n += 1
    return n
