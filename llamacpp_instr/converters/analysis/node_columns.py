"""The per-node columns that the ``ops`` table (``frames_ops.OpsBuilder``) joins its ops to:
each node's metadata (name, op, label, category, shape, dtype, weight and its type as codes, layer,
estimated FLOPs and bytes, a MUL_MAT_ID's expert tensor), computed once per graph, graph after
graph, so that the table's columns are made by integer indexing."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pandas as pd

from ..reading.decode.graphs import Graph
from ..session import derive
from .table_columns import EMPTY_I64, int_column, shape_text


def _expert_tensor(n: Any, g: Graph) -> tuple[int, int]:
    """A MUL_MAT_ID's expert tensor (its first source, [k, rows, n_expert]): bytes and experts."""
    if n.op != "MUL_MAT_ID" or not n.src:
        return 0, 0
    shape = derive.src_shape(n.src[0], g) + [1, 1, 1]
    if shape[2] < 2:
        return 0, 0
    return int(derive.src_bytes(n.src[0], g)), int(shape[2])


OP_CATS = "name op label category shape dtype weight weight_type".split()


class GraphMeta:
    """Where a graph's nodes start in the builder's per-node columns, and their FLOPs and bytes."""

    def __init__(self, offset: int, errors: dict[int, Exception]) -> None:
        self.offset = offset
        self.errors = errors  # node position -> what joining its metadata raised


class NodeColumns:
    """The per-node columns of every graph the ops use, graph after graph, and each graph's
    place among them (``GraphMeta``)."""

    def __init__(self) -> None:
        self.metas: dict[Graph, GraphMeta] = {}  # each graph's place
        self.n_nodes = 0
        self.node_i = array("q")
        self.node_layer = array("q")
        self.node_flops = array("q")
        self.node_bytes = array("q")
        # a MUL_MAT_ID's expert tensor: its bytes and its number of experts (0 for other nodes)
        self.node_exp_bytes = array("q")
        self.node_n_expert = array("q")
        self.node_cats = {c: array("i") for c in OP_CATS}
        self.cat_index: dict[str, dict[str, int]] = {c: {} for c in OP_CATS}

    def meta(self, g: Graph) -> GraphMeta:
        """The graph's per-node columns (made on first use)."""
        known = self.metas.get(g)
        if known is not None:
            return known
        meta = GraphMeta(self.n_nodes, {})
        for k, n in enumerate(g.nodes):
            try:
                w = derive.weight_source(n)
                vals = {
                    "name": n.name,
                    "op": n.op,
                    "label": n.label,
                    "category": derive.category(n),
                    "shape": shape_text(n.shape),
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
                for c in OP_CATS:
                    v = vals[c]
                    if v is None:
                        codes.append(-1)
                    else:
                        index = self.cat_index[c]
                        codes.append(index.setdefault(str(v), len(index)))
                # every value fits before any column grows
                array("q", row)
            except Exception as exc:  # raised only where a compute's op rows name this node
                meta.errors[k] = exc
                row, codes = (0, 0, 0, 0), [-1] * len(OP_CATS)
            self.node_i.append(row[0])
            self.node_layer.append(row[1])
            self.node_flops.append(row[2])
            self.node_bytes.append(row[3])
            eb, ne = _expert_tensor(n, g) if k not in meta.errors else (0, 0)
            self.node_exp_bytes.append(eb)
            self.node_n_expert.append(ne)
            for c, code in zip(OP_CATS, codes, strict=True):
                self.node_cats[c].append(code)
        self.n_nodes += len(g.nodes)
        self.metas[g] = meta
        return meta

    def categoricals(self, gidx: np.ndarray, n: int) -> dict[str, pd.Categorical]:
        """The ops' categorical columns (``OP_CATS``), ``gidx`` each op's node (``n`` ops)."""
        data: dict[str, pd.Categorical] = {}
        # categories in order of first appearance among the ops, as when built row by row
        first_seen = pd.unique(gidx) if n else EMPTY_I64
        for c in OP_CATS:
            names = list(self.cat_index[c])
            ncodes = int_column(self.node_cats[c], np.int32)
            seen = [x for x in dict.fromkeys(ncodes[first_seen].tolist()) if x >= 0]
            lut = np.full(len(names) + 1, -1, np.int64)  # the last slot: code -1 stays -1
            lut[seen] = np.arange(len(seen))
            dtype = np.int8 if len(seen) < 127 else np.int16 if len(seen) < 32767 else np.int32
            codes = lut[ncodes].astype(dtype)[gidx]
            data[c] = pd.Categorical.from_codes(codes, categories=[names[x] for x in seen])
        return data
