"""Derived quantities every writer shares: estimated FLOPs and bytes moved per op, rates, categories.

These are estimates from shapes (the timings they are divided by are measured). Shapes are in
ggml order: ``shape[0]`` is the innermost (contiguous) dimension.

FLOPs per node (``n`` = elements of the output):

* ``MUL_MAT``: ``2 * K * n`` where ``K = src0.shape[0]`` (a multiply and an add per inner element).
* ``FLASH_ATTN_EXT``: ``4 * D * n_q * n_kv * H`` (Q·Kᵀ and P·V), from q ``[D, n_q, H]`` and
  k ``[D, n_kv, H_kv]``.
* ``RMS_NORM`` 3n, ``NORM`` 5n, ``SOFT_MAX`` 5n (max, subtract, exp, sum, divide), ``ROPE`` 6n,
  ``GLU`` 5n (activation + product), ``UNARY`` 4n, element-wise ``ADD``/``MUL``/``SUB``/``DIV``/
  ``SCALE`` n.
* Data movement (``GET_ROWS``, ``SET_ROWS``, ``CPY``, ``CONT``, views): 0.

Bytes moved per node: the bytes of every source plus the bytes of the output, except that

* a KV cache write (``SET_ROWS``/``CPY`` into the cache, whose output is a view of the whole cache)
  counts the rows it writes: twice the bytes of the rows it reads (read once, written once);
* a strided view source counts the elements it holds, not the span ggml_nbytes gives it;
* a ``GET_ROWS`` (the token embedding lookup) counts the rows it gathers, not the whole table: the
  table's bytes times the rows of the output over the rows of the table, plus the indices and the
  output.

What a step reads from memory that is not an activation (the roofline's headline, see
``roofline.py``): ``weight_bytes_read`` (every weight source, ``GET_ROWS`` counting only the rows it
gathers) and ``kv_bytes_read`` (the KV cache views a ``kv_read`` node reads).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..reading.decode.graphs import Graph, Node

_PER_ELEMENT_FLOPS = {
    "ADD": 1,
    "SUB": 1,
    "MUL": 1,
    "DIV": 1,
    "SCALE": 1,
    "ADD1": 1,
    "ACC": 1,
    "RMS_NORM": 3,
    "NORM": 5,
    "L2_NORM": 3,
    "SOFT_MAX": 5,
    "ROPE": 6,
    "GLU": 5,
    "UNARY": 4,
    "SILU": 4,
    "GELU": 8,
}

CATEGORIES = {
    "MUL_MAT": "matmul",
    "MUL_MAT_ID": "matmul",
    "FLASH_ATTN_EXT": "attention",
    "SOFT_MAX": "attention",
    "ROPE": "rope",
    "RMS_NORM": "norm",
    "NORM": "norm",
    "GET_ROWS": "memory",
    "SET_ROWS": "memory",
    "CPY": "memory",
    "CONT": "memory",
    "DUP": "memory",
}


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 0


def src_shape(src: dict[str, Any], graph: Graph) -> list[int]:
    if "node" in src:
        return graph.nodes[src["node"]].shape
    return list(src.get("shape", []))


# bytes per element of the types a strided view can have (blocks for the quantized ones)
_TYPE_SIZE = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "i32": 4.0,
    "i64": 8.0,
    "i16": 2.0,
    "i8": 1.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}


def src_bytes(src: dict[str, Any], graph: Graph) -> int:
    """Bytes of a source. A node's ``bytes`` is ggml_nbytes, which for a strided view (the
    transposed V cache) spans the whole range it strides over: the elements it holds are counted
    instead, where its type's size is known."""
    if "node" in src:
        n = graph.nodes[src["node"]]
        size = _TYPE_SIZE.get(n.dtype)
        return n.bytes if size is None else min(n.bytes, int(numel(n.shape) * size))
    return int(src.get("bytes", 0))


def is_kv_write(node: Node) -> bool:
    return "kv_write" in node.flags


