"""Execution-time per-op, per-layer and per-thread timing (issue 3), on real runs."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFReader
from helpers.support import PROMPT, RunLog, make_run

pytestmark = pytest.mark.native


def graphs(log: RunLog) -> dict[int, dict[str, Any]]:
    return {g["graph"]: g for g in log.of("graph")}


def built_in_step(log: RunLog) -> set[int]:
    """Steps whose compute ran a graph for the first time (it was built inside that step)."""
    seen: set[int] = set()
    steps = set()
    for c in log.of("compute"):
        if c["graph"] not in seen:
            seen.add(c["graph"])
            steps.add(c["step"])
    return steps


def test_op_time_covers_generation_steps(smollm2_detailed: RunLog) -> None:
    ends = {e["step"]: e for e in smollm2_detailed.of("step_end")}
    kinds = {b["step"]: b["kind"] for b in smollm2_detailed.of("step_begin")}
    per_step: dict[int, int] = defaultdict(int)
    for c in smollm2_detailed.of("compute"):
        per_step[c["step"]] += sum(op[2] for op in c["ops"])
    rebuilt = built_in_step(smollm2_detailed)
    gen = [s for s in ends if kinds[s] == "gen"]
    assert len(gen) == 15
    coverage = {s: per_step[s] / ends[s]["dur"] for s in gen}
    # Steps that reuse their graph: ops are >= 90 % of llama_decode's wall time (a step that
    # builds a new graph also spends time building it, which is not an op). Asserted on the
    # median: on a shared machine a step can be preempted outside the graph compute, which is a
    # fact about the machine, not about the instrumentation.
    reused = sorted(coverage[s] for s in gen if s not in rebuilt)
    assert reused and reused[len(reused) // 2] >= 0.90, coverage
    assert all(0.0 < c <= 1.0 for c in coverage.values()), coverage


def test_spans_nest(smollm2_detailed: RunLog) -> None:
    ends = {e["step"]: e for e in smollm2_detailed.of("step_end")}
    n_layer = smollm2_detailed.start["model"]["n_layer"]
    for c in smollm2_detailed.of("compute"):
        e = ends[c["step"]]
        assert e["t_start"] <= c["t_start"] and c["t_start"] + c["dur"] <= e["t_start"] + e["dur"]
        layers = c["layers"]
        assert [lay[0] for lay in layers] == list(range(n_layer))
        prev_end = 0
        for _, off, dur, n_ops in layers:
            assert off >= prev_end and off + dur <= c["dur"] and n_ops > 0
            prev_end = off + dur
        prev = 0
        for op in c["ops"]:  # ops are sequential on the coordinating thread
            assert op[1] >= prev and op[1] + op[2] <= c["dur"]
            prev = op[1] + op[2]


def test_every_layer_has_its_matmuls_with_its_own_weights(smollm2_detailed: RunLog) -> None:
    n_layer = smollm2_detailed.start["model"]["n_layer"]
    gs = graphs(smollm2_detailed)
    assert gs and n_layer > 0  # the loop below must run
    for g in gs.values():
        by_layer: dict[int, set[str]] = defaultdict(set)
        for n in g["nodes"]:
            if n["op"] != "MUL_MAT":
                continue
            for s in n["src"]:
                if s.get("kind") == "weight" and n["layer"] is not None:
                    assert s["name"].startswith(f"blk.{n['layer']}."), (n["name"], s["name"])
                    by_layer[n["layer"]].add(s["name"].split(".")[2])
        assert sorted(by_layer) == list(range(n_layer))
        for names in by_layer.values():
            assert names == {
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "ffn_gate",
                "ffn_up",
                "ffn_down",
            }


def test_every_graph_node_is_timed_once_per_compute(smollm2_detailed: RunLog) -> None:
    gs = graphs(smollm2_detailed)
    for c in smollm2_detailed.of("compute"):
        nodes = gs[c["graph"]]["nodes"]
        timed = [op[0] for op in c["ops"]] + [f for op in c["ops"] if len(op) == 4 for f in op[3]]
        assert len(timed) == len(set(timed))
        work = {n["i"] for n in nodes if "noop" not in n["flags"]}
        assert set(timed) == work


def test_kv_cache_io_is_visible(smollm2_detailed: RunLog) -> None:
    n_layer = smollm2_detailed.start["model"]["n_layer"]
    gs = graphs(smollm2_detailed)
    assert gs and n_layer > 0  # the loop below must run
    for g in gs.values():
        writes = Counter(n["layer"] for n in g["nodes"] if "kv_write" in n["flags"])
        reads = Counter(n["layer"] for n in g["nodes"] if "kv_read" in n["flags"])
        assert writes == {il: 2 for il in range(n_layer)}  # K and V
        assert set(reads) == set(range(n_layer))
        for n in g["nodes"]:
            if "kv_write" in n["flags"]:
                assert n["op"] in ("SET_ROWS", "CPY")


def test_tiny_model_matmul_shapes(tiny_detailed: RunLog) -> None:
    m = tiny_detailed.start["model"]
    n_embd, n_ff = m["n_embd"], m["n_ff"]
    n_embd_kv = n_embd // m["n_head"] * m["n_head_kv"]
    for g in graphs(tiny_detailed).values():
        T = g["n_tokens"]
        expect = {"Qcur": n_embd, "Kcur": n_embd_kv, "Vcur": n_embd_kv, "attn_out": n_embd,
                  "ffn_gate": n_ff, "ffn_up": n_ff, "ffn_out": n_embd}  # fmt: skip
        seen = set()
        for n in g["nodes"]:
            base = n["name"].rsplit("-", 1)[0]
            if n["op"] == "MUL_MAT" and base in expect:
                # the last layer keeps only the rows that produce logits (1) before its FFN
                rows = 1 if base.startswith("ffn") and n["layer"] == m["n_layer"] - 1 else T
                want = [expect[base], rows] if rows > 1 else [expect[base]]
                assert n["shape"] == want, (n["name"], n["shape"], want)
                seen.add(base)
        assert seen == set(expect)


def test_second_architecture_has_layer_spans(
    tiny_second_arch: Path, tmp_path: Path, instr_api: Any
) -> None:
    log = RunLog(make_run(tiny_second_arch, tmp_path / "arch2.log", "detailed", n_predict=4))
    m = log.start["model"]
    assert m["architecture"] != "llama"
    computes = log.of("compute")
    assert computes and m["n_layer"] > 0  # the loop below must run
    for c in computes:
        assert [lay[0] for lay in c["layers"]] == list(range(m["n_layer"]))


@pytest.mark.parametrize("flash", [False, True])
def test_flash_attention_changes_the_ops(flash: bool, tiny_llama_f32: Path, tmp_path: Path) -> None:
    log = RunLog(
        make_run(tiny_llama_f32, tmp_path / "fa.log", "detailed", n_predict=3, flash_attn=flash)
    )
    assert log.start["context"]["flash_attn"] is flash
    ops = Counter(n["op"] for g in graphs(log).values() for n in g["nodes"])
    n_layer = log.start["model"]["n_layer"]
    if flash:
        assert ops["FLASH_ATTN_EXT"] == n_layer * len(graphs(log)) and ops["SOFT_MAX"] == 0
    else:
        assert ops["SOFT_MAX"] == n_layer * len(graphs(log)) and ops["FLASH_ATTN_EXT"] == 0


def test_verbose_threads_and_stats(smollm2_verbose: RunLog) -> None:
    gs = graphs(smollm2_verbose)
    computes = smollm2_verbose.of("compute")
    assert computes  # each loop below must run
    for c in computes:
        assert c["n_threads"] == 2 and c["ops"]
        for op, th in zip(c["ops"], c["threads"], strict=True):
            assert len(th) == 2 and all(0 <= t <= op[2] for t in th)
    stats = smollm2_verbose.of("tensor_stats")
    assert len(stats) == len(computes)  # one per compute at verbose
    for st in stats:
        nodes = gs[st["graph"]]["nodes"]
        assert st["stats"]
        for i, mn, mx, mean, std, n_nan, n_inf in st["stats"]:
            assert nodes[i]["dtype"] in ("f32", "f16")
            if mn is not None:
                assert mn <= mean <= mx and std >= 0
                assert math.isfinite(mn) and math.isfinite(mx)
            # a healthy model computes finite values only (the attention mask's -inf is an input,
            # not a node, and the soft_max that applies it outputs probabilities)
            assert n_nan == 0 and n_inf == 0


def test_verbose_topk_is_the_greedy_choice(smollm2_verbose: RunLog) -> None:
    topk = {t["step"]: t for t in smollm2_verbose.of("topk")}
    res = smollm2_verbose.result
    steps = sorted(topk)
    assert len(steps) == len(smollm2_verbose.of("step_end"))
    # greedy sampling: each step's top-1 is the next generated token
    for s, tok in zip(steps, res.token_ids, strict=False):
        row = topk[s]["rows"][0]
        assert row["ids"][0] == tok
        assert row["logits"] == sorted(row["logits"], reverse=True) and len(row["ids"]) == 10


def test_verbose_stats_of_the_embedding_lookup(tiny_llama_f32: Path, tmp_path: Path) -> None:
    """The first op gathers token_embd rows of the prompt: its stats must equal numpy's."""
    log = RunLog(
        make_run(tiny_llama_f32, tmp_path / "v.log", "verbose", n_predict=2, value_stats=True)
    )
    first = log.of("step_begin")[0]["tokens"]
    emb = next(t for t in GGUFReader(tiny_llama_f32).tensors if t.name == "token_embd.weight")
    rows = np.asarray(emb.data, dtype=np.float32).reshape(-1, log.start["model"]["n_embd"])[first]
    g = graphs(log)[log.of("compute")[0]["graph"]]
    get_rows = next(n for n in g["nodes"] if n["op"] == "GET_ROWS")
    stats = {s[0]: s for s in log.of("tensor_stats")[0]["stats"]}
    _, mn, mx, mean, std, _, _ = stats[get_rows["i"]]
    assert mn == pytest.approx(float(rows.min()), rel=1e-6)
    assert mx == pytest.approx(float(rows.max()), rel=1e-6)
    assert mean == pytest.approx(float(rows.mean()), rel=1e-4, abs=1e-7)
    assert std == pytest.approx(float(rows.std()), rel=1e-4)


