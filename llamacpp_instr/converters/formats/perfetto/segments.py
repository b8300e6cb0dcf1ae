"""A device log's rows kept as columns through a flush: a ``SliceRows`` (copies, command buffers,
RPC graphs, network commands: about one slice for every two ops) whose args share their names
becomes a ``Seg`` of its batch instead of two small rows per slice.

Made small rows, each slice cost a tuple per begin and end, a place among the begins that wait
(``begins``), its begin's bytes put back in its tuple, and its rows picked out again as columns
(``singles.collect``) and as a list of bodies (``singles.frame_rows``): several Python passes per
row, most of what the writer spent on a device log. A ``Seg`` keeps the ``SliceRows``' lists as
they are; at the flush its begins are encoded with the others of their category and arg names
(``Begins.encode`` gives each segment its range of the group's bytes), and the templated encoder
takes every segment's keys (batch, ts, rank, tie, seq) and bodies as arrays (``seg_columns``).
The paths that want small rows (the general encoder, ``join_units``) get them (``materialize``):
the same rows, so the same bytes.

What is interned is interned when the writer receives the rows, in the order ``add_rows`` did.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from ...traces.items import Slice, SliceRows
from .events import EventFields
from .protowire import fixed64_all, fixed64_ok


class GroupBytes:
    """The begins of a ``Begins.encode``: the bytes, and each row's start and length."""

    __slots__ = ("blob", "starts", "lens", "_data")

    def __init__(self, blob: Any, starts: Any, lens: Any) -> None:
        self.blob = blob
        self.starts = starts
        self.lens = lens
        self._data: bytes | None = None

    def data(self) -> bytes:
        """The bytes as ``bytes`` (made once: each batch that takes small rows slices them)."""
        if self._data is None:
            self._data = self.blob.tobytes()
        return self._data


class Seg:
    """Rows of a ``SliceRows`` in a batch (their seq from ``seq0`` on): their timestamps,
    durations and tracks, and where their begins' bytes are once encoded: from row ``off`` of
    their group (``grp``: a ``begins.Pending``, whose ``gb`` and ``r0`` say where its rows are)."""

    __slots__ = ("ts", "dur", "track", "depth", "seq0", "grp", "off")

    def __init__(
        self, ts: list[int], dur: list[int], track: list[int], depth: int, seq0: int
    ) -> None:
        self.ts = ts
        self.dur = dur
        self.track = track
        self.depth = depth
        self.seq0 = seq0
        self.grp: Any = None
        self.off = 0


def add_segs(b: Any, rows: SliceRows, begins: Any, events: EventFields) -> None:
    """``Writer.add_slice`` for each of ``rows`` into batch ``b``: each run of rows whose args
    have the same names and that end as many flows kept as a ``Seg`` (a row whose flow ids do
    not fit a fixed64 made small rows, its begin encoded now: ``EventFields.begin`` says so)."""
    n = len(rows.ts)
    if not n:
        return
    args = rows.args
    flows = rows.flows_in
    names = tuple(args[0])
    # (the usual: one run. Every row's arg names those of the first, in order: all the names
    # in one C loop, compared with the first row's repeated)
    if n == 1 or list(chain.from_iterable(args)) == list(names) * n:
        if not flows:
            _add(b, rows, rows.track, rows.name, args, 0, 0, begins, events, names)
            return
        if len(flows) == n and all(map(flows.__contains__, range(n))):
            counts = list(map(len, flows.values()))
            if counts.count(counts[0]) == n and fixed64_all(chain.from_iterable(flows.values())):
                each = counts[0]
                _add(b, rows, rows.track, rows.name, args, 0, each, begins, events, names)
                return
    keys = list(map(tuple, args))
    n_in = [0] * n
    fits = True
    for r, f in flows.items():
        if 0 <= r < n:  # (an entry beyond the rows is no row's)
            n_in[r] = len(f)
            fits = fits and fixed64_ok(f)
    if fits:
        # (every flow id fits: runs of rows with the same arg names and number of flows; a
        # device's command buffers: the first row unlike the others)
        cuts = [r for r in range(1, n) if keys[r] != keys[r - 1] or n_in[r] != n_in[r - 1]]
        for lo, hi in zip([0, *cuts], [*cuts, n], strict=True):
            add_seg(b, rows, lo, hi, begins, events, keys[lo])
        return
    lo = 0
    for r in range(n):
        if flows and not fixed64_ok(flows.get(r, ())):
            if lo < r:
                add_seg(b, rows, lo, r, begins, events, keys[lo])
            _flow_row(b, rows, r, events)
            lo = r + 1
        elif keys[r] != keys[lo] or n_in[r] != n_in[lo]:
            add_seg(b, rows, lo, r, begins, events, keys[lo])
            lo = r
    if lo < n:
        add_seg(b, rows, lo, n, begins, events, keys[lo])


