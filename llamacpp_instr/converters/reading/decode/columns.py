"""The one packer of a compute's ``ops`` and ``layers`` lists into int64 columns (``pack_ops``,
``layer_rows``): the forked reader (``reading.prefetch``) runs it on the other core."""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from itertools import chain, repeat
from operator import itemgetter
from typing import Any, NamedTuple, overload

import numpy as np

from .fields import VALUE_MAX, nonneg, uint
from .layer_plan import FOUR, MixedRows, getter, mixed_rows

_ITEM = (itemgetter(0), itemgetter(1), itemgetter(2))


class LayerSpan(NamedTuple):
    """A layer's part of a compute: first start to last end of its timed ops (a tuple: a million
    ops come with some 50,000 of these)."""

    layer: int
    start: int
    dur: int
    n_ops: int


def layer_rows(raw: Any, t0: int) -> np.ndarray | None:
    """A compute record's ``layers`` rows as an int64 array, start offsets made absolute, in bulk;
    None unless they are all plain ints with non-negative times (the per-row reading then
    converts or rejects the odd values). Rows of four (spans timed on the CPU backend) give
    (m, 4); rows naming their device in a fifth element give (m, 5), the device -1 in the rows
    without one."""
    got = _layer_array(raw, t0)
    if got is None:
        return None
    a, mixed = got
    if mixed is None:
        return a
    out: np.ndarray = a[mixed.at5].reshape(-1, 5)
    _shift(out, t0)
    return out


def _layer_array(raw: Any, t0: int) -> tuple[np.ndarray, MixedRows | None] | None:
    """``layer_rows``' packing: rows of four as their (m, 4) array, starts made absolute, and
    None; rows of four and five as their flat array (a -1 after the last value: the device of the
    rows of four) and its ``MixedRows``; None for anything else."""
    if type(raw) is not list or not raw:
        return None
    try:
        widths = tuple(map(len, raw))
        mixed = mixed_rows(widths)
        if mixed is None:
            return None
        flat = list(chain.from_iterable(raw))
        if mixed is FOUR:
            if len(flat) != 4 * len(raw):  # (only a row that is no list could: refused)
                return None
            # the bounds on the flat list: min and max over a few dozen values cost less there
            # than numpy's reductions of a small array (a value no int, which ``array`` refuses,
            # may raise here first: refused all the same)
            starts, durs = flat[1::4], flat[2::4]
            if min(starts) < 0 or min(durs) < 0 or t0 + max(starts) >= 1 << 63:
                return None
            if max(starts) >= VALUE_MAX or max(durs) >= VALUE_MAX:
                return None  # (refused by the per-row reading)
            a = np.frombuffer(array("q", flat), np.int64).reshape(-1, 4).copy()  # ints only
            _shift(a, t0)
            return a, None
        # ints only, and no bool (``array`` would take one as 0 or 1; the per-row reading
        # refuses a bool device): what the rows of five always refused
        if set(map(type, raw)) != _LIST or set(map(type, flat)) != _INT:
            return None
        if min(mixed.devices(flat)) < 0:
            return None
        begins, ends = mixed.starts(flat), mixed.durs(flat)
        if min(begins) < 0 or min(ends) < 0 or t0 + max(begins) >= 1 << 63:
            return None
        if max(begins) >= VALUE_MAX or max(ends) >= VALUE_MAX:
            return None
        flat.append(-1)
        return np.frombuffer(array("q", flat), np.int64), mixed
    except (TypeError, ValueError, OverflowError):
        return None


_LIST: set[type] = {list}
_INT: set[type] = {int}


def _shift(rows: np.ndarray, t0: int) -> None:
    """Add ``t0`` to the starts (column 1) in place: through ``out``, as ``rows[:, 1] += t0``
    would also write its result back through the index (twice the time, on a few dozen rows)."""
    starts = rows[:, 1]
    np.add(starts, t0, out=starts)


class LayerRows(Sequence[LayerSpan]):
    """A compute's layer spans kept as the (m, 4) int64 ``rows`` ``layer_rows`` made (layer,
    absolute start, dur, n_ops): the tables take the rows as they are, and the ``LayerSpan``
    tuples (a million ops come with some 50,000) are made only when first read."""

    __slots__ = ("rows", "_spans")

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows
        self._spans: list[LayerSpan] | None = None

    def spans(self) -> list[LayerSpan]:
        if self._spans is None:
            # (``tuple.__new__``: ``LayerSpan._make`` without its length check, the rows
            # being four wide)
            rows = self.rows.tolist()
            self._spans = list(map(tuple.__new__, repeat(LayerSpan, len(rows)), rows))
        return self._spans

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, k: int) -> LayerSpan: ...
    @overload
    def __getitem__(self, k: slice) -> list[LayerSpan]: ...
    def __getitem__(self, k: int | slice) -> LayerSpan | list[LayerSpan]:
        return self.spans()[k]

    def __iter__(self) -> Iterator[LayerSpan]:
        return iter(self.spans())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and self.spans() == list(other)

    def __repr__(self) -> str:
        return repr(self.spans())