def test_prompt_longer_than_ubatch_runs_several_computes(
    tiny_llama_f32: Path, tmp_path: Path
) -> None:
    prompt = " ".join([PROMPT] * 12)
    log = RunLog(
        make_run(
            tiny_llama_f32, tmp_path / "ub.log", "detailed", n_predict=2, prompt=prompt, n_ubatch=32
        )
    )
    first = log.of("step_begin")[0]
    computes = [c for c in log.of("compute") if c["step"] == first["step"]]
    assert first["n_tokens"] > 32
    assert len(computes) == -(-first["n_tokens"] // 32)
    assert sum(c["n_tokens"] for c in computes) == first["n_tokens"]
    assert log.of("step_end")[0]["n_computes"] == len(computes)


def test_verbose_stats_count_nan_and_inf(tiny_dir: Path, tmp_path: Path) -> None:
    """Every embedding row holds a NaN, a +inf and a -inf: the lookup's stats count them, and its
    min, max and mean are numpy's over the finite values (the blocks holding them are redone
    value by value)."""
    from helpers.tiny_gguf import write_tiny_model

    model = write_tiny_model(tmp_path / "poisoned.gguf", seed=3)
    # written through the reader's shared memory map of the file
    (emb,) = [t for t in GGUFReader(model, "r+").tensors if t.name == "token_embd.weight"]
    data = emb.data.reshape(-1, emb.data.shape[-1])
    data[:, 3], data[:, 100], data[:, 200] = np.nan, np.inf, -np.inf
    del emb, data
    log = RunLog(make_run(model, tmp_path / "v.log", "verbose", n_predict=1, value_stats=True))
    first = log.of("step_begin")[0]["tokens"]
    emb = next(t for t in GGUFReader(model).tensors if t.name == "token_embd.weight")
    rows = np.asarray(emb.data, dtype=np.float32).reshape(-1, log.start["model"]["n_embd"])[first]
    assert np.isnan(rows).sum() == len(first)  # the file really holds them
    finite = rows[np.isfinite(rows)]
    g = graphs(log)[log.of("compute")[0]["graph"]]
    get_rows = next(n for n in g["nodes"] if n["op"] == "GET_ROWS")
    stats = {s[0]: s for s in log.of("tensor_stats")[0]["stats"]}
    _, mn, mx, mean, _, n_nan, n_inf = stats[get_rows["i"]]
    assert (n_nan, n_inf) == (len(first), 2 * len(first))
    assert (np.float32(mn), np.float32(mx)) == (finite.min(), finite.max())
    assert mean == pytest.approx(float(finite.astype(np.float64).mean()), rel=1e-6, abs=1e-9)
