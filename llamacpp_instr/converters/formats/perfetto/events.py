"""The track event fields of the trace's rows other than ops: slice begins and ends, counters.

A slice end is the same bytes for every slice of a track: each track gets an end id, and its end
field is kept once (``ends``, and as a byte matrix for the bulk encoder). Compute and layer slice
begins, and those of a device's part of a compute, repeat every step with the same args: they are
encoded once and kept.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ...reading.decode.columns import LayerSpan
from ...traces.items import Sample, Slice
from .packets import Interner
from .protowire import (
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

_F64 = struct.Struct("<d").pack


class EventFields:
    """The ``track_event`` fields (tag and length included) of slices and counter samples."""

    def __init__(self, interner: Interner) -> None:
        self.interner = interner
        self.ends: list[bytes] = []  # per end id: the END packet's track event field
        self.end_ids: dict[int, int] = {}  # track -> end id
        self.layers: dict[tuple[int, int, int], bytes] = {}  # (track, layer, n_ops) -> begin
        self.computes: dict[tuple[Any, ...], bytes] = {}  # (track, name, *args) -> begin
        # a device's part of a compute: (track, name, *args.items()) -> begin
        self.parts: dict[tuple[Any, ...], bytes] = {}
        self.samples: dict[int, bytes] = {}  # track -> a sample's fields but its value
        self._matrix: tuple[Any, Any] = (None, None)
        self._matrix_rows = -1

    def end_id(self, track: int) -> int:
        e = self.end_ids.get(track)
        if e is None:
            e = self.end_ids[track] = len(self.ends)
            self.ends.append(
                ld(TRACK_EVENT, TE_TRACK_UUID + varint(track) + TE_TYPE + varint(TYPE_SLICE_END))
            )
        return e

    def end_matrix(self) -> tuple[Any, Any]:
        """The end fields as a zero-padded byte matrix (a row per end id) and their lengths."""
        if self._matrix_rows != len(self.ends):
            bodies = self.ends or [b""]  # (a row to index when there are no end rows)
            mat = np.zeros((len(bodies), max(1, *map(len, bodies))), dtype=np.uint8)
            for k, b in enumerate(bodies):
                mat[k, : len(b)] = np.frombuffer(b, dtype=np.uint8)
            self._matrix = (mat, np.array([len(b) for b in bodies], dtype=np.int64))
            self._matrix_rows = len(self.ends)
        return self._matrix

    def begin(self, it: Slice) -> bytes:
        """A slice's begin."""
        if it.category == "compute":  # the same few args every step: kept
            return self._kept(self.computes, (it.track, it.name, *it.args.values()), it)
        if it.category == "device" and not (it.flows_out or it.flows_in):
            # (its args say what the part is: ubatch, graph, device, number of ops; the same
            # every step, as a compute's are)
            return self._kept(self.parts, (it.track, it.name, *it.args.items()), it)
        return self._begin(it)

    def _kept(self, cache: dict[tuple[Any, ...], bytes], key: tuple[Any, ...], it: Slice) -> bytes:
        """``it``'s begin, from ``cache`` by ``key`` (what makes it), made the first time (a
        cache past 4096 begins starts over: a log of ever new values stays bounded)."""
        s = cache.get(key)
        if s is None:
            if len(cache) > 4096:
                cache.clear()
            s = cache[key] = self._begin(it)
        return s

    def _begin(self, it: Slice) -> bytes:
        i = self.interner
        te = TE_TRACK_UUID + varint(it.track) + TE_TYPE + varint(TYPE_SLICE_BEGIN)
        te += TE_NAME_IID + varint(i.name(it.name))
        te += ld(TE_CATEGORIES, it.category.encode()) + i.args(it.args)
        if it.flows_out or it.flows_in:  # flow_ids, terminating_flow_ids: fixed64 each
            te += b"".join(TE_FLOW_IDS + struct.pack("<Q", f) for f in it.flows_out)
            te += b"".join(TE_TERMINATING_FLOW_IDS + struct.pack("<Q", f) for f in it.flows_in)
        return ld(TRACK_EVENT, te)

    def layer_begin(self, track: int, lay: LayerSpan) -> bytes:
        """A layer slice's begin (its args: the layer and its number of ops)."""
        lk = (track, lay.layer, lay.n_ops)
        s = self.layers.get(lk)
        if s is None:
            args = {"layer": lay.layer, "n_ops": lay.n_ops}
            s = self.layers[lk] = self.begin(
                Slice(track, f"layer {lay.layer}", 0, 0, 2, "layer", args)
            )
        return s

    def sample(self, it: Sample) -> bytes:
        """A counter sample: its track's fields (kept: the same for every sample of the track,
        the length included, as the value is 8 bytes), then the value."""
        head = self.samples.get(it.track)
        if head is None:
            te = TE_TRACK_UUID + varint(it.track) + TE_TYPE + varint(TYPE_COUNTER)
            te += TE_DOUBLE_COUNTER_VALUE
            head = self.samples[it.track] = ld(TRACK_EVENT, te + bytes(8))[:-8]
        return head + _F64(it.value)
