"""The timestamps of a flush's templated blocks, every template's at once (``template_fill.fill``).

A device log's flush has a template per device (about three), each with a few dozen blocks:
made template by template (``template_fill.stacked``), the columns, the range and order checks
and the reorder cost some forty numpy calls per template, more than the values' work. Here the
values of every block are made into one array (compute begins and ends, layer begins and ends,
op begins and ends of all blocks, each part one after another), each template's rows in its
own order are one index (made from where its parts start, with what the template keeps:
``Layout``), and one gather, one difference and two reductions check them all.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

BIG = 1 << 62  # (timestamps and durations below it: their sums stay in int64)
_TS, _START, _DUR = attrgetter("ts"), attrgetter("start"), attrgetter("dur")
_ANY = np.iinfo(np.int64).min  # (a threshold any difference passes: between two blocks' rows)


class Layout:
    """Where a template's rows (in its order) come from among a flush's values: per row, its
    part (0 compute begin, 1 compute end, 2 layer begin, 3 layer end, 4 op begin, 5 op end),
    its place in its block's part (``within``) and its block's stride there; and ``thr``, what
    the difference to the next row must be at least (1, or 0 where the static keys order two
    equal timestamps; any after a block's last row)."""

    def __init__(self, perm: Any, static_ok: Any, n_layers: int, n_ops: int) -> None:
        n_l, m = n_layers, n_ops
        part = np.concatenate(([0, 1], np.full(n_l, 2), np.full(n_l, 3), np.full(m, 4)))
        part = np.concatenate((part, np.full(m, 5))).astype(np.int64)
        ar_l, ar_m = np.arange(n_l, dtype=np.int64), np.arange(m, dtype=np.int64)
        within = np.concatenate(([0, 0], ar_l, ar_l, ar_m, ar_m)).astype(np.int64)
        self.part = part[perm]
        self.within = within[perm]
        self.stride = np.array([1, 1, n_l, n_l, m, m], dtype=np.int64)[self.part]
        self.thr = np.append(np.where(static_ok, 0, 1), _ANY).astype(np.int64)
        self.n_layers, self.n_ops = n_l, m
        self.by_n: dict[int, tuple[Any, Any]] = {}

    def of(self, n: int) -> tuple[Any, Any]:
        """For ``n`` blocks: each row's place relative to where the blocks' parts start (a
        matrix, a row per block) and ``thr`` for all (kept: a flush has as many blocks of a
        template as the flush before it, most of the time)."""
        got = self.by_n.get(n)
        if got is None:
            if len(self.by_n) >= 16:
                self.by_n.clear()
            rel = self.within + np.arange(n, dtype=np.int64)[:, None] * self.stride
            got = self.by_n[n] = (rel, np.tile(self.thr, n))
        return got


def gather(groups: list[tuple[Any, list[Any]]]) -> Any:
    """For each template of ``groups`` (a template and its blocks: ``(k, batch, block)``), its
    blocks' timestamps in its row order (a matrix, a row per block; views of one array), and
    the ops' gids and durations of all (block after block, template after template): ``(ts
    list, flat ts, gids, durs)``; None if a duration is not positive or a block's rows do not
    sort as its template's or a timestamp's varint is not the template's length; ``False``
    where this cannot tell (a value beyond 2**62, a block unlike its template's, ops' times as
    Python ints): ``template_fill.stacked`` then does, template by template."""
    blocks = [x for _, bl in groups for x in bl]
    if not blocks:
        empty = np.zeros(0, dtype=np.int64)
        return [], empty, empty, empty
    lays = [bl.cb.layers for _, _, bl in blocks]
    want_l = [tm.layout.n_layers for tm, bl in groups for _ in bl]
    if list(map(len, lays)) != want_l:
        return False
    grp = [b.groups[bl.group] if bl.group >= 0 else None for _, b, bl in blocks]
    want_m = [tm.layout.n_ops for tm, bl in groups for _ in bl]
    if [0 if g is None else len(g[1]) for g in grp] != want_m:
        return False
    ops = [g for g in grp if g is not None]
    dtypes = {g[2].dtype for g in ops} | {g[3].dtype for g in ops}
    if dtypes and dtypes != {np.dtype(np.int64)}:
        return False
    heads = [bl.cb.slice for _, _, bl in blocks]
    layers = list(chain.from_iterable(lays))
    n_b, n_l = len(heads), len(layers)
    try:  # (each attribute of all in one C loop)
        c0, c1 = (np.fromiter(map(get, heads), np.int64, n_b) for get in (_TS, _DUR))
        l0, l1 = (np.fromiter(map(get, layers), np.int64, n_l) for get in (_START, _DUR))
    except OverflowError:
        return False
    if ops:
        st = np.concatenate([g[2] for g in ops])
        du = np.concatenate([g[3] for g in ops])
        gids = np.concatenate([g[1] for g in ops])
    else:
        st = du = gids = np.zeros(0, dtype=np.int64)
    starts = np.concatenate((c0, l0, st))
    durs = np.concatenate((c1, l1, du))
    if int(starts.max()) >= BIG or int(starts.min()) <= -BIG or int(durs.max()) >= BIG:
        return False
    if int(durs.min()) <= 0:
        return None
    n_m = len(st)
    values = np.concatenate((c0, c0 + c1, l0, l0 + l1, st, st + du))
    base = np.array([0, n_b, 2 * n_b, 2 * n_b + n_l, 2 * (n_b + n_l), 2 * (n_b + n_l) + n_m])
    at = np.zeros(6, dtype=np.int64)  # where the next template's blocks start in each part
    idx, thr, cuts = [], [], [0]
    for tm, bl in groups:
        lo, n = tm.layout, len(bl)
        rel, lo_thr = lo.of(n)
        idx.append((rel + (base + at)[lo.part]).reshape(-1))
        thr.append(lo_thr)
        at += n * np.array([1, 1, lo.n_layers, lo.n_layers, lo.n_ops, lo.n_ops])
        cuts.append(cuts[-1] + n * len(lo.thr))
    flat = values[np.concatenate(idx)]
    if not (np.diff(flat) >= np.concatenate(thr)[:-1]).all():
        return None
    # (each block's rows ascend: a template's least and greatest are its first and last rows')
    lows = np.minimum.reduceat(flat, cuts[:-1]).tolist()
    highs = np.maximum.reduceat(flat, cuts[:-1]).tolist()
    out = []
    for (tm, bl), a, z, low, high in zip(groups, cuts[:-1], cuts[1:], lows, highs, strict=True):
        nb = tm.nb
        if low < ((1 << (7 * (nb - 1))) if nb > 1 else 0) or high >= 1 << (7 * nb):
            return None
        out.append(flat[a:z].reshape(len(bl), -1))
    return out, flat, gids, du
