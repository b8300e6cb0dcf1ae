"""The general encoder: a flush's rows sorted and encoded in bulk with numpy.

Rows that no template covers (first steps, odd computes, everything interleaved) are sorted by
their key (``batch``: batch, timestamp, rank, depth tiebreak, sequence) and their packets
assembled from pieces: the static parts of each row (``OpStore``, end fields, small rows' bytes),
the ops' rates, and per row the "glue" (timestamp, sequence id and flags, the next packet's tag
and length) built as a byte matrix.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ...traces.op_args import op_rates
from .batch import Batch
from .events import EventFields
from .ops import OpStore, RateFields
from .packets import POST, Sequence, packet
from .protowire import TIMESTAMP, TRACE_PACKET, varint, varint_bytes, varint_len


def _small_columns(small: list[tuple[Any, ...]]) -> tuple[dict[str, list[Any]], list[bytes]]:
    """The key columns of every row, begun with the small rows' (each row: batch, ts, rank,
    tie, seq (the sort key); end id (end rows) or -1; gid (op begin rows) or -1; index among
    the small rows or -1), and the small rows' bytes."""
    cols: dict[str, list[Any]] = {
        k: [] for k in ("batch", "ts", "rank", "tie", "seq", "end", "gid", "small")
    }
    ns = len(small)
    s_objs: list[bytes] = []
    if ns:
        columns = [list(c) for c in zip(*small, strict=True)]
        s_objs = columns.pop(5)  # (batch, ts, rank, tie, seq, S, end id)
        for k, v in zip(("batch", "ts", "rank", "tie", "seq", "end"), columns, strict=True):
            cols[k].append(np.array(v, dtype=np.int64))
        cols["gid"].append(np.full(ns, -1, dtype=np.int64))
        cols["small"].append(np.arange(ns, dtype=np.int64))
    return cols, s_objs


class _Sorted(NamedTuple):
    """The sorted rows' columns the packets' lengths and pieces are made of."""

    end: Any
    gid: Any
    sm: Any
    is_e: Any
    is_op: Any
    g_safe: Any  # (an op row's gid, else 0)
    t_len: Any


def _bodies(store: OpStore, rows: _Sorted, e_len: Any, s_objs: list[bytes]) -> Any:
    """The length of each sorted row's packet body: an end row's END body, an op begin's S D
    T, a small row's bytes."""
    ns = len(s_objs)
    sm_len = np.array([len(x) for x in s_objs], dtype=np.int64) if ns else np.zeros(1, np.int64)
    g_safe, sm = rows.g_safe, rows.sm
    return np.where(
        rows.is_e,
        e_len[np.where(rows.is_e, rows.end, 0)],
        np.where(
            rows.is_op,
            store.a_slen[g_safe] + store.a_dlen[g_safe] + rows.t_len,
            sm_len[np.where(sm >= 0, sm, 0)],
        ),
    )


def _glue_rows(v: int, ts: Any, nxt_len: Any, nxt_e: Any, nxt_end: Any, e_mat: Any) -> list[bytes]:
    """``BulkEncoder._glue`` for rows whose timestamps are all ``v`` bytes long."""
    lnb = varint_len(nxt_len)
    c = 1 + v + len(POST)  # where the next packet's tag goes
    e_rows = np.flatnonzero(nxt_e)
    ew = e_mat.shape[1] if len(e_rows) else 0
    width = c + 1 + int(lnb.max()) + ew
    mat = np.zeros((len(ts), width), dtype=np.uint8)
    mat[:, 0] = TIMESTAMP[0]
    mat[:, 1 : 1 + v] = varint_bytes(ts, v)
    mat[:, 1 + v : c] = np.frombuffer(POST, dtype=np.uint8)
    mat[:, c] = np.where(nxt_len > 0, TRACE_PACKET[0], 0)  # none after the flush's last row
    for j in range(int(lnb.max())):
        byte = (nxt_len >> (7 * j)) & 0x7F
        mat[:, c + 1 + j] = np.where(lnb > j, byte | np.where(lnb - 1 > j, 0x80, 0), 0)
    if len(e_rows):  # an end packet's length is one byte, then its body
        mat[e_rows, c + 2 : c + 2 + ew] = e_mat[nxt_end[e_rows]]
    out: list[bytes] = mat.view(f"S{width}").ravel().tolist()
    return out


