"""The analysis API: a session log as pandas DataFrames.

    from . import load_session
    s = load_session("session.log")
    s.ops.groupby("label", observed=True)["dur_ns"].sum().sort_values()

Tables (integer nanosecond timestamps and durations; names, ops and types are categoricals):

* ``steps`` — one row per ``llama_decode``: step, ctx, kind, n_tokens, pos0, pos1, t_start, dur_ns,
  status, n_outputs, kv_used, op_ns (sum of its op durations), ended; weight_bytes and kv_bytes
  (read by its graphs), and with peaks ideal_ns, roof_frac and roof (memory for generation, compute
  for prompt steps).
* ``layers`` — one row per layer span per compute: step, ubatch, layer, t_start, dur_ns, n_ops.
* ``ops`` — one row per timed op per compute, with its node's metadata joined: step, ubatch, graph,
  node, name, op, label, category, layer, t_start, dur_ns, n_fused, shape, dtype, weight,
  weight_type, est_flops, est_bytes; the roofline (``roofline.py``): intensity (FLOPs/byte),
  gflops_s, gbs (achieved), and, when peaks are cached for the machine that made the log
  (``instr peaks``; NaN otherwise), ideal_ns (the least time at the roofs), roof_frac, bound.
* ``nodes`` — the graph tables: graph, node, name, op, label, layer, shape, dtype, bytes, flags.
* ``weights`` — the weight inventory of session_start.
* ``tensor_stats`` (verbose) — step, ubatch, node, name, min, max, mean, std, n_nan, n_inf.
* ``topk`` (verbose) — step, row, rank, token, logit.

Built in one streaming pass over the records, with the session model's semantics (the same steps,
the same skipped records) but no Python object per op: the compact ``ops`` array of each
``compute`` record becomes one int64 block, and each op's node metadata (name, op, layer, shape,
weight, estimated FLOPs and bytes) is joined at the end by integer indexing into per-node columns
computed once per graph. Categorical columns keep their categories in order of first appearance.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import derive, peaks, roofline
from .errors import UserError
from .reader import ReadReport, iter_records
from .session import (
    MALFORMED,
    Graph,
    SessionInfo,
    _end_step,
    _graph,
    _info,
    _nn,
    _request_id,
    _seqs,
    _topk_rows,
    layer_rows,
    skip_malformed,
)

# what a record that parses but lacks the schema's shape raises (as in session.iter_events)
_INT64_MAX = (1 << 63) - 1


class _Cat:
    """A categorical column under construction: codes in an int32 array."""

    def __init__(self) -> None:
        self.codes = array("i")
        self.index: dict[str, int] = {}

    def append(self, value: str | None) -> None:
        if value is None:
            self.codes.append(-1)
            return
        code = self.index.get(value)
        if code is None:
            code = self.index[value] = len(self.index)
        self.codes.append(code)

    def series(self) -> pd.Categorical:
        return pd.Categorical.from_codes(self.codes, categories=list(self.index))  # type: ignore[arg-type]


def string_categories(col: pd.Series) -> pd.Series:
    """A categorical column whose (possibly empty) categories are typed as strings, so that an
    all-missing column (steps without a request) stays categorical through Parquet."""
    if len(col.cat.categories):
        return col
    return col.cat.set_categories(pd.Index([], dtype="str"))


def _nullable(values: np.ndarray) -> pd.arrays.IntegerArray:
    """int64 with -1 meaning missing -> nullable Int64 (as ``s.where(s >= 0).astype("Int64")``)."""
    mask = values < 0
    return pd.arrays.IntegerArray(np.where(mask, 1, values), mask)


class _Table:
    """Small tables row by row: ints (int64, -1 = missing for nullable ones), floats, categoricals."""

    def __init__(
        self, ints: str = "", floats: str = "", cats: str = "", nullable: str = ""
    ) -> None:
        self.ints = {c: array("q") for c in ints.split()}
        self.floats = {c: array("d") for c in floats.split()}
        self.cats = {c: _Cat() for c in cats.split()}
        self.nullable = set(nullable.split())
        self.order = ints.split() + floats.split() + cats.split()

    def add(self, **row: Any) -> None:
        for c, a in self.ints.items():
            v = row[c]
            a.append(-1 if v is None else int(v))
        for c, f in self.floats.items():
            v = row[c]
            f.append(float("nan") if v is None else float(v))
        for c, k in self.cats.items():
            k.append(None if row[c] is None else str(row[c]))

    def frame(self, order: list[str]) -> pd.DataFrame:
        data: dict[str, Any] = {}
        for c, a in self.ints.items():
            s = pd.Series(a, dtype="int64")
            data[c] = s.where(s >= 0).astype("Int64") if c in self.nullable else s
        for c, f in self.floats.items():
            data[c] = pd.Series(f, dtype="float64")
        for c, k in self.cats.items():
            data[c] = k.series()
        return pd.DataFrame({c: data[c] for c in order})


def _shape(shape: list[int]) -> str:
    return "x".join(map(str, shape))


@dataclass
class SessionFrames:
    """One session's tables (see the module docstring)."""

    info: SessionInfo
    steps: pd.DataFrame
    layers: pd.DataFrame
    ops: pd.DataFrame
    nodes: pd.DataFrame
    weights: pd.DataFrame
    tensor_stats: pd.DataFrame
    topk: pd.DataFrame
    seqs: pd.DataFrame = field(default_factory=pd.DataFrame)
    requests: pd.DataFrame = field(default_factory=pd.DataFrame)
    graphs: dict[int, Graph] = field(default_factory=dict)  # the node tables, with their sources
    report: ReadReport = field(default_factory=ReadReport)
    # the peaks of the machine that made the log (roofline.py), or why there are none
    peaks: Any = None
    peaks_note: str = ""

    TABLES = (
        "steps",
        "layers",
        "ops",
        "nodes",
        "weights",
        "tensor_stats",
        "topk",
        "seqs",
        "requests",
    )

    def tables(self) -> dict[str, pd.DataFrame]:
        return {name: getattr(self, name) for name in self.TABLES}


