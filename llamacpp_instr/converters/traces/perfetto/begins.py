"""Slice begins encoded in bulk: a flush's slices grouped by category and arg names, each group's
fields assembled column by column (``pieces``) instead of one slice at a time.

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
from .pieces import Pieces
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
from .segments import GroupBytes, Seg

_KEYED = (int, str, bool, type(None))  # values that pick one encoding by equality


class Pending:
    """The slices of one category and arg names whose begins wait for the flush, as columns, and
    where their rows are (a batch's small rows, and the index of each)."""

    __slots__ = ("tracks", "names", "args", "at", "segs", "flows_out", "flows_in")

    def __init__(self) -> None:
        self.tracks: list[int] = []
        self.names: list[str] = []
        self.args: list[dict[str, Any]] = []  # made columns at the flush
        self.at: list[tuple[list[Any], int]] = []
        self.segs: list[Seg] = []  # or, in a group of segments (``segments``), those
        # in a group of slices with flows (as many per slice: the key's counts), their ids
        self.flows_out: list[tuple[int, ...]] = []
        self.flows_in: list[tuple[int, ...]] = []


def flows_key(category: str, ks: tuple[str, ...], seg: bool, n_out: int, n_in: int) -> Any:
    """The key of the pending group of slices with these arg names and numbers of flows."""
    if n_out or n_in:
        return (category, ks, seg, n_out, n_in)
    return (category, ks, True) if seg else (category, ks)


def _uint_column(vals: Any) -> Any:
    """The values as int64s if they are all ints in [0, 2**63) (varints, encoded in bulk), else
    None."""
    if set(map(type, vals)) != {int}:
        return None
    try:
        v = np.array(vals, dtype=np.int64)
    except OverflowError:
        return None
    return v if int(v.min()) >= 0 else None


def _int_run(te: Pieces, run: list[tuple[bytes, Any]]) -> None:
    """A run of int args (their heads and values) as debug annotations, at once; emptied."""
    if run:
        v = np.stack([vals for _, vals in run])
        te.annotations(TE_DEBUG_ANNOTATIONS, [head for head, _ in run], v)
        run.clear()


# distinct values remembered per cache (the encodings of a step's tracks, names and string args:
# a few hundred); past this many the cache starts over, so a log of ever new values stays bounded
CACHE_MAX = 4096


def pick(te: Pieces, values: list[Any], encode: Any, cache: dict[Any, bytes]) -> None:
    """Per row, ``encode(value)``: each distinct value's encoding once, from ``cache`` (by value:
    what ``encode`` depends on besides the value is fixed for the cache's life) or made and put
    there; a column of one value is a constant."""
    # the distinct values in the order first met, then each value's code (in C loops)
    index: dict[Any, int] = dict.fromkeys(values, 0)
    if len(cache) + len(index) > CACHE_MAX:
        cache.clear()
    table = []
    for j, v in enumerate(index):
        index[v] = j
        b = cache.get(v)
        if b is None:
            b = cache[v] = encode(v)
        table.append(b)
    if len(table) == 1:
        te.const(table[0])
        return
    codes = np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))
    te.pick(codes, table)


def columns(args: list[Any], ks: tuple[str, ...]) -> list[list[Any]]:
    """The values of each of ``ks`` in ``args`` (mappings whose keys are ``ks``, in that order:
    a group's), one list per name."""
    m = len(ks)
    try:  # (dicts: every value in one C loop, then each name's every m-th)
        flat = list(chain.from_iterable(map(dict.values, args)))
    except TypeError:
        flat = []
    if len(flat) == m * len(args):
        return [flat[j::m] for j in range(m)]
    return [[a[k] for a in args] for k in ks]


