"""The ``ops`` table of ``frames``, built in one streaming pass with no Python object per op: each
compute's ops, columns already (``ComputeColumns``), become one int64 block, and each op's node
metadata (name, op, layer, shape, weight, estimated FLOPs and bytes) is joined at the end by
integer indexing into per-node columns computed once per graph (``OpsBuilder``, its nodes'
columns ``node_columns``)."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pandas as pd

from ..reading.decode.columns import LayerRows
from ..reading.decode.computes import Compute
from ..reading.decode.graphs import Graph
from .node_columns import GraphMeta, NodeColumns
from .table_columns import EMPTY_I64, Chunks, int_column, int_rows, nullable


class ComputeColumns:
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
        self.fused_row = np.array([r for r, _ in rows], np.int64) if rows else EMPTY_I64
        self.fused_node = np.array([j for _, j in rows], np.int64) if rows else EMPTY_I64


# --- the tables ----------------------------------------------------------------------------------


class OpsBuilder:
    """The ``ops`` table as it is built: each op's node (a row of the per-node columns), start and
    duration in chunks, with no Python object per op; each op's node metadata (name, op, layer,
    shape, weight, estimated FLOPs and bytes) is computed once per graph (``NodeColumns``) and
    joined at the end by integer indexing (``frame``)."""

    OP_COLS = (
        "step ubatch graph node name op label category layer t_start dur_ns n_fused shape dtype "
        "weight weight_type est_flops est_bytes expert_bytes"
    ).split()

    def __init__(self) -> None:
        self.nodes = NodeColumns()  # per-node columns of every graph the ops use
        # (step, ubatch, layer) -> the distinct experts the router sent that ubatch's tokens to
        self.routed: dict[tuple[int, int, int], int] = {}
        # the ops: global node, start and duration in chunks; fused nodes as (row, global node)
        self.op_cols = Chunks()
        self.op_keys = array("q")  # per compute: step, ubatch, graph id, n
        self.fused_rows: list[np.ndarray] = []
        self.fused_nodes: list[np.ndarray] = []
        self.n_ops = 0

    def add(self, step: int, ubatch: int, g: Graph, cc: ComputeColumns) -> None:
        """A compute's ops (``cc``, of graph ``g``, with ops) as rows of the table."""
        meta = self.nodes.meta(g)
        if meta.errors:
            self._raise_node_error(meta, cc)
        self.op_cols.add(cc.ops, meta.offset)
        self.op_keys.extend((step, ubatch, g.id, cc.ops.shape[1]))
        if len(cc.fused_row):
            self.fused_rows.append(cc.fused_row + self.n_ops)
            self.fused_nodes.append(cc.fused_node + meta.offset)
        self.n_ops += cc.ops.shape[1]

    def route(self, step: int, r: Any) -> None:
        """A compute's routing (``session.expert_routing.Routing``): the experts each layer used."""
        for layer, n in r.used().items():
            self.routed[(step, r.ubatch, layer)] = n

    @staticmethod
    def _raise_node_error(meta: GraphMeta, c: ComputeColumns) -> None:
        for k, i in enumerate(c.ops[0].tolist()):
            for p in [i] + c.fused_node[c.fused_row == k].tolist():
                if p in meta.errors:
                    raise meta.errors[p]

    def frame(self) -> pd.DataFrame:
        keys = int_rows(self.op_keys, 4)
        counts = keys[:, 3]
        n = self.n_ops
        nodes = self.nodes
        gidx = self.op_cols.column(0, np.int32 if nodes.n_nodes < 1 << 31 else np.int64)
        t_start = self.op_cols.column(1)
        dur = self.op_cols.column(2)
        self.op_cols = Chunks()
        node_flops = int_column(nodes.node_flops)
        node_bytes = int_column(nodes.node_bytes)
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
        step = np.repeat(keys[:, 0], counts)
        ubatch = np.repeat(keys[:, 1], counts)
        layer = int_column(nodes.node_layer)[gidx]
        expert_bytes = self._routed_bytes(gidx, step, ubatch, layer, est_bytes)
        data: dict[str, Any] = {
            "step": step,
            "ubatch": ubatch,
            "graph": np.repeat(keys[:, 2], counts),
            "node": int_column(nodes.node_i)[gidx],
            "layer": nullable(layer),
            "t_start": t_start,
            "dur_ns": dur,
            "n_fused": n_fused,
            "est_flops": est_flops,
            "est_bytes": est_bytes,
            "expert_bytes": expert_bytes,
        }
        data |= nodes.categoricals(gidx, n)
        return pd.DataFrame({c: data[c] for c in self.OP_COLS}, copy=False)

    def _routed_bytes(
        self,
        gidx: np.ndarray,
        step: np.ndarray,
        ubatch: np.ndarray,
        layer: np.ndarray,
        est_bytes: np.ndarray,
    ) -> pd.Categorical:
        """A MUL_MAT_ID's est_bytes with only the experts its ubatch routed to (in place, where the
        routing is recorded): "routed"; "all experts" where it is not; missing for other ops."""
        n_exp = int_column(self.nodes.node_n_expert)[gidx]
        codes = np.full(len(gidx), -1, np.int8)
        labels: list[str] = []  # in order of first appearance, as every categorical here
        for k in np.flatnonzero(n_exp > 0).tolist():
            used = self.routed.get((int(step[k]), int(ubatch[k]), int(layer[k])))
            label = "all experts" if used is None else "routed"
            if label not in labels:
                labels.append(label)
            codes[k] = labels.index(label)
            if used is not None:
                whole = int(self.nodes.node_exp_bytes[int(gidx[k])])
                est_bytes[k] -= whole - whole * min(used, int(n_exp[k])) // int(n_exp[k])
        # (no MUL_MAT_ID: string-typed empty categories, so the column stays one through Parquet)
        return pd.Categorical.from_codes(codes, categories=labels or pd.Index([], dtype="str"))


class LayersBuilder:
    """The ``layers`` table as it is built: each compute's layer spans, an (m, 4) block (layer,
    start, dur, n_ops), with its step and ubatch."""

    COLS = "step ubatch layer t_start dur_ns n_ops".split()

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []
        self.keys = array("q")  # per compute: step, ubatch, m

    def add(self, step: int, ubatch: int, rows: np.ndarray) -> None:
        self.parts.append(rows)
        self.keys.extend((step, ubatch, len(rows)))

    def frame(self) -> pd.DataFrame:
        keys = int_rows(self.keys, 3)
        a = np.concatenate(self.parts) if self.parts else np.zeros((0, 4), np.int64)
        self.parts = []
        data = {
            "step": np.repeat(keys[:, 0], keys[:, 2]),
            "ubatch": np.repeat(keys[:, 1], keys[:, 2]),
        }
        for k, c in enumerate(self.COLS[2:]):
            data[c] = a[:, k].copy()
        return pd.DataFrame(data, copy=False)
