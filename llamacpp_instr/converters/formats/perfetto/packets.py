"""Perfetto packets for the hand-written trace: framing, track descriptors, interning, bundles.

Every event packet of the trace's one sequence (``Sequence``) ends with ``POST`` (sequence id and
flags) after its timestamp; the first packet of the trace clears the incremental state, and the
first packet of each flush defines the strings the flush interns (``Sequence.head``). Tags:
``protowire``.
"""

from __future__ import annotations

from typing import Any

try:  # ISA-L's deflate: the same zlib streams, about 4x faster at level 1 (bench/convert.py)
    from isal.isal_zlib import compress as _deflate
except ImportError:  # a platform without isal wheels: the standard library's
    from zlib import compress as _deflate  # type: ignore[assignment]

from ...traces.items import Track
from .protowire import (
    CD_UNIT_NAME,
    CHILD_ORDERING_EXPLICIT,
    COMPRESSED_PACKETS,
    DA_NAME_IID,
    DA_STRING_VALUE_IID,
    ENTRY_IID,
    ENTRY_NAME,
    ID_DEBUG_ANNOTATION_NAMES,
    ID_DEBUG_ANNOTATION_STRING_VALUES,
    ID_EVENT_CATEGORIES,
    ID_EVENT_NAMES,
    INTERNED_DATA,
    PD_PID,
    PD_PROCESS_LABELS,
    PD_PROCESS_NAME,
    SEQ_INCREMENTAL_STATE_CLEARED,
    SEQ_NEEDS_INCREMENTAL_STATE,
    SEQUENCE_FLAGS,
    TD_CHILD_ORDERING,
    TD_COUNTER,
    TD_NAME,
    TD_PARENT_UUID,
    TD_PROCESS,
    TD_SIBLING_ORDER_RANK,
    TD_UUID,
    TE_DEBUG_ANNOTATIONS,
    TRACE_PACKET,
    TRACK_DESCRIPTOR,
    TRUSTED_PACKET_SEQUENCE_ID,
    annotation_value,
    ld,
    varint,
)

SEQ_ID = 1729  # the trace's one trusted_packet_sequence_id
ZLIB_LEVEL = 1

SEQ = TRUSTED_PACKET_SEQUENCE_ID + varint(SEQ_ID)
FLAGS_NEEDS = SEQUENCE_FLAGS + varint(SEQ_NEEDS_INCREMENTAL_STATE)
# the trace's first event packet: needs the state, and clears it
FLAGS_FIRST_EVENT = SEQUENCE_FLAGS + varint(
    SEQ_NEEDS_INCREMENTAL_STATE | SEQ_INCREMENTAL_STATE_CLEARED
)
FLAGS_FIRST = SEQUENCE_FLAGS + varint(SEQ_INCREMENTAL_STATE_CLEARED)  # a first track descriptor
POST = SEQ + FLAGS_NEEDS  # after the timestamp, in every event packet


def packet(body: bytes) -> bytes:
    """A packet of the trace, ``body`` its fields."""
    return ld(TRACE_PACKET, body)


def track_body(t: Track) -> bytes:
    """A ``track_descriptor`` field for ``t``."""
    d = TD_UUID + varint(t.uuid) + ld(TD_NAME, t.name.encode())
    d += TD_CHILD_ORDERING + varint(CHILD_ORDERING_EXPLICIT)
    d += TD_SIBLING_ORDER_RANK + varint(max(-(2**31), min(t.order, 2**31 - 1)))
    if t.parent is None:
        proc = PD_PID + varint(t.pid) + ld(PD_PROCESS_NAME, t.name.encode())
        proc += b"".join(ld(PD_PROCESS_LABELS, label.encode()) for label in t.labels)
        d += ld(TD_PROCESS, proc)
    else:
        d += TD_PARENT_UUID + varint(t.parent)
        if t.kind == "counter":
            d += ld(TD_COUNTER, ld(CD_UNIT_NAME, t.unit.encode()))
    return ld(TRACK_DESCRIPTOR, d)


_MEMO_TYPES = (int, str, bool, type(None))


class Interner:
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
            self.pending.append(ld(tag, ENTRY_IID + varint(iid) + ld(ENTRY_NAME, s.encode())))
        return iid

    def name(self, s: str) -> int:
        return self._iid(self.names, ID_EVENT_NAMES, s)

    def arg(self, s: str) -> int:
        return self._iid(self.arg_names, ID_DEBUG_ANNOTATION_NAMES, s)

    def string(self, s: str) -> int:
        return self._iid(self.strings, ID_DEBUG_ANNOTATION_STRING_VALUES, s)

    def category(self, s: str) -> int:
        return self._iid(self.categories, ID_EVENT_CATEGORIES, s)

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
                    value = DA_STRING_VALUE_IID + varint(self.string(v))
                else:
                    value = annotation_value(v)
                b = ld(TE_DEBUG_ANNOTATIONS, DA_NAME_IID + varint(self.arg(k)) + value)
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
        return ld(INTERNED_DATA, data)


class Sequence:
    """The trace's one packet sequence: its interned strings, and whether its first packet (which
    clears the incremental state) is still to come."""

    def __init__(self) -> None:
        self.interner = Interner()
        self.first = True

    def track_flags(self) -> bytes:
        """A track descriptor's sequence flags: the trace's first packet clears the state."""
        flags = FLAGS_FIRST if self.first else b""
        self.first = False
        return flags

    def needs_head(self) -> bool:
        """Whether the next event packet must be a head (``head``): the trace's first, or strings
        interned since the last head."""
        return self.first or bool(self.interner.pending)

    def head(self) -> bytes:
        """What follows a head event packet's timestamp (in place of ``POST``): the sequence id,
        its flags (clearing the state if it is the trace's first) and the strings interned since
        the last head."""
        flags = FLAGS_FIRST_EVENT if self.first else FLAGS_NEEDS
        self.first = False
        return SEQ + flags + self.interner.take()


def compressed_packet(data: bytes) -> bytes:
    """A packet holding ``data`` (packets) deflated: ``TracePacket.compressed_packets``."""
    return packet(ld(COMPRESSED_PACKETS, _deflate(data, ZLIB_LEVEL)))
