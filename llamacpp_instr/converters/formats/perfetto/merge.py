"""A flush with many single rows, or single rows inside templated blocks, merged row by row.

On a device, a compute's part and what the device timed of it overlap: a Vulkan device's
command buffers run while the device's ops do, so the step's single rows (splits, command
buffers) sort among the rows of the templated blocks, and a device log has about one single row
for every two ops. Each single row is placed among the blocks' rows (``inserts.plan``: the
blocks' rows are in key order already), and the packets are joined in runs from the templates'
filled buffers and the single rows' framed packets: the bytes the general encoder writes, which
sorts the same keys (batch, ts, rank, tie, seq), without encoding the blocks' rows one by one.
Where the blocks interleave, every row gets its key and one sort orders them all
(``merge_sorted``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...traces.sinks import Data
from .inserts import Plan, plan
from .keysort import key_sort
from .packets import Sequence, packet
from .protowire import TIMESTAMP, varint
from .segments import pairs
from .singles import frame_rows


def merge(
    first: list[Any],
    picked: list[Any],
    ends: list[bytes],
    fills: list[Any],
    seq: Sequence,
    sc: Any = None,
) -> Data | None:
    """The flush's packets (parts: ``sinks.Data``): its single rows (``first``: their key
    columns, ``picked``: what makes their bodies, ``singles.collect``'s) and the templated
    blocks (``fills``: ``template_fill.fill``'s) in key order; None if the first packet is a
    block's (it must carry the sequence's head: the general encoder writes it); ``sc``: the
    segments' rows (``segments.SegColumns``), after the others in ``first``. The single rows
    are placed among the blocks' (``inserts``), or where that cannot be, every row sorted."""
    p = plan(first, fills)
    if p is None:
        return merge_sorted(first, picked, ends, fills, seq, sc)
    return _placed(p, first, picked, ends, fills, seq, sc)


def _placed(
    p: Plan,
    first: list[Any],
    picked: list[Any],
    ends: list[bytes],
    fills: list[Any],
    seq: Sequence,
    sc: Any,
) -> Data | None:
    """``merge``'s packets from the singles' places among the blocks (``p``)."""
    n_s = len(first[0])
    s_ts = first[1]
    order, pos, starts = p.order, p.pos, p.starts
    bodies, sbuf, slen = frame_rows(picked, ends, s_ts, sc, order)  # (in their order)
    total = int(starts[-1])
    if not n_s and not total:
        return []
    head = b""
    s0 = 0  # the first single row after the head
    if seq.needs_head():
        # the first packet defines what the batches intern (and clears the state if first)
        if not n_s or int(pos[0]):
            return None
        u = int(order[0])
        head = packet(bodies[u] + TIMESTAMP + varint(int(s_ts[u])) + seq.head())
        s0 = 1
    cum = np.concatenate(([0], np.cumsum(slen)))
    pos = pos[s0:]
    # the single rows in groups, one per place: a group's first row and its place
    g_first = np.flatnonzero(np.diff(pos, prepend=-1))  # (places are never negative)
    g_end = np.concatenate((g_first[1:], [len(pos)]))
    g_pos = pos[g_first]
    # cuts in the blocks' rows: where a block starts, where single rows go
    cuts = np.sort(np.concatenate((starts[:-1], g_pos)))
    cuts = cuts[np.concatenate(([True], cuts[1:] != cuts[:-1]))]
    nxt = np.concatenate((cuts[1:], [total]))
    # at each cut, its group of single rows (if any) then the block rows up to the next cut
    gi = np.minimum(np.searchsorted(g_pos, cuts), len(g_pos) - 1)
    has_s = (g_pos[gi] == cuts) if len(g_pos) else np.zeros(len(cuts), dtype=bool)
    s_a = cum[s0 + g_first[gi]] if len(g_pos) else cuts
    s_z = cum[s0 + g_end[gi]] if len(g_pos) else cuts
    has_b = cuts < total
    blk = np.minimum(np.searchsorted(starts, cuts, side="right") - 1, len(p.fill) - 1)
    f = p.fill[blk]
    ro = np.concatenate([x[3][3].row_off for x in fills])  # each template's row starts, and end
    ro_at = np.cumsum([0] + [len(x[3][3].row_off) for x in fills])[f] - starts[blk]
    base = p.row[blk] * np.array([x[2].shape[1] for x in fills], dtype=np.int64)[f]
    b_a = base + ro[ro_at + np.minimum(cuts, total)]
    b_z = base + ro[ro_at + nxt]
    buf = pairs(0, f + 1)
    a = pairs(s_a, b_a)
    z = pairs(s_z, b_z)
    keep = pairs(has_s, has_b, bool)
    keep &= z > a
    mvs = [memoryview(sbuf)] + [memoryview(x[2].reshape(-1)) for x in fills]
    # (not joined here: the sink joins a bundle's parts once)
    parts: list[Any] = [head] if head else []
    parts += [
        mvs[k][i:j]
        for k, i, j in zip(buf[keep].tolist(), a[keep].tolist(), z[keep].tolist(), strict=True)
    ]
    return parts


