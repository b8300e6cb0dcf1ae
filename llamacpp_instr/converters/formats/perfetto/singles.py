"""Rows encoded in bulk: the packets of many small rows at once, and units put in key order.

A flush of a log with devices holds many rows that no template covers (step slices, the
scheduler's splits, copies, command buffers, RPC graphs and network commands: about one for
every two ops). Framing them one packet at a time in Python cost as much as all the rest of the
writer; here every row's packet (``TRACE_PACKET``, its length, the row's fields, the timestamp,
``POST``) is made at once for all (``framed``), and where the single rows are few (a CPU log's)
the units of a flush (these rows and the templates' blocks) are put in key order one by one
(``join_units``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .packets import POST, Sequence, packet
from .protowire import (
    I64_END,
    MORE,
    TIMESTAMP,
    TRACE_PACKET,
    spread7,
    varint,
    varint_bytes,
    varint_len,
)

_U8 = np.uint8
# fewer single rows than this per templated block: ``join_units`` frames them one by one
FEW_ROWS = 8


def put_const(out: Any, pos: Any, data: bytes) -> None:
    """``data`` at each of the positions ``pos`` (an int64 array) of ``out``."""
    if len(data) > 1:  # (every byte at once)
        out[pos[:, None] + np.arange(len(data))] = np.frombuffer(data, dtype=_U8)
    elif data:
        out[pos] = data[0]


def put_varints(out: Any, pos: Any, v: Any, nb: Any) -> None:
    """The varints of the non-negative ``v`` (``nb`` bytes each: ``varint_len``) at ``pos``."""
    if not len(v):
        return
    lo = int(nb.min())
    for j in range(int(nb.max())):
        if j < lo:
            byte = ((v >> (7 * j)) & 0x7F).astype(_U8)
            more = nb - 1 > j
            out[pos + j] = byte | (more.astype(_U8) << 7)
        else:
            sel = nb > j
            byte = ((v[sel] >> (7 * j)) & 0x7F).astype(_U8)
            more = nb[sel] - 1 > j
            out[pos[sel] + j] = byte | (more.astype(_U8) << 7)


def framed(bodies: list[Any], ts: Any, bl: Any = None) -> tuple[Any, Any]:
    """Each row's packet, ``packet(body + TIMESTAMP + varint(ts) + POST)``, in one buffer (for
    timestamps in [0, 2**63)): the buffer and each packet's length. The bytes between two bodies
    (a packet's timestamp and ``POST``, the next one's tag and length: ``glue``) are made by
    numpy for every row at once, and the bodies (bytes-like) joined between them in one call:
    less than copying the bodies byte by byte into place with numpy, which needs an index per
    byte. ``bl``: the bodies' lengths, if known."""
    n = len(bodies)
    if bl is None:
        bl = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
    glue, plen = _glue(bl, ts)
    pieces: list[Any] = [None] * (2 * n + 1)
    pieces[0::2] = glue
    pieces[1::2] = bodies
    return np.frombuffer(b"".join(pieces), dtype=_U8), plen


# (``_glue`` keeps each piece's bytes in a fixed-width numpy string, which drops trailing zero
# bytes: a piece ends in a length's varint, never zero, or in ``POST``)
assert POST[-1] != 0


def _glue(bl: Any, ts: Any) -> tuple[list[bytes], Any]:
    """The bytes before the first body, between each two, and after the last, for bodies ``bl``
    bytes long with timestamps ``ts`` (in [0, 2**63)); and each packet's length."""
    n = len(bl)
    if n:
        nb = len(varint(int(ts.min())))
        if nb == len(varint(int(ts.max()))):  # (the usual: a flush spans far less than 2**49 ns)
            return _glue_even(bl, ts, nb)
    nts = varint_len(ts)
    tail = len(TIMESTAMP) + len(POST)
    size = bl + tail + nts
    n_size = varint_len(size)
    plen = len(TRACE_PACKET) + n_size + size
    w = tail + 10 + len(TRACE_PACKET) + 10  # a packet's end, and the next one's start
    mat = np.zeros((n + 1, w), dtype=_U8)
    flat = mat.reshape(-1)
    at = np.arange(w, (n + 1) * w, w)  # piece k + 1 starts with packet k's end
    put_const(flat, at, TIMESTAMP)
    put_varints(flat, at + len(TIMESTAMP), ts, nts)
    put_const(flat, at + len(TIMESTAMP) + nts, POST)
    at = np.arange(0, n * w, w)  # piece k ends with packet k's start
    at[1:] += tail + nts[:-1]
    put_const(flat, at, TRACE_PACKET)
    put_varints(flat, at + len(TRACE_PACKET), size, n_size)
    glue: list[bytes] = mat.view(f"S{w}").ravel().tolist()
    return glue, plen


