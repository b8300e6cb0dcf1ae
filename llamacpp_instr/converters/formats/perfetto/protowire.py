"""Protocol-buffer wire encoding for the hand-written Perfetto trace, with every tag named.

A field's tag is the varint of ``field_number << 3 | wire_type``; the constants below are those
bytes for the fields of Perfetto's ``trace_packet.proto``, ``track_event.proto``,
``debug_annotation.proto``, ``interned_data.proto`` and ``track_descriptor.proto`` that the
writer uses (field numbers from those files). ``varint_bytes``/``varint_len`` encode many
varints at once with numpy.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

VARINT, FIXED64, LEN = 0, 1, 2  # wire types
U64 = (1 << 64) - 1
I64_MIN, I64_END = -(1 << 63), 1 << 63

_SMALL = [bytes([i]) for i in range(0x80)]


def varint(v: int) -> bytes:
    """A varint; negative values (int64 fields) in two's complement, as protobuf writes them."""
    if 0 <= v < 0x80:
        return _SMALL[v]
    if not I64_MIN <= v <= U64:
        raise ValueError(f"Value out of range: {v}")  # as the protobuf library says
    v &= U64
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def ld(tag_bytes: bytes, payload: bytes) -> bytes:
    """A length-delimited field."""
    return tag_bytes + varint(len(payload)) + payload


# Trace
TRACE_PACKET = tag(1, LEN)
# TracePacket
TIMESTAMP = tag(8, VARINT)
TRUSTED_PACKET_SEQUENCE_ID = tag(10, VARINT)
TRACK_EVENT = tag(11, LEN)
INTERNED_DATA = tag(12, LEN)
SEQUENCE_FLAGS = tag(13, VARINT)
COMPRESSED_PACKETS = tag(50, LEN)
TRACK_DESCRIPTOR = tag(60, LEN)
SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE = 1, 2  # sequence_flags bits
# TrackEvent
TE_CATEGORY_IIDS = tag(3, VARINT)
TE_DEBUG_ANNOTATIONS = tag(4, LEN)
TE_TYPE = tag(9, VARINT)
TE_NAME_IID = tag(10, VARINT)
TE_TRACK_UUID = tag(11, VARINT)
TE_CATEGORIES = tag(22, LEN)
TE_DOUBLE_COUNTER_VALUE = tag(44, FIXED64)
TE_FLOW_IDS = tag(47, FIXED64)
TE_TERMINATING_FLOW_IDS = tag(48, FIXED64)
TYPE_SLICE_BEGIN, TYPE_SLICE_END, TYPE_COUNTER = 1, 2, 4  # TrackEvent.Type
# DebugAnnotation
DA_NAME_IID = tag(1, VARINT)
DA_BOOL_VALUE = tag(2, VARINT)
DA_INT_VALUE = tag(4, VARINT)
DA_DOUBLE_VALUE = tag(5, FIXED64)
DA_STRING_VALUE = tag(6, LEN)
DA_STRING_VALUE_IID = tag(17, VARINT)
# InternedData, and its entries (EventCategory, EventName, DebugAnnotationName, InternedString)
ID_EVENT_CATEGORIES = tag(1, LEN)
ID_EVENT_NAMES = tag(2, LEN)
ID_DEBUG_ANNOTATION_NAMES = tag(3, LEN)
ID_DEBUG_ANNOTATION_STRING_VALUES = tag(29, LEN)
ENTRY_IID = tag(1, VARINT)
ENTRY_NAME = tag(2, LEN)  # name, or InternedString.str
# TrackDescriptor, ProcessDescriptor, CounterDescriptor
TD_UUID = tag(1, VARINT)
TD_NAME = tag(2, LEN)
TD_PROCESS = tag(3, LEN)
TD_PARENT_UUID = tag(5, VARINT)
TD_COUNTER = tag(8, LEN)
TD_CHILD_ORDERING = tag(11, VARINT)
TD_SIBLING_ORDER_RANK = tag(12, VARINT)
CHILD_ORDERING_EXPLICIT = 3
PD_PID = tag(1, VARINT)
PD_PROCESS_NAME = tag(6, LEN)
PD_PROCESS_LABELS = tag(8, LEN)
CD_UNIT_NAME = tag(6, LEN)


