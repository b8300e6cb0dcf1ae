"""The analysis API: a session log as pandas DataFrames.

    from . import load_session
    s = load_session("session.log")
    s.ops.groupby("label", observed=True)["dur_ns"].sum().sort_values()

Tables (integer nanosecond timestamps and durations; names, ops and types are categoricals):

* ``steps`` — one row per ``llama_decode``: step, ctx, kind, n_tokens, pos0, pos1, t_start, dur_ns,
  status, n_outputs, kv_used, op_ns (sum of its op durations), ended.
* ``layers`` — one row per layer span per compute: step, ubatch, layer, t_start, dur_ns, n_ops.
* ``ops`` — one row per timed op per compute, with its node's metadata joined: step, ubatch, graph,
  node, name, op, label, category, layer, t_start, dur_ns, n_fused, shape, dtype, weight,
  weight_type, est_flops, est_bytes.
* ``nodes`` — the graph tables: graph, node, name, op, label, layer, shape, dtype, bytes, flags.
* ``weights`` — the weight inventory of session_start.
* ``tensor_stats`` (verbose) — step, ubatch, node, name, min, max, mean, std, n_nan, n_inf.
* ``topk`` (verbose) — step, row, rank, token, logit.

Built in one streaming pass over the session model; numeric columns accumulate in typed arrays and
strings as category codes, so a million-op log does not become a million Python objects per column.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from . import derive
from .errors import UserError
from .reader import ReadReport
from .session import Graph, SessionInfo, SessionStarted, Step, StepDone, iter_events


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


class _Table:
    """Columns of ints (int64, with -1 meaning missing for nullable ones), floats and categoricals."""

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
    graphs: dict[int, Graph] = field(default_factory=dict)  # the node tables, with their sources
    report: ReadReport = field(default_factory=ReadReport)

    TABLES = ("steps", "layers", "ops", "nodes", "weights", "tensor_stats", "topk")

    def tables(self) -> dict[str, pd.DataFrame]:
        return {name: getattr(self, name) for name in self.TABLES}


class _Builder:
    STEP_COLS = "step ctx kind n_tokens pos0 pos1 t_start dur_ns status n_outputs kv_used op_ns ended".split()
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
            cats="kind",
            nullable="status",
        )
        self.layers = _Table("step ubatch layer t_start dur_ns n_ops")
        self.ops = _Table(
            "step ubatch graph node layer t_start dur_ns n_fused est_flops est_bytes",
            cats="name op label category shape dtype weight weight_type",
            nullable="layer",
        )
        self.nodes = _Table(
            "graph node layer bytes", cats="name op label shape dtype flags", nullable="layer"
        )
        self.stats = _Table("step ubatch node n_nan n_inf", "min max mean std", cats="name")
        self.topk = _Table("step row rank token", "logit")
        self.graphs: dict[int, Graph] = {}

    def step(self, s: Step) -> None:
        self.steps.add(
            step=s.index, ctx=s.ctx, kind=s.kind, n_tokens=s.n_tokens, pos0=s.pos[0], pos1=s.pos[1],
            t_start=s.start, dur_ns=s.dur, status=s.status, n_outputs=s.n_outputs, kv_used=s.kv_used,
            op_ns=s.op_time, ended=int(s.ended),
        )  # fmt: skip
        for c in s.computes:
            for lay in c.layers:
                self.layers.add(
                    step=s.index,
                    ubatch=c.ubatch,
                    layer=lay.layer,
                    t_start=lay.start,
                    dur_ns=lay.dur,
                    n_ops=lay.n_ops,
                )
            g = c.graph
            if g is None:
                continue
            if g.id not in self.graphs:
                self.graphs[g.id] = g
                for n in g.nodes:
                    self.nodes.add(
                        graph=g.id, node=n.i, name=n.name, op=n.op, label=n.label, layer=n.layer,
                        shape=_shape(n.shape), dtype=n.dtype, bytes=n.bytes, flags=",".join(n.flags),
                    )  # fmt: skip
            for op in c.ops:
                n = op.node
                w = derive.weight_source(n)
                self.ops.add(
                    step=s.index, ubatch=c.ubatch, graph=g.id, node=n.i, name=n.name, op=n.op,
                    label=n.label, category=derive.category(n), layer=n.layer, t_start=op.start,
                    dur_ns=op.dur, n_fused=len(op.fused), shape=_shape(n.shape), dtype=n.dtype,
                    weight=w["name"] if w else None, weight_type=w["type"] if w else None,
                    est_flops=derive.flops(n, g) + sum(derive.flops(f, g) for f in op.fused),
                    est_bytes=derive.bytes_moved(n, g) + sum(derive.bytes_moved(f, g) for f in op.fused),
                )  # fmt: skip
                if op.stats is not None:
                    mn, mx, mean, std, n_nan, n_inf = op.stats
                    self.stats.add(
                        step=s.index, ubatch=c.ubatch, node=n.i, name=n.name, min=mn, max=mx,
                        mean=mean, std=std, n_nan=n_nan, n_inf=n_inf,
                    )  # fmt: skip
        for row in s.topk:
            for rank, (tok, logit) in enumerate(zip(row["ids"], row["logits"], strict=False)):
                self.topk.add(
                    step=s.index, row=row.get("row", 0), rank=rank, token=tok, logit=logit
                )

    def frames(self, report: ReadReport) -> SessionFrames:
        steps = self.steps.frame(self.STEP_COLS)
        steps["ended"] = steps["ended"].astype(bool)
        weights = pd.DataFrame(self.info.weights)
        if not weights.empty:
            weights["shape"] = weights["shape"].map(_shape)
            for c in ("name", "type", "buffer"):
                weights[c] = weights[c].astype("category")
            weights["layer"] = weights["layer"].astype("Int64")
        return SessionFrames(
            info=self.info,
            steps=steps,
            layers=self.layers.frame(self.LAYER_COLS),
            ops=self.ops.frame(self.OP_COLS),
            nodes=self.nodes.frame(self.NODE_COLS),
            weights=weights,
            tensor_stats=self.stats.frame(self.STAT_COLS),
            topk=self.topk.frame(self.TOPK_COLS),
            graphs=self.graphs,
            report=report,
        )


def load_sessions(path: Path | str, *, strict: bool = False) -> list[SessionFrames]:
    """Every session of the log, as tables."""
    report = ReadReport()
    builders: dict[str, _Builder] = {}
    for ev in iter_events(path, strict=strict, report=report):
        if isinstance(ev, SessionStarted):
            builders[ev.session.sid] = _Builder(ev.session)
        elif isinstance(ev, StepDone):
            builders[ev.session.sid].step(ev.step)
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
