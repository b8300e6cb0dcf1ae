"""What ggml's scheduler did in each compute: its splits by device, and the copies between them.

A CPU-only run has one split and no copies. Offloading to a second backend (ggml's RPC backend on
loopback, see rpc_backend.py: the same code paths a GPU takes) splits the graph between devices
and copies tensors across; each copy's bytes are the copied tensor's size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.rpc_backend import run_offloaded
from helpers.support import by_type, read_log

import llamacpp_instr

pytestmark = pytest.mark.native


def _start(records: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in records if r["type"] == "session_start")


def test_a_cpu_only_compute_is_one_split_without_copies(
    tiny_llama_f32: Path, tmp_path: Path, schema_validator: Any
) -> None:
    import llama_cpp

    llm = llama_cpp.Llama(str(tiny_llama_f32), n_ctx=128, n_batch=64, n_threads=2, verbose=False)
    try:
        with llamacpp_instr.session(llm, tmp_path / "c.log", level="minimal"):
            llm.eval([1, 40, 41, 42])
            llm.eval([43])
    finally:
        llm.close()
    records = read_log(tmp_path / "c.log")
    for r in records:
        schema_validator.validate(r)
    devices = _start(records)["machine"]["devices"]
    assert devices and devices[0]["type"] == "cpu" and devices[0]["memory_total"] > 0
    computes = by_type(records, "compute")
    assert len(computes) == 2
    for c in computes:
        assert len(c["splits"]) == 1 and c["copies"] == []
        dev, i0, i1, t0, t_launch, t1 = c["splits"][0]
        assert devices[dev]["type"] == "cpu" and i0 == 0 and i1 > 0
        assert 0 <= t0 <= t_launch <= t1 <= c["dur"] and c["wait"] >= 0


def _offloaded_run(model: Path, log: Path, n_gpu_layers: int) -> None:
    run_offloaded(f"""
import llama_cpp, llamacpp_instr
llm = llama_cpp.Llama({str(model)!r}, n_ctx=128, n_batch=64, n_threads=2, verbose=False,
                      n_gpu_layers={n_gpu_layers})
with llamacpp_instr.session(llm, {str(log)!r}, level="detailed"):
    llm.eval([1, 40, 41, 42, 43, 44])
    llm.eval([45])
llm.close()
""")


def test_a_partial_offload_logs_its_splits_and_copies(
    tiny_llama_f32: Path, tmp_path: Path, schema_validator: Any
) -> None:
    """Layer 1 of 0..1 and the output on the RPC device: the graph is split between it and the CPU, and
    every tensor crossing over is logged with its size."""
    _offloaded_run(tiny_llama_f32, tmp_path / "p.log", n_gpu_layers=2)
    records = read_log(tmp_path / "p.log")
    for r in records:
        schema_validator.validate(r)
    devices = _start(records)["machine"]["devices"]
    rpc = [i for i, d in enumerate(devices) if d["backend"].startswith("RPC")]
    assert len(rpc) == 1 and devices[rpc[0]]["type"] == "gpu"
    graphs = {g["graph"]: g for g in by_type(records, "graph")}
    weights = {w["name"]: w for w in _start(records)["weights"]}
    # the offloaded layer's weights live on the device (its buffer is named after it)
    assert all(w["buffer"].startswith("RPC") for n, w in weights.items() if n.startswith("blk.1."))
    computes = by_type(records, "compute")
    assert len(computes) == 2
    for c in computes:
        nodes = graphs[c["graph"]]["nodes"]
        splits = c["splits"]
        assert {s[0] for s in splits} == {0, rpc[0]}
        # the splits run the graph's nodes in order, each range once
        assert splits[0][1] == 0 and splits[-1][2] == len(nodes)
        assert all(a[2] == b[1] for a, b in zip(splits, splits[1:], strict=False))
        assert c["copies"], "nothing crossed between the devices"
        leaf_bytes = {s["name"]: s["bytes"] for n in nodes for s in n["src"] if "name" in s}
        for split, node, name, nbytes, src, dst, t0, dur in c["copies"]:
            assert 0 <= split < len(splits) and splits[split][0] == dst and src != dst
            expected = nodes[node]["bytes"] if node >= 0 else leaf_bytes.get(name)
            if node < 0 and name in weights:
                expected = weights[name]["bytes"]
            assert expected is not None, name
            assert nbytes == expected, (name, nbytes, expected)
            assert 0 <= t0 and 0 <= dur and t0 + dur <= c["dur"]


def test_a_session_that_fails_to_open_stops_recording_transfers(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """LLAMA_INSTR_LOG set, its session unable to open (issue 35): the model's upload, recorded for
    it, is dropped and recording stops, so that a later session the program opens itself holds no
    load-phase transfers it never asked for (before the fix they were kept, up to 262,144 rows)."""
    log = tmp_path / "later.log"
    run_offloaded(f"""
import os, json
os.environ["LLAMA_INSTR_LOG"] = {str(tmp_path / "no-such-dir" / "env.log")!r}
import llama_cpp, llamacpp_instr
llm = llama_cpp.Llama({str(tiny_llama_f32)!r}, n_ctx=128, n_gpu_layers=99, verbose=False)
with llamacpp_instr.session(llm, {str(log)!r}, "detailed"):
    llm.eval(llm.tokenize(b"Hello there", add_bos=True))
llm.close()
""")
    recs = read_log(log)
    steps = [r for r in recs if r["type"] == "step_begin"]
    transfers = [r for r in recs if r["type"] == "transfers"]
    assert steps, "the later session recorded nothing"
    assert not [t for t in transfers if t.get("phase") == "load"], transfers[:2]