# --- the records, folded as session.iter_events folds them, with compact computes ---------------

_EMPTY_OPS = np.zeros((3, 0), np.int64)
_EMPTY_I64 = np.zeros(0, np.int64)


class _Compute:
    """One compute record. ``ops`` is a (3, n) int64 block (node positions, start offsets from
    t_start, durations) of the ops the session model keeps (node inside the graph);
    ``fused_row`` and ``fused_node`` list each fused node (a row of ``ops``, a node position);
    ``stats`` maps a node index to its tensor statistics (verbose)."""

    __slots__ = (
        "ubatch", "start", "dur", "graph", "layers", "ops", "fused_row", "fused_node", "stats"
    )  # fmt: skip

    def __init__(
        self,
        ubatch: Any,
        start: int,
        dur: int,
        graph: Graph | None,
        layers: np.ndarray,
        ops: np.ndarray,
        fused_row: np.ndarray,
        fused_node: np.ndarray,
    ) -> None:
        self.ubatch = ubatch
        self.start = start
        self.dur = dur
        self.graph = graph
        self.layers = layers  # (m, 4) int64: layer, absolute start, dur, n_ops
        self.ops = ops
        self.fused_row = fused_row
        self.fused_node = fused_node
        self.stats: dict[Any, tuple[Any, ...]] | None = None


class _Step:
    __slots__ = (
        "index", "ctx", "kind", "n_tokens", "pos", "start", "dur", "status", "n_outputs",
        "kv_used", "computes", "topk", "ended", "request", "seqs",
    )  # fmt: skip

    def __init__(
        self, index: int, ctx: int, kind: str, n_tokens: int, pos: tuple[int, int], start: int
    ) -> None:
        self.index = index
        self.ctx = ctx
        self.kind = kind
        self.n_tokens = n_tokens
        self.pos = pos
        self.start = start
        self.dur = 0
        self.status: int | None = None
        self.n_outputs = 0
        self.kv_used = -1
        self.computes: list[_Compute] = []
        self.topk: list[dict[str, Any]] = []
        self.ended = False
        self.request: str | None = None
        self.seqs: list[tuple[int, int, int, int]] = []


