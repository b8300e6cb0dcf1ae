"""``device_time.step_time`` for every step of a session at once, in columns (``frames``' device
tables, ``analysis.frames_devices``): the same figures, from the same rows, without a Python
object per step, device or interval.

The rows come as the tables hold them (``StepRows``: the ops' and layer spans' devices, the
splits, copies, busy and remote rows and the commands, each row with the step it belongs to, by
position in the session); every figure is then a sum per step and device, or the measure of a
union of intervals per step (and device). ``step_time`` takes overlaps of merged interval lists;
for sets, |A ∩ B| = |A| + |B| - |A ∪ B|, so each overlap is a difference of union measures
(``union_measure``), and a union's measure is, its intervals sorted by start, the sum of what
each reaches beyond the furthest end before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..reading.decode.passes import Pass
from .device_time import Devices, measure, union

_I64 = np.int64
# the ``device_steps`` columns, in order
DEVICE_COLUMNS = tuple(
    "step kind device timed compute_ns share op_ns n_ops layer_ns n_layers outstanding_ns idle_ns"
    " gap_ns wait_ns copy_in_bytes copy_out_bytes copy_ns sent_bytes recv_bytes data_bytes net_ns"
    " n_cmds transfer_bytes transfer_ns".split()
)


def _a(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=_I64)


@dataclass
class StepRows:
    """What ``step_times`` reads: per step (by position ``g`` in the session) its index, kind,
    token count and window's start and end before its commands (``lo``, ``hi``), then the rows
    of every step, each with its step's position: ops (device, duration, count: a row may stand
    for several ops, their durations summed), layer spans (device: the CPU backend's for -1,
    layer, duration), splits (device, launch, end), busy and remote
    rows (device, split row: an index into the splits, -1 for none, start, end), copies (source,
    destination, bytes, start, duration) and commands (device, sent, received and tensor bytes,
    start, end). Empty columns may be empty lists."""

    index: Any
    kind: list[str]
    n_tokens: Any
    lo: Any
    hi: Any
    op: tuple[Any, Any, Any, Any] = ((), (), (), ())  # g, device, dur, count (ops grouped)
    layer: tuple[Any, Any, Any, Any] = ((), (), (), ())  # g, device, layer, dur
    split: tuple[Any, Any, Any, Any] = ((), (), (), ())  # g, device, launch, end
    busy: tuple[Any, ...] = ((), (), (), (), ())  # g, device, split row, start, end
    remote: tuple[Any, ...] = ((), (), (), (), ())  # g, device, split row, start, end
    copy: tuple[Any, ...] = ((), (), (), (), (), ())  # g, src, dst, bytes, start, dur
    cmd: tuple[Any, ...] = ((), (), (), (), (), (), ())  # g, device, sent, recv, bytes, start, end


def ready_at(step: Pass) -> int:
    """When a step's outputs were ready (host clock): ``llama_decode``'s return, or later the end of
    its last compute or the reply to its last command to an RPC server. ``llama_decode`` returns
    once an RPC server was sent the step's last graph and the read of its outputs was queued; the
    step's commands (its ``transfers`` rows, all issued inside the step and finished before its
    ``step_end`` was written) end with that read's reply, which comes once the server computed the
    graph. A step that did not end keeps its end. This is the end of ``token_time``'s window."""
    end = int(step.end)
    if not step.ended:
        return end
    for c in step.computes:
        end = max(end, c.start + c.dur)
    for t in step.transfers:
        rows, t0 = t.bulk_rows()
        if rows:
            end = max(end, t0 + max(row[9] for row in rows))
    return end


