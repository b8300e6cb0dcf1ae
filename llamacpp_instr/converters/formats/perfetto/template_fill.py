"""A flush's templated blocks written from their templates: each block's packets a copy of its
template's bytes with its own timestamps (as varints of the template's length) and its ops' rates
in place, every template's blocks at once (``fill``; the blocks' timestamps gathered and checked
together by ``stacks.gather``, else template by template: ``stacked``)."""

from __future__ import annotations

from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from .batch import Batch, Block
from .ops import OpStore
from .protowire import varint_bytes
from .stacks import BIG, gather
from .template import Template, candidates

_BATCH, _BLOCK, _SEQ0 = itemgetter(0), itemgetter(2), attrgetter("seq0")


def stacked(blocks: list[tuple[int, Batch, Block]]) -> Any:
    """``candidates`` of blocks of one template (the same layers and ops) at once: their
    timestamps as a matrix (a row per block), their ops' gids and durations one block after
    another; None unless every duration is positive. (One block at a time where a value is
    beyond 2**62, or the ops' times are Python ints.)"""
    n = len(blocks)
    n_l = len(blocks[0][2].cb.layers)
    heads = [bl.cb.slice for _, _, bl in blocks]
    lays = [(lay.start, lay.dur) for _, _, bl in blocks for lay in bl.cb.layers]
    grp = [b.groups[bl.group] for _, b, bl in blocks if bl.group >= 0]
    if len(lays) != n * n_l or len(grp) not in (0, n):
        return _each(blocks)
    try:
        c = np.array([[cs.ts for cs in heads], [cs.dur for cs in heads]], dtype=np.int64)
        lay = np.array(lays, dtype=np.int64).reshape(n, n_l, 2)
    except OverflowError:
        return _each(blocks)
    empty = np.zeros((n, 0), dtype=np.int64)
    st, du, gi = (np.stack([g[j] for g in grp]) for j in (2, 3, 1)) if grp else (empty,) * 3
    if st.dtype != np.int64 or du.dtype != np.int64:
        return _each(blocks)
    if any(x.size and (int(x.max()) >= BIG or int(x.min()) <= -BIG) for x in (c, lay, st, du)):
        return _each(blocks)
    if (c[1] <= 0).any() or (lay[..., 1] <= 0).any() or (du <= 0).any():
        return None
    l_start = lay[..., 0]
    ts = np.concatenate(
        (c[0][:, None], (c[0] + c[1])[:, None], l_start, l_start + lay[..., 1], st, st + du),
        axis=1,
    )
    return ts, gi.reshape(-1), du.reshape(-1)


def _each(blocks: list[tuple[int, Batch, Block]]) -> Any:
    """``stacked``, one block at a time."""
    cands = [candidates(b, bl) for _, b, bl in blocks]
    if any(c is None for c in cands):
        return None
    return (
        np.stack([c[0] for c in cands]),
        np.concatenate([c[1] for c in cands]),
        np.concatenate([c[2] for c in cands]),
    )


def _stacked_sorted(tm: Template, blocks: list[tuple[int, Batch, Block]]) -> Any:
    """``stacked`` with the timestamps in the template's row order: ``(ts, gids, durs)``; None
    if a block's rows do not sort as the template's, or a timestamp's varint is not ``nb``
    bytes long."""
    got = stacked(blocks)
    if got is None:
        return None
    ts, gids, durs = got
    ts = np.take(ts, tm.perm, axis=1)  # (C-ordered: its rows are read whole later)
    d = np.diff(ts, axis=1)
    if not ((d > 0) | ((d == 0) & tm.static_ok)).all():
        return None
    nb = tm.nb
    if int(ts[:, 0].min()) < (1 << (7 * (nb - 1)) if nb > 1 else 0):
        return None
    if int(ts[:, -1].max()) >= 1 << (7 * nb):
        return None
    return ts, gids, durs


