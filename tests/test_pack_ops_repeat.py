"""``columns.pack_ops`` reuses the fused ops of a graph's last compute (``last``) through a check
made once per such dict (``_Repeat``): the same columns, the same fused dict (``last`` itself when
they repeat) and the same refusals as the check an entry at a time it replaced, kept here as
``_reference``."""

from __future__ import annotations

import random
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np
import pytest

from llamacpp_instr.converters.reading.decode import columns
from llamacpp_instr.converters.reading.decode.columns import PackedOps, pack_ops

pytestmark = pytest.mark.fast

_ITEM = (itemgetter(0), itemgetter(1), itemgetter(2))


def _reference(ops: Any, last: dict[int, list[int]] | None = None) -> PackedOps | None:
    """``pack_ops`` as it was before ``_Repeat`` (main a690a2f)."""
    try:
        if not isinstance(ops, list) or not ops:
            return None
        n = len(ops)
        arr = np.empty((3, n), dtype=np.int64)
        for k in range(3):
            arr[k] = np.fromiter(map(_ITEM[k], ops), dtype=np.int64, count=n)
        extra = sum(map(len, ops)) - 3 * n
        if not extra:
            return PackedOps(arr, {})
        if (
            last is not None
            and len(last) == extra
            and all(len(ops[k]) == 4 and ops[k][3] == f for k, f in last.items())
        ):
            fused = last
        else:
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
    except Exception:  # noqa: BLE001
        return None


def _same(ops: Any, last: dict[int, list[int]] | None) -> PackedOps | None:
    """``pack_ops(ops, last)``, asserted equal to the reference's, ``last`` reused or not alike."""
    got, want = pack_ops(ops, last), _reference(ops, last)
    if want is None:
        assert got is None, ops
        return None
    assert got is not None, ops
    assert np.array_equal(got.arr, want.arr) and got.arr.dtype == np.int64
    assert (got.lo, got.hi, got.f_lo, got.f_hi) == (want.lo, want.hi, want.f_lo, want.f_hi)
    assert got.fused == want.fused
    assert (got.fused is last) == (want.fused is last)
    return got


BASE: list[list[Any]] = [[0, 0, 5], [1, 5, 3, [2, 3]], [4, 9, 1], [5, 10, 2, [6]], [7, 12, 1]]


def _copy(ops: list[list[Any]]) -> list[list[Any]]:
    """A record's ops as another line would parse them: new lists, fused lists included."""
    return [[*e[:3], list(e[3])] if len(e) > 3 and isinstance(e[3], list) else list(e) for e in ops]


def test_a_repeat_reuses_last_and_its_bounds() -> None:
    first = _same(BASE, None)
    assert first is not None and first.fused == {1: [2, 3], 3: [6]}
    again = _same(_copy(BASE), first.fused)
    assert again is not None and again.fused is first.fused
    assert (again.f_lo, again.f_hi) == (2, 6)
    # and again, the check made once for that dict being used
    third = _same(_copy(BASE), first.fused)
    assert third is not None and third.fused is first.fused


def test_what_is_no_repeat_is_rebuilt_or_refused_as_before() -> None:
    last = {1: [2, 3], 3: [6]}
    moved = _copy(BASE)
    moved[3] = moved[3][:3]
    moved[2].append([8])  # as many fused ops, one at another position (an entry of three there)
    got = _same(moved, last)
    assert got is not None and got.fused == {1: [2, 3], 2: [8]} and got.fused is not last
    other = _copy(BASE)
    other[3][3] = [7]  # the same positions, another node
    got = _same(other, last)
    assert got is not None and got.fused == {1: [2, 3], 3: [7]}
    shorter = _copy(BASE)[:3]  # ``last`` names a position beyond the ops: refused...
    shorter[0].append([1])
    assert _same(shorter, last) is None
    shorter[1] = shorter[1][:3] + [[4]]  # ... unless a position before it differs: rebuilt
    got = _same(shorter, last)
    assert got is not None and got.fused == {0: [1], 1: [4]}
    five = _copy(BASE)
    five[1].append(9)  # five elements and one of three elsewhere: the extra count matches
    five[3] = five[3][:3]
    assert _same(five, {1: [2, 3]}) is None
    assert _same(_copy(BASE), {1: [2, 3], 3: [6], 4: [1]}) is not None  # (another count)


def test_a_last_with_odd_nodes_is_refused_as_before() -> None:
    ops = _copy(BASE)
    ops[1][3] = [2, "3"]
    assert _same(ops, {1: [2, "3"], 3: [6]}) is None  # (a fused node that is no int)
    ops = _copy(BASE)
    ops[1][3], ops[3][3] = [], []
    got = _same(ops, {1: [], 3: []})
    assert got is not None and (got.f_lo, got.f_hi) == (0, -1)


def test_random_ops_against_the_reference() -> None:
    rnd = random.Random(38)
    odd: list[Any] = [True, -1, 0.5, "1", None, 1 << 63, [], [1, "2"]]
    lasts: list[dict[int, list[int]]] = []
    n_reused = n_none = n_built = 0
    for _ in range(3000):
        n = rnd.randint(1, 12)
        ops: list[list[Any]] = [[rnd.randint(0, 30), rnd.randint(0, 10**6), rnd.randint(0, 99)]]
        ops += [[rnd.randint(0, 30), rnd.randint(0, 999), rnd.randint(0, 9)] for _ in range(n)]
        for e in ops:
            if rnd.random() < 0.3:
                e.append([rnd.randint(0, 30) for _ in range(rnd.randint(1, 2))])
        last = rnd.choice(lasts) if lasts and rnd.random() < 0.8 else None
        if last is not None and rnd.random() < 0.6:  # a repeat of that compute's fused ops
            prev = last if rnd.random() < 0.8 else rnd.choice(lasts)
            ops = [e[:3] for e in ops]
            if max(prev) >= len(ops) and rnd.random() < 0.7:
                ops += [[1, 2, 3] for _ in range(max(prev) + 1 - len(ops))]
            for k, f in prev.items():
                if k < len(ops):
                    ops[k].append(list(f))
        if rnd.random() < 0.05:
            e = rnd.choice(ops)
            e[rnd.randrange(len(e))] = rnd.choice(odd)
        if rnd.random() < 0.02:
            e = rnd.choice(ops)
            e.append(rnd.choice(odd))
        got = _same(ops, last)
        if got is None:
            n_none += 1
        elif last is not None and got.fused is last:
            n_reused += 1
        else:
            n_built += 1
            if got.fused:
                lasts.append(got.fused)
    assert n_reused > 300 and n_none > 50 and n_built > 300  # every outcome exercised
    assert 0 < len(columns._REPEATS) <= columns._REPEATS_MAX
