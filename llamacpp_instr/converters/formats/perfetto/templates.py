"""Templates: a compute seen again (every generation step) written from its previous packets.

A compute's rows (its slice, its layers' and its ops' begins and ends) form a ``Block`` of the
``Batch`` of its step. Once a block of the same key (track, args, layers, op variants) has been
seen twice, its packets are kept as bytes (a ``Template``) with the positions of every timestamp
and rate; a later block whose rows sort in the same order is written by copying the template and
putting its own timestamps and rates in place, thousands of packets in a few numpy operations.
"""

from __future__ import annotations

from itertools import compress
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from ...traces.sinks import Data
from .batch import Batch, Block
from .events import EventFields
from .merge import merge
from .ops import OpStore, RateFields
from .packets import POST, Sequence
from .protowire import TIMESTAMP, TRACE_PACKET, varint, varint_bytes, varint_len
from .segments import materialize, seg_columns
from .singles import FEW_ROWS, collect, frame_rows, interleaved, join_units
from .stacks import BIG, Layout, gather

TEMPLATE_BYTES = 64 << 20  # templates kept, at most (then forgotten, and learnt again)
_BATCH, _BLOCK, _SEQ0 = itemgetter(0), itemgetter(2), attrgetter("seq0")


class Template:
    """A block's packets as bytes, for blocks of the same key whose rows sort in the same order
    (``perm``, over the candidate rows: compute begin and end, layer begins, layer ends, op begins,
    op ends) and whose timestamps are all ``nb`` bytes long as varints: only the timestamps
    (at ``ts_idx``) and the ops' rates (at ``rate_idx``) change."""

    def __init__(self) -> None:
        self.perm: Any = None
        self.static_ok: Any = None  # per adjacent pair: (rank, tie, seq) ordered when ts equal
        self.first: tuple[int, int, int] = (0, 0, 0)  # (rank, tie, seq - seq0) of the first row
        self.last: tuple[int, int, int] = (0, 0, 0)
        self.buf: Any = None
        self.nb = 0
        self.ts_idx: Any = None  # per row, the positions of its timestamp's bytes
        self.rate_idx: Any = None  # per op, the positions of its rates' bytes
        self.row_off: Any = None  # where each row's packet starts in ``buf`` (and ``buf``'s end)
        self.keys: Any = None  # per row: rank, tie, seq - seq0 (``merge``)
        self.n_rates = 2  # rates per op (3 where the ops have a roof: all or none of a block)
        self.layout: Layout = None  # type: ignore[assignment]  # (``stacks.gather``'s)


def candidates(b: Batch, bl: Block) -> Any:
    """A block's timestamps in candidate order (compute begin and end, layer begins, layer
    ends, op begins, op ends), with its ops' gids and durations and its number of layers:
    ``(ts, gids, dur, n_layers)``; None unless every duration is positive (templates are made
    for those only: an end's rank depends on it)."""
    cs = bl.cb.slice
    spans = bl.cb.layers
    n_l = len(spans)
    if cs.dur <= 0 or any(lay.dur <= 0 for lay in spans):
        return None
    l_start = np.array([lay.start for lay in spans], dtype=np.int64)
    l_end = l_start + np.array([lay.dur for lay in spans], dtype=np.int64)
    if bl.group >= 0:
        _, gids, start, dur, _ = b.groups[bl.group]
        if int(dur.min()) <= 0:
            return None
        end = start + dur
    else:
        gids = start = end = dur = np.zeros(0, dtype=np.int64)
    ts = np.concatenate(([cs.ts, cs.ts + cs.dur], l_start, l_end, start, end))
    return ts, gids, dur, n_l


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


