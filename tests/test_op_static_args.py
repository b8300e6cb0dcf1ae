"""``op_static_args`` and ``op_rates`` against values worked out by hand.

Both trace writers build every op's args from these, so comparing the writers with each other
cannot catch a mistake in them: these numbers are computed here from the formulas in
converters/derive.py, not by calling it.
"""

from __future__ import annotations

from typing import Any

from llamacpp_instr.converters.decode import Graph, Node
from llamacpp_instr.converters.trace_layout import op_rates, op_static_args


def weight(name: str, type_: str, shape: list[int], nbytes: int) -> dict[str, Any]:
    return {"name": name, "kind": "weight", "type": type_, "shape": shape, "bytes": nbytes}


NORM_W = weight("blk.0.attn_norm.weight", "f32", [256], 1024)
Q_W = weight("blk.0.attn_q.weight", "q8_0", [256, 256], 69632)
OUT_W = weight("output.weight", "q6_K", [256, 1000], 210000)
IDX = {"name": "idx", "kind": "input", "type": "i64", "shape": [1], "bytes": 8}

NODES = [
    Node(0, "attn_norm-0", "MUL", None, 0, [256], "f32", 1024, [NORM_W], []),
    Node(1, "Qcur-0", "MUL_MAT", None, 0, [256, 2], "f32", 2048, [Q_W, {"node": 0}], []),
    Node(2, "ffn_swiglu-0", "GLU", "SWIGLU", 0, [512], "f32", 2048, [{"node": 1}, {"node": 1}], []),
    # fmt: off
    Node(
        3, "cache_k_l0 (view)", "SET_ROWS", None, 0, [128, 256], "f16", 65536,
        [{"node": 0}, IDX], ["kv_write"],
    ),
    # fmt: on
    Node(4, "result_output", "MUL_MAT", None, None, [1000], "f32", 4000, [OUT_W, {"node": 0}], []),
]
GRAPH = Graph(ctx=1, id=7, n_tokens=2, nodes=NODES)


def args(i: int, fused: tuple[int, ...] = ()) -> tuple[dict[str, Any], int, int, dict[str, Any]]:
    return op_static_args(NODES[i], [NODES[j] for j in fused], GRAPH)


def test_matmul_with_a_weight() -> None:
    head, n_flops, n_bytes, tail = args(1)
    # 2 * K (256, the weight's first dimension) * 512 output elements
    assert n_flops == 2 * 256 * 512 == 262144
    # its output, the weight and the activation it reads
    assert n_bytes == 2048 + 69632 + 1024 == 72704
    assert head == {
        "op": "MUL_MAT",
        "node": "Qcur-0",
        "node_index": 1,
        "graph": 7,
        "layer": 0,
        "shape": "[256, 2]",
        "dtype": "f32",
        "bytes": 2048,
        "sources": "blk.0.attn_q.weight q8_0 [256, 256] (weight); attn_norm-0 f32 [256]",
        "category": "matmul",
        "est_flops": 262144,
        "est_bytes_moved": 72704,
    }
    # in this order: the UI lists args as written
    assert (
        list(head)
        == (
            "op node node_index graph layer shape dtype bytes sources category est_flops "
            "est_bytes_moved"
        ).split()
    )
    # arithmetic intensity, FLOPs per byte moved: 262144 / 72704, to 3 decimals
    assert tail == {"weight": "blk.0.attn_q.weight", "weight_type": "q8_0", "intensity": 3.606}


def test_fused_nodes_add_their_work() -> None:
    head, n_flops, n_bytes, tail = args(1, (2,))
    # the GLU: 5 FLOPs per output element; it moves its output and both inputs (2048 each)
    assert n_flops == 262144 + 5 * 512 == 264704
    assert n_bytes == 72704 + 3 * 2048 == 78848
    assert (head["est_flops"], head["est_bytes_moved"]) == (264704, 78848)
    assert head["op"] == "MUL_MAT" and head["node"] == "Qcur-0"  # the node's own, not the GLU's
    assert tail == {
        "weight": "blk.0.attn_q.weight",
        "weight_type": "q8_0",
        "fused": "ffn_swiglu-0 (GLU:SWIGLU)",
        "intensity": 3.357,  # 264704 / 78848
    }


def test_kv_cache_write() -> None:
    head, n_flops, n_bytes, tail = args(3)
    assert n_flops == 0  # SET_ROWS does no arithmetic
    assert n_bytes == 2 * 1024  # reads its first source (1024 bytes) and writes as much
    assert head["category"] == "kv_cache"
    assert head["sources"] == "attn_norm-0 f32 [256]; idx i64 [1] (input)"
    assert head["shape"] == "[128, 256]" and head["dtype"] == "f16"
    assert tail == {"flags": "kv_write", "intensity": 0.0}


def test_outside_any_layer() -> None:
    head, n_flops, n_bytes, tail = args(4)
    assert head["layer"] == "none"
    assert n_flops == 2 * 256 * 1000
    assert n_bytes == 4000 + 210000 + 1024
    # 512000 / 215024
    assert tail == {"weight": "output.weight", "weight_type": "q6_K", "intensity": 2.381}


def test_elementwise_and_activation_categories() -> None:
    assert args(0)[0]["category"] == "elementwise"
    assert args(0)[1] == 256  # MUL: one FLOP per element
    assert args(2)[0]["category"] == "activation"
    assert args(2)[0]["op"] == "GLU:SWIGLU"


def test_rates() -> None:
    # FLOPs per ns are GFLOP/s, bytes per ns GB/s, rounded to 3 decimals
    assert op_rates(262144, 72704, 1000) == (262.144, 72.704)
    assert op_rates(1, 2, 3) == (0.333, 0.667)
    assert op_rates(5, 5, 0) == (0.0, 0.0)  # no duration: no rate
