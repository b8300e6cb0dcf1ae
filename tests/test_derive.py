"""The byte and FLOP formulas of converters/session/derive.py, and the roofline arithmetic of
converters/analysis/roofline.py, against values computed by hand from the shapes written here.

Every writer shares these formulas, so only a direct test can catch one being wrong. The graph
below is one layer of a llama-style model with the op types the bundled model's and the tiny
models' graphs hold (GET_ROWS, RMS_NORM, MUL, a quantized MUL_MAT, ROPE, the KV cache write and
read, SOFT_MAX, CONT, ADD, GLU), plus FLASH_ATTN_EXT and a CPY into the cache (flash attention and
older KV layouts). Shapes: n_embd 256, 4 tokens, head size 64, 4 query heads, 2 KV heads, 256 KV
cells, vocabulary 100, FFN 512.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from llamacpp_instr.converters.analysis import roofline
from llamacpp_instr.converters.reading.decode.graphs import Graph, Node
from llamacpp_instr.converters.session import derive
from llamacpp_instr.converters.session.machine_peaks import DevicePeaks

pytestmark = pytest.mark.fast


def _node(i: int, op: str, shape: list[int], dtype: str, nbytes: int, src: list[Any], **kw: Any):
    return Node(
        i=i,
        name=kw.get("name", f"n{i}"),
        op=op,
        sub=kw.get("sub"),
        layer=0,
        shape=shape,
        dtype=dtype,
        bytes=nbytes,
        src=src,
        flags=kw.get("flags", []),
    )


def _w(name: str, type_: str, shape: list[int], nbytes: int) -> dict[str, Any]:
    return {"name": name, "kind": "weight", "type": type_, "shape": shape, "bytes": nbytes}


def _in(name: str, type_: str, shape: list[int], nbytes: int) -> dict[str, Any]:
    return {"name": name, "kind": "input", "type": type_, "shape": shape, "bytes": nbytes}


def _kv(name: str, shape: list[int], nbytes: int) -> dict[str, Any]:
    return {"name": name, "kind": "kv_cache", "type": "f16", "shape": shape, "bytes": nbytes}


def N(i: int) -> dict[str, int]:
    return {"node": i}


# token_embd q8_0 [256, 100]: 100 rows x 8 blocks x 34 bytes = 27200
# q4_K: 144 bytes per 256 values; f16: 2 bytes; f32: 4 bytes
NODES = [
    _node(0, "GET_ROWS", [256, 4], "f32", 4096,
          [_w("token_embd.weight", "q8_0", [256, 100], 27200), _in("inp_tokens", "i32", [4], 16)]),
    _node(1, "RMS_NORM", [256, 4], "f32", 4096, [N(0)]),
    _node(2, "MUL", [256, 4], "f32", 4096, [N(1), _w("blk.0.attn_norm.weight", "f32", [256], 1024)]),
    # q4_K [256, 256]: 256 rows x 1 block x 144 = 36864
    _node(3, "MUL_MAT", [256, 4], "f32", 4096, [_w("blk.0.attn_q.weight", "q4_k", [256, 256], 36864), N(2)]),
    _node(4, "ROPE", [64, 4, 4], "f32", 4096, [N(3), _in("inp_pos", "i32", [4], 16)]),
    # f16 [256, 128]: 65536
    _node(5, "MUL_MAT", [128, 4], "f32", 2048, [_w("blk.0.attn_k.weight", "f16", [256, 128], 65536), N(2)]),
    _node(6, "SET_ROWS", [128, 256], "f16", 65536,
          [N(5), _in("k_idxs", "i64", [4], 32), _kv("cache_k_l0", [128, 256], 65536)],
          flags=["kv_write"]),
    _node(7, "VIEW", [64, 2, 256], "f16", 65536, [_kv("cache_k_l0", [128, 256], 65536)], flags=["noop"]),
    _node(8, "PERMUTE", [64, 256, 2], "f16", 65536, [N(7)], flags=["noop"]),
    _node(9, "MUL_MAT", [256, 4, 4], "f32", 16384, [N(8), N(4)], flags=["kv_read"]),
    _node(10, "SOFT_MAX", [256, 4, 4], "f32", 16384, [N(9), _in("kq_mask", "f32", [256, 4], 4096)]),
    # the transposed V cache: ggml_nbytes of the strided view spans 261632 bytes, it holds 65536
    _node(11, "VIEW", [256, 64, 2], "f16", 261632, [_kv("cache_v_l0", [128, 1024], 262144)], flags=["noop"]),
    _node(12, "MUL_MAT", [64, 4, 4], "f32", 4096, [N(11), N(10)], flags=["kv_read"]),
    _node(13, "CONT", [256, 4], "f32", 4096, [N(12)]),
    _node(14, "ADD", [256, 4], "f32", 4096, [N(13), N(0)]),
    # q4_K [256, 512]: 512 x 144 = 73728
    _node(15, "MUL_MAT", [512, 4], "f32", 8192, [_w("blk.0.ffn_gate.weight", "q4_k", [256, 512], 73728), N(14)]),
    _node(16, "GLU", [512, 4], "f32", 8192, [N(15), N(15)], sub="SWIGLU"),
    _node(17, "FLASH_ATTN_EXT", [64, 4, 4], "f32", 4096,
          [N(4), N(8), N(8), _in("kq_mask", "f16", [256, 4], 2048)], flags=["kv_read"]),
    _node(18, "CPY", [128, 256], "f16", 65536, [N(5), _kv("cache_k_l0", [128, 256], 65536)], flags=["kv_write"]),
]  # fmt: skip
GRAPH = Graph(ctx=1, id=1, n_tokens=4, nodes=NODES)

# (node, FLOPs, bytes moved, weight bytes read, KV bytes read), each worked out by hand
EXPECTED = [
    # GET_ROWS gathers 4 of 100 rows: 27200 * 4 / 100 = 1088; + indices 16 + output 4096
    (0, 0, 1088 + 16 + 4096, 1088, 0),
    # RMS_NORM: 3 per element, 1024 elements; reads 4096, writes 4096
    (1, 3 * 1024, 4096 + 4096, 0, 0),
    # MUL by the norm weight: 1 per element; 4096 + 1024 (weight) + 4096
    (2, 1024, 4096 + 1024 + 4096, 1024, 0),
    # MUL_MAT q4_K: 2 * K(256) * 1024 outputs; weight 36864 + x 4096 + out 4096
    (3, 2 * 256 * 1024, 36864 + 4096 + 4096, 36864, 0),
    # ROPE: 6 per element; 4096 in, 16 positions, 4096 out
    (4, 6 * 1024, 4096 + 16 + 4096, 0, 0),
    # MUL_MAT f16: 2 * 256 * 512; 65536 + 4096 + 2048
    (5, 2 * 256 * 512, 65536 + 4096 + 2048, 65536, 0),
    # KV write: the 2048 bytes of K rows, read once and written once
    (6, 0, 2 * 2048, 0, 0),
    (7, 0, 65536 + 65536, 0, 0),  # a view (never timed): its source and itself
    (8, 0, 65536 + 65536, 0, 0),
    # KQ: 2 * 64 * (256 * 4 * 4); K view 64*256*2 f16 = 65536, Q 4096, out 4096 f32 = 16384
    (9, 2 * 64 * 4096, 65536 + 4096 + 16384, 0, 65536),
    # SOFT_MAX: 5 per element of 4096; 16384 in + 4096 mask + 16384 out
    (10, 5 * 4096, 16384 + 4096 + 16384, 0, 0),
    (11, 0, 261632 + 262144, 0, 0),
    # KQV: 2 * 256 * (64 * 4 * 4); V holds 256*64*2 f16 = 65536 (not its 261632 span)
    (12, 2 * 256 * 1024, 65536 + 16384 + 4096, 0, 65536),
    (13, 0, 4096 + 4096, 0, 0),  # CONT: a copy
    (14, 1024, 4096 * 3, 0, 0),  # ADD
    # MUL_MAT q4_K ffn: 2 * 256 * 2048; 73728 + 4096 + 8192
    (15, 2 * 256 * 2048, 73728 + 4096 + 8192, 73728, 0),
    (16, 5 * 2048, 8192 * 3, 0, 0),  # GLU: 5 per element
    # FLASH_ATTN_EXT: 4 * D(64) * n_q(4) * n_kv(256) * H(4); q 4096 + k 65536 + v 65536 + mask
    # 2048 + out 4096; K and V read from the cache
    (17, 4 * 64 * 4 * 256 * 4, 4096 + 65536 + 65536 + 2048 + 4096, 0, 2 * 65536),
    (18, 0, 2 * 2048, 0, 0),  # CPY into the cache: as SET_ROWS
]


@pytest.mark.parametrize("i,flops,nbytes,wbytes,kvbytes", EXPECTED, ids=[n.label for n in NODES])
def test_formulas_by_hand(i: int, flops: int, nbytes: int, wbytes: int, kvbytes: int) -> None:
    node = GRAPH.nodes[i]
    assert derive.flops(node, GRAPH) == flops
    assert derive.bytes_moved(node, GRAPH) == nbytes
    assert derive.weight_bytes_read(node, GRAPH) == wbytes
    assert derive.kv_bytes_read(node, GRAPH) == kvbytes


def test_every_node_has_a_hand_value() -> None:
    assert [e[0] for e in EXPECTED] == list(range(len(NODES)))


def test_graph_reads_sum_the_weights_and_cache() -> None:
    w, kv = roofline.graph_reads(GRAPH)
    assert w == 1088 + 1024 + 36864 + 65536 + 73728
    assert kv == 65536 + 65536 + 2 * 65536


def test_rates() -> None:
    assert derive.gflops_per_s(2_000, 1_000) == 2.0
    assert derive.gbytes_per_s(5_000, 1_000) == 5.0
    assert derive.gflops_per_s(1, 0) == 0.0


DEV = DevicePeaks(
    "CPU", "cpu", "test", bandwidth_gbs=10.0, matmul_gflops={"q4_k": 100.0, "f32": 50.0}
)


def _ops(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def test_roof_columns_by_hand() -> None:
    ops = _ops(
        [
            # node 3: 45056 bytes at 10 GB/s = 4505.6 ns; 524288 FLOPs at 100 = 5242.88 ns
            {"op": "MUL_MAT", "weight_type": "q4_k", "est_flops": 524288, "est_bytes": 45056, "dur_ns": 10_000},
            # node 14: 12288 bytes = 1228.8 ns; 1024 FLOPs at the f32 roof 50 = 20.48 ns
            {"op": "ADD", "weight_type": None, "est_flops": 1024, "est_bytes": 12288, "dur_ns": 2048},
            # node 9 (KV read, f16 cache, not measured: the highest roof, 100): 86016 bytes =
            # 8601.6 ns; 524288 FLOPs = 5242.88 ns
            {"op": "MUL_MAT", "weight_type": None, "est_flops": 524288, "est_bytes": 86016, "dur_ns": 17203.2},
            # a copy: no FLOPs; 8192 bytes = 819.2 ns
            {"op": "CONT", "weight_type": None, "est_flops": 0, "est_bytes": 8192, "dur_ns": 1638.4},
        ]
    )  # fmt: skip
    c = roofline.op_columns(ops, DEV, kv_type="f16")
    np.testing.assert_allclose(c["intensity"], [524288 / 45056, 1024 / 12288, 524288 / 86016, 0])
    np.testing.assert_allclose(c["ideal_ns"], [5242.88, 1228.8, 8601.6, 819.2])
    np.testing.assert_allclose(c["roof_frac"], [0.524288, 0.6, 0.5, 0.5])
    assert list(c["bound"]) == ["compute", "memory", "memory", "memory"]
    np.testing.assert_allclose(c["gflops_s"], [52.4288, 0.5, 524288 / 17203.2, 0])


def test_no_peaks_gives_empty_roofs() -> None:
    ops = _ops([{"op": "ADD", "weight_type": None, "est_flops": 1, "est_bytes": 12, "dur_ns": 3}])
    c = roofline.op_columns(ops, None, kv_type="f16")
    assert math.isnan(c["roof_frac"][0]) and c["intensity"][0] == 1 / 12


def test_aggregate_is_time_weighted() -> None:
    # two ADDs: ideal 100 of 200 ns and 300 of 300 ns: (100 + 300) / 500 = 0.8, lost 100 ns
    ops = _ops(
        [
            {"label": "ADD", "est_flops": 0, "est_bytes": 1000, "dur_ns": 200, "ideal_ns": 100.0, "bound": "memory"},
            {"label": "ADD", "est_flops": 0, "est_bytes": 3000, "dur_ns": 300, "ideal_ns": 300.0, "bound": "memory"},
        ]
    )  # fmt: skip
    a = roofline.aggregate(ops, "label").iloc[0]
    assert a["roof_frac"] == pytest.approx(0.8)
    assert a["lost_ns"] == pytest.approx(100.0)
    assert a["gbs"] == pytest.approx(4000 / 500)
    assert a["bound"] == "memory"