def layer_spans(raw: Any, t0: int) -> tuple[Sequence[LayerSpan], Any]:
    """A compute record's ``layers`` rows, their start offsets made absolute, and the device of
    each span (an int64 array, -1 for the CPU backend's; None when no row names one). ``raw``
    may be ``layer_rows(raw, t0)`` already (the forked log reader's work: ``prefetch``)."""
    if isinstance(raw, np.ndarray):
        if raw.shape[1] == 4:
            return LayerRows(raw), None
        return LayerRows(np.ascontiguousarray(raw[:, :4])), raw[:, 4].copy()
    got = _layer_array(raw, t0)
    if got is not None:
        a, mixed = got
        if mixed is None:
            return LayerRows(a), None
        rows: np.ndarray = a[mixed.at4].reshape(-1, 4)  # (a new array)
        _shift(rows, t0)
        return LayerRows(rows), a[mixed.device_at]
    if not any(type(r) is list and len(r) == 5 for r in raw):
        return [LayerSpan(int(a), t0 + nonneg(b), nonneg(c), int(d)) for a, b, c, d in raw], None
    spans, devices = [], []
    for a, b, c, d, *e in raw:
        if len(e) > 1:
            raise ValueError("a layers row of more than 5 elements")
        spans.append(LayerSpan(int(a), t0 + nonneg(b), nonneg(c), int(d)))
        devices.append(uint(e[0]) if e else -1)
    return spans, np.array(devices, np.int64)


# --- the ops and layers packer --------------------------------------------------------------


class PackedOps:
    """A compute record's ``ops`` list as columns: ``arr`` rows (node, start offset, duration),
    each row's ``lo``/``hi``, the fused nodes by op position, and their smallest and largest node
    index. ``to_list()`` gives the list back, for the per-op reader."""

    __slots__ = ("arr", "lo", "hi", "fused", "f_lo", "f_hi")

    def __init__(
        self, arr: Any, fused: dict[int, list[int]], f_lo: int = 0, f_hi: int = -1
    ) -> None:
        self.arr = arr
        self.lo: list[int] = arr.min(axis=1).tolist()
        self.hi: list[int] = arr.max(axis=1).tolist()
        self.fused, self.f_lo, self.f_hi = fused, f_lo, f_hi

    def to_list(self) -> list[list[Any]]:
        ops: list[list[Any]] = self.arr.T.tolist()
        for k, f in self.fused.items():
            ops[k].append(f)
        return ops


def pack_ops(ops: Any, last: dict[int, list[int]] | None = None) -> PackedOps | None:
    """``ops`` (a compute record's list of ``[i, start, dur]`` or ``[i, start, dur, [j, ...]]``)
    as columns, or None if any entry is unusual (the per-op reader then decides). ``last``: the
    fused ops of the graph's previous compute, which every generation step repeats (reused, not
    rebuilt, when they match)."""
    try:
        if not isinstance(ops, list) or not ops:
            return None
        n = len(ops)
        # int64 conversion is int()'s, as the per-op reader's, but fails beyond 64 bits (and on
        # short or odd entries): those records are left to the per-op reader
        arr = np.empty((3, n), dtype=np.int64)
        for k in range(3):
            arr[k] = np.fromiter(map(_ITEM[k], ops), dtype=np.int64, count=n)
        extra = sum(map(len, ops)) - 3 * n  # elements beyond (node, offset, duration)
        if not extra:
            return PackedOps(arr, {})
        if last is not None and len(last) == extra:
            plan = _plan(last)
            if plan.repeated(ops):
                if plan.bounds is None:
                    return None
                return PackedOps(arr, last, *plan.bounds)
        lens = np.fromiter(map(len, ops), dtype=np.int64, count=n)
        pos = np.flatnonzero(lens > 3).tolist()
        lists = [ops[k][3] for k in pos]
        if set(map(type, lists)) != {list} or any(len(ops[k]) != 4 for k in pos):
            return None
        fused = dict(zip(pos, lists, strict=True))
        flat = list(chain.from_iterable(fused.values()))
        if not flat:
            return PackedOps(arr, fused)
        if set(map(type, flat)) != {int}:
            return None
        return PackedOps(arr, fused, min(flat), max(flat))
    except Exception:  # noqa: BLE001 - whatever it is, the per-op reader reports it
        return None


class _Repeat:
    """What ``pack_ops`` checks a compute's ops against to reuse the fused ops of the graph's last
    compute (``last``), made once per such dict (they are structure, never times): their
    positions, fetched in one call, their lists, and their smallest and largest node (None: a
    node that is no int, refused)."""

    __slots__ = ("fused", "get", "k_max", "values", "bounds")

    def __init__(self, fused: dict[int, list[int]]) -> None:
        self.fused = fused
        keys = list(fused)
        self.get = getter(keys)
        self.k_max = max(keys)
        self.values = list(fused.values())
        flat = list(chain.from_iterable(self.values))
        self.bounds: tuple[int, int] | None = (0, -1)
        if flat:
            self.bounds = (min(flat), max(flat)) if set(map(type, flat)) == {int} else None

    def repeated(self, ops: list[Any]) -> bool:
        """Whether ``ops`` has the same fused lists at the same positions. Its entries having
        three elements at least (their columns were read) and ``len(fused)`` elements beyond
        three in all, the ``len(fused)`` entries that have a fourth have exactly four, and the
        others three: as the test an entry at a time found."""
        if self.k_max >= len(ops):  # (rare) an entry at a time, raising where it did
            return all(len(ops[k]) == 4 and ops[k][3] == f for k, f in self.fused.items())
        try:
            return list(map(_FOURTH, self.get(ops))) == self.values
        except IndexError:  # (an entry of three there: the fused ops moved)
            return False


_FOURTH = itemgetter(3)
_REPEATS: dict[int, _Repeat] = {}  # by id of the fused dict, which each holds (ids stay unique)
_REPEATS_MAX = 16  # (a run has a graph or two of generation steps; beyond this, begun again)


def _plan(fused: dict[int, list[int]]) -> _Repeat:
    r = _REPEATS.get(id(fused))
    if r is None or r.fused is not fused:
        if len(_REPEATS) >= _REPEATS_MAX:
            _REPEATS.clear()
        r = _REPEATS[id(fused)] = _Repeat(fused)
    return r