class BulkEncoder:
    """Batches of rows in, their packets out, in key order (``encode``; ``encode_rows`` for
    timestamps beyond int64)."""

    def __init__(
        self, store: OpStore, fields: RateFields, events: EventFields, seq: Sequence
    ) -> None:
        self.store = store
        self.fields = fields
        self.events = events
        self.seq = seq

    def encode(self, batches: list[Batch], small: list[tuple[Any, ...]]) -> bytes:
        """The packets of the batches' rows (``small``: every batch's small rows, each with its
        batch number first), sorted by their key."""
        store = self.store.arrays()
        cols, s_objs = _small_columns(small)
        m, d_objs = self._op_columns(batches, store, cols)
        ns = len(s_objs)
        a = {k: np.concatenate(v) for k, v in cols.items()}
        # (np.lexsort: these rows come begins, then ends, not in runs ``keysort`` merges fast)
        order = np.lexsort((a["seq"], a["tie"], a["rank"], a["ts"], a["batch"]))
        ts = a["ts"][order]
        end = a["end"][order]
        gid = a["gid"][order]
        sm = a["small"][order]
        is_e = end >= 0
        is_op = gid >= 0
        # which op begin (in the order the rates were computed) each sorted row is
        op_pos = np.full(2 * m + ns, -1, dtype=np.int64)
        op_pos[ns : ns + m] = np.arange(m, dtype=np.int64)
        op_pos = op_pos[order]
        g_safe = np.where(is_op, gid, 0)
        rows = _Sorted(end, gid, sm, is_e, is_op, g_safe, np.where(is_op, store.a_tlen[g_safe], 0))
        e_mat, e_len = self.events.end_matrix()
        nb_ts = varint_len(ts)
        plen = _bodies(store, rows, e_len, s_objs) + 1 + nb_ts + len(POST)  # the packet's length
        glue = self._glue(ts, nb_ts, plen, is_e, end, e_mat)
        pieces, first = self._pieces(store, rows, int(plen[0]), glue, (op_pos, d_objs), s_objs)
        if self.seq.needs_head():
            # the first packet defines what the batch interns (and clears the state if first)
            row0 = pieces[1:first].tolist()
            post = 1 + int(nb_ts[0]) + len(POST)
            content = (self.events.ends[end[0]] if is_e[0] else b"".join(row0)) + TIMESTAMP
            content += varint(int(ts[0])) + self.seq.head()
            pieces[0] = packet(content) + glue[0][post:]
            pieces[1 : first + 1] = b""
        return b"".join(pieces.tolist())

    def _op_columns(
        self, batches: list[Batch], store: OpStore, cols: dict[str, list[Any]]
    ) -> tuple[int, Any]:
        """The key columns of the batches' op rows (``cols``), a begin and an end row per op; the
        number of ops and the D part of each begin (its rates, ``_rate_objects``)."""
        groups = [(k, *g) for k, b in enumerate(batches) for g in b.groups]
        if not groups:
            return 0, None
        sizes = np.array([len(g[2]) for g in groups], dtype=np.int64)
        m = int(sizes.sum())
        gid = np.concatenate([g[2] for g in groups])
        start = np.concatenate([g[3] for g in groups])
        dur = np.concatenate([g[4] for g in groups])
        first = np.cumsum(sizes) - sizes
        base = np.repeat(np.array([g[1] for g in groups], dtype=np.int64) - 2 * first, sizes)
        seq_b = base + 2 * np.arange(m, dtype=np.int64)
        kb_o = np.repeat(np.array([g[0] for g in groups], dtype=np.int64), sizes)
        end_o = np.repeat(np.array([g[5] for g in groups], dtype=np.int64), sizes)
        depth = store.a_depth[gid]
        none = np.full(m, -1, dtype=np.int64)
        # begin rows, then end rows
        cols["batch"] += [kb_o, kb_o]
        cols["ts"] += [start, start + dur]
        cols["rank"] += [np.ones(m, dtype=np.int64), np.where(dur > 0, 0, 2)]
        cols["tie"] += [depth, -depth]
        cols["seq"] += [seq_b, seq_b + 1]
        cols["end"] += [none, end_o]
        cols["gid"] += [gid, none]
        cols["small"] += [none, none]
        return m, self._rate_objects(gid, dur)

    def _pieces(
        self,
        store: OpStore,
        rows: _Sorted,
        plen0: int,
        glue: Any,
        rates: tuple[Any, Any],
        s_objs: list[bytes],
    ) -> tuple[Any, int]:
        """The packets' pieces: [0x0a LEN (END body)] of row 0 (``plen0``: its packet's length),
        then per row its S D T (an op's begin), its bytes (a small row's) and its glue
        (``rates``: each row's op begin, and their D parts); and where row 0's glue is."""
        end, gid, sm, is_e, is_op = rows.end, rows.gid, rows.sm, rows.is_e, rows.is_op
        has_t = is_op & (rows.t_len > 0)
        cnt = 1 + np.where(is_e, 0, 1) + is_op + has_t
        off = np.cumsum(cnt) - cnt + 1
        pieces = np.empty(int(cnt.sum()) + 1, dtype=object)
        pieces[0] = TRACE_PACKET + varint(plen0) + (self.events.ends[end[0]] if is_e[0] else b"")
        op_pos, d_objs = rates
        if d_objs is not None:
            s_rows = np.flatnonzero(is_op)
            pieces[off[s_rows]] = store.a_s[gid[s_rows]]
            pieces[off[s_rows] + 1] = d_objs[op_pos[s_rows]]
            t_rows = np.flatnonzero(has_t)
            pieces[off[t_rows] + 2] = store.a_t[gid[t_rows]]
        if s_objs:
            sm_rows = np.flatnonzero((sm >= 0) & ~is_e)
            objs = np.empty(len(s_objs), dtype=object)
            objs[:] = s_objs
            pieces[off[sm_rows]] = objs[sm[sm_rows]]
        pieces[off + cnt - 1] = glue
        return pieces, int(off[0] + cnt[0] - 1)

    def _glue(self, ts: Any, nb_ts: Any, plen: Any, is_e: Any, end: Any, e_mat: Any) -> Any:
        """Per row: what follows its S D T (or END body) up to the next row's: its timestamp,
        sequence id and flags, then the next packet's tag and length, and its END body if it is
        an end row. The last byte is never zero (a flag's, a length's, a track event's)."""
        n = len(ts)
        nxt_len, nxt_e = np.append(plen[1:], 0), np.append(is_e[1:], False)
        nxt_end = np.append(end[1:], 0)
        if int(nb_ts.min()) == int(nb_ts.max()):  # all timestamps as long: one layout
            out = np.empty(n, dtype=object)
            out[:] = _glue_rows(int(nb_ts[0]), ts, nxt_len, nxt_e, nxt_end, e_mat)
            return out
        out = np.empty(n, dtype=object)
        for v in sorted(set(nb_ts.ravel().tolist())):
            r = np.flatnonzero(nb_ts == v)
            out[r] = _glue_rows(v, ts[r], nxt_len[r], nxt_e[r], nxt_end[r], e_mat)
        return out

    def _rate_objects(self, gid: Any, dur: Any) -> Any:
        """The D part of each op begin packet (its rates), as bytes objects."""
        rates = self.store.rates(gid, dur)
        encode = self.fields.encode
        objs = np.empty(len(gid), dtype=object)
        if len(rates) == 2:
            objs[:] = encode(rates)
            return objs
        roofed = self.store.a_roofed[gid]
        objs[~roofed] = encode([r[~roofed] for r in rates[:2]])
        objs[roofed] = encode([r[roofed] for r in rates])
        return objs

    def encode_rows(self, batches: list[Batch]) -> bytes:
        """``encode`` row by row, for timestamps beyond int64 (a damaged log)."""
        rows: list[tuple[int, int, int, int, int, bytes]] = []
        st = self.store
        ends = self.events.ends
        for k, batch in enumerate(batches):
            for ts, rank, tie, seq, s, e in batch.small:
                rows.append((k, ts, rank, tie, seq, ends[e] if e >= 0 else s))
            for seq0, gids, start, dur, e in batch.groups:
                for j, (r, s0, du) in enumerate(
                    zip(gids.tolist(), start.tolist(), dur.tolist(), strict=True)
                ):
                    rates = op_rates(st.flops[r], st.nbytes[r], du, st.ideal[r])
                    d = self.fields.encode([np.array([v]) for v in rates])[0]
                    depth = st.depth[r]
                    seq = seq0 + 2 * j
                    rows.append((k, s0, 1, depth, seq, st.s[r] + d + st.t[r]))
                    rows.append((k, s0 + du, 0 if du else 2, -depth, seq + 1, ends[e]))
        rows.sort(key=lambda e: e[:5])
        out = []
        for _, ts, _, _, _, body in rows:
            tail = self.seq.head() if self.seq.needs_head() else POST
            out.append(packet(body + TIMESTAMP + varint(ts) + tail))
        return b"".join(out)
