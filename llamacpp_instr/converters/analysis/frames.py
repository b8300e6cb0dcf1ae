"""The analysis API: a session log as pandas DataFrames.

    from . import load_session
    s = load_session("session.log")
    s.ops.groupby("label", observed=True)["dur_ns"].sum().sort_values()

Tables (integer nanosecond timestamps and durations; names, ops and types are categoricals):

* ``steps`` — one row per ``llama_decode``: step, ctx, kind, n_tokens, pos0, pos1, t_start, dur_ns,
  status, n_outputs, kv_used, op_ns (sum of its op durations), ended, request, level (what it was
  recorded at: with sampling, minimal steps have no op times); weight_bytes and kv_bytes
  (read by its graphs), and with peaks ideal_ns, roof_frac and roof (memory for generation, compute
  for prompt steps).
* ``layers`` — one row per layer span per compute: step, ubatch, layer, t_start, dur_ns, n_ops.
* ``ops`` — one row per timed op per compute, with its node's metadata joined: step, ubatch, graph,
  node, name, op, label, category, layer, t_start, dur_ns, n_fused, shape, dtype, weight,
  weight_type, est_flops, est_bytes; the roofline (``roofline.py``): intensity (FLOPs/byte),
  gflops_s, gbs (achieved), and, when ``peaks_cache`` holds peaks for the machine that made the
  log (``instr peaks``; NaN otherwise), ideal_ns (the least time at the roofs), roof_frac, bound.
* ``nodes`` — the graph tables: graph, node, name, op, label, layer, shape, dtype, bytes, flags.
* ``weights`` — the weight inventory of session_start.
* ``tensor_stats`` (verbose) — step, ubatch, node, name, min, max, mean, std, n_nan, n_inf.
* ``topk`` (verbose) — step, row, rank, token, logit.

Built in one streaming pass over the session model's steps (``session.iter_events_packed``: the
one decoder, so the same steps and the same skipped records as every other reader), with no
Python object per op: each compute's ops, columns already, become one int64 block, and each op's
node metadata (name, op, layer, shape,
weight, estimated FLOPs and bytes) is joined at the end by integer indexing into per-node columns
computed once per graph. Categorical columns keep their categories in order of first appearance.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import UserError
from ..reading.decode.columns import LayerRows
from ..reading.decode.computes import Compute
from ..reading.decode.graphs import Graph
from ..reading.decode.memory import StepMemory
from ..reading.decode.sessions import SessionInfo, SessionStarted, StepDone
from ..reading.decode.steps import Step
from ..reading.reader import ReadReport
from ..session import derive, machine_peaks
from ..session.device_time import multi_device
from ..session.fold import iter_events_packed
from . import roofline
from .frames_devices import TABLES as DEVICE_TABLES
from .frames_devices import DeviceBuilder
from .memory_frames import allocations_frame, memory_frame

_FIRST = itemgetter(0)


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
    # the tokens the run fed back while generating (its own choices), in step order
    generated_tokens: list[int] = field(default_factory=list)
    # a run on several devices (``frames_devices``; empty for a CPU-only log)
    devices: pd.DataFrame = field(default_factory=pd.DataFrame)
    splits: pd.DataFrame = field(default_factory=pd.DataFrame)
    copies: pd.DataFrame = field(default_factory=pd.DataFrame)
    busy: pd.DataFrame = field(default_factory=pd.DataFrame)
    remote: pd.DataFrame = field(default_factory=pd.DataFrame)
    transfers: pd.DataFrame = field(default_factory=pd.DataFrame)
    device_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    token_time: pd.DataFrame = field(default_factory=pd.DataFrame)
    # memory (``memory_frames``; empty for a log from before memory was recorded), and each
    # step's figures as read (``session.memory``)
    allocations: pd.DataFrame = field(default_factory=pd.DataFrame)
    memory: pd.DataFrame = field(default_factory=pd.DataFrame)
    step_memory: list[StepMemory] = field(default_factory=list)

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
        """The tables (with the device tables of a run on several devices)."""
        names = self.TABLES + (DEVICE_TABLES if not self.devices.empty else ())
        names += ("allocations", "memory") if not self.allocations.empty else ()
        return {name: getattr(self, name) for name in names}

    def sampling(self) -> Sampling:
        """What was recorded at which level (``Sampling``): per-op figures come from the
        ``timed_steps`` only."""
        return Sampling.of(self)


@dataclass
class Sampling:
    """Which steps of a session carry op times. A sampled log (``--sample``, ``--sample-requests``)
    records some steps at its level and the others at minimal; a log whose level was changed
    while it ran mixes levels too. Per-op figures (time per op type, op-time coverage) come from
    the steps recorded at detailed or above, and say so."""

    level: str  # the session's
    sample_steps: int  # one step in N (1: every step)
    sample_requests: int  # the steps of one request in N (1: every request)
    steps_by_level: dict[str, int]  # steps recorded at each level
    timed_steps: int  # steps recorded at detailed or above (with op times)
    steps: int

    @classmethod
    def of(cls, f: SessionFrames) -> Sampling:
        from ..schema import level_at_least

        levels = f.steps["level"].astype(str).value_counts() if len(f.steps) else pd.Series()
        by_level = {str(k): int(v) for k, v in levels.items()}
        timed = sum(n for lv, n in by_level.items() if level_at_least(lv, "detailed"))
        return cls(
            level=f.info.level,
            sample_steps=int(f.info.sample.get("steps", 1) or 1),
            sample_requests=int(f.info.sample.get("requests", 1) or 1),
            steps_by_level=by_level,
            timed_steps=timed,
            steps=len(f.steps),
        )

    @property
    def mixed(self) -> bool:
        """Are the steps recorded at more than one level?"""
        return len(self.steps_by_level) > 1

    def describe(self) -> str:
        """One line: "1 step in 16 at detailed (63 of 1000 steps with op times)"; "" when every
        step is recorded at the session's level."""
        if not self.mixed and self.sample_steps == 1 and self.sample_requests == 1:
            return ""
        how = []
        if self.sample_steps > 1:
            how.append(f"1 step in {self.sample_steps}")
        if self.sample_requests > 1:
            how.append(f"the steps of 1 request in {self.sample_requests}")
        what = (" and ".join(how) + f" at {self.level}") if how else "levels changed during the run"
        return f"{what} ({self.timed_steps} of {self.steps} steps with op times)"