def union_measure(key: Any, a: Any, b: Any, n: int) -> np.ndarray:
    """Per key in ``[0, n)``: the measure of the union of its intervals ``[a, b)`` (empty ones
    left out), as ``measure(union(...))``."""
    out = np.zeros(n, _I64)
    key, a, b = _a(key), _a(a), _a(b)
    ok = b > a
    if not ok.all():
        key, a, b = key[ok], a[ok], b[ok]
    if not len(key):
        return out
    order = np.lexsort((a, key))
    key, a, b = key[order], a[order], b[order]
    first = np.ones(len(key), dtype=bool)
    first[1:] = key[1:] != key[:-1]
    starts = np.flatnonzero(first)
    seg = np.cumsum(first) - 1
    base = a[starts][seg]  # each key's first start: times relative to it are small
    ra, rb = a - base, b - base
    width = int(rb.max()) + 1
    if len(starts) * width >= 1 << 62:  # (a span too long to pack the keys apart: one by one)
        ks, lo, hi = key.tolist(), a.tolist(), b.tolist()
        bounds = [*starts.tolist(), len(ks)]
        for s, e in zip(bounds, bounds[1:], strict=False):
            out[ks[s]] = measure(union(list(zip(lo[s:e], hi[s:e], strict=True))))
        return out
    # the furthest end so far within each key (the keys packed apart: one running maximum)
    shift = seg * width
    run = np.maximum.accumulate(rb + shift) - shift
    prev = np.zeros(len(key), _I64)
    prev[1:] = run[:-1]
    prev[first] = 0  # (relative starts are >= 0)
    part = np.maximum(rb - np.maximum(ra, prev), 0)
    out[key[starts]] = np.add.reduceat(part, starts)
    return out


def _sum_at(n: int, key: Any, values: Any) -> np.ndarray:
    out = np.zeros(n, _I64)
    np.add.at(out, _a(key), _a(values))
    return out


