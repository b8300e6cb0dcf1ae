"""The compute records' bookkeeping, checked against facts the log states independently.

Each test here reproduces a bug a review found in the native side (issue "Native correctness"):
per-thread rows read at another compute's offset, captures served stale, a graph index trusted
after a rebuild while recording was paused, and token counts guessed per compute.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.rpc_backend import run_offloaded
from helpers.support import by_type, read_log

import llamacpp_instr

pytestmark = pytest.mark.native


def _graphs(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {g["graph"]: g for g in by_type(records, "graph")}


def _embedded_tokens(graph: dict[str, Any]) -> int:
    """Tokens a graph embeds: the rows its token_embd GET_ROWS gathers (0: no ubatch's graph)."""
    for n in graph["nodes"]:
        if n["op"] == "GET_ROWS" and any(
            s.get("name") == "token_embd.weight" for s in n["src"] if "name" in s
        ):
            return int(n["shape"][1]) if len(n["shape"]) > 1 else 1
    return 0


def test_verbose_thread_rows_follow_each_computes_thread_count(
    smollm2_path: Path, tmp_path: Path
) -> None:
    """ubatches of 8, 8 and 1 tokens: the first two run n_threads_batch=1 threads, the last
    n_threads=2. Each op's row holds its compute's thread count of finish times, within the op."""
    import llama_cpp

    llm = llama_cpp.Llama(
        str(smollm2_path),
        n_ctx=128,
        n_batch=64,
        n_ubatch=8,
        n_threads=2,
        n_threads_batch=1,
        verbose=False,
    )
    try:
        tokens = llm.tokenize(b"The quick brown fox jumps over the lazy dog, and then some more")
        tokens = (tokens * 3)[:17]
        with llamacpp_instr.session(llm, tmp_path / "v.log", level="verbose"):
            llm.eval(tokens)
    finally:
        llm.close()
    computes = by_type(read_log(tmp_path / "v.log"), "compute")
    assert [c["n_tokens"] for c in computes] == [8, 8, 1]
    assert [c["n_threads"] for c in computes] == [1, 1, 2]
    for c in computes:
        assert c["ops"] and len(c["threads"]) == len(c["ops"])
        for op, row in zip(c["ops"], c["threads"], strict=True):
            assert len(row) == c["n_threads"]
            assert all(0 <= t <= op[2] for t in row), (c["ubatch"], op, row)


def _captured(api: Any, ctx: Any) -> list[tuple[str, np.ndarray]]:
    """Every captured output, in order (names repeat: Kcur-0 is a matmul, a reshape, a rope)."""
    lib = api.lib
    name = ctypes.create_string_buffer(128)
    ne = (ctypes.c_int64 * 4)()
    out = []
    for i in range(int(lib.llama_instr_captured_count(ctx))):
        n = int(lib.llama_instr_captured_get(ctx, i, name, 128, ne, None, 0))
        assert n > 0
        buf = np.empty(n, dtype=np.float32)
        ptr = buf.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        assert lib.llama_instr_captured_get(ctx, i, name, 128, ne, ptr, n) == n
        out.append((name.value.decode(), buf))
    return out


def test_captures_are_only_outputs_the_compute_wrote(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """A capture pattern that matches views (Kcur-0 after reshape) and a norm fused into the MUL
    after it serves only the outputs an op wrote in this decode, never zeros or stale values."""
    import llama_cpp

    llm = llama_cpp.Llama(str(tiny_llama_f32), n_ctx=128, n_batch=64, n_threads=2, verbose=False)
    patterns = ["Kcur-0", "norm-0", "attn_norm-0", "l_out-1"]
    runs = []
    try:
        with llamacpp_instr.session(llm, tmp_path / "c.log", level="detailed"):
            instr_api.capture(llm.ctx, patterns)
            for prompt in ([1, 40, 41, 42, 43, 44], [1, 50, 51, 52]):
                llm.reset()
                llm.eval(prompt)
                runs.append(_captured(instr_api, llm.ctx))
            instr_api.capture(llm.ctx, [])
    finally:
        llm.close()
    records = read_log(tmp_path / "c.log")
    graphs = _graphs(records)
    computes = by_type(records, "compute")
    assert len(computes) == 2 and len(runs) == 2
    for compute, captured in zip(computes, runs, strict=True):
        nodes = graphs[compute["graph"]]["nodes"]
        # an executed op writes the output of its last node (first + fused ones)
        written = [op[0] + len(op[3]) if len(op) > 3 else op[0] for op in compute["ops"]]
        expected = [nodes[i]["name"] for i in sorted(written) if nodes[i]["name"] in patterns]
        assert expected, "no node matched the patterns: the test would prove nothing"
        assert [name for name, _ in captured] == expected
        for name, values in captured:
            assert np.all(np.isfinite(values)) and np.any(values != 0), name
    # the second decode's outputs are its own (another prompt, other values, other length)
    first = dict(runs[0])
    assert all(first[n].size != v.size or not np.array_equal(first[n], v) for n, v in runs[1])


def test_a_graph_rebuilt_while_paused_is_indexed_again(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """llama.cpp rebuilds a graph in the same memory. Rebuilt while recording is paused, and
    reused after it resumes, it must be indexed anew: each compute's graph is the one it ran."""
    import llama_cpp

    llm = llama_cpp.Llama(str(tiny_llama_f32), n_ctx=128, n_batch=64, n_threads=2, verbose=False)
    try:
        with llamacpp_instr.session(llm, tmp_path / "p.log", level="detailed"):
            llm.eval([1, 40, 41, 42, 43, 44])  # a 6-token graph, indexed
            instr_api.set_level("off")
            llm.eval([45])  # rebuilt for 1 token, in the same memory, unseen
            instr_api.set_level("detailed")
            llm.eval([46])  # the 1-token graph, reused
            llm.eval([47, 48, 49])  # and a 3-token one
            totals = instr_api.totals()
    finally:
        llm.close()
    records = read_log(tmp_path / "p.log")
    graphs = _graphs(records)
    computes = by_type(records, "compute")
    assert [c["n_tokens"] for c in computes] == [6, 1, 3]
    for c in computes:
        assert _embedded_tokens(graphs[c["graph"]]) == c["n_tokens"]
        nodes = graphs[c["graph"]]["nodes"]
        assert all(nodes[op[0]]["name"] for op in c["ops"])
    assert totals.n_lost == 0


def _context_shift(llm: Any) -> None:
    """Drop positions 1..3 of 8 and move the rest back by 3 (a context shift): the next
    llama_decode computes a K-shift graph before its ubatch."""
    import llama_cpp

    mem = llama_cpp.llama_get_memory(llm.ctx)
    assert llama_cpp.llama_memory_seq_rm(mem, 0, 1, 4)
    llama_cpp.llama_memory_seq_add(mem, 0, 4, -1, -3)
    llm.n_tokens = 5


def test_a_k_shift_compute_has_no_tokens(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """Shifting the KV cache makes the next llama_decode compute a K-shift graph before its
    ubatch: that compute embeds no token, and the ubatch's compute has all of the step's."""
    import llama_cpp

    llm = llama_cpp.Llama(str(tiny_llama_f32), n_ctx=128, n_batch=64, n_threads=2, verbose=False)
    try:
        with llamacpp_instr.session(llm, tmp_path / "k.log", level="detailed"):
            llm.eval([1, 40, 41, 42, 43, 44, 45, 46])
            _context_shift(llm)
            llm.eval([47, 48])
    finally:
        llm.close()
    records = read_log(tmp_path / "k.log")
    graphs = _graphs(records)
    steps = by_type(records, "step_end")
    computes = by_type(records, "compute")
    assert [s["n_computes"] for s in steps] == [1, 2], "no K-shift compute: nothing was tested"
    for s in steps:
        mine = [c for c in computes if c["step"] == s["step"]]
        assert sum(c["n_tokens"] for c in mine) == s["n_tokens"]
        for c in mine:
            assert _embedded_tokens(graphs[c["graph"]]) == c["n_tokens"]


def test_a_k_shift_after_a_reserve_takes_its_layers_from_its_cache(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """A K-shift right after llama.cpp reserved its graphs again (here: a control vector set, so
    the next decode reserves first): the K-shift graph is built in the reserve's memory, and the
    reserve's graph callback named tensors at the same addresses. Each ROPE of the K-shift is of
    the layer of the cache it rotates (issue 55 §1). Before the fix the K-shift was built without
    llama_instr_graph_build_begin, so it took the layer ids the reserve left."""
    import llama_cpp
    from llama_cpp import llama_cpp as L

    llm = llama_cpp.Llama(str(tiny_llama_f32), n_ctx=128, n_batch=64, n_threads=2, verbose=False)
    try:
        with llamacpp_instr.session(llm, tmp_path / "k.log", level="detailed"):
            llm.eval([1, 40, 41, 42, 43, 44, 45, 46])
            _context_shift(llm)
            # no vector: only the reserve it makes llama.cpp do at the next decode
            n_embd = L.llama_model_n_embd(llm.model)
            assert L.llama_set_adapter_cvec(llm.ctx, None, 0, n_embd, -1, -1) == 0
            llm.eval([47, 48])
    finally:
        llm.close()
    records = read_log(tmp_path / "k.log")
    graphs = _graphs(records)
    shift = [c for c in by_type(records, "compute") if c["n_tokens"] == 0]
    assert shift, "no K-shift compute: nothing was tested"
    nodes = graphs[shift[0]["graph"]]["nodes"]
    ropes = [n for n in nodes if n["op"] == "ROPE"]
    assert ropes
    for n in ropes:
        (cache,) = [s for s in n["src"] if s.get("kind") == "kv_cache"] or [
            nodes[s["node"]]["src"][0] for s in n["src"] if "node" in s
        ][:1]
        layer = int(cache["name"].split("cache_k_l")[1].split(" ")[0])
        assert n["layer"] == layer, (n["name"], n["layer"], cache["name"])


def _offloaded_k_shift(model: Path, log: Path, n_gpu_layers: int) -> None:
    """The K-shift run above, with n_gpu_layers on an RPC device (a second backend)."""
    run_offloaded(f"""
import llama_cpp, llamacpp_instr
llm = llama_cpp.Llama({str(model)!r}, n_ctx=128, n_batch=64, n_threads=2, verbose=False,
                      n_gpu_layers={n_gpu_layers})
with llamacpp_instr.session(llm, {str(log)!r}, level="detailed"):
    llm.eval([1, 40, 41, 42, 43, 44, 45, 46])
    mem = llama_cpp.llama_get_memory(llm.ctx)
    assert llama_cpp.llama_memory_seq_rm(mem, 0, 1, 4)
    llama_cpp.llama_memory_seq_add(mem, 0, 4, -1, -3)
    llm.n_tokens = 5
    llm.eval([47, 48])
llm.close()
""")


def test_a_compute_with_no_cpu_op_has_the_hosts_times(tiny_llama_f32: Path, tmp_path: Path) -> None:
    """Every layer offloaded: the K-shift graph runs wholly on the other backend, so the CPU
    backend times nothing. Its compute still starts inside its step, and what the host did of it
    (its splits) ends within the step. (The other backend is ggml's RPC server, which times its own
    ops and sends them back: those are on the RPC device, and may end after llama_decode returned,
    as docs/schema.md says.)"""
    _offloaded_k_shift(tiny_llama_f32, tmp_path / "o.log", n_gpu_layers=99)
    records = read_log(tmp_path / "o.log")
    cpu = next(d["index"] for d in records[0]["machine"]["devices"] if d["type"] == "cpu")
    steps = {s["step"]: s for s in by_type(records, "step_end")}
    computes = by_type(records, "compute")
    assert [s["n_computes"] for s in steps.values()] == [1, 2]

    def cpu_ops(c: dict[str, Any]) -> list[Any]:
        owner = {i: s[0] for s in c["splits"] for i in range(s[1], s[2])}
        return [op for op in c.get("ops", []) if owner.get(op[0], cpu) == cpu]

    assert any(not cpu_ops(c) for c in computes), "every compute timed a CPU op: nothing tested"
    for c in computes:
        s = steps[c["step"]]
        assert s["t_start"] <= c["t_start"] and c["dur"] >= 0
        assert c["t_start"] + max(sp[5] for sp in c["splits"]) <= s["t_start"] + s["dur"]


def test_sources_read_through_backend_copies_are_the_models_own(
    tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """One of two layers offloaded: ggml's scheduler reads some sources through copies on the
    other backend ("RPC0#name#0"). The node table names the model's own tensors: weights stay
    weights, the KV cache read stays a kv_read."""
    _offloaded_k_shift(tiny_llama_f32, tmp_path / "p.log", n_gpu_layers=1)
    records = read_log(tmp_path / "p.log")
    graphs = by_type(records, "graph")
    assert graphs
    n_layer = next(r for r in records if r["type"] == "session_start")["model"]["n_layer"]
    for g in graphs:
        srcs = [s for n in g["nodes"] for s in n["src"] if "name" in s]
        assert srcs and not [s["name"] for s in srcs if "#" in s["name"]]
        if _embedded_tokens(g):
            weights = {s["name"] for s in srcs if s["kind"] == "weight"}
            for il in range(n_layer):
                assert f"blk.{il}.attn_q.weight" in weights
            reads = [n for n in g["nodes"] if "kv_read" in n["flags"]]
            assert {n["layer"] for n in reads} == set(range(n_layer))