class TemplateSet:
    """The templates learnt so far (``learn``), and the batches encoded from them (``encode``)."""

    def __init__(
        self, store: OpStore, fields: RateFields, events: EventFields, seq: Sequence
    ) -> None:
        self.store = store
        self.fields = fields
        self.events = events
        self.seq = seq
        # per block key: its template, or how many times it was seen without one
        self.templates: dict[tuple[Any, ...], Template | int] = {}
        self.bytes = 0  # the templates' size
        self.templated = 0  # blocks encoded from a template

    def clear(self) -> None:
        self.templates.clear()
        self.bytes = 0

    def _build(self, b: Batch, bl: Block) -> Template | None:
        cand = candidates(b, bl)
        if cand is None:
            return None
        ts, gids, dur, n_l = cand
        m = len(gids)
        st = self.store.arrays()
        depth = st.a_depth[gids]
        ones, twos = np.ones(n_l, dtype=np.int64), np.full(n_l, 2, dtype=np.int64)
        rank = np.concatenate(([1, 0], ones, 0 * ones, np.ones(m, np.int64), np.zeros(m, np.int64)))
        tie = np.concatenate(([1, -1], twos, -twos, depth, -depth))
        ar_l, ar_m = np.arange(n_l, dtype=np.int64), np.arange(m, dtype=np.int64)
        seq = np.concatenate(([0, 1], 2 + 2 * ar_l, 3 + 2 * ar_l, 2 + 2 * n_l + 2 * ar_m))
        seq = np.concatenate((seq, 3 + 2 * n_l + 2 * ar_m))
        perm = np.lexsort((seq, tie, rank, ts))
        nbs = varint_len(ts)
        nb = int(nbs[0])
        if int(nbs.min()) != nb or int(nbs.max()) != nb or len(ts) < 2:
            return None
        n_rates = 3 if m and st.a_roofed[gids[0]] else 2
        if m and (st.a_roofed[gids] != (n_rates == 3)).any():
            return None  # (one graph's ops have one session's roof: never here)
        small = b.small
        e = self.events.ends[small[bl.i0 + 1][5]]
        d0 = self.fields.encode([np.zeros(1)] * n_rates)[0] if m else b""
        bodies = [small[bl.i0][4], e]
        track = bl.cb.slice.track
        bodies += [self.events.layer_begin(track, lay) for lay in bl.cb.layers] + [e] * n_l
        gl = gids.tolist()
        bodies += [self.store.s[g] + d0 + self.store.t[g] for g in gl] + [e] * m
        rate_off = self.fields.offsets(n_rates)  # where each rate's double sits in a D part
        out = bytearray()
        ts_off, rate_at, rate_op = [], [], []
        op0 = 2 + 2 * n_l
        row_off = []
        for r in perm.tolist():
            body = bodies[r]
            row_off.append(len(out))
            out += TRACE_PACKET + varint(len(body) + 1 + nb + len(POST))
            if op0 <= r < op0 + m:
                k = r - op0
                rate_at.append(len(out) + len(self.store.s[gl[k]]))
                rate_op.append(k)
            out += body + TIMESTAMP
            ts_off.append(len(out))
            out += bytes(nb) + POST
        tm = Template()
        tm.perm = perm
        r_, t_, s_ = rank[perm], tie[perm], seq[perm]
        tm.static_ok = (r_[:-1] < r_[1:]) | (
            (r_[:-1] == r_[1:]) & ((t_[:-1] < t_[1:]) | ((t_[:-1] == t_[1:]) & (s_[:-1] < s_[1:])))
        )
        tm.first = (int(r_[0]), int(t_[0]), int(s_[0]))
        tm.keys = (r_, t_, s_)
        tm.row_off = np.array(row_off + [len(out)], dtype=np.int64)
        tm.last = (int(r_[-1]), int(t_[-1]), int(s_[-1]))
        tm.buf = np.frombuffer(bytes(out), dtype=np.uint8)
        tm.nb = nb
        tm.ts_idx = np.array(ts_off, dtype=np.int64)[:, None] + np.arange(nb)
        eight = np.arange(8)
        by_op = np.argsort(np.array(rate_op, dtype=np.int64))  # rows in op order
        at = np.array(rate_at, dtype=np.int64)[by_op]
        tm.rate_idx = (at[:, None, None] + rate_off[None, :, None] + eight).reshape(m, 8 * n_rates)
        tm.n_rates = n_rates
        tm.layout = Layout(perm, tm.static_ok, n_l, m)
        return tm

    def _fill(self, groups: list[tuple[Template, list[tuple[int, Batch, Block]]]]) -> Any:
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
        rates: Any = self.store.rates(gids, durs) if sum(n_ops) else None
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

    def encode(self, batches: list[Batch]) -> Data | None:
        """The batches' packets with each compute from its template and the other rows framed
        in bulk (``singles``), or None if a compute has no template or its rows do not sort as
        the template's, or the first packet would be a compute's (the general encoder writes
        those)."""
        got = by_templates(batches, self.templates, self.events)
        if got is None:
            return None
        by_template, blocks, keys, first, picked, sc = got
        ends = self.events.ends
        n_s = len(first[0])
        fills = self._fill(list(by_template.values()))
        if fills is None:
            return None
        # single rows inside templated computes (a device's busy stretches) are merged row by
        # row, as are many single rows (a device log's: ``merge`` places them among the blocks'
        # rows, wherever they fall); a few not inside (a CPU log's) cost less one by one
        few = n_s < FEW_ROWS * blocks
        inter = few and bool(n_s) and interleaved(first[0], first[1], by_template.values())
        if few and not inter:
            if len(sc):  # (``join_units`` takes small rows)
                return self.encode([materialize(b, self.events) for b in batches])
            units = join_units(keys, frame_rows(picked, ends, None)[0], fills, self.seq)
            if units is not None:
                self.templated += blocks
                return units
        data = merge(first, picked, ends, fills, self.seq, sc)
        self.templated += blocks if data is not None else 0
        return data

    def learn(self, batches: list[Batch]) -> None:
        """Templates for the blocks seen more than once (a few tries each)."""
        if len(self.templates) > 4096 or self.bytes > TEMPLATE_BYTES:
            self.clear()
        for b in batches:
            for bl in b.blocks:
                v = self.templates.get(bl.key, 0)
                if isinstance(v, Template):
                    continue
                v += 1
                tm = self._build(b, bl) if 2 <= v <= 4 else None
                self.templates[bl.key] = tm if tm is not None else v
                if tm is not None:
                    self.bytes += len(tm.buf)