def _glue_even(bl: Any, ts: Any, nb: int) -> tuple[list[bytes], Any]:
    """``_glue`` where every timestamp's varint is ``nb`` bytes long: each packet's end (the
    timestamp and ``POST``) then fits fixed columns, and the next one's start (its tag and
    length) the columns after them, shorter lengths padded with zeros: whole columns at a time."""
    n = len(bl)
    tail = len(TIMESTAMP) + nb + len(POST)
    size = bl + tail
    n_size = varint_len(size)
    plen = len(TRACE_PACKET) + n_size + size
    w = tail + len(TRACE_PACKET) + int(n_size.max())
    mat = np.zeros((n + 1, w), dtype=_U8)
    c = len(TIMESTAMP)
    mat[1:, :c] = np.frombuffer(TIMESTAMP, dtype=_U8)
    mat[1:, c : c + nb] = varint_bytes(ts, nb)
    mat[1:, c + nb : tail] = np.frombuffer(POST, dtype=_U8)
    c = tail + len(TRACE_PACKET)
    mat[:n, tail:c] = np.frombuffer(TRACE_PACKET, dtype=_U8)
    # (a byte past a length's last is 0: dropped with the padding)
    spread = spread7(size)
    spread |= MORE[n_size]
    mat[:n, c:] = spread.view(_U8).reshape(n, 8)[:, : w - c]
    glue: list[bytes] = mat.view(f"S{w}").ravel().tolist()
    glue[0] = TRACE_PACKET + varint(int(size[0]))  # (no packet's end before it)
    return glue, plen


def key_order(first: list[Any], last: list[Any]) -> Any:
    """The units' order by their first keys (columns: batch, ts, rank, tie, seq; all distinct),
    or None if one unit's last key is not below the next one's first (the units interleave)."""
    order = np.lexsort(first[::-1])
    if len(order) < 2:
        return order
    z = [c[order[:-1]] for c in last]
    f = [c[order[1:]] for c in first]
    less = np.zeros(len(order) - 1, dtype=bool)
    equal = np.ones(len(order) - 1, dtype=bool)
    for zc, fc in zip(z, f, strict=True):
        less |= equal & (zc < fc)
        equal &= zc == fc
    if not less.all():
        return None
    return order


def collect(rows: list[Any], batch: list[int], keys: list[list[Any]], picked: list[Any]) -> bool:
    """A flush's single rows (its batches' small rows that no block covers, ``batch`` the
    number of each one's batch): their keys put in ``keys`` (batch, ts, rank, tie, seq: lists,
    made arrays once per flush) and what makes their bodies in ``picked``; False if a timestamp
    is beyond int64 (the general encoder's ``encode_rows`` takes those)."""
    if not rows:
        return True
    cols = list(zip(*rows, strict=True))
    if max(cols[0]) >= I64_END:
        return False
    keys[0] += batch
    for j in range(4):
        keys[j + 1] += cols[j]
    picked.append((cols[4], cols[5]))
    return True