# --- the session model's steps, as columns ----------------------------------------------------

_EMPTY_I64 = np.zeros(0, np.int64)


class _Columns:
    """One compute as the tables want it: ``ops`` a (3, n) int64 block (node positions, absolute
    starts, durations), ``fused_row``/``fused_node`` each fused node (a row of ``ops``, a node
    position), ``layers`` (m, 4) (layer, absolute start, dur, n_ops), ``stats`` per op row its
    tensor statistics (verbose)."""

    __slots__ = ("ops", "fused_row", "fused_node", "layers", "stats")

    def __init__(self, c: Compute) -> None:
        if isinstance(c.layers, LayerRows):
            self.layers = c.layers.rows
        else:
            self.layers = np.array(c.layers, np.int64).reshape(-1, 4)
        # the decoder's columns, as they are (int64: a value beyond 64 bits fails here, as it
        # always did)
        self.ops = np.stack((c.op_node, c.op_start, c.op_dur)).astype(np.int64, copy=False)
        rows = [(k, j) for k, f in c.op_fused.items() for j in f]
        self.stats: list[tuple[int, tuple[Any, ...]]] = sorted(c.op_stats.items())
        self.fused_row = np.array([r for r, _ in rows], np.int64) if rows else _EMPTY_I64
        self.fused_node = np.array([j for _, j in rows], np.int64) if rows else _EMPTY_I64