class Begins:
    """The interning of slices received (``note``) and the encoding of their begins (``encode``)."""

    def __init__(self, interner: Interner) -> None:
        self.interner = interner
        self.arg_sets: set[tuple[str, ...]] = set()  # arg names already interned together
        # (category, arg names[, True for a group of segments[, the number of flows each slice
        # starts and ends, where they have some]]) -> its slices noted since the last flush
        self.pending: dict[tuple[Any, ...], Pending] = {}
        # encodings met before (``pick``): a category's (track, name) heads, an arg's values (by
        # its head, and for mixed types by type and value: True == 1, yet encodes otherwise)
        self.cache: dict[Any, dict[Any, bytes]] = {}

    def group(
        self, category: str, args: Any, seg: bool = False, n_out: int = 0, n_in: int = 0
    ) -> Pending:
        """Intern the arg names of ``args`` (after its slice's name: ``note``) and give the
        pending group of its category and arg names (``seg``: of segments; ``n_out``, ``n_in``:
        of slices that start and end as many flows each)."""
        ks = tuple(args)
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
        g = self.group(category, args, False, len(flows_out), len(flows_in))
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
        for (category, ks, *_), p in pending.items():
            blob, lens = self._group(category, ks, p)
            if p.segs:  # (a group of segments) each segment its range of the group's rows
                gb = GroupBytes(blob, lens)
                a = 0
                for sg in p.segs:
                    sg.gb, sg.at = gb, a
                    a += len(sg.ts)
                continue
            data = blob.tobytes()
            ends = np.cumsum(lens).tolist()
            a = 0
            for (small, i), z in zip(p.at, ends, strict=True):
                r = small[i]
                small[i] = (r[0], r[1], r[2], r[3], data[a:z], r[5])
                a = z

    def _group(self, category: str, ks: tuple[str, ...], p: Pending) -> tuple[Any, Any]:
        i = self.interner
        n = len(p.tracks)
        te = Pieces(n)
        # track, type, name and category: one pick per (track, name)
        category_field = ld(TE_CATEGORIES, category.encode())
        pick(
            te,
            list(zip(p.tracks, p.names, strict=True)),
            lambda tn: TE_TRACK_UUID
            + varint(tn[0])
            + TE_TYPE
            + varint(TYPE_SLICE_BEGIN)
            + TE_NAME_IID
            + varint(i.names[tn[1]])
            + category_field,
            self.cache.setdefault(("head", category_field), {}),
        )
        if ks:
            run: list[tuple[bytes, Any]] = []  # consecutive int args: encoded at once
            for k, col in zip(ks, columns(p.args, ks), strict=True):
                head = DA_NAME_IID + varint(i.arg_names[k])
                v = _uint_column(col)
                if v is not None:
                    run.append((head + DA_INT_VALUE, v))
                    continue
                _int_run(te, run)
                self._arg(te, head, col)
            _int_run(te, run)
        if p.flows_out:  # flow_ids, terminating_flow_ids: fixed64 each (as many per slice)
            for tag_, flows in ((TE_FLOW_IDS, p.flows_out), (TE_TERMINATING_FLOW_IDS, p.flows_in)):
                for ids in zip(*flows, strict=True):
                    te.const(tag_)
                    te.fixed64(np.array(ids, dtype=np.uint64))
        body = Pieces(n)
        body.const(TRACK_EVENT)
        body.varint(te.lengths())
        body.parts += te.parts
        return body.build()

    def _arg(self, te: Pieces, head: bytes, vals: list[Any]) -> None:
        """One debug annotation per row: ``head`` (its name) and the value, as ``Interner.args``
        encodes it (non-compact); ints in [0, 2**63) are ``_int_run``'s."""
        types = set(map(type, vals))
        if types == {float}:
            te.const(ld(TE_DEBUG_ANNOTATIONS, head + DA_DOUBLE_VALUE + bytes(8))[:-8])
            te.f64(np.array(vals, dtype=np.float64))
        elif types == {str}:
            enc = lambda v: ld(TE_DEBUG_ANNOTATIONS, head + annotation_value(v))  # noqa: E731
            pick(te, vals, enc, self.cache.setdefault(("str", head), {}))
        elif types <= set(_KEYED):
            # (type, value): True == 1, yet encodes otherwise
            pick(
                te,
                [(type(v), v) for v in vals],
                lambda tv: ld(TE_DEBUG_ANNOTATIONS, head + annotation_value(tv[1])),
                self.cache.setdefault(("typed", head), {}),
            )
        else:  # floats among others: one encoding per row (0.0 == -0.0, NaN != NaN)
            table = [ld(TE_DEBUG_ANNOTATIONS, head + annotation_value(v)) for v in vals]
            te.pick(np.arange(len(vals), dtype=np.int64), table)