def _distinct(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` of an int64 array, counted (``bincount``) when its values span a range
    not much wider than it is long: the keys and devices here are small dense integers, and
    counting them is several times quicker than sorting or hashing them."""
    if not len(a):
        return np.unique(a)
    lo, hi = int(a.min()), int(a.max())
    if hi - lo > 4 * len(a) + 4096:
        return np.unique(a)
    return (np.flatnonzero(np.bincount(a - lo, minlength=hi - lo + 1)) + lo).astype(_I64)


class _Lookup:
    """Positions of values in a sorted array of distinct ints (``np.searchsorted`` of values it
    holds), by a table over their range when it is not too wide; ``searchsorted`` itself for a
    value outside the table or not held."""

    def __init__(self, sorted_values: np.ndarray) -> None:
        self.values = sorted_values
        n = len(sorted_values)
        self.lo = int(sorted_values[0]) if n else 0
        span = int(sorted_values[-1]) - self.lo + 1 if n else 0
        self.table: np.ndarray | None = None
        if n and span <= 4 * n + 4096:
            self.table = np.full(span, -1, _I64)
            self.table[sorted_values - self.lo] = np.arange(n, dtype=_I64)

    def __call__(self, v: np.ndarray) -> np.ndarray:
        t = self.table
        if t is not None and len(v):
            i = v - self.lo
            if int(i.min()) >= 0 and int(i.max()) < len(t):
                at = t[i]
                if int(at.min()) >= 0:
                    return at
        return np.searchsorted(self.values, v)


class _Keys:
    """The (step, device) pairs met, dense: ``of(g, device)`` gives each its row; ``present``:
    those of ``shown``, the pairs with figures."""

    def __init__(
        self, devs: Devices, pairs: list[tuple[Any, Any]], shown: list[tuple[Any, Any]]
    ) -> None:
        gs = np.concatenate([_a(g) for g, _ in pairs])
        ds = np.concatenate([_a(d) for _, d in pairs])
        # devices in the machine's order (``Devices.order``): the rows' order within a step
        self.devices = devs.order(_distinct(ds).tolist())
        uniq = np.array(sorted(self.devices), _I64)
        rank = np.empty(len(uniq), _I64)
        rank[np.searchsorted(uniq, np.array(self.devices, _I64))] = np.arange(len(uniq))
        self.uniq, self.rank, self.nd = uniq, rank, max(len(uniq), 1)
        self.slot = _Lookup(uniq)
        self.keys = _distinct(self._code(gs, ds))
        self.at = _Lookup(self.keys)
        self.present = np.zeros(len(self.keys), dtype=bool)
        for g, d in shown:
            self.present[self.of(g, d)] = True

    def _code(self, g: Any, d: Any) -> np.ndarray:
        d = _a(d)
        slot = self.rank[self.slot(d)] if len(d) else d
        return _a(g) * self.nd + slot

    def of(self, g: Any, d: Any) -> np.ndarray:
        return self.at(self._code(g, d))

    def device_of_key(self) -> np.ndarray:
        """Each key's device."""
        return np.array(self.devices, _I64)[self.keys % self.nd] if len(self) else self.keys

    def __len__(self) -> int:
        return len(self.keys)


def _outstanding(
    split: tuple[np.ndarray, ...], timed: tuple[tuple[np.ndarray, ...], ...], lo: Any, hi: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each split from its launch to when its device was done with it (``timed``: the busy and
    remote rows, each ``(split row, start, end)``), clipped to its step's window: (start, end),
    and from its launch to its device's first start on it (and whether there was one)."""
    sg, s_launch, s_end = split
    last = s_end.copy()
    first = np.full(len(sg), np.iinfo(_I64).max, _I64)
    for row, start, end in timed:
        m = row >= 0
        np.maximum.at(last, row[m], end[m])
        np.minimum.at(first, row[m], start[m])
    started = first != np.iinfo(_I64).max
    oa, ob = np.maximum(s_launch, lo[sg]), np.minimum(last, hi[sg])
    return oa, ob, np.maximum(first - s_launch, 0), started


def _client_wait(
    k: _Keys, n_steps: int, cpu: int, work: tuple[np.ndarray, ...], busy: tuple[Any, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the CPU backend's compute (``work``: step, device, start, end); per key, the
    measure of its outstanding splits and commands (``busy``: keys, starts, ends) joined with the
    CPU backend's compute of its step, under each other device's key of the step."""
    n = len(k)
    wg, wd, wa, wb = work
    key_g = k.keys // k.nd
    key_d = k.device_of_key()
    cpu_w = wd == cpu
    cw_g, cw_a, cw_b = wg[cpu_w], wa[cpu_w], wb[cpu_w]
    order = np.argsort(cw_g, kind="stable")
    cw_g, cw_a, cw_b = cw_g[order], cw_a[order], cw_b[order]
    lo_i = np.searchsorted(cw_g, np.arange(n_steps), "left")
    cnt = np.searchsorted(cw_g, np.arange(n_steps), "right") - lo_i
    others = np.flatnonzero(key_d != cpu)
    reps = cnt[key_g[others]]
    src = np.repeat(lo_i[key_g[others]] - np.cumsum(reps) + reps, reps) + np.arange(reps.sum())
    m_cpu = union_measure(cw_g, cw_a, cw_b, n_steps)
    bk, ba, bb = busy
    m_wait = union_measure(
        np.concatenate([bk, np.repeat(others, reps)]),
        np.concatenate([ba, cw_a[src]]),
        np.concatenate([bb, cw_b[src]]),
        n,
    )
    return m_cpu, m_wait


def _n_layers(n: int, lk: np.ndarray, l_id: np.ndarray) -> np.ndarray:
    """Per key, the distinct layers its spans timed."""
    if not len(lk):
        return np.zeros(n, _I64)
    # the distinct (key, layer) pairs, packed one int each where they fit
    l_lo = int(l_id.min())
    width = int(l_id.max()) - l_lo + 1
    if n * width < 1 << 62:
        keys_of = _distinct(lk * width + (l_id - l_lo)) // width
    else:
        keys_of = np.unique(np.stack([lk, l_id]), axis=1)[0]
    return np.bincount(keys_of, minlength=n).astype(_I64)


def _sums(
    k: _Keys,
    op: tuple[np.ndarray, ...],
    layer: tuple[np.ndarray, ...],
    copy: tuple[Any, ...],
    cmd: tuple[np.ndarray, ...],
) -> dict[str, np.ndarray]:
    """The sums per step and device of the ops, layer spans, copies and commands."""
    n = len(k)
    og, od, o_dur, o_n = op
    lg, ld, l_id, l_dur = layer
    pg, p_src, p_dst, p_bytes, _, p_dur = copy
    cg, cd, c_sent, c_recv, c_bytes, _, _ = cmd
    ok, lk = k.of(og, od), k.of(lg, ld)
    ik, xk = k.of(pg, p_dst), k.of(pg, p_src)
    ck = k.of(cg, cd)
    return {
        "op_ns": _sum_at(n, ok, o_dur),
        "n_ops": _sum_at(n, ok, o_n),
        "layer_ns": _sum_at(n, lk, l_dur),
        "n_layers": _n_layers(n, lk, l_id),
        "copy_in_bytes": _sum_at(n, ik, p_bytes),
        "copy_out_bytes": _sum_at(n, xk, p_bytes),
        "copy_ns": _sum_at(n, ik, p_dur) + _sum_at(n, xk, p_dur),
        "sent_bytes": _sum_at(n, ck, c_sent),
        "recv_bytes": _sum_at(n, ck, c_recv),
        "data_bytes": _sum_at(n, ck, c_bytes),
        "n_cmds": np.bincount(ck, minlength=n).astype(_I64),
    }


def _step_parts(
    lo: np.ndarray, hi: np.ndarray, work: tuple[np.ndarray, ...], moves: tuple[np.ndarray, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Per step: the time any device computed (``work``: step, start, end) and the time something
    moved (``moves``: commands and copies, step, start, end, clipped to the step's window) while
    none computed."""
    n_steps = len(lo)
    wg, wa, wb = work
    mg, ma, mb = moves
    xa, xb = np.maximum(ma, lo[mg]), np.minimum(mb, hi[mg])
    every = union_measure(wg, wa, wb, n_steps)
    moving = union_measure(
        np.concatenate([mg, wg]), np.concatenate([xa, wa]), np.concatenate([xb, wb]), n_steps
    )
    return every, moving - every


def _window(r: StepRows) -> tuple[np.ndarray, np.ndarray]:
    """Per step, its window: from its start to its end or its last command's, if later."""
    lo, hi = _a(r.lo), _a(r.hi).copy()
    cg, c_end = _a(r.cmd[0]), _a(r.cmd[6])
    if len(cg):
        np.maximum.at(hi, cg, c_end)
    return lo, hi


def _work(
    cpu: int,
    split: tuple[np.ndarray, ...],
    busy: tuple[np.ndarray, ...],
    remote: tuple[np.ndarray, ...],
    lo: np.ndarray,
    hi: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What each device timed itself (a CPU split: from its launch to its return), clipped to its
    step's window: step, device, start, end."""
    sg, sd, s_launch, s_end = split
    bg, bd, _, b_start, b_end = busy
    rg, rd, _, r_start, r_end = remote
    cpu_split = sd == cpu
    wg = np.concatenate([bg, rg, sg[cpu_split]])
    wd = np.concatenate([bd, rd, sd[cpu_split]])
    wa = np.concatenate([b_start, r_start, s_launch[cpu_split]])
    wb = np.concatenate([b_end, r_end, s_end[cpu_split]])
    wa, wb = np.maximum(wa, lo[wg]), np.minimum(wb, hi[wg])
    return wg, wd, wa, wb


def _device_measures(
    k: _Keys,
    cpu: int,
    work: tuple[np.ndarray, ...],
    split: tuple[np.ndarray, ...],
    timed_rows: tuple[tuple[np.ndarray, ...], ...],
    cmd: tuple[np.ndarray, ...],
    window: tuple[np.ndarray, np.ndarray],
) -> dict[str, np.ndarray]:
    """The measures of unions per step and device: its compute (``work``), its splits outstanding
    (``split``; ``timed_rows``: the busy and remote rows, each ``(split row, start, end)``), the
    gap from a split's launch to its device's first start, the commands' time on the connection
    (``cmd``) less its own compute, and its outstanding time less its compute (idle) and less
    the CPU backend's compute (the client's wait)."""
    n = len(k)
    lo, hi = window
    wg, wd, wa, wb = work
    sg, sd, s_launch, s_end = split
    cg, cd, _, _, _, c_start, c_end = cmd
    wk = k.of(wg, wd)
    timed = np.zeros(n, dtype=bool)
    timed[wk] = True
    m_work = union_measure(wk, wa, wb, n)

    # outstanding: each split from its launch to when its device was done with it
    oa, ob, late, started = _outstanding((sg, s_launch, s_end), timed_rows, lo, hi)
    sk = k.of(sg, sd)
    ck = k.of(cg, cd)
    m_net_work = union_measure(np.concatenate([ck, wk]), np.concatenate([c_start, wa]),
                               np.concatenate([c_end, wb]), n)  # fmt: skip
    m_out = union_measure(sk, oa, ob, n)
    m_out_work = union_measure(np.concatenate([sk, wk]), np.concatenate([oa, wa]),
                               np.concatenate([ob, wb]), n)  # fmt: skip
    m_cpu, m_wait = _client_wait(
        k, len(lo), cpu, work,
        (np.concatenate([sk, ck]), np.concatenate([oa, c_start]), np.concatenate([ob, c_end])),
    )  # fmt: skip
    not_cpu = k.device_of_key() != cpu
    key_g = k.keys // k.nd
    return {
        "timed": timed,
        "compute_ns": m_work,
        "outstanding_ns": np.where(not_cpu, m_out, 0),
        "idle_ns": np.where(not_cpu & timed, m_out_work - m_work, 0),
        "gap_ns": _sum_at(n, sk[started], late[started]),
        "wait_ns": np.where(not_cpu, m_wait - m_cpu[key_g], 0),
        "net_ns": m_net_work - m_work,
    }


def _device_columns(
    r: StepRows,
    k: _Keys,
    devs: Devices,
    token: np.ndarray,
    m: dict[str, np.ndarray],
    sums: dict[str, np.ndarray],
) -> dict[str, Any]:
    """The ``device_steps`` columns, one row per step and device with figures (``present``)."""
    key_g = k.keys // k.nd
    tok = token[key_g]
    share = np.zeros(len(k), np.float64)
    np.divide(m["compute_ns"], tok, out=share, where=tok > 0)
    rpc = (sums["n_cmds"] > 0) | np.array([devs[d].is_rpc for d in k.devices], bool)[k.keys % k.nd]
    cols = {
        "step": _a(r.index)[key_g],
        "device": k.device_of_key(),
        "share": share,
        **m,
        **sums,
        "transfer_bytes": np.where(
            rpc,
            sums["sent_bytes"] + sums["recv_bytes"],
            sums["copy_in_bytes"] + sums["copy_out_bytes"],
        ),
        "transfer_ns": np.where(rpc, m["net_ns"], sums["copy_ns"]),
    }
    rows = np.flatnonzero(k.present)
    kinds = r.kind
    return {
        c: [kinds[g] for g in key_g[rows].tolist()] if c == "kind" else cols[c][rows]
        for c in DEVICE_COLUMNS
    }


def step_times(r: StepRows, devs: Devices) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``device_steps`` and ``token_time`` columns of ``r``'s steps (see the module doc):
    ``device_time.step_time``'s figures, row for row."""
    lo, hi = _window(r)
    op, layer, copy = tuple(map(_a, r.op)), tuple(map(_a, r.layer)), tuple(map(_a, r.copy))
    split, busy, remote, cmd = (tuple(map(_a, c)) for c in (r.split, r.busy, r.remote, r.cmd))
    pg, p_src, p_dst, _, p_start, p_dur = copy
    cg, cd, _, _, _, c_start, c_end = cmd
    # the devices with figures in a step (``step_time``'s ``get``), and those only timing work
    sg, sd = split[0], split[1]
    shown = [(op[0], op[1]), (layer[0], layer[1]), (pg, p_dst), (pg, p_src), (sg, sd), (cg, cd)]
    k = _Keys(devs, [*shown, (busy[0], busy[1]), (remote[0], remote[1])], shown)

    work = _work(devs.cpu, split, busy, remote, lo, hi)
    timed_rows = (busy[2:], remote[2:])
    m = _device_measures(k, devs.cpu, work, split, timed_rows, cmd, (lo, hi))
    # the step: any device computing, else anything moving (clipped), else the host
    token = hi - lo
    wg, _, wa, wb = work
    every, transfer = _step_parts(
        lo, hi, (wg, wa, wb), (np.concatenate([cg, pg]), np.concatenate([c_start, p_start]),
                               np.concatenate([c_end, p_start + p_dur]))
    )  # fmt: skip
    dev_cols = _device_columns(r, k, devs, token, m, _sums(k, op, layer, copy, cmd))
    token_cols = {
        "step": _a(r.index),
        "kind": list(r.kind),
        "n_tokens": _a(r.n_tokens),
        "t_start": lo,
        "token_ns": token,
        "compute_ns": every,
        "transfer_ns": transfer,
        "host_ns": token - every - transfer,
    }
    return dev_cols, token_cols