def kv_caches(node: Node, graph: Graph) -> tuple[str, ...]:
    """The KV cache tensors (``cache_k_l0``, ...) a node's data comes from or goes to: its
    ``kv_cache`` sources, directly or through views, reshapes and permutes (``noop`` nodes).

    Of a ``kv_write`` node, the cache it writes; of a ``kv_read`` node, the caches it reads."""
    found: list[str] = []
    todo = list(node.src)
    seen: set[int] = set()
    while todo:
        s = todo.pop()
        j = s.get("node")
        if j is None:
            if s.get("kind") == "kv_cache" and s.get("name") not in found:
                found.append(str(s.get("name")))
        elif j not in seen and 0 <= j < len(graph.nodes) and "noop" in graph.nodes[j].flags:
            seen.add(j)
            todo.extend(graph.nodes[j].src)
    return tuple(sorted(found))


def weight_source(node: Node) -> dict[str, Any] | None:
    """The weight a node reads (for a matmul: which weight, and its quantization type)."""
    for s in node.src:
        if s.get("kind") == "weight":
            return s
    return None


def flops(node: Node, graph: Graph) -> int:
    n = numel(node.shape)
    if node.op in ("MUL_MAT", "MUL_MAT_ID") and node.src:
        k = src_shape(node.src[0], graph)
        return 2 * (k[0] if k else 0) * n
    if node.op == "FLASH_ATTN_EXT" and len(node.src) >= 2:
        q = src_shape(node.src[0], graph) + [1, 1, 1]
        kk = src_shape(node.src[1], graph) + [1, 1, 1]
        return 4 * q[0] * q[1] * kk[1] * q[2]
    return _PER_ELEMENT_FLOPS.get(node.op, 0) * n


def _gathered(node: Node, src: dict[str, Any], graph: Graph) -> int:
    """Bytes of ``src`` that ``node`` reads: a GET_ROWS table only the rows it gathers."""
    b = src_bytes(src, graph)
    if node.op == "GET_ROWS" and src is node.src[0]:
        table = src_shape(src, graph) + [1, 1, 1]
        rows = table[1] * table[2] * table[3]
        got = (node.shape + [1, 1, 1])[1:4]
        return b * min(rows, got[0] * got[1] * got[2]) // max(rows, 1)
    return b


def bytes_moved(node: Node, graph: Graph) -> int:
    if is_kv_write(node):
        return 2 * sum(src_bytes(s, graph) for s in node.src[:1])
    return node.bytes + sum(_gathered(node, s, graph) for s in node.src)


def weight_bytes_read(node: Node, graph: Graph) -> int:
    """Bytes of model weights the node reads (a GET_ROWS table: the rows it gathers)."""
    return sum(_gathered(node, s, graph) for s in node.src if s.get("kind") == "weight")


def kv_bytes_read(node: Node, graph: Graph) -> int:
    """Bytes of the KV cache a ``kv_read`` node reads: its sources that are views of the cache."""
    if "kv_read" not in node.flags:
        return 0
    total = 0
    for s in node.src:
        j = s.get("node")
        reads_cache = s.get("kind") == "kv_cache" or (
            j is not None and 0 <= j < len(graph.nodes) and kv_caches(graph.nodes[j], graph)
        )
        if reads_cache:
            total += src_bytes(s, graph)
    return total


def category(node: Node) -> str:
    if "kv_write" in node.flags:
        return "kv_cache"
    if node.op in ("GLU", "UNARY"):
        return "activation"
    return CATEGORIES.get(node.op, "elementwise")


def gflops_per_s(n_flops: int, dur_ns: int) -> float:
    return n_flops / dur_ns if dur_ns > 0 else 0.0  # flops/ns == GFLOP/s


def gbytes_per_s(n_bytes: int, dur_ns: int) -> float:
    return n_bytes / dur_ns if dur_ns > 0 else 0.0  # bytes/ns == GB/s