class _Chunks:
    """Rows of three int64 columns, appended in blocks, kept in chunks of 64k rows: big enough
    to be memory-mapped on their own, so freeing them hands the memory back to the system."""

    SIZE = 1 << 16

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.fill = 0  # rows used in the last chunk

    def add(self, block: np.ndarray, offset: int) -> None:
        """Append ``block`` (3, n) as (node position + offset, start, dur)."""
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
            ch[1, rows] = part[1]
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
        "request level"
    ).split()
    SEQ_COLS = "step ctx seq n_tokens pos0 pos1".split()
    REQUEST_COLS = (
        "id endpoint method status outcome stream t_arrive wait_ns ttft_ns model_ns dur_ns "
        "prompt_tokens gen_tokens tokens_sent slot level error"
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
            cats="kind request level",
            nullable="status",
        )
        self.seqs = _Table("step ctx seq n_tokens pos0 pos1")
        self.memory_rows: list[tuple[int, int, int, StepMemory]] = []
        self.nodes = _Table(
            "graph node layer bytes", cats="name op label shape dtype flags", nullable="layer"
        )
        self.stats = _Table("step ubatch node n_nan n_inf", "min max mean std", cats="name")
        self.topk = _Table("step row rank token", "logit")
        self.graphs: dict[int, Graph] = {}
        self.layer_parts: list[np.ndarray] = []  # per compute (m, 4): layer, t_start, dur, n_ops
        self.layer_keys = array("q")  # per compute: step, ubatch, m
        # per-node columns of every graph the ops use, graph after graph
        self.metas: dict[Graph, _GraphMeta] = {}  # each graph's place
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
        self.generated: list[tuple[int, list[int]]] = []  # per generation step: index, tokens
        self.dev = DeviceBuilder(info) if multi_device(info) else None  # several devices

    def _meta(self, g: Graph) -> _GraphMeta:
        """The graph's per-node columns (made on first use)."""
        known = self.metas.get(g)
        if known is not None:
            return known
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
        self.metas[g] = meta
        return meta

    def step(self, s: Step) -> None:
        cols = [_Columns(c) for c in s.computes]
        op_ns = 0
        for cc in cols:
            if cc.ops.shape[1]:
                op_ns += int(cc.ops[2].sum())
        self.steps.add(
            step=s.index, ctx=s.ctx, kind=s.kind, n_tokens=s.n_tokens, pos0=s.pos[0], pos1=s.pos[1],
            t_start=s.start, dur_ns=s.dur, status=s.status, n_outputs=s.n_outputs, kv_used=s.kv_used,
            op_ns=op_ns, ended=int(s.ended), request=s.request, level=s.level or self.info.level,
        )  # fmt: skip
        if s.kind == "gen":
            self.generated.append((s.index, s.tokens))
        if s.memory is not None:
            self.memory_rows.append((s.index, s.ctx, s.end, s.memory))
        for seq, n_tok, p0, p1 in s.seqs:
            self.seqs.add(step=s.index, ctx=s.ctx, seq=seq, n_tokens=n_tok, pos0=p0, pos1=p1)
        for c, cc in zip(s.computes, cols, strict=True):
            g = c.graph
            has_ops = g is not None and cc.ops.shape[1] > 0
            ubatch = -1  # converted only for rows that show it, as before
            if len(cc.layers) or has_ops:
                ubatch = -1 if c.ubatch is None else int(c.ubatch)
            if len(cc.layers):
                self.layer_parts.append(cc.layers)
                self.layer_keys.extend((s.index, ubatch, len(cc.layers)))
                if self.dev is not None:
                    self.dev.layers(c)
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
                self._raise_node_error(meta, cc)
            self.op_cols.add(cc.ops, meta.offset)
            self.op_keys.extend((s.index, ubatch, g.id, cc.ops.shape[1]))
            if self.dev is not None:
                self.dev.ops(c)
            if len(cc.fused_row):
                self.fused_rows.append(cc.fused_row + self.n_ops)
                self.fused_nodes.append(cc.fused_node + meta.offset)
            self.n_ops += cc.ops.shape[1]
            for k, (mn, mx, mean, std, n_nan, n_inf) in cc.stats:
                n = g.nodes[int(cc.ops[0, k])]
                self.stats.add(
                    step=s.index, ubatch=ubatch, node=n.i, name=n.name, min=mn, max=mx,
                    mean=mean, std=std, n_nan=n_nan, n_inf=n_inf,
                )  # fmt: skip
        for row in s.topk:
            for rank, (tok, logit) in enumerate(zip(row["ids"], row["logits"], strict=False)):
                self.topk.add(
                    step=s.index, row=row.get("row", 0), rank=rank, token=tok, logit=logit
                )
        if self.dev is not None:
            self.dev.step(s)

    @staticmethod
    def _raise_node_error(meta: _GraphMeta, c: _Columns) -> None:
        for k, i in enumerate(c.ops[0].tolist()):
            for p in [i] + c.fused_node[c.fused_row == k].tolist():
                if p in meta.errors:
                    raise meta.errors[p]

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
            "status t_arrive wait_ns ttft_ns model_ns dur_ns prompt_tokens gen_tokens tokens_sent "
            "stream slot",
            cats="id endpoint method outcome level error",
            nullable="wait_ns ttft_ns model_ns dur_ns tokens_sent slot",
        )
        for r in self.info.requests:
            status = r.get("status", 0)
            t.add(
                id=r.get("id"), endpoint=r.get("endpoint"), method=r.get("method"),
                status=status, stream=int(bool(r.get("stream"))),
                # what became of it (logs from before it was said: by the status)
                outcome=r.get("outcome") or ("ok" if int(status or 0) < 400 else "error"),
                error=r.get("error"), tokens_sent=r.get("tokens_sent"), level=r.get("level"),
                t_arrive=r.get("t_arrive", 0), wait_ns=r.get("wait"), ttft_ns=r.get("ttft"),
                model_ns=r.get("model"), dur_ns=r.get("dur"),
                prompt_tokens=r.get("prompt_tokens", 0), gen_tokens=r.get("gen_tokens", 0),
                slot=r.get("slot"),  # llama-server: the sequence id of its tokens in `seqs`
            )  # fmt: skip
        df = t.frame(self.REQUEST_COLS)
        df["stream"] = df["stream"].astype(bool)
        for c in ("id", "endpoint", "method", "outcome", "level", "error"):
            df[c] = string_categories(df[c])
        return df

    def frames(self, report: ReadReport, peaks_cache: Path | None) -> SessionFrames:
        steps = self.steps.frame(self.STEP_COLS)
        steps["ended"] = steps["ended"].astype(bool)
        steps["request"] = string_categories(steps["request"])
        steps["level"] = string_categories(steps["level"])
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
            generated_tokens=[
                t for _, tokens in sorted(self.generated, key=_FIRST) for t in tokens
            ],
        )
        if self.dev is not None:
            for name, df in self.dev.tables(sf.ops, sf.layers).items():
                setattr(sf, name, df)
        if self.info.allocations or self.memory_rows:
            sf.allocations = allocations_frame(self.info)
            sf.memory = memory_frame(self.memory_rows, self.info)
            sf.step_memory = [m for *_, m in self.memory_rows]
        found = (
            machine_peaks.for_session(self.info, peaks_cache)
            if peaks_cache is not None
            else (None, "")
        )
        roofline.apply(sf, *found)
        return sf


