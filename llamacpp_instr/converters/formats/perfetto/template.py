"""One template: a block's packets as bytes (``Template``), made from a block seen again
(``make_template``) with the positions of every timestamp and rate, so that a later block of the
same key whose rows sort in the same order is written by putting its own timestamps and rates in
place (``template_fill``; the templates learnt, and when: ``templates``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .batch import Batch, Block
from .events import EventFields
from .ops import OpStore, RateFields
from .packets import POST
from .protowire import TIMESTAMP, TRACE_PACKET, varint, varint_len
from .stacks import Layout


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


def make_template(
    b: Batch, bl: Block, store: OpStore, fields: RateFields, events: EventFields
) -> Template | None:
    """The template of block ``bl`` of ``b``: its packets made with ``store``, ``fields`` and
    ``events`` (the writer's); None where it cannot be one (``candidates``, its timestamps'
    varints of several lengths, its ops with and without a roof)."""
    cand = candidates(b, bl)
    if cand is None:
        return None
    ts, gids, dur, n_l = cand
    m = len(gids)
    st = store.arrays()
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
    e = events.ends[small[bl.i0 + 1][5]]
    d0 = fields.encode([np.zeros(1)] * n_rates)[0] if m else b""
    bodies = [small[bl.i0][4], e]
    track = bl.cb.slice.track
    bodies += [events.layer_begin(track, lay) for lay in bl.cb.layers] + [e] * n_l
    gl = gids.tolist()
    bodies += [store.s[g] + d0 + store.t[g] for g in gl] + [e] * m
    rate_off = fields.offsets(n_rates)  # where each rate's double sits in a D part
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
            rate_at.append(len(out) + len(store.s[gl[k]]))
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
