"""Slice begins encoded in bulk: a flush's slices grouped by category and arg names, each group's
fields made column by column (ints as int64s, strings and heads as codes into tables kept from
one flush to the next), and every group's rows assembled at once (``pieces.Assembly``) instead
of one slice at a time.

A log with devices has about one such slice (step, split, copy, command buffer, RPC graph,
network command) for every two ops, each with its own args; encoding them one by one cost more
than everything else the writer does. The bytes are the same as ``EventFields.begin``'s: what a
slice interns (its name, then its arg names) is interned when the writer receives it
(``note``), so the trace's interned ids and their order do not change; only the assembly waits
for the flush (``encode``). The groups gather every slice noted since the last flush, the
current (unfinished) batch's included: a begin's bytes do not depend on when they are made.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np

from .packets import Interner
from .pieces import Assembly, Scratch, Table, int_heads
from .protowire import (
    DA_DOUBLE_VALUE,
    DA_INT_VALUE,
    DA_NAME_IID,
    TE_CATEGORIES,
    TE_DEBUG_ANNOTATIONS,
    TE_FLOW_IDS,
    TE_NAME_IID,
    TE_TERMINATING_FLOW_IDS,
    TE_TRACK_UUID,
    TE_TYPE,
    TRACK_EVENT,
    TYPE_SLICE_BEGIN,
    annotation_value,
    ld,
    varint,
)
from .segments import GroupBytes

_KEYED = (int, str, bool, type(None))  # values that pick one encoding by equality


class Pending:
    """The slices of one category and arg names whose begins wait for the flush, as columns, and
    where their rows are (a batch's small rows, and the index of each)."""

    __slots__ = ("tracks", "names", "args", "at", "seg", "flows_out", "flows_in", "gb", "r0")

    def __init__(self) -> None:
        self.tracks: list[int] = []
        self.names: list[str] = []
        self.args: list[dict[str, Any]] = []  # made columns at the flush
        self.at: list[tuple[list[Any], int]] = []
        # or, a group of segments (``segments``): each ``Seg`` knows its group; the group does
        # not list them (a cycle, which the command's disabled collector would never free)
        self.seg = False
        # in a group of slices with flows (as many per slice: the key's counts), their ids
        self.flows_out: list[tuple[int, ...]] = []
        self.flows_in: list[tuple[int, ...]] = []
        # once encoded (a group of segments): the bytes, and the group's first row in them
        self.gb: GroupBytes | None = None
        self.r0 = 0


def flows_key(category: str, ks: tuple[str, ...], seg: bool, n_out: int, n_in: int) -> Any:
    """The key of the pending group of slices with these arg names and numbers of flows."""
    if n_out or n_in:
        return (category, ks, seg, n_out, n_in)
    return (category, ks, True) if seg else (category, ks)


# distinct values remembered per table (the encodings of a step's tracks, names and string args:
# a few hundred); past this many the table starts over, so a log of ever new values stays bounded
CACHE_MAX = 4096


def columns(args: list[Any], ks: tuple[str, ...]) -> tuple[list[list[Any]], list[Any]]:
    """The values of each of ``ks`` in ``args`` (mappings whose keys are ``ks``, in that order:
    a group's), one list per name, and the type of each list's values where every row's is the
    first row's (else None: ``Begins._arg`` looks at the list's)."""
    m, n = len(ks), len(args)
    try:  # (dicts: every value in one C loop, then each name's every m-th)
        flat = list(chain.from_iterable(map(dict.values, args)))
    except TypeError:
        flat = []
    if len(flat) != m * n:
        return [[a[k] for a in args] for k in ks], [None] * m
    cols = [flat[j::m] for j in range(m)]
    # (each column's types, counted in C: cheaper than a set per column, or than comparing the
    # types of all the values with the first row's repeated)
    first = list(map(type, flat[:m]))
    same = [list(map(type, c)).count(t) == n for c, t in zip(cols, first, strict=True)]
    return cols, [t if ok else None for t, ok in zip(first, same, strict=True)]


class Begins:
    """The interning of slices received (``note``) and the encoding of their begins (``encode``)."""

    def __init__(self, interner: Interner) -> None:
        self.interner = interner
        self.arg_sets: set[tuple[str, ...]] = set()  # arg names already interned together
        # (category, arg names[, True for a group of segments[, the number of flows each slice
        # starts and ends, where they have some]]) -> its slices noted since the last flush
        self.pending: dict[tuple[Any, ...], Pending] = {}
        # encodings met before (``Table``): a category's (track, name) heads, an arg's values (by
        # its name, and for mixed types by type and value: True == 1, yet encodes otherwise)
        self.cache: dict[Any, Table] = {}
        self.int_heads: dict[bytes, bytes] = {}  # an int arg's name -> its ``int_heads``
        self.scratch = Scratch()

    def group_of(
        self, category: str, ks: tuple[str, ...], seg: bool, n_out: int, n_in: int
    ) -> Pending:
        """Intern the arg names ``ks`` (after its slice's name: ``note``) and give the pending
        group of its category and arg names (``seg``: of segments; ``n_out``, ``n_in``: of
        slices that start and end as many flows each)."""
        key = flows_key(category, ks, seg, n_out, n_in)
        g = self.pending.get(key)
        if g is None:  # (else its arg names are interned: they were when it was made)
            self._arg_names(ks)
            g = self.pending[key] = Pending()
        return g

    def _arg_names(self, ks: tuple[str, ...]) -> None:
        if ks not in self.arg_sets:
            for k in ks:
                self.interner.arg(k)
            self.arg_sets.add(ks)

    def note(
        self,
        small: list[Any],
        at: int,
        track: int,
        name: str,
        category: str,
        args: Any,
        flows_out: tuple[int, ...] = (),
        flows_in: tuple[int, ...] = (),
    ) -> None:
        """A slice whose begin is row ``at`` of ``small`` (its batch's small rows): interned now
        (as ``EventFields.begin`` would: its name, then its arg names), encoded at the flush.
        (Its flow ids, if any, must fit a fixed64: ``fixed64_ok``.)"""
        if name not in self.interner.names:
            self.interner.name(name)
        ks = tuple(args)
        if flows_out or flows_in:
            g = self.group_of(category, ks, False, len(flows_out), len(flows_in))
        else:  # (the usual: ``flows_key``'s, built here)
            g = self.pending.get((category, ks)) or self.group_of(category, ks, False, 0, 0)
        g.tracks.append(track)
        g.names.append(name)
        g.args.append(args)
        g.at.append((small, at))
        if flows_out or flows_in:
            g.flows_out.append(flows_out)
            g.flows_in.append(flows_in)

    def encode(self) -> None:
        """Put the begins noted since the last flush in their small rows (and segments)."""
        pending, self.pending = self.pending, {}
        if not pending:
            return
        asm = Assembly(TRACK_EVENT, self.scratch)
        # the groups of small rows first: their bytes, wanted as ``bytes``, are the blob's start
        groups = sorted(pending.items(), key=lambda kp: kp[1].seg)
        placed = [
            (p, asm.add(len(p.tracks), self._pieces(category, ks, p)))
            for (category, ks, *_), p in groups
        ]
        blob, starts, lens = asm.build()
        gb = GroupBytes(blob, starts, lens)
        small_rows = sum(len(p.at) for p, _ in placed if not p.seg)
        data = blob[: int(starts[small_rows]) if small_rows < len(starts) else None].tobytes()
        for p, r0 in placed:
            if p.seg:  # (a group of segments: each knows its rows in the group's)
                p.gb, p.r0 = gb, r0
                continue
            r1 = r0 + len(p.at)
            begin = starts[r0:r1]
            ends = (begin + lens[r0:r1]).tolist()
            for (small, i), a, z in zip(p.at, begin.tolist(), ends, strict=True):
                r = small[i]
                small[i] = (r[0], r[1], r[2], r[3], data[a:z], r[5])

    def _table(self, key: Any) -> Table:
        """The table of ``key`` (started over past ``CACHE_MAX`` entries)."""
        t = self.cache.get(key)
        if t is None or len(t) > CACHE_MAX:
            t = self.cache[key] = Table()
        return t

    def _pick(self, key: Any, values: list[Any], encode: Any) -> tuple[Any, ...]:
        """The piece of ``values`` by the entries of table ``key``: a constant where they are
        one value (a C loop that compares, cheaper than one that looks each up)."""
        t = self._table(key)
        v0 = values[0]
        if values[-1] == v0 and values.count(v0) == len(values):
            return ("c", t.entry(v0, encode))
        return ("t", t, t.codes(values, encode))

    def _pieces(self, category: str, ks: tuple[str, ...], p: Pending) -> list[tuple[Any, ...]]:
        """The pieces of a group's begins (``pieces.Assembly``), after their length."""
        i = self.interner
        # track, type, name and category: an entry per track, then one per name (its category's)
        category_field = ld(TE_CATEGORIES, category.encode())
        pieces = [
            self._pick(("track",), p.tracks, _track_head),
            self._pick(
                ("name", category_field),
                p.names,
                lambda s: varint(i.names[s]) + category_field,
            ),
        ]
        if ks:
            cols, types = columns(p.args, ks)
            for k, col, t in zip(ks, cols, types, strict=True):
                self._arg(pieces, DA_NAME_IID + varint(i.arg_names[k]), col, t)
        if p.flows_out:  # flow_ids, terminating_flow_ids: fixed64 each (as many per slice)
            for tag_, flows in ((TE_FLOW_IDS, p.flows_out), (TE_TERMINATING_FLOW_IDS, p.flows_in)):
                for ids in zip(*flows, strict=True):
                    pieces.append(("c", tag_))
                    pieces.append(("8", _eights(np.array(ids, dtype="<u8"))))
        return pieces

    def _arg(self, pieces: list[tuple[Any, ...]], name: bytes, vals: list[Any], t: Any) -> None:
        """One debug annotation per row: ``name`` and the value, as ``Interner.args`` encodes
        it (non-compact); ``t``: the values' type, if known to be one."""
        types = {t} if t is not None else set(map(type, vals))
        if types == {int}:  # (varints in bulk; a negative one in ten bytes, as ``varint``'s)
            try:
                v = np.fromiter(vals, dtype=np.int64, count=len(vals))
            except OverflowError:  # (beyond int64: a string, ``annotation_value``)
                pass
            else:
                heads = self.int_heads.get(name)
                if heads is None:
                    heads = self.int_heads[name] = int_heads(
                        TE_DEBUG_ANNOTATIONS, name + DA_INT_VALUE
                    )
                pieces.append(("i", heads, v))
                return
        if types == {float}:
            pieces.append(("c", ld(TE_DEBUG_ANNOTATIONS, name + DA_DOUBLE_VALUE + bytes(8))[:-8]))
            pieces.append(("8", _eights(np.array(vals, dtype="<f8"))))
        elif types == {str}:
            enc = lambda v: ld(TE_DEBUG_ANNOTATIONS, name + annotation_value(v))  # noqa: E731
            pieces.append(self._pick(("str", name), vals, enc))
        elif types <= set(_KEYED):
            # (type, value): True == 1, yet encodes otherwise
            enc = lambda tv: ld(TE_DEBUG_ANNOTATIONS, name + annotation_value(tv[1]))  # noqa: E731
            pieces.append(self._pick(("typed", name), [(type(v), v) for v in vals], enc))
        else:  # floats among others: one entry per row (0.0 == -0.0, NaN != NaN)
            table = Table()
            table.entries = [ld(TE_DEBUG_ANNOTATIONS, name + annotation_value(v)) for v in vals]
            pieces.append(("t", table, np.arange(len(vals), dtype=np.int64)))


def _track_head(track: int) -> bytes:
    """A begin's fields from its track to its name's tag (then its name's iid: ``_pieces``)."""
    return TE_TRACK_UUID + varint(track) + TE_TYPE + varint(TYPE_SLICE_BEGIN) + TE_NAME_IID


def _eights(v: Any) -> Any:
    """8-byte values (float64s, uint64s: little-endian) as an (n, 8) uint8 matrix."""
    return np.ascontiguousarray(v).view(np.uint8).reshape(-1, 8)