def _flow_row(b: Any, rows: SliceRows, r: int, events: EventFields) -> None:
    """Row ``r`` of ``rows``, which ends flows, as the two small rows of batch ``b``."""
    tr, ts, dur, d = rows.track[r], rows.ts[r], rows.dur[r], rows.depth
    e = events.end_id(tr)
    it = Slice(tr, rows.name[r], ts, dur, d, rows.category, rows.args[r], (), rows.flows_in[r])
    seq = b.seq
    b.small.append((ts, 1, d, seq, events.begin(it), -1))
    b.small.append((ts + dur, 0 if dur else 2, -d, seq + 1, b"", e))
    b.seq += 2
    b.rows += 2


def add_seg(
    b: Any,
    rows: SliceRows,
    lo: int,
    hi: int,
    begins: Any,
    events: EventFields,
    ks: tuple[str, ...],
) -> None:
    """Rows ``lo`` to ``hi`` of ``rows``, whose args have the names ``ks``, as a ``Seg`` of
    batch ``b``."""
    if lo == 0 and hi == len(rows.ts):
        track, name, args = rows.track, rows.name, rows.args
    else:
        track, name, args = rows.track[lo:hi], rows.name[lo:hi], rows.args[lo:hi]
    flows = rows.flows_in
    n_in = len(flows.get(lo, ())) if flows else 0
    _add(b, rows, track, name, args, lo, n_in, begins, events, ks)


def _add(
    b: Any,
    rows: SliceRows,
    track: list[int],
    name: list[str],
    args: list[Any],
    lo: int,
    n_in: int,
    begins: Any,
    events: EventFields,
    ks: tuple[str, ...],
) -> None:
    """``add_seg`` for the rows from ``lo`` (``track``, ``name``, ``args``: theirs), each ending
    ``n_in`` flows. What is interned is interned in the order the rows would intern it one by
    one (the first row's name, then the arg names, then the other names as first met), and the
    rows' tracks get their end ids in the same order."""
    n = len(track)
    hi = lo + n
    whole = n == len(rows.ts)
    sg = Seg(
        rows.ts if whole else rows.ts[lo:hi],
        rows.dur if whole else rows.dur[lo:hi],
        track,
        rows.depth,
        b.seq,
    )
    interner = begins.interner
    known = interner.names
    if name[0] not in known:
        interner.name(name[0])
    key = (rows.category, ks, True, 0, n_in) if n_in else (rows.category, ks, True)
    g = begins.pending.get(key) or begins.group_of(rows.category, ks, True, 0, n_in)
    if not all(map(known.__contains__, name)):
        for s in dict.fromkeys(name):
            if s not in known:
                interner.name(s)
    end_ids = events.end_ids
    if not all(map(end_ids.__contains__, track)):
        for tr in dict.fromkeys(track):
            if tr not in end_ids:
                events.end_id(tr)
    sg.grp, sg.off = g, len(g.tracks)
    g.tracks += track
    g.names += name
    g.args += args
    if n_in:  # (each row of the segment ends as many flows)
        flows = rows.flows_in
        g.flows_out += [()] * n
        g.flows_in += [flows[r] for r in range(lo, hi)]
    g.seg = True
    b.segs.append(sg)
    b.seq += 2 * n
    b.rows += 2 * n


def materialize(b: Any, events: EventFields) -> Any:
    """Batch ``b``'s segments as small rows (after ``Begins.encode``), as ``add_rows`` makes
    them: for the paths that take small rows. Returns ``b``."""
    small = b.small
    for sg in b.segs:
        gb = sg.grp.gb
        assert gb is not None
        data = gb.data()
        d = sg.depth
        n = len(sg.ts)
        at = sg.grp.r0 + sg.off
        starts = gb.starts[at : at + n].tolist()
        lens = gb.lens[at : at + n].tolist()
        end_ids = events.end_ids
        seq = sg.seq0
        for ts, dur, tr, a, ln in zip(sg.ts, sg.dur, sg.track, starts, lens, strict=True):
            small.append((ts, 1, d, seq, data[a : a + ln], -1))
            small.append((ts + dur, 0 if dur else 2, -d, seq + 1, b"", end_ids[tr]))
            seq += 2
    b.segs = []
    return b


class SegColumns:
    """A flush's segment rows as columns, begin and end of each slice one after the other:
    their keys (batch, ts, rank, tie, seq), their bodies' lengths (``lens``), and where the
    bodies are: a begin's in ``src`` (bytes: the begins' encoding, ``GroupBytes.data``) from
    ``starts`` on (one per slice), an end's in ``EventFields.ends`` (``end_id``, one per slice)."""

    def __init__(self, keys: list[Any], src: bytes, starts: Any, lens: Any, end_id: Any) -> None:
        self.keys = keys
        self.src, self.starts, self.lens = src, starts, lens
        self.end_id = end_id

    def __len__(self) -> int:
        return len(self.keys[0])