def load_sessions(
    path: Path | str, *, strict: bool = False, peaks_cache: Path | None = None
) -> list[SessionFrames]:
    """Every session of the log, as tables; each against the peaks that ``peaks_cache`` (the
    directory ``instr peaks`` saves to) holds for the machine that made it, if any."""
    report = ReadReport()
    builders: dict[str, _Builder] = {}
    # read here: the tables' own work per record is small, and sending the records from a
    # forked reader costs more than parsing them (bench/convert.py)
    try:
        for ev in iter_events_packed(path, strict=strict, report=report, fork=False):
            if isinstance(ev, SessionStarted):
                builders[ev.session.sid] = _Builder(ev.session)
            elif isinstance(ev, StepDone):
                builders[ev.session.sid].step(ev.step)
        if not builders:
            raise UserError(f"no session in {path}")
        return [b.frames(report, peaks_cache) for b in builders.values()]
    except OverflowError:
        # (the traces keep such a value, op by op; the tables' columns are 64-bit)
        raise UserError(
            f"{path}: a number in the log does not fit in 64 bits, which the tables need "
            "(a damaged log? `instr to-perfetto` still converts it)"
        ) from None


def load_session(
    path: Path | str,
    sid: str | None = None,
    *,
    strict: bool = False,
    peaks_cache: Path | None = None,
) -> SessionFrames:
    """One session of the log as tables: the first, or the one with session id ``sid``; with
    ``peaks_cache``, against the cached peaks of the machine that made it (``load_sessions``)."""
    sessions = load_sessions(path, strict=strict, peaks_cache=peaks_cache)
    if sid is None:
        return sessions[0]
    for s in sessions:
        if s.info.sid == sid:
            return s
    raise UserError(
        f"no session {sid} in {path} (it has {', '.join(s.info.sid for s in sessions)})"
    )
