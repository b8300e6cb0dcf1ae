"""Where a flush's single rows go among its templated blocks' rows, without sorting the blocks'.

Sorting every row of a flush by its key (batch, ts, rank, tie, seq) would sort, on a device log,
some 32k block rows a flush for under 2k single rows. But a block's rows come out of its template
already in key order, and the blocks of a flush seldom interleave: in key order they form one
sorted sequence of rows, and each single row (the singles sorted among themselves first) only needs
its place in it. That place is found on (batch, ts) packed into one int64 by a binary search, and
where a single row's (batch, ts) equals some block rows', by comparing the rest of the key (rank,
tie, seq) with theirs. The places give the output as runs: a block's rows between two places, then
the single rows placed there.

``plan`` gives up (None) where the blocks interleave or (batch, ts) does not pack; ``merge`` then
sorts every row by its key.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .keysort import key_sort, packed
from .singles import key_order

_I64 = 1 << 63


class Plan:
    """The singles' order (``order``: indices into the singles' key columns) and each one's
    place (``pos``: how many block rows come before it), and the blocks in key order: each
    one's fill (``fill``), row in its fill's matrix (``row``) and first row among the blocks'
    rows in order (``starts``, with the number of block rows at the end)."""

    __slots__ = ("order", "pos", "fill", "row", "starts")

    def __init__(self, order: Any, pos: Any, fill: Any, row: Any, starts: Any) -> None:
        self.order, self.pos, self.fill, self.row, self.starts = order, pos, fill, row, starts


def plan(first: list[Any], fills: list[Any]) -> Plan | None:
    """The singles (``first``: their key columns, int64) placed among the blocks (``fills``:
    ``template_fill.fill``'s), or None if the blocks interleave or the keys do not pack."""
    if not fills:
        return None
    b_order, kb = _block_order(fills)
    if b_order is None:
        return None
    sizes = [len(f[2]) for f in fills]
    fill = np.repeat(np.arange(len(fills)), sizes)[b_order]
    row = (np.arange(len(b_order)) - np.repeat(np.cumsum(sizes) - sizes, sizes))[b_order]
    n_rows = np.array([len(f[3][3].keys[0]) for f in fills], dtype=np.int64)[fill]
    starts = np.concatenate(([0], np.cumsum(n_rows)))
    fl, rl = fill.tolist(), row.tolist()
    ts = np.concatenate([fills[f][3][2][r] for f, r in zip(fl, rl, strict=True)])
    s_batch, s_ts = first[0], first[1]
    n_s = len(s_batch)
    b_lo, b_hi = int(kb.min()), int(kb.max())
    t_lo, t_hi = int(ts.min()), int(ts.max())
    if n_s:
        b_lo, b_hi = min(b_lo, int(s_batch.min())), max(b_hi, int(s_batch.max()))
        t_lo, t_hi = min(t_lo, int(s_ts.min())), max(t_hi, int(s_ts.max()))
    span = t_hi - t_lo + 1
    if t_lo < 0 or (b_hi - b_lo + 1) * span >= _I64:
        return None
    # (batch, ts) as one int64: the blocks' rows, in order, are sorted by it
    off = (kb - b_lo) * span - t_lo  # (in int64: each of its values fits, as the sums do)
    g = np.repeat(off, n_rows)
    g += ts  # (in place: one array of the flush's block rows fewer to get from the allocator)
    order = key_sort(first)
    s = [c[order] for c in first]
    sg = (s[0] - b_lo) * span + (s[1] - t_lo)
    pos = np.searchsorted(g, sg, side="left")
    # (a single row whose (batch, ts) some block rows share: those come first at ``pos``)
    tied = np.flatnonzero(g[np.minimum(pos, len(g) - 1)] == sg)
    if len(tied):
        hi = np.searchsorted(g, sg[tied], side="right")
        pos[tied] += _below(s, tied, pos[tied], hi, fills, fill, row, starts)
    return Plan(order, pos, fill, row, starts)


def _block_order(fills: list[Any]) -> tuple[Any, Any]:
    """The blocks (their fills' in turn) in key order, and their batches in that order; None
    (twice) if a block's last key is not below the next one's first (they interleave)."""
    n = sum(len(f[2]) for f in fills)
    # (the usual: each block's last (batch, ts) below the next one's first, which orders them
    # by (batch, ts) alone; where two are equal, every part of the keys decides)
    b_ts = [np.concatenate([f[0][j] for f in fills] + [f[1][j] for f in fills]) for j in (0, 1)]
    p = packed(b_ts)
    if p is not None:
        order = np.argsort(p[:n], kind="stable")
        if (p[n:][order[:-1]] < p[:n][order[1:]]).all():
            return order, b_ts[0][order]
    # every block's first key, then every block's last: one int64 each where they fit
    both = [np.concatenate([f[0][j] for f in fills] + [f[1][j] for f in fills]) for j in range(5)]
    p = packed(both)
    if p is None:
        order = key_order([c[:n] for c in both], [c[n:] for c in both])
        return order, None if order is None else both[0][order]
    order = np.argsort(p[:n])  # (keys are distinct: any sort)
    if (p[n:][order[:-1]] >= p[:n][order[1:]]).any():
        return None, None
    return order, both[0][order]


def _below(
    s: list[Any], tied: Any, lo: Any, hi: Any, fills: list[Any], fill: Any, row: Any, starts: Any
) -> Any:
    """For the singles ``tied`` (their keys ``s``, in sorted order) whose (batch, ts) is that of
    the block rows ``lo`` to ``hi`` (in the blocks' order), how many of those rows' keys are
    below theirs (by rank, tie, seq)."""
    cnt = hi - lo
    n = int(cnt.sum())
    first_pair = np.cumsum(cnt) - cnt
    who = np.repeat(np.arange(len(tied)), cnt)  # each pair's single (among ``tied``)
    rows = np.arange(n) + np.repeat(lo - first_pair, cnt)  # and block row
    blk = np.searchsorted(starts, rows, side="right") - 1
    local = rows - starts[blk]
    keys = [f[3][3].keys for f in fills]  # per template: rank, tie, seq - seq0 of each row
    k_off = np.cumsum([0] + [len(k[0]) for k in keys])
    at = k_off[fill[blk]] + local
    rank = np.concatenate([k[0] for k in keys])[at]
    tie = np.concatenate([k[1] for k in keys])[at]
    seq0 = np.concatenate([f[3][1] for f in fills])
    f_off = np.cumsum([0] + [len(f[2]) for f in fills])
    seq = seq0[f_off[fill[blk]] + row[blk]] + np.concatenate([k[2] for k in keys])[at]
    sr, st, sq = (c[tied][who] for c in s[2:])
    below = (rank < sr) | ((rank == sr) & ((tie < st) | ((tie == st) & (seq < sq))))
    return np.add.reduceat(below.astype(np.int64), first_pair)