def seg_columns(batches: list[Any], events: EventFields) -> SegColumns | None:
    """The segments of ``batches`` as columns (after ``Begins.encode``); None if an end is
    beyond int64 (the paths that take small rows handle those; a negative one is
    framed as the small rows' are, ``singles.frame_rows``)."""
    segs = [sg for b in batches for sg in b.segs]
    if not segs:
        return _NONE
    # (each attribute of every segment in one C loop)
    tss = list(map(_TS, segs))
    ns = np.fromiter(map(len, tss), dtype=np.int64, count=len(segs))
    total = int(ns.sum())
    try:
        ts = np.fromiter(chain.from_iterable(tss), np.int64, total)
        dur = np.fromiter(chain.from_iterable(map(_DUR, segs)), np.int64, total)
    except OverflowError:
        return None
    end = ts + dur
    if (((dur > 0) & (end < ts)) | ((dur < 0) & (end > ts))).any():  # (past int64: wrapped)
        return None
    tracks = chain.from_iterable(map(_TRACK, segs))
    # (every track has its end id: ``add_seg``)
    end_id = np.fromiter(map(events.end_ids.__getitem__, tracks), np.int64, total)
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(ns) - ns, ns)
    per_batch = np.fromiter(map(len, map(_SEGS, batches)), np.int64, len(batches))
    kb = np.repeat(np.repeat(np.arange(len(batches), dtype=np.int64), per_batch), ns)
    seq0 = np.fromiter(map(_SEQ0, segs), np.int64, len(segs))
    depth = np.fromiter(map(_DEPTH, segs), np.int64, len(segs))
    depth_r = np.repeat(depth, ns)
    seq_b = np.repeat(seq0, ns) + 2 * within
    keys = [
        pairs(kb, kb),
        pairs(ts, end),
        pairs(np.ones(total, np.int64), np.where(dur != 0, 0, 2)),
        pairs(depth_r, -depth_r),
        pairs(seq_b, seq_b + 1),
    ]
    # the bodies: begins from their encoding's bytes (``GroupBytes``: one per ``Begins.encode``,
    # made bytes once for the flushes it serves, not copied per flush), ends from the end fields
    e_lens = np.fromiter(map(len, events.ends), dtype=np.int64, count=len(events.ends))
    grps = list(map(_GRP, segs))
    gbs = list(map(_GB, grps))
    seg_row0 = np.fromiter(map(_R0, grps), np.int64, len(segs))
    seg_row0 += np.fromiter(map(_OFF, segs), np.int64, len(segs))
    gb0 = gbs[0]
    assert gb0 is not None
    if gbs.count(gb0) == len(gbs):  # (the usual: one encoding)
        src, g_starts, g_lens = gb0.data(), gb0.starts, gb0.lens
    else:  # (each encoding's rows after the others', their bytes joined)
        distinct = list({id(gb): gb for gb in gbs}.values())
        datas: list[bytes] = []
        row0: dict[int, int] = {}  # each encoding's first row among them all
        base, at, rows = [], 0, 0
        for gb in distinct:
            assert gb is not None
            row0[id(gb)] = rows
            base.append(at)
            datas.append(gb.data())
            at += len(datas[-1])
            rows += len(gb.lens)
        src = b"".join(datas)
        g_starts = np.concatenate([gb.starts + at for gb, at in zip(distinct, base, strict=True)])
        g_lens = np.concatenate([gb.lens for gb in distinct])
        seg_row0 += np.fromiter(map(row0.__getitem__, map(id, gbs)), np.int64, len(segs))
    idx = np.repeat(seg_row0, ns) + within
    lens = pairs(g_lens[idx], e_lens[end_id])
    return SegColumns(keys, src, g_starts[idx], lens, end_id)


_TS, _DUR, _TRACK = attrgetter("ts"), attrgetter("dur"), attrgetter("track")
_SEQ0, _DEPTH, _GRP, _OFF = (
    attrgetter("seq0"),
    attrgetter("depth"),
    attrgetter("grp"),
    attrgetter("off"),
)
_GB, _R0, _SEGS = attrgetter("gb"), attrgetter("r0"), attrgetter("segs")
_EMPTY = np.zeros(0, dtype=np.int64)
_NONE = SegColumns([_EMPTY] * 5, b"", _EMPTY, _EMPTY, _EMPTY)


def pairs(a: Any, z: Any, dtype: Any = np.int64) -> Any:
    """``a[0], z[0], a[1], z[1]``... (``a`` may be a scalar), without ``np.stack``'s passes."""
    out = np.empty(2 * len(z), dtype=dtype)
    out[0::2] = a
    out[1::2] = z
    return out