def merge_sorted(
    first: list[Any],
    picked: list[Any],
    ends: list[bytes],
    fills: list[Any],
    seq: Sequence,
    sc: Any = None,
) -> Data | None:
    """``merge`` with every row's key built and sorted (blocks that interleave)."""
    n_s = len(first[0])
    s_ts = first[1]
    bodies, sbuf, slen = frame_rows(picked, ends, s_ts, sc)
    cols: list[list[Any]] = [[c] for c in first]
    bufs: list[Any] = [sbuf]
    starts: list[Any] = [np.cumsum(slen) - slen]
    lens: list[Any] = [slen]
    base = len(sbuf)
    for _, _, tb, (kb, seq0, ts, tm) in fills:
        n, size = tb.shape
        r_, t_, s_ = tm.keys
        nr = len(r_)
        cols[0].append(np.repeat(kb, nr))
        cols[1].append(ts.reshape(-1))
        cols[2].append(np.tile(r_, n))
        cols[3].append(np.tile(t_, n))
        cols[4].append((seq0[:, None] + s_[None, :]).reshape(-1))
        off = tm.row_off
        at = base + np.arange(n, dtype=np.int64)[:, None] * size + off[None, :-1]
        starts.append(at.reshape(-1))
        lens.append(np.tile(np.diff(off), n))
        bufs.append(tb.reshape(-1))
        base += tb.size
    keys = [np.concatenate(c).astype(np.int64, copy=False) for c in cols]
    if not len(keys[0]):
        return []
    order = key_sort(keys)
    at_o = np.concatenate(starts)[order]
    len_o = np.concatenate(lens)[order]
    head = b""
    if seq.needs_head():
        # the first packet defines what the batches intern (and clears the state if first)
        u = int(order[0])
        if u >= n_s:
            return None
        head = packet(bodies[u] + TIMESTAMP + varint(int(s_ts[u])) + seq.head())
        at_o, len_o = at_o[1:], len_o[1:]
    if not len(at_o):
        return [head]
    # runs of rows that lie one after another in one buffer (a block's rows between two
    # single rows), each joined as one slice of its buffer (the buffers are not joined first:
    # a copy of the flush, in memory the allocator may have to get afresh)
    bases = np.cumsum([0] + [len(b) for b in bufs])
    buf_o = np.searchsorted(bases, at_o, side="right") - 1
    brk = np.flatnonzero((at_o[1:] != at_o[:-1] + len_o[:-1]) | (buf_o[1:] != buf_o[:-1])) + 1
    first_o = np.concatenate(([0], brk))
    last = np.concatenate((brk, [len(at_o)])) - 1
    run_buf = buf_o[first_o]
    lo = (at_o[first_o] - bases[run_buf]).tolist()
    hi = (at_o[last] + len_o[last] - bases[run_buf]).tolist()
    mvs = [memoryview(b) for b in bufs]
    # (not joined here: the sink joins a bundle's parts once)
    parts: list[Any] = [head] if head else []
    parts += [mvs[k][a:z] for k, a, z in zip(run_buf.tolist(), lo, hi, strict=True)]
    return parts
