"""The shapes the probes run, read from a graph: an attention op's (``Shape``: the probe's
attention kind, ``attention_shape``) and the weight a one-column matmul reads (``WeightShape``:
``weight_shape``, ``one_column``).

What a graph holds, no more: the prediction reads them to price an op by its shape, and the probes
(``running/probes/``) build the ops they time from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamacpp_instr.converters.reading.decode.graphs import Graph, Node
from llamacpp_instr.converters.session import derive

FLASH, KQ, SOFTMAX, KQV = "FLASH_ATTN_EXT", "kq", "kq_soft_max", "kqv"


@dataclass(frozen=True)
class Shape:
    """One attention op as the probe runs it: which (FLASH, KQ, SOFTMAX, KQV), its query rows, the KV cells it
    reads, the heads and their sizes, the caches' types (ggml's names)."""

    op: str
    rows: int
    n_kv: int
    head_dim_k: int
    head_dim_v: int
    n_head: int
    n_head_kv: int
    type_k: str
    type_v: str

    def at(self, n_kv: int) -> Shape:
        return Shape(
            self.op, self.rows, n_kv, self.head_dim_k, self.head_dim_v, self.n_head,
            self.n_head_kv, self.type_k, self.type_v,
        )  # fmt: skip

    def cache_bytes(self, kv_size: int) -> int:
        """A layer's caches the op reads from (the K and V rows of ``kv_size`` cells)."""
        per = {FLASH: self.head_dim_k + self.head_dim_v, KQ: self.head_dim_k, KQV: self.head_dim_v}
        # (2 bytes a value, an F16 cache: a quantized one holds less, an F32 one twice as much)
        return 2 * per.get(self.op, 0) * self.n_head_kv * kv_size


def _src(g: Graph, node: Node, i: int) -> Node | None:
    s = node.src[i] if i < len(node.src) else None
    return g.nodes[int(s["node"])] if s is not None and "node" in s else None


def _dims(n: Node | None) -> list[int]:
    return [int(x) for x in n.shape] + [1] * (3 - len(n.shape)) if n is not None else []


def attention_shape(g: Graph, k: int, role: str) -> Shape | None:
    """The probe's shape of node ``k`` of ``g`` (role ``role``, its name without the layer),
    None where it is none of attention's ops the probe runs (a softcap's scale, say)."""
    node = g.nodes[k]
    if node.op == FLASH:
        q, kk, v = _dims(_src(g, node, 0)), _dims(_src(g, node, 1)), _dims(_src(g, node, 2))
        if not (q and kk and v):
            return None
        tk, tv = _src(g, node, 1), _src(g, node, 2)
        return Shape(
            FLASH, q[1], kk[1], kk[0], v[0], q[2], kk[2],
            tk.dtype if tk else "f16", tv.dtype if tv else "f16",
        )  # fmt: skip
    if node.op == "SOFT_MAX" and role == SOFTMAX:
        s = _dims(_src(g, node, 0))
        return Shape(SOFTMAX, s[1], s[0], 1, 1, s[2], 1, "f16", "f16") if s else None
    if node.op == "MUL_MAT" and "kv_read" in node.flags and role in (KQ, KQV):
        a, b = _src(g, node, 0), _dims(_src(g, node, 1))
        d = _dims(a)
        if not d or not b or a is None:
            return None
        if role == KQ:  # k [head_dim, n_kv, heads_kv] by q [head_dim, rows, heads]
            return Shape(KQ, b[1], d[1], d[0], d[0], b[2], d[2], a.dtype, a.dtype)
        # v [n_kv, head_dim, heads_kv] (the transposed cache) by the scores [n_kv, rows, heads]
        return Shape(KQV, b[1], d[0], d[1], d[1], b[2], d[2], a.dtype, a.dtype)
    return None


# (weight type, k, m): the weight's row length and its rows
WeightShape = tuple[str, int, int]


def weight_bytes(shape: WeightShape) -> int:
    """A weight's bytes (its type's blocks over its ``k x m`` values), 0 for a type gguf does not
    know."""
    import gguf

    name, k, m = shape
    try:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name.upper()]]
    except KeyError:
        return 0
    return k // block * size * m


def weight_shape(node: Node, graph: Graph) -> WeightShape | None:
    """The weight a matmul of one column reads (MUL_MAT by a single token, a weight of two
    dimensions), None for any other node."""
    # (a graph's shapes drop trailing dimensions of 1: one column's output is [m])
    if node.op != "MUL_MAT" or any(int(x) != 1 for x in node.shape[1:]):
        return None
    src = node.src[0] if node.src else {}
    if src.get("kind") != "weight":
        return None
    dims = [int(x) for x in derive.src_shape(src, graph)] + [1, 1]
    if dims[2] != 1 or dims[3] != 1:
        return None
    return (str(src.get("type") or ""), dims[0], dims[1])


def one_column(graph: Graph) -> dict[WeightShape, int]:
    """The weights ``graph``'s matmuls of one column read, with the bytes each shape's read in
    all."""
    out: dict[WeightShape, int] = {}
    for node in graph.nodes:
        key = weight_shape(node, graph)
        if key is not None:
            out[key] = out.get(key, 0) + weight_bytes(key)
    return out
