"""A flush whose single rows fall inside templated blocks, merged row by row.

On a device, a compute's part and what the device timed of it overlap: a Vulkan device's
command buffers run while the device's ops do, so the step's single rows (splits, command
buffers) sort among the rows of the templated blocks. ``singles.key_order`` puts whole units in
order and cannot; here every row, single or a block's, gets its key (batch, ts, rank, tie, seq:
a block's from its template's static keys and its own timestamps), one sort orders them all, and
their packets are joined from the templates' filled buffers in runs: the bytes the general
encoder writes, which sorts the same keys, without encoding the blocks' rows one by one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..sinks import Data
from .keysort import key_sort
from .packets import Sequence, packet
from .protowire import TIMESTAMP, varint
from .singles import frame_rows, join_units


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
    blocks (``fills``: ``TemplateSet._fill``'s) in key order; None if the first packet is a
    block's (it must carry the sequence's head: the general encoder writes it); ``sc``: the
    segments' rows (``segments.SegColumns``), after the others in ``first``."""
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


def joined(
    inter: bool,
    keys: list[list[int]],
    first: list[Any],
    picked: list[Any],
    ends: list[bytes],
    fills: list[Any],
    seq: Sequence,
    sc: Any = None,
) -> Data | None:
    """A flush with few single rows per templated block (a CPU log), or whose single rows fall
    inside the blocks (``inter``): the units framed one by one and put in key order
    (``singles.join_units``) where they do not interleave (there are no segments then: they
    were made small rows), else the rows merged (``merge``)."""
    data = None if inter else join_units(keys, frame_rows(picked, ends, None)[0], fills, seq)
    return data if data is not None else merge(first, picked, ends, fills, seq, sc)
