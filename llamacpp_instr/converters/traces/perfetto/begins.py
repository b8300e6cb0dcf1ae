"""Slice begins encoded in bulk: a flush's slices grouped by category and arg names, each group's
fields assembled column by column (``pieces``) instead of one slice at a time.

A log with devices has about one such slice (step, split, copy, command buffer, RPC graph,
network command) for every two ops, each with its own args; encoding them one by one cost more
than everything else the writer does. The bytes are the same as ``EventFields.begin``'s: what a
slice interns (its name, then its arg names) is interned when the writer receives it
(``note``), so the trace's interned ids and their order do not change; only the assembly waits
for the flush (``encode``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .packets import Interner
from .pieces import Pieces
from .protowire import (
    DA_DOUBLE_VALUE,
    DA_INT_VALUE,
    DA_NAME_IID,
    I64_END,
    TE_CATEGORIES,
    TE_DEBUG_ANNOTATIONS,
    TE_NAME_IID,
    TE_TRACK_UUID,
    TE_TYPE,
    TRACK_EVENT,
    TYPE_SLICE_BEGIN,
    annotation_value,
    ld,
    varint,
    varint_len,
)

# a slice whose begin waits for the flush: its track, name, category, args, and arg names
Pending = tuple[int, str, str, dict[str, Any], tuple[str, ...]]
_KEYED = (int, str, bool, type(None))  # values that pick one encoding by equality


class Begins:
    """The interning of slices received (``note``) and the encoding of their begins (``encode``)."""

    def __init__(self, interner: Interner) -> None:
        self.interner = interner
        self.arg_sets: set[tuple[str, ...]] = set()  # arg names already interned together
        self.tracks: dict[int, bytes] = {}
        self.names: dict[str, bytes] = {}

    def note(self, track: int, name: str, category: str, args: dict[str, Any]) -> Pending:
        """Intern what the slice's begin names (as ``EventFields.begin`` would, in its order)."""
        i = self.interner
        i.name(name)
        ks = tuple(args)
        if ks not in self.arg_sets:
            for k in ks:
                i.arg(k)
            self.arg_sets.add(ks)
        return (track, name, category, args, ks)

    def encode(self, slices: list[Pending]) -> list[bytes]:
        """The begin (``track_event`` field) of each slice, in order."""
        out: list[bytes] = [b""] * len(slices)
        groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for j, p in enumerate(slices):
            groups.setdefault((p[2], p[4]), []).append(j)
        for (category, ks), rows in groups.items():
            group = [slices[j] for j in rows]
            blob, lens = self._group(category, ks, group)
            data = blob.tobytes()
            ends = np.cumsum(lens).tolist()
            starts = [0, *ends[:-1]]
            for j, a, z in zip(rows, starts, ends, strict=True):
                out[j] = data[a:z]
        return out

    def _codes(self, values: list[Any], encode: Any, cache: dict[Any, bytes] | None) -> Any:
        """Codes into the distinct values' encodings (``encode(value)``)."""
        index: dict[Any, int] = {}
        table: list[bytes] = []
        codes = np.empty(len(values), dtype=np.int64)
        for r, v in enumerate(values):
            c = index.get(v)
            if c is None:
                c = index[v] = len(table)
                b = cache.get(v) if cache is not None else None
                if b is None:
                    b = encode(v)
                    if cache is not None:
                        cache[v] = b
                table.append(b)
            codes[r] = c
        return codes, table

    def _group(self, category: str, ks: tuple[str, ...], group: list[Pending]) -> tuple[Any, Any]:
        i = self.interner
        n = len(group)
        te = Pieces(n)
        codes, table = self._codes(
            [p[0] for p in group], lambda t: TE_TRACK_UUID + varint(t), self.tracks
        )
        te.pick(codes, table)
        te.const(TE_TYPE + varint(TYPE_SLICE_BEGIN))
        codes, table = self._codes(
            [p[1] for p in group], lambda s: TE_NAME_IID + varint(i.names[s]), self.names
        )
        te.pick(codes, table)
        te.const(ld(TE_CATEGORIES, category.encode()))
        for k in ks:
            self._arg(te, DA_NAME_IID + varint(i.arg_names[k]), [p[3][k] for p in group])
        body = Pieces(n)
        body.const(TRACK_EVENT)
        body.varint(te.lengths())
        body.parts += te.parts
        return body.build()

    def _arg(self, te: Pieces, head: bytes, vals: list[Any]) -> None:
        """One debug annotation per row: ``head`` (its name) and the value, as ``Interner.args``
        encodes it (non-compact)."""
        types = set(map(type, vals))
        if types == {int} and 0 <= min(vals) and max(vals) < I64_END:
            v = np.array(vals, dtype=np.int64)
            te.const(TE_DEBUG_ANNOTATIONS)
            te.varint(len(head) + len(DA_INT_VALUE) + varint_len(v))
            te.const(head + DA_INT_VALUE)
            te.varint(v)
        elif types == {float}:
            te.const(ld(TE_DEBUG_ANNOTATIONS, head + DA_DOUBLE_VALUE + bytes(8))[:-8])
            te.f64(np.array(vals, dtype=np.float64))
        elif types == {str}:
            enc = lambda v: ld(TE_DEBUG_ANNOTATIONS, head + annotation_value(v))  # noqa: E731
            te.pick(*self._codes(vals, enc, None))
        elif types <= set(_KEYED):
            # (type, value): True == 1, yet encodes otherwise
            codes, table = self._codes(
                [(type(v), v) for v in vals],
                lambda tv: ld(TE_DEBUG_ANNOTATIONS, head + annotation_value(tv[1])),
                None,
            )
            te.pick(codes, table)
        else:  # floats among others: one encoding per row (0.0 == -0.0, NaN != NaN)
            table = [ld(TE_DEBUG_ANNOTATIONS, head + annotation_value(v)) for v in vals]
            te.pick(np.arange(len(vals), dtype=np.int64), table)