def _varints(ts: list[Any], nbs: list[int], flat: Any = None) -> list[Any]:
    """``varint_bytes(ts[j], nbs[j])`` for each j: those of one length at once (all at once
    where they are one length and ``flat`` holds every ``ts[j]``, one after another)."""
    out: list[Any] = [None] * len(ts)
    if flat is not None and len(set(nbs)) == 1 and len(ts) > 1:
        vb = varint_bytes(flat, nbs[0])
        at = 0
        for j, x in enumerate(ts):
            out[j] = vb[at : at + x.size].reshape(x.shape + (nbs[0],))
            at += x.size
        return out
    for nb in dict.fromkeys(nbs):
        js = [j for j, x in enumerate(nbs) if x == nb]
        if len(js) == 1:  # (no copy: a CPU log's flush has one template)
            out[js[0]] = varint_bytes(ts[js[0]], nb)
            continue
        vb = varint_bytes(np.concatenate([ts[j].ravel() for j in js]), nb)
        at = 0
        for j in js:
            out[j] = vb[at : at + ts[j].size].reshape(ts[j].shape + (nb,))
            at += ts[j].size
    return out


def fill(groups: list[tuple[Template, list[tuple[int, Batch, Block]]]], store: OpStore) -> Any:
    """Each template's blocks' packets (``groups``: a template and its blocks): the columns
    of their first and last keys (batch, ts, rank, tie, seq) and their packets (a row of
    bytes per block), with what ``merge`` needs; None if the rows of one do not sort as its
    template's. The timestamps' varints and the ops' rates of every template at once (both
    are made value by value: a flush of a device log has a template per device)."""
    nbs = [tm.nb for tm, _ in groups]
    fast = gather(groups)
    if fast is None:
        return None
    if fast is not False:  # (the usual: every template's at once)
        ts_all, flat, gids, durs = fast
        vbs = _varints(ts_all, nbs, flat)
        n_ops = [len(tm.rate_idx) * len(bl) for tm, bl in groups]
    else:
        got = [_stacked_sorted(tm, blocks) for tm, blocks in groups]
        if any(g is None for g in got):
            return None
        ts_all = [g[0] for g in got]
        vbs = _varints(ts_all, nbs)
        with_ops = [j for j, (tm, _) in enumerate(groups) if len(tm.rate_idx)]
        n_ops = [len(g[1]) for g in got]
        if with_ops:
            gids, durs = (np.concatenate([got[j][c] for j in with_ops]) for c in (1, 2))
    rates: Any = store.rates(gids, durs) if sum(n_ops) else None
    fills = []
    at = 0  # the next template's first op among the rates
    every = [x for _, blocks in groups for x in blocks]  # (batches and seq0s: all at once)
    kb_all = np.fromiter(map(_BATCH, every), np.int64, len(every))
    seq0_all = np.fromiter(map(_SEQ0, map(_BLOCK, every)), np.int64, len(every))
    b0 = 0
    for (tm, blocks), ts, n_g, vb in zip(groups, ts_all, n_ops, vbs, strict=True):
        n = len(blocks)
        kb, seq0 = kb_all[b0 : b0 + n], seq0_all[b0 : b0 + n]
        b0 += n
        bufs = np.empty((n, len(tm.buf)), dtype=np.uint8)
        bufs[:] = tm.buf  # (a broadcast: cheaper than np.tile)
        bufs[:, tm.ts_idx] = vb
        m = len(tm.rate_idx)
        if m:
            k = tm.n_rates
            mine = np.empty((n_g, k), dtype="<f8")
            for r in range(k):
                mine[:, r] = rates[r][at : at + n_g]
            at += n_g
            bufs[:, tm.rate_idx] = mine.view(np.uint8).reshape(n, m, 8 * k)
        f, z = tm.first, tm.last
        first = [kb, ts[:, 0], np.full(n, f[0]), np.full(n, f[1]), seq0 + f[2]]
        last = [kb, ts[:, -1], np.full(n, z[0]), np.full(n, z[1]), seq0 + z[2]]
        fills.append((first, last, bufs, (kb, seq0, ts, tm)))
    return fills