def by_templates(batches: list[Batch], templates: dict[Any, Any], events: EventFields) -> Any:
    """For ``TemplateSet.encode``: the blocks of ``batches`` by template, their number, the
    single rows' keys (lists: batch, ts, rank, tie, seq) and the same as arrays with the
    segments' rows after the others (``segments.seg_columns``), what makes the single rows'
    bodies (``singles.collect``) and the segments' columns; None if a block has no template, a
    group no block, or a timestamp is out of range."""
    by_template: dict[int, tuple[Template, list[tuple[int, Batch, Block]]]] = {}
    blocks = 0
    keys: list[list[Any]] = [[] for _ in range(5)]  # the single rows' batch, ts, rank, tie, seq
    picked: list[tuple[Any, Any]] = []  # the single rows' S and end id columns
    singles: list[Any] = []  # every batch's small rows not in a block, in one list
    batch_of: list[int] = []  # the number of each one's batch
    for k, b in enumerate(batches):
        small = b.small
        single = bytearray(b"\x01") * len(small)
        groups = 0
        for bl in b.blocks:
            tm = templates.get(bl.key)
            if not isinstance(tm, Template):
                return None
            got = by_template.get(id(tm))
            if got is None:
                got = by_template[id(tm)] = (tm, [])
            got[1].append((k, b, bl))
            blocks += 1
            single[bl.i0] = single[bl.i0 + 1] = 0
            groups += bl.group >= 0
        if groups != len(b.groups):
            return None
        n0 = len(singles)
        singles += compress(small, single)
        batch_of += [k] * (len(singles) - n0)
    if not collect(singles, batch_of, keys, picked):
        return None
    sc = seg_columns(batches, events)
    if sc is None:
        return None
    first = [np.concatenate((np.array(c, np.int64), z)) for c, z in zip(keys, sc.keys, strict=True)]
    return by_template, blocks, keys, first, picked, sc