def annotation_value(v: Any) -> bytes:
    """A DebugAnnotation's value field, chosen by the value's type: a bool as ``bool_value``, an
    int64 as ``int_value``, a float as ``double_value``; anything else (a string, an int beyond
    64 bits) as ``string_value``, None as ``"null"``."""
    if isinstance(v, bool):
        return DA_BOOL_VALUE + (b"\x01" if v else b"\x00")
    if isinstance(v, int) and I64_MIN <= v < I64_END:
        return DA_INT_VALUE + varint(v)
    if isinstance(v, float):
        return DA_DOUBLE_VALUE + struct.pack("<d", v)
    return ld(DA_STRING_VALUE, ("null" if v is None else str(v)).encode())


def fixed64_ok(values: tuple[int, ...]) -> bool:
    """Whether every value fits a fixed64 (flow ids: else ``struct.pack`` says so, one by one)."""
    if len(values) == 1:  # (the usual: a slice starts or ends one flow)
        return 0 <= values[0] <= U64
    return all(0 <= v <= U64 for v in values)


def fixed64_all(values: Any) -> bool:
    """``fixed64_ok`` for many ints at once (any iterable; C loops where they are all ints)."""
    vals = list(values)
    if not vals or set(map(type, vals)) != {int}:
        return fixed64_ok(tuple(vals))
    return min(vals) >= 0 and max(vals) <= U64


def varint_bytes(x: Any, nb: int) -> Any:
    """int64s as varints all ``nb`` bytes long: an array of ``x.shape + (nb,)`` (a negative one
    takes 10, in two's complement, as ``varint`` writes it; for ``nb`` up to 8, a view of a
    wider array)."""
    if nb <= 8:
        y = spread7(x)
        y |= _MORE[nb]
        return y.view(np.uint8).reshape(np.shape(x) + (8,))[..., :nb]
    out = np.empty(x.shape + (nb,), dtype=np.uint8)
    # as uint64: a negative value's top groups are its two's complement, not its sign
    u = np.asarray(x).astype(np.uint64)
    for j in range(nb):
        byte = (u >> 7 * j) & 0x7F
        out[..., j] = byte | 0x80 if j < nb - 1 else byte
    return out


def spread7(x: Any) -> Any:
    """Each of the non-negative int64s ``x`` (below 2**56) as a uint64 whose bytes, little-endian,
    are its 7-bit groups: a varint's bytes but for the continuation bits (``MORE``)."""
    y = np.asarray(x).astype(np.uint64)  # (a copy: changed in place)
    for mask, shift in _SPREAD:
        t = y & mask
        y ^= t
        t <<= shift
        y |= t
    return y


# (little-endian: 28-bit halves into 32-bit lanes, 14-bit quarters into 16-bit lanes, 7-bit
# groups into bytes: each step moves the upper part of every lane up by the lanes' padding)
_SPREAD = [
    (np.uint64(0xFFFFFFF << 28), np.uint64(4)),
    (np.uint64(0x0FFFC0000FFFC000), np.uint64(2)),
    (np.uint64(0x3F803F803F803F80), np.uint64(1)),
]
# the continuation bits of the first 8 bytes of a varint ``nb`` bytes long (0 to 10): every
# byte's but its last
MORE = np.array(
    [sum(0x80 << (8 * j) for j in range(min(nb - 1, 8))) for nb in range(11)], dtype=np.uint64
)
_MORE = list(MORE)


# (each varint length's least value, as uint64: a negative int64 seen so is at least 2**63)
_LEAST = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


def varint_len(x: Any) -> Any:
    """How many bytes each of the int64s ``x`` (an array of any shape) takes as a varint (10 for
    a negative one)."""
    x = np.asarray(x)
    if x.size <= 2048:  # (one call: a binary search per value, cheaper than ten passes here)
        u = x.view(np.uint64) if x.dtype == np.int64 else x.astype(np.int64).view(np.uint64)
        return np.searchsorted(_LEAST, u, side="right").astype(np.int64) + 1
    nb = np.ones(x.shape, dtype=np.int64)
    top = int(x.max())
    for k in range(1, 10):  # (a pass per length up to the greatest's: few for small values)
        if top < (1 << (7 * k)):
            break
        nb += x >= (1 << (7 * k))
    if int(x.min()) < 0:
        nb[x < 0] = 10
    return nb
