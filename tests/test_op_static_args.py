"""``op_static_args`` and ``op_rates`` against values worked out by hand.

Both trace writers build every op's args from these, so comparing the writers with each other
cannot catch a mistake in them: these numbers are computed here from the formulas in
converters/session/derive.py, not by calling it.
"""

from __future__ import annotations

from typing import Any

import pytest

from llamacpp_instr.converters.reading.decode.graphs import Graph, Node
from llamacpp_instr.converters.session.machine_peaks import DevicePeaks, Roof
from llamacpp_instr.converters.traces.op_args import op_rates, op_static_args

pytestmark = pytest.mark.fast


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
    head, n_flops, n_bytes, tail, ideal = op_static_args(NODES[i], [NODES[j] for j in fused], GRAPH)
    assert ideal is None  # no roof given: no roof fraction
    return head, n_flops, n_bytes, tail


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


# made-up peaks, so that each roof below is worked out by hand: 10 GB/s; matmul peaks in GFLOP/s
DEV = DevicePeaks("CPU", "cpu", "test", 10.0, {"f32": 20.0, "f16": 30.0, "q8_0": 50.0})
ROOF = Roof(DEV, "f16")


def test_roof_of_a_memory_bound_matmul() -> None:
    head, n_flops, n_bytes, tail, ideal = op_static_args(NODES[1], [], GRAPH, ROOF)
    # 72704 bytes at 10 GB/s take 7270.4 ns; 262144 FLOPs at q8_0's 50 GFLOP/s 5242.88 ns
    assert ideal == 7270.4
    assert tail["bound"] == "memory"
    assert tail["intensity"] == 3.606
    # the roof fraction: 7270.4 ns of 1000 ns measured
    assert op_rates(n_flops, n_bytes, 1000, ideal) == (262.144, 72.704, 7.27)
    assert op_rates(n_flops, n_bytes, 0, ideal) == (0.0, 0.0, 0.0)  # no duration: no fraction


def test_roof_of_a_compute_bound_matmul() -> None:
    fast_memory = Roof(DevicePeaks("CPU", "cpu", "test", 1000.0, DEV.matmul_gflops), "f16")
    _, _, _, tail, ideal = op_static_args(NODES[1], [], GRAPH, fast_memory)
    # 72.704 ns for the bytes, 5242.88 ns for the FLOPs at q8_0's peak
    assert ideal == 5242.88
    assert tail["bound"] == "compute"


def test_roof_of_types_not_measured_and_of_other_ops() -> None:
    # q6_K was not measured: the highest peak (50) stands in, so no fraction is overstated
    _, _, n_bytes, tail, ideal = op_static_args(NODES[4], [], GRAPH, ROOF)
    assert ideal == max(215024 / 10.0, 512000 / 50.0) == 21502.4
    # an elementwise MUL is set against the F32 matmul peak: 256 FLOPs / 20; its one source
    # (the norm weight, 1024 bytes) and its output (1024 bytes) / 10
    _, n_flops, n_bytes, tail, ideal = op_static_args(NODES[0], [], GRAPH, ROOF)
    assert (n_flops, n_bytes) == (256, 2048)
    assert ideal == 204.8 and tail["bound"] == "memory"
    # a matmul without a weight (attention over the KV cache) meets the cache type's peak
    assert ROOF.compute("MUL_MAT", None) == 30.0
    assert ROOF.compute("MUL_MAT", "q8_0") == 50.0
    assert ROOF.compute("SOFT_MAX", None) == 20.0