def frame_rows(
    picked: list[Any], ends: list[bytes], ts: Any, sc: Any = None, perm: Any = None
) -> tuple[Any, Any, Any]:
    """The bodies of the rows ``collect`` picked (a begin's S, or its track's end field), then
    of the segments' rows (``sc``: ``segments.SegColumns``, if any), and (unless ``ts`` is None)
    their packets (``framed``) with their lengths: in the order of the rows, or of ``perm``
    (the rows' indices) where given."""
    bodies: list[bytes] = []
    for s_, e_ in picked:
        bodies += [ends[e] if e >= 0 else s for s, e in zip(s_, e_, strict=True)]
    bl = None
    if sc is not None and len(sc) and ts is not None:
        bl = np.fromiter(map(len, bodies), dtype=np.int64, count=len(bodies))
        bl = np.concatenate((bl, sc.lens))  # (the segments' lengths are known)
        bl_b = sc.lens[0::2]
        src = sc.src  # (each segment begin's body: a slice of it)
        # (begin, end, begin...: an end's body is its end field itself, not a slice)
        b_at = sc.starts
        seg: list[Any] = [None] * len(sc.lens)
        seg[0::2] = map(src.__getitem__, map(slice, b_at.tolist(), (b_at + bl_b).tolist()))
        seg[1::2] = map(ends.__getitem__, sc.end_id.tolist())
        bodies += seg
    if not bodies or ts is None:
        return bodies, np.zeros(0, dtype=_U8), np.zeros(0, dtype=np.int64)
    each, ts_each = bodies, ts
    if perm is not None:
        each, ts_each = _pick(bodies, perm), ts[perm]
        bl = None if bl is None else bl[perm]
    if int(ts.min()) < 0:  # (an int64 field's negative varint: ten bytes)
        pk = [
            packet(bd + TIMESTAMP + varint(t) + POST)
            for bd, t in zip(each, ts_each.tolist(), strict=True)
        ]
        return (
            bodies,
            np.frombuffer(b"".join(pk), dtype=_U8),
            np.array([len(x) for x in pk], dtype=np.int64),
        )
    buf, lens = framed(each, ts_each, bl)
    return bodies, buf, lens


def _pick(items: list[Any], perm: Any) -> list[Any]:
    """``[items[u] for u in perm]``, in a few C loops (an object array: no int per item)."""
    if len(perm) < 2:
        return [items[u] for u in perm.tolist()]
    objs = np.fromiter(items, dtype=object, count=len(items))  # (each item as it is)
    got: list[Any] = objs[perm].tolist()
    return got


def interleaved(batch: Any, ts: Any, templated: Any) -> bool:
    """Whether a single row (its batch and timestamp) falls strictly inside a templated
    compute's slice, so inside its block's rows: the units would interleave (``key_order``
    would say so once the templates are filled; a device's busy stretches do, every step)."""
    spans = [(k, bl.cb.slice) for _, blist in templated for k, _, bl in blist]
    if not spans:
        return False
    kb = np.array([k for k, _ in spans], dtype=np.int64)
    lo = np.array([cs.ts for _, cs in spans], dtype=np.int64)
    hi = lo + np.array([cs.dur for _, cs in spans], dtype=np.int64)
    n, m = len(ts), len(spans)
    # one sort of every single row and every slice's start and end: a start after the rows
    # at its time, an end before them, so the rows between a start and its end are inside
    kind = np.concatenate((np.ones(n, np.int64), np.full(m, 2), np.zeros(m, np.int64)))
    order = np.lexsort((kind, np.concatenate((ts, lo, hi)), np.concatenate((batch, kb, kb))))
    before = np.cumsum(kind[order] == 1)  # single rows up to each position
    pos = np.empty(n + 2 * m, dtype=np.int64)
    pos[order] = np.arange(n + 2 * m)
    return bool((before[pos[n + m :]] > before[pos[n : n + m]]).any())


def join_units(
    keys: list[list[int]], bodies: list[bytes], fills: list[Any], seq: Sequence
) -> list[Any] | None:
    """The flush's packets (parts, ``sinks.Data``), its single rows (``keys``' columns,
    ``bodies``) framed one by one and put in key order with the templated blocks (``fills``:
    ``template_fill.fill``'s), or None if they interleave."""
    units: list[tuple[Any, Any, Any]] = []
    for key, body in zip(zip(*keys, strict=True), bodies, strict=True):
        units.append((key, key, packet(body + TIMESTAMP + varint(key[1]) + POST)))
    n_s = len(units)
    for f_keys, z_keys, tb, _ in fills:
        firsts = zip(*[c.tolist() for c in f_keys], strict=True)
        lasts = zip(*[c.tolist() for c in z_keys], strict=True)
        units += [(f, z, memoryview(r)) for f, z, r in zip(firsts, lasts, tb, strict=True)]
    order = sorted(range(len(units)), key=lambda u: units[u][0])
    for a, z in zip(order, order[1:], strict=False):
        if not units[a][1] < units[z][0]:
            return None
    out = [units[u][2] for u in order]
    if out and seq.needs_head():
        # the first packet defines what the batches intern (and clears the state if first)
        u = order[0]
        if u >= n_s:
            return None
        key = units[u][0]
        out[0] = packet(bodies[u] + TIMESTAMP + varint(key[1]) + seq.head())
    return out