class _State:
    def __init__(self, info: SessionInfo) -> None:
        self.info = info
        self.graphs: dict[tuple[int, int], Graph] = {}
        self.open_steps: dict[tuple[int, int], _Step] = {}


def _ops_slow(
    ops: Any, graph: Graph | None, threads: Any, t0: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """session._compute's loop, entry by entry: raises exactly what it raises."""
    n_nodes = len(graph.nodes) if graph is not None else 0
    kept: list[tuple[int, int, int]] = []
    f_row: list[int] = []
    f_node: list[int] = []
    for k, entry in enumerate(ops):
        i, off, dur = int(entry[0]), _nn(entry[1]), _nn(entry[2])
        if graph is None or not 0 <= i < n_nodes:
            continue
        if len(entry) > 3:
            for j in entry[3]:
                if 0 <= int(j) < n_nodes:
                    f_row.append(len(kept))
                    f_node.append(int(j))
        if threads and k < len(threads):
            [int(x) for x in threads[k]]
        kept.append((i, off, dur))
    if kept and t0 + max(o for _, o, _ in kept) > _INT64_MAX:
        raise OverflowError("op start beyond 64 bits")  # as the per-op tables raised
    block = np.array(kept, np.int64).reshape(-1, 3).T.copy()
    return block, np.array(f_row, np.int64), np.array(f_node, np.int64)


def _longer(ops: list[Any]) -> list[int] | None:
    """Where the entries of more than three values (fused ops) are; None if some have fewer."""
    lens = list(map(len, ops))
    n3 = lens.count(3)
    if n3 == len(lens):
        return []
    if n3 + lens.count(4) == len(lens):  # the usual: some fused ops, [i, off, dur, [j, ...]]
        longer = []
        k = -1
        index = lens.index
        try:
            while True:
                k = index(4, k + 1)
                longer.append(k)
        except ValueError:
            return longer
    if min(lens) < 3:
        return None
    return [k for k, n in enumerate(lens) if n != 3]


def _ops_fast(
    ops: Any, graph: Graph | None, threads: Any, t0: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The same as ``_ops_slow`` in bulk, or None when anything is unusual (the slow path then
    raises what the session model raises, or handles the odd value the same way)."""
    if type(ops) is not list:
        return None
    n = len(ops)
    if n == 0:
        return _EMPTY_OPS, _EMPTY_I64, _EMPTY_I64
    try:
        longer = _longer(ops)
        if longer is None:
            return None  # an entry with fewer than three values
        heads = ops
        if longer:
            heads = ops.copy()
            for k in longer:
                heads[k] = ops[k][:3]
        # array("q") takes only ints (a float, a string or a list is a TypeError: slow path).
        # (No per-op Python objects that the garbage collector tracks: they would make it run.)
        flat = np.frombuffer(array("q", list(chain.from_iterable(heads))), np.int64)
        if len(flat) != 3 * n:
            return None
        del heads
        block = flat.reshape(n, 3).T  # node positions, start offsets, durations
        lo = int(flat.min())
        if lo < 0 and block[1:].min() < 0:
            return None  # a negative time: the slow path raises the session model's message
        if graph is None:
            return _EMPTY_OPS, _EMPTY_I64, _EMPTY_I64
        n_nodes = len(graph.nodes)
        if t0 + int(flat.max()) > _INT64_MAX and t0 + int(block[1].max()) > _INT64_MAX:
            return None
        all_kept = lo >= 0 and int(block[0].max()) < n_nodes
        keep = None
        if not all_kept:
            idx = block[0]
            keep = (idx >= 0) & (idx < n_nodes)
        if threads:
            if type(threads) is not list:
                return None
            t = np.array(threads, dtype=np.int64)  # every row converts, so the kept ones do
            if t.ndim != 2:
                return None
        f_row = f_node = _EMPTY_I64
        fk = [k for k in longer if keep is None or keep[k]]
        if fk:
            subs = [ops[k][3] for k in fk]
            flen = np.fromiter(map(len, subs), np.intp, len(subs))
            f_node = np.frombuffer(array("q", chain.from_iterable(subs)), np.int64)
            rows = np.array(fk, np.int64)
            if keep is not None:
                rows = (np.cumsum(keep) - 1)[rows]
            f_row = np.repeat(rows, flen)
            ok = (f_node >= 0) & (f_node < n_nodes)
            if not ok.all():
                f_row, f_node = f_row[ok], f_node[ok]
        if keep is not None:
            block = block[:, keep]
        return block, f_row, f_node
    except (TypeError, ValueError, OverflowError, IndexError, KeyError, AttributeError):
        return None


def _layers(layers: Any, t0: int) -> np.ndarray:
    a = layer_rows(layers, t0)
    if a is not None:
        return a
    rows = [(int(a), t0 + _nn(b), _nn(c), int(d)) for a, b, c, d in layers]
    return np.array(rows, np.int64).reshape(-1, 4)


def _compute(rec: dict[str, Any], graph: Graph | None) -> _Compute:
    t0 = _nn(rec["t_start"])
    ops = rec.get("ops", [])
    threads = rec.get("threads")
    parsed = _ops_fast(ops, graph, threads, t0)
    if parsed is None:
        parsed = _ops_slow(ops, graph, threads, t0)
    block, f_row, f_node = parsed
    layers = _layers(rec["layers"], t0)
    # the remaining fields, read and checked in the session model's order
    rec["step"]
    ubatch = rec["ubatch"]
    dur = _nn(rec["dur"])
    int(rec["n_tokens"]), int(rec.get("n_threads", 0)), int(rec.get("status", 0))
    return _Compute(ubatch, t0, dur, graph, layers, block, f_row, f_node)


def _attach_stats(computes: list[_Compute], rec: dict[str, Any]) -> None:
    by_node: dict[Any, tuple[Any, ...]] | None = None
    for c in computes:
        if c.ubatch == int(rec["ubatch"]):
            if by_node is None:
                by_node = {row[0]: tuple(row[1:]) for row in rec["stats"]}
            if c.stats is None:
                c.stats = dict(by_node)
            else:
                c.stats.update(by_node)


_Event = tuple[SessionInfo, _Step | None]  # (session, None) when it starts, else a finished step


def _events(path: Path | str, strict: bool, report: ReadReport) -> Iterator[_Event]:
    """session.iter_events, with compact steps (the same steps, the same skipped records)."""
    states: dict[str, _State] = {}
    for n, rec in iter_records(path, strict=strict, report=report):
        try:
            yield from _apply(rec, states)
        except MALFORMED as exc:
            skip_malformed(path, n, rec, exc, strict, report)
    for state in states.values():
        yield from _close(state, state.info.last_ts)


def _apply(rec: dict[str, Any], states: dict[str, _State]) -> Iterator[_Event]:
    rtype = rec["type"]
    sid = str(rec["sid"])
    if rtype == "session_start":
        st = _State(_info(rec))
        states[sid] = st
        yield st.info, None
        return
    state = states.get(sid)
    if state is None:
        return
    state.info.last_ts = max(state.info.last_ts, _nn(rec["ts"]))
    if rtype == "compute":
        step = state.open_steps.get((int(rec["ctx"]), int(rec["step"])))
        if step is not None:
            graph = state.graphs.get((int(rec["ctx"]), int(rec["graph"])))
            step.computes.append(_compute(rec, graph))
    elif rtype == "graph":
        g = _graph(rec)
        state.graphs[(g.ctx, g.id)] = g
    elif rtype == "step_begin":
        key = (int(rec["ctx"]), int(rec["step"]))
        step = _Step(
            index=int(rec["step"]),
            ctx=int(rec["ctx"]),
            kind="gen" if rec["kind"] == "gen" else "prompt",
            n_tokens=int(rec["n_tokens"]),
            pos=(int(rec["pos"][0]), int(rec["pos"][1])),
            start=_nn(rec["ts"]),
        )
        [int(t) for t in rec.get("tokens", [])]  # checked as the session model checks them
        [str(x) for x in rec.get("pieces", [])]
        step.request = _request_id(rec)
        step.seqs = _seqs(rec)
        state.open_steps[key] = step
    elif rtype == "request":
        state.info.requests.append(rec)
    elif rtype == "tensor_stats":
        step = state.open_steps.get((int(rec["ctx"]), int(rec["step"])))
        if step is not None:
            _attach_stats(step.computes, rec)
    elif rtype == "topk":
        step = state.open_steps.get((int(rec["ctx"]), int(rec["step"])))
        if step is not None:
            step.topk = _topk_rows(rec)
    elif rtype == "step_end":
        step = state.open_steps.pop((int(rec["ctx"]), int(rec["step"])), None)
        if step is not None:
            _end_step(step, rec)
            yield state.info, step
    elif rtype == "session_end":
        yield from _close(state, rec["ts"])
        state.info.end = rec
        del states[sid]


def _close(state: _State, ts: int) -> Iterator[_Event]:
    for step in state.open_steps.values():
        last = max([step.start] + [c.start + c.dur for c in step.computes])
        step.dur = max(ts, last) - step.start
        step.ended = False
        yield state.info, step
    state.open_steps.clear()


class _Chunks:
    """Rows of three int64 columns, appended in blocks, kept in chunks of 64k rows: big enough
    to be memory-mapped on their own, so freeing them hands the memory back to the system."""

    SIZE = 1 << 16

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.fill = 0  # rows used in the last chunk

    def add(self, block: np.ndarray, offset: int, t0: int) -> None:
        """Append ``block`` (3, n) as (node position + offset, start offset + t0, dur)."""
        done, m = 0, block.shape[1]
        while done < m:
            if not self.chunks or self.fill == self.chunks[-1].shape[1]:
                self.chunks.append(np.empty((3, self.SIZE), np.int64))
                self.fill = 0
            ch = self.chunks[-1]
            take = min(m - done, ch.shape[1] - self.fill)
            part = block[:, done : done + take]
            rows = slice(self.fill, self.fill + take)
            np.add(part[0], offset, out=ch[0, rows])
            np.add(part[1], t0, out=ch[1, rows])
            ch[2, rows] = part[2]
            done += take
            self.fill += take

    def column(self, k: int, dtype: Any = np.int64) -> np.ndarray:
        if not self.chunks:
            return np.zeros(0, dtype)
        parts = [ch[k] for ch in self.chunks[:-1]] + [self.chunks[-1][k, : self.fill]]
        return np.concatenate(parts, dtype=dtype, casting="unsafe")


def _keys(a: array, width: int) -> np.ndarray:
    return np.array(a, np.int64).reshape(-1, width)


def _column(a: array, dtype: Any = np.int64) -> np.ndarray:
    return np.array(a, dtype)


# --- the tables ----------------------------------------------------------------------------------

_OP_CATS = "name op label category shape dtype weight weight_type".split()


class _GraphMeta:
    """Where a graph's nodes start in the builder's per-node columns, and their FLOPs and bytes."""

    def __init__(self, offset: int, errors: dict[int, Exception]) -> None:
        self.offset = offset
        self.errors = errors  # node position -> what joining its metadata raised


class _Builder:
    STEP_COLS = (
        "step ctx kind n_tokens pos0 pos1 t_start dur_ns status n_outputs kv_used op_ns ended "
        "request"
    ).split()
    SEQ_COLS = "step ctx seq n_tokens pos0 pos1".split()
    REQUEST_COLS = (
        "id endpoint method status stream t_arrive wait_ns ttft_ns model_ns dur_ns "
        "prompt_tokens gen_tokens"
    ).split()
    LAYER_COLS = "step ubatch layer t_start dur_ns n_ops".split()
    OP_COLS = (
        "step ubatch graph node name op label category layer t_start dur_ns n_fused shape dtype "
        "weight weight_type est_flops est_bytes"
    ).split()
    NODE_COLS = "graph node name op label layer shape dtype bytes flags".split()
    STAT_COLS = "step ubatch node name min max mean std n_nan n_inf".split()
    TOPK_COLS = "step row rank token logit".split()

    def __init__(self, info: SessionInfo) -> None:
        self.info = info
        self.steps = _Table(
            "step ctx n_tokens pos0 pos1 t_start dur_ns status n_outputs kv_used op_ns ended",
            cats="kind request",
            nullable="status",
        )
        self.seqs = _Table("step ctx seq n_tokens pos0 pos1")
        self.nodes = _Table(
            "graph node layer bytes", cats="name op label shape dtype flags", nullable="layer"
        )
        self.stats = _Table("step ubatch node n_nan n_inf", "min max mean std", cats="name")
        self.topk = _Table("step row rank token", "logit")
        self.graphs: dict[int, Graph] = {}
        self.layer_parts: list[np.ndarray] = []  # per compute (m, 4): layer, t_start, dur, n_ops
        self.layer_keys = array("q")  # per compute: step, ubatch, m
        # per-node columns of every graph the ops use, graph after graph
        self.metas: dict[int, tuple[Graph, _GraphMeta]] = {}  # id(graph) -> its place
        self.n_nodes = 0
        self.node_i = array("q")
        self.node_layer = array("q")
        self.node_flops = array("q")
        self.node_bytes = array("q")
        self.node_cats = {c: array("i") for c in _OP_CATS}
        self.cat_index: dict[str, dict[str, int]] = {c: {} for c in _OP_CATS}
        # the ops: global node, start and duration in chunks; fused nodes as (row, global node)
        self.op_cols = _Chunks()
        self.op_keys = array("q")  # per compute: step, ubatch, graph id, n
        self.fused_rows: list[np.ndarray] = []
        self.fused_nodes: list[np.ndarray] = []
        self.n_ops = 0

    def _meta(self, g: Graph) -> _GraphMeta:
        """The graph's per-node columns (made on first use)."""
        known = self.metas.get(id(g))
        if known is not None:
            return known[1]
        meta = _GraphMeta(self.n_nodes, {})
        for k, n in enumerate(g.nodes):
            try:
                w = derive.weight_source(n)
                vals = {
                    "name": n.name,
                    "op": n.op,
                    "label": n.label,
                    "category": derive.category(n),
                    "shape": _shape(n.shape),
                    "dtype": n.dtype,
                    "weight": None if not w else w["name"],
                    "weight_type": None if not w else w["type"],
                }
                row = (
                    int(n.i),
                    -1 if n.layer is None else int(n.layer),
                    int(derive.flops(n, g)),
                    int(derive.bytes_moved(n, g)),
                )
                codes = []
                for c in _OP_CATS:
                    v = vals[c]
                    if v is None:
                        codes.append(-1)
                    else:
                        index = self.cat_index[c]
                        codes.append(index.setdefault(str(v), len(index)))
                # every value fits before any column grows
                array("q", row)
            except Exception as exc:  # raised when an op of this node is joined, as before
                meta.errors[k] = exc
                row, codes = (0, 0, 0, 0), [-1] * len(_OP_CATS)
            self.node_i.append(row[0])
            self.node_layer.append(row[1])
            self.node_flops.append(row[2])
            self.node_bytes.append(row[3])
            for c, code in zip(_OP_CATS, codes, strict=True):
                self.node_cats[c].append(code)
        self.n_nodes += len(g.nodes)
        self.metas[id(g)] = (g, meta)
        return meta

    def step(self, s: _Step) -> None:
        op_ns = 0
        for c in s.computes:
            if c.ops.shape[1]:
                op_ns += int(c.ops[2].sum())
        self.steps.add(
            step=s.index, ctx=s.ctx, kind=s.kind, n_tokens=s.n_tokens, pos0=s.pos[0], pos1=s.pos[1],
            t_start=s.start, dur_ns=s.dur, status=s.status, n_outputs=s.n_outputs, kv_used=s.kv_used,
            op_ns=op_ns, ended=int(s.ended), request=s.request,
        )  # fmt: skip
        for seq, n_tok, p0, p1 in s.seqs:
            self.seqs.add(step=s.index, ctx=s.ctx, seq=seq, n_tokens=n_tok, pos0=p0, pos1=p1)
        for c in s.computes:
            g = c.graph
            has_ops = g is not None and c.ops.shape[1] > 0
            ubatch = -1  # converted only for rows that show it, as before
            if len(c.layers) or has_ops:
                ubatch = -1 if c.ubatch is None else int(c.ubatch)
            if len(c.layers):
                self.layer_parts.append(c.layers)
                self.layer_keys.extend((s.index, ubatch, len(c.layers)))
            if g is None:
                continue
            if g.id not in self.graphs:
                self.graphs[g.id] = g
                for n in g.nodes:
                    self.nodes.add(
                        graph=g.id, node=n.i, name=n.name, op=n.op, label=n.label, layer=n.layer,
                        shape=_shape(n.shape), dtype=n.dtype, bytes=n.bytes, flags=",".join(n.flags),
                    )  # fmt: skip
            if not has_ops:
                continue
            meta = self._meta(g)
            if meta.errors:
                self._raise_node_error(meta, c)
            self.op_cols.add(c.ops, meta.offset, c.start)
            self.op_keys.extend((s.index, ubatch, g.id, c.ops.shape[1]))
            if len(c.fused_row):
                self.fused_rows.append(c.fused_row + self.n_ops)
                self.fused_nodes.append(c.fused_node + meta.offset)
            self.n_ops += c.ops.shape[1]
            if c.stats is not None:
                self._stats(s, c, ubatch)
        for row in s.topk:
            for rank, (tok, logit) in enumerate(zip(row["ids"], row["logits"], strict=False)):
                self.topk.add(
                    step=s.index, row=row.get("row", 0), rank=rank, token=tok, logit=logit
                )

    @staticmethod
    def _raise_node_error(meta: _GraphMeta, c: _Compute) -> None:
        for k, i in enumerate(c.ops[0].tolist()):
            for p in [i] + c.fused_node[c.fused_row == k].tolist():
                if p in meta.errors:
                    raise meta.errors[p]

    def _stats(self, s: _Step, c: _Compute, ubatch: int) -> None:
        assert c.graph is not None and c.stats is not None
        nodes = c.graph.nodes
        for p in c.ops[0].tolist():
            n = nodes[p]
            if n.i in c.stats:
                mn, mx, mean, std, n_nan, n_inf = c.stats[n.i]
                self.stats.add(
                    step=s.index, ubatch=ubatch, node=n.i, name=n.name, min=mn, max=mx,
                    mean=mean, std=std, n_nan=n_nan, n_inf=n_inf,
                )  # fmt: skip

    def _layers_frame(self) -> pd.DataFrame:
        keys = _keys(self.layer_keys, 3)
        a = np.concatenate(self.layer_parts) if self.layer_parts else np.zeros((0, 4), np.int64)
        self.layer_parts = []
        data = {
            "step": np.repeat(keys[:, 0], keys[:, 2]),
            "ubatch": np.repeat(keys[:, 1], keys[:, 2]),
        }
        for k, c in enumerate(self.LAYER_COLS[2:]):
            data[c] = a[:, k].copy()
        return pd.DataFrame(data, copy=False)

    def _ops_frame(self) -> pd.DataFrame:
        keys = _keys(self.op_keys, 4)
        counts = keys[:, 3]
        n = self.n_ops
        gidx = self.op_cols.column(0, np.int32 if self.n_nodes < 1 << 31 else np.int64)
        t_start = self.op_cols.column(1)
        dur = self.op_cols.column(2)
        self.op_cols = _Chunks()
        node_flops = _column(self.node_flops)
        node_bytes = _column(self.node_bytes)
        est_flops = node_flops[gidx]
        est_bytes = node_bytes[gidx]
        n_fused = np.zeros(n, np.int64)
        if self.fused_rows:
            rows = np.concatenate(self.fused_rows)
            fnodes = np.concatenate(self.fused_nodes)
            # each op's fused nodes are consecutive, ops in order: sum them per run of a row
            first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
            op_rows = rows[first]
            n_fused[op_rows] = np.diff(np.r_[first, len(rows)])
            est_flops[op_rows] += np.add.reduceat(node_flops[fnodes], first)
            est_bytes[op_rows] += np.add.reduceat(node_bytes[fnodes], first)
        data: dict[str, Any] = {
            "step": np.repeat(keys[:, 0], counts),
            "ubatch": np.repeat(keys[:, 1], counts),
            "graph": np.repeat(keys[:, 2], counts),
            "node": _column(self.node_i)[gidx],
            "layer": _nullable(_column(self.node_layer)[gidx]),
            "t_start": t_start,
            "dur_ns": dur,
            "n_fused": n_fused,
            "est_flops": est_flops,
            "est_bytes": est_bytes,
        }
        # categories in order of first appearance among the ops, as when built row by row
        first_seen = pd.unique(gidx) if n else _EMPTY_I64
        for c in _OP_CATS:
            names = list(self.cat_index[c])
            ncodes = _column(self.node_cats[c], np.int32)
            seen = [x for x in dict.fromkeys(ncodes[first_seen].tolist()) if x >= 0]
            lut = np.full(len(names) + 1, -1, np.int64)  # the last slot: code -1 stays -1
            lut[seen] = np.arange(len(seen))
            dtype = np.int8 if len(seen) < 127 else np.int16 if len(seen) < 32767 else np.int32
            codes = lut[ncodes].astype(dtype)[gidx]
            data[c] = pd.Categorical.from_codes(codes, categories=[names[x] for x in seen])
        return pd.DataFrame({c: data[c] for c in self.OP_COLS}, copy=False)

    def _requests_frame(self) -> pd.DataFrame:
        t = _Table(
            "status t_arrive wait_ns ttft_ns model_ns dur_ns prompt_tokens gen_tokens stream",
            cats="id endpoint method",
            nullable="wait_ns ttft_ns model_ns dur_ns",
        )
        for r in self.info.requests:
            t.add(
                id=r.get("id"), endpoint=r.get("endpoint"), method=r.get("method"),
                status=r.get("status", 0), stream=int(bool(r.get("stream"))),
                t_arrive=r.get("t_arrive", 0), wait_ns=r.get("wait"), ttft_ns=r.get("ttft"),
                model_ns=r.get("model"), dur_ns=r.get("dur"),
                prompt_tokens=r.get("prompt_tokens", 0), gen_tokens=r.get("gen_tokens", 0),
            )  # fmt: skip
        df = t.frame(self.REQUEST_COLS)
        df["stream"] = df["stream"].astype(bool)
        for c in ("id", "endpoint", "method"):
            df[c] = string_categories(df[c])
        return df

    def frames(self, report: ReadReport) -> SessionFrames:
        steps = self.steps.frame(self.STEP_COLS)
        steps["ended"] = steps["ended"].astype(bool)
        steps["request"] = string_categories(steps["request"])
        weights = pd.DataFrame(self.info.weights)
        if not weights.empty:
            weights["shape"] = weights["shape"].map(_shape)
            for c in ("name", "type", "buffer"):
                weights[c] = weights[c].astype("category")
            weights["layer"] = weights["layer"].astype("Int64")
        sf = SessionFrames(
            info=self.info,
            steps=steps,
            layers=self._layers_frame(),
            ops=self._ops_frame(),
            nodes=self.nodes.frame(self.NODE_COLS),
            weights=weights,
            tensor_stats=self.stats.frame(self.STAT_COLS),
            topk=self.topk.frame(self.TOPK_COLS),
            seqs=self.seqs.frame(self.SEQ_COLS),
            requests=self._requests_frame(),
            graphs=self.graphs,
            report=report,
        )
        roofline.apply(sf, *peaks.for_session(self.info))
        return sf


def load_sessions(path: Path | str, *, strict: bool = False) -> list[SessionFrames]:
    """Every session of the log, as tables."""
    report = ReadReport()
    builders: dict[str, _Builder] = {}
    for info, step in _events(path, strict, report):
        if step is None:
            builders[info.sid] = _Builder(info)
        else:
            builders[info.sid].step(step)
    if not builders:
        raise UserError(f"no session in {path}")
    return [b.frames(report) for b in builders.values()]


def load_session(
    path: Path | str, sid: str | None = None, *, strict: bool = False
) -> SessionFrames:
    """One session of the log as tables: the first, or the one with session id ``sid``."""
    sessions = load_sessions(path, strict=strict)
    if sid is None:
        return sessions[0]
    for s in sessions:
        if s.info.sid == sid:
            return s
    raise UserError(
        f"no session {sid} in {path} (it has {', '.join(s.info.sid for s in sessions)})"
    )
