"""The peak probe (``llama_instr_probe_run`` through ggml's backend API), the per-machine cache of
``instr peaks``, the machine identity in session_start, and the roofline of a real run.

Sane shape only: finite positive figures, the bytes and FLOPs the probe counts equal to its graph's
tensors (sizes worked out by hand here, not by the code under test), cached peaks reused and refused
for another machine. No timing thresholds: speed lives in bench/.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import QUICK, RunLog

from llamacpp_instr import load_session
from llamacpp_instr.cli import main
from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.session import machine_peaks
from llamacpp_instr.native import bindings
from llamacpp_instr.running import peak_probe as measure

pytestmark = pytest.mark.native

# ggml type ids (ggml.h enum ggml_type) and one row of 256 values in each type, by hand:
# f32 4 bytes a value, f16 2, q4_K 144 bytes a block of 256, q8_0 34 bytes a block of 32
TYPES = {"f32": (0, 256 * 4), "f16": (1, 256 * 2), "q4_k": (12, 144), "q8_0": (8, 8 * 34)}


@pytest.fixture(scope="module")
def quick_peaks(instr_api: Any) -> machine_peaks.Peaks:
    return measure.measure(QUICK, instr_api)


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache directory of this test's own (LLAMACPP_INSTR_CACHE)."""
    monkeypatch.setenv("LLAMACPP_INSTR_CACHE", str(tmp_path))
    return tmp_path


def test_machine_info_names_the_cpu(instr_api: Any) -> None:
    m = instr_api.machine_info()
    assert isinstance(m["cpu"], str) and m["cpu"]
    assert m["n_cpus"] == os.cpu_count()
    cpus = [d for d in m["devices"] if d["type"] == "cpu"]
    assert len(cpus) == 1 and cpus[0]["description"] == m["cpu"]
    assert [d["index"] for d in m["devices"]] == list(range(len(m["devices"])))


def test_session_start_records_the_machine(
    instr_api: Any, smollm2_detailed: RunLog, schema_validator: Any
) -> None:
    start = smollm2_detailed.start
    assert start["machine"] == instr_api.machine_info()
    schema_validator.validate(start)
    # the schema checks the field: a machine without its CPU is refused
    with pytest.raises(Exception, match="cpu"):
        schema_validator.validate({**start, "machine": {"n_cpus": 1, "devices": []}})


@pytest.mark.parametrize("name", list(TYPES))
def test_matmul_probe_counts_its_graphs_tensors(instr_api: Any, name: str) -> None:
    type_id, row_bytes = TYPES[name]
    p = instr_api.probe(bindings.PROBE_MATMUL, 0, type_id, 1, 256, 8, 2)
    t = p.tensors
    assert p.n_tensors == 3
    # w [256, 256] of the type, x [256, 8] F32, y [256, 8] F32
    assert (t[0].type, list(t[0].ne), t[0].nbytes) == (type_id, [256, 256, 1, 1], 256 * row_bytes)
    assert (t[1].type, list(t[1].ne), t[1].nbytes) == (0, [256, 8, 1, 1], 256 * 8 * 4)
    assert (t[2].type, list(t[2].ne), t[2].nbytes) == (0, [256, 8, 1, 1], 256 * 8 * 4)
    assert p.bytes == 256 * row_bytes + 2 * 256 * 8 * 4
    assert p.flops == 2 * 256 * 256 * 8
    assert p.device_name == b"CPU" and p.n_threads == 1 and p.buffer_type
    assert 0 < p.best_ns <= p.total_ns
    assert math.isfinite(p.flops / p.best_ns) and p.flops / p.best_ns > 0


def test_matmul_probe_runs_weights_of_one_shape_at_two_counts_in_turn(instr_api: Any) -> None:
    """Five F16 weights [256, 128], each its own, times one column: the first weight's tensors,
    every weight's bytes and output counted, their FLOPs; the runs at the second count timed
    apart (a graph of 256 such weights, 16 MiB, takes longer than one: the work asked is run)."""
    f16 = 1
    p = instr_api.probe(
        bindings.PROBE_MATMUL, 0, f16, 1, 256, 1, 3, m=128, n_weights=5, n_threads_b=2
    )
    t = p.tensors
    assert [(x.type, list(x.ne), x.nbytes) for x in t[:3]] == [
        (f16, [256, 128, 1, 1], 256 * 128 * 2),
        (0, [256, 1, 1, 1], 256 * 4),
        (0, [128, 1, 1, 1], 128 * 4),
    ]
    assert p.bytes == 5 * (256 * 128 * 2 + 128 * 4) + 256 * 4
    assert p.flops == 2 * 256 * 128 * 5
    assert p.n_threads == 1 and 0 < p.best_ns <= p.total_ns and 0 < p.best_ns_b <= p.total_ns_b
    one = instr_api.probe(bindings.PROBE_MATMUL, 0, f16, 1, 256, 1, 3, m=128)
    assert one.bytes == 256 * 128 * 2 + 128 * 4 + 256 * 4 and one.best_ns_b == one.total_ns_b == 0
    many = instr_api.probe(bindings.PROBE_MATMUL, 0, f16, 1, 256, 1, 3, m=128, n_weights=256)
    assert many.best_ns > one.best_ns


def test_probe_medians_sit_among_its_runs(instr_api: Any) -> None:
    f16 = 1
    # of three runs the median is the middle one: the fastest is at most it, the slowest at least
    mm = instr_api.probe(bindings.PROBE_MATMUL, 0, f16, 1, 256, 1, 3, m=128, n_threads_b=2)
    bw = instr_api.probe(bindings.PROBE_BANDWIDTH, 0, 0, 2, 1 << 20, 0, 3)
    for best, median, total in (
        (mm.best_ns, mm.median_ns, mm.total_ns),
        (mm.best_ns_b, mm.median_ns_b, mm.total_ns_b),
        (bw.best_ns, bw.median_ns, bw.total_ns),
    ):
        assert best <= median and best + 2 * median <= total
    assert bw.median_ns_b == 0
    # one run is its own median; of two, their mean
    one = instr_api.probe(bindings.PROBE_MATMUL, 0, f16, 1, 256, 1, 1, m=128)
    assert one.median_ns == one.best_ns == one.total_ns
    two = instr_api.probe(bindings.PROBE_MATMUL, 0, f16, 1, 256, 1, 2, m=128)
    assert two.median_ns in (two.total_ns // 2, (two.total_ns + 1) // 2)


@pytest.mark.parametrize(
    "kind,kw,what",
    [
        (bindings.PROBE_MATMUL, {"m": -1}, "m 0..65536"),
        (bindings.PROBE_MATMUL, {"m": 70000}, "m 0..65536"),
        (bindings.PROBE_MATMUL, {"n_weights": 4097}, "n_weights"),
        (bindings.PROBE_MATMUL, {"n_weights": -1}, "n_weights"),
        # 4096 weights of 256 x 65536 F32: 256 GiB
        (bindings.PROBE_MATMUL, {"m": 65536, "n_weights": 4096}, "4 GiB"),
        (bindings.PROBE_MATMUL, {"n_threads_b": -1}, "n_threads_b"),
        (bindings.PROBE_BANDWIDTH, {"n_threads_b": 2}, "n_threads_b"),
    ],
)
def test_probe_refuses_bad_weights_and_counts(
    instr_api: Any, kind: int, kw: dict[str, int], what: str
) -> None:
    size = 256 if kind == bindings.PROBE_MATMUL else 4096
    with pytest.raises(bindings.SessionError) as e:
        instr_api.probe(kind, 0, 0, 1, size, 1, 1, **kw)
    assert e.value.code == bindings.ERR_INVALID_ARG and what in str(e.value)


def test_bandwidth_probe_counts_its_graphs_tensors(instr_api: Any) -> None:
    n = 1 << 20
    p = instr_api.probe(bindings.PROBE_BANDWIDTH, 0, 0, 2, n, 0, 2)
    # rows of 4096 floats, which the threads share (one long row would be one thread's)
    want = [(0, [4096, n // 4096, 1, 1], 4 * n)] * 3
    assert [(x.type, list(x.ne), x.nbytes) for x in p.tensors] == want
    assert p.bytes == 3 * 4 * n and p.flops == n
    assert 0 < p.best_ns <= p.total_ns and p.n_threads == 2


@pytest.mark.parametrize(
    "args,what",
    [
        ((7, 0, 0, 1, 256, 8, 1), "kind"),
        ((1, 999, 0, 1, 256, 8, 1), "device"),
        ((1, 0, 12, 1, 100, 8, 1), "multiple"),  # q4_K rows are blocks of 256
        ((1, 0, 0, 1, 256, 8, 0), "n_runs"),
        ((1, 0, 4, 1, 256, 8, 1), "type"),  # 4 was Q4_2, removed from ggml
        ((0, 0, 0, 1, 0, 0, 1), "size"),
        ((0, 0, 0, 1, 5000, 0, 1), "multiple of 4096"),
    ],
)
def test_probe_refuses_bad_input(instr_api: Any, args: tuple[int, ...], what: str) -> None:
    with pytest.raises(bindings.SessionError) as e:
        instr_api.probe(*args)
    assert e.value.code == bindings.ERR_INVALID_ARG and what in str(e.value)


def _attn(**kw: int) -> bindings.ProbeAttn:
    """An attention probe's shapes: KQ, 8 query heads of 64 over 2 KV heads, F16 caches of 512
    cells of which 300 read, 3 query rows from position 297, 2 layers (``kw`` changes them)."""
    shape = dict(
        op=bindings.ATTN_KQ, type_k=1, type_v=1, head_dim_k=64, head_dim_v=64, n_head=8, n_head_kv=2,
        n_layer=2, kv_size=512, n_kv=300, pos0=297,
    )  # fmt: skip
    return bindings.ProbeAttn(**(shape | kw))


@pytest.mark.parametrize(
    "op,first,second,out,flops",
    [
        # q [64, 8 heads, 3 rows]; the K cache [2 heads x 64, 512 cells]; out [64, 8, 3]
        (bindings.ATTN_FLASH, [64, 8, 3, 1], [128, 512, 1, 1], [64, 8, 3, 1], 2 * (64 + 64)),
        # kq: scores [300 cells, 3 rows, 8 heads]
        (bindings.ATTN_KQ, [64, 8, 3, 1], [128, 512, 1, 1], [300, 3, 8, 1], 2 * 64),
        # softmax of the scores with the mask [300, 3]
        (bindings.ATTN_SOFTMAX, [300, 3, 8, 1], [300, 3, 1, 1], [300, 3, 8, 1], 1),
        # kqv: the V cache by the scores, out [64, 3, 8]
        (bindings.ATTN_KQV, [300, 3, 8, 1], [128, 512, 1, 1], [64, 3, 8, 1], 2 * 64),
    ],
)
def test_attention_probe_runs_llama_cpp_s_ops(
    instr_api: Any, op: int, first: list[int], second: list[int], out: list[int], flops: int
) -> None:
    """Each op of attention as llama.cpp's graph builds it, on its caches' views: the tensors
    and FLOPs it reports (per (row, cell) pair of every head, both layers), worked out here."""
    p = instr_api.probe(bindings.PROBE_ATTENTION, 0, 0, 2, 0, 3, 2, _attn(op=op))
    assert p.n_tensors == 3
    assert [list(t.ne) for t in p.tensors[:3]] == [first, second, out]
    assert p.flops == 300 * 3 * 8 * flops * 2
    assert p.device_name == b"CPU" and p.n_threads == 2
    assert 0 < p.best_ns <= p.total_ns


def test_attention_probe_grows_with_the_cells_it_reads(instr_api: Any) -> None:
    """Flash attention over 4,096 cells takes longer than over 256 (one row, the same layers):
    the probe runs the work it is asked (no threshold on how much longer: speed is bench/'s)."""

    def ns(n_kv: int) -> int:
        a = _attn(op=bindings.ATTN_FLASH, kv_size=4096, n_kv=n_kv, pos0=n_kv - 1)
        return int(instr_api.probe(bindings.PROBE_ATTENTION, 0, 0, 1, 0, 1, 3, a).best_ns)

    assert ns(4096) > ns(256)


@pytest.mark.parametrize(
    "kw,what",
    [
        ({"op": 4}, "attn.op"),
        ({"type_k": 4}, "type"),
        ({"n_head": 7}, "multiple"),  # 7 query heads over 2 KV heads
        ({"head_dim_k": 0}, "head sizes"),
        ({"pos0": 298}, "pos0 + rows"),  # 298 + 3 rows > the 300 cells read
        ({"n_kv": 513}, "n_kv 1..kv_size"),
        ({"n_layer": 0}, "layers"),
        ({"kv_size": 1 << 22, "n_kv": 1 << 22, "n_layer": 512}, "4 GiB"),
        ({"op": bindings.ATTN_KQV, "type_v": 8}, "transposed"),  # a Q8_0 V cannot be transposed
    ],
)
def test_attention_probe_refuses_bad_input(instr_api: Any, kw: dict[str, int], what: str) -> None:
    with pytest.raises(bindings.SessionError) as e:
        instr_api.probe(bindings.PROBE_ATTENTION, 0, 0, 1, 0, 3, 1, _attn(**kw))
    assert e.value.code == bindings.ERR_INVALID_ARG and what in str(e.value)


def test_thread_counts_are_measured_in_turns(instr_api: Any) -> None:
    """measure_counts: each count's figure is the median over the rounds of that round's best,
    worked out here from the raw records the rounds kept (the counts alternating in them)."""
    import numpy as np

    plan = measure.Plan(
        n_threads=1, types=("f32",), bandwidth_elements=1 << 20, matmul_size=128, matmul_n=8
    )
    got = measure.measure_counts([2, 1], plan, instr_api)
    assert [p.n_threads for p in got] == [2, 1]
    for p in got:
        recs = [m for m in p.measurements if m["device"] == "CPU"]
        assert {m["n_threads"] for m in recs if m["what"] != "sync"} == {p.n_threads}
        bw = [m["bytes"] / m["best_ns"] for m in recs if m["what"] == "bandwidth"]
        mm = [m["flops"] / m["best_ns"] for m in recs if m["what"] == "matmul"]
        assert len(bw) == len(mm) == measure.COUNT_ROUNDS
        cpu = p.device()
        assert cpu.bandwidth_gbs == pytest.approx(float(np.median(bw)))
        assert cpu.matmul_gflops["f32"] == pytest.approx(float(np.median(mm)))


def test_the_one_column_matmul_is_measured_beyond_the_caches(instr_api: Any) -> None:
    """Each weight type's one-column matmul (a generated token's): a square weight of about the
    plan's ``gemv_bytes`` (its side a multiple of the type's block) multiplied by one column; its
    GFLOP/s in the device's gemv_gflops, from the record's own FLOPs and time."""
    plan = measure.Plan(
        n_threads=1, types=("f32", "q8_0"), bandwidth_elements=1 << 20, matmul_size=128,
        matmul_n=8, n_runs=1, gemv_bytes=4 << 20,
    )  # fmt: skip
    got = measure.measure(plan, instr_api, only={"CPU"})
    recs = {m["type"]: m for m in got.measurements if m["what"] == "gemv"}
    assert [t["ne"] for t in recs["f32"]["tensors"]][:2] == [[1024, 1024, 1, 1], [1024, 1, 1, 1]]
    assert recs["q8_0"]["tensors"][0]["ne"][:2] == [1792, 1792]
    assert recs["q8_0"]["tensors"][0]["nbytes"] == 1792 * 1792 // 32 * 34
    cpu = got.device()
    for t, r in recs.items():
        assert r["flops"] == 2 * r["tensors"][0]["ne"][0] * r["tensors"][0]["ne"][1]
        assert cpu.gemv_gflops[t] == pytest.approx(r["flops"] / r["best_ns"])


def test_thread_counts_refuse_bad_input() -> None:
    for bad in ("0,1", "a", "2,2", ""):
        r = CliRunner().invoke(main, ["peaks", "--thread-counts", bad])
        assert r.exit_code == 2 and "--thread-counts" in r.output, r.output


def test_measured_peaks_are_sane(quick_peaks: machine_peaks.Peaks) -> None:
    cpu = quick_peaks.device()
    assert cpu.type == "cpu" and quick_peaks.n_threads == 2
    assert sorted(cpu.matmul_gflops) == ["f32", "q8_0"]
    figures = [cpu.bandwidth_gbs, *cpu.matmul_gflops.values()]
    assert all(math.isfinite(v) and v > 0 for v in figures)
    # each figure is its measurement's counted work over its best time
    recs = [r for r in quick_peaks.measurements if r["device"] == "CPU"]
    # bandwidth; each type's matmul and one-column matmul; the two sync graphs
    assert [r["what"] for r in recs] == ["bandwidth"] + ["matmul", "gemv"] * 2 + ["sync"] * 2
    for r in recs:
        assert r["bytes"] == sum(t["nbytes"] for t in r["tensors"])
    bw = recs[0]
    assert bw["what"] == "bandwidth" and cpu.bandwidth_gbs == bw["bytes"] / bw["best_ns"]
    # what starting a graph on the threads costs: a 64 x 64 matmul by one column at 2 threads over on one
    on2, on1 = recs[-2:]
    assert (on2["n_threads"], on1["n_threads"]) == (2, 1)
    assert [t["ne"][:2] for t in on2["tensors"]] == [[64, 64], [64, 1], [64, 1]]
    assert cpu.sync_ns == max(on2["best_ns"] - on1["best_ns"], 0)


def test_cache_is_reused_and_refused_for_another_machine(
    quick_peaks: machine_peaks.Peaks, tmp_path: Path
) -> None:
    m, t = quick_peaks.machine, quick_peaks.n_threads
    assert machine_peaks.cached(m, t, tmp_path) is None
    path = machine_peaks.save(quick_peaks, tmp_path)
    assert path.parent == tmp_path / "peaks" and not list(path.parent.glob("*.tmp*"))
    got = machine_peaks.cached(m, t, tmp_path)
    assert got is not None and got.to_json() == quick_peaks.to_json()
    other = {**m, "cpu": "Some Other CPU"}
    assert machine_peaks.cached(other, t, tmp_path) is None
    assert machine_peaks.cached(m, t + 1, tmp_path) is None  # another thread count: other peaks
    with pytest.raises(UserError, match="measured on"):
        machine_peaks.check_fits(quick_peaks, other, t, "these peaks")
    # a file at this machine's place that names another machine is refused, not used
    doc = quick_peaks.to_json()
    doc["machine"] = other
    path.write_text(json.dumps(doc))
    assert machine_peaks.cached(m, t, tmp_path) is None


def test_instr_peaks_measures_then_reuses(instr_api: Any, own_cache: Path) -> None:
    args = ["peaks", "--threads", "1", "--types", "f32", "--size-mib", "4", "--format", "json"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "measuring" in r.stderr and "CPU: bandwidth" in r.stderr and "saved" in r.stderr
    doc = json.loads(r.stdout)
    assert doc["n_threads"] == 1 and doc["machine"] == instr_api.machine_info()
    assert len(list((own_cache / "peaks").glob("*.json"))) == 1
    r2 = CliRunner().invoke(main, args)
    assert r2.exit_code == 0 and "cached" in r2.stderr and "measuring" not in r2.stderr
    assert json.loads(r2.stdout) == doc
    bad = CliRunner().invoke(main, ["peaks", "--types", "f32,q9_9"])
    assert bad.exit_code == 2 and bad.output.strip() == "error: unknown ggml type 'q9_9'"


def test_run_against_its_roofs(
    smollm2_detailed: RunLog, quick_peaks: machine_peaks.Peaks, own_cache: Path
) -> None:
    f = load_session(smollm2_detailed.path)
    assert f.peaks is None and "instr peaks --threads 2" in f.peaks_note
    assert f.ops["roof_frac"].isna().all() and f.ops["intensity"].notna().any()
    machine_peaks.save(quick_peaks, own_cache)
    f = load_session(smollm2_detailed.path)
    assert f.peaks is not None and f.peaks.key == quick_peaks.key
    timed = f.ops[f.ops["dur_ns"] > 0]
    assert len(timed) and (timed["roof_frac"] > 0).all() and timed["bound"].notna().all()
    # a generation step reads every weight once, and of token_embd the generated token's row
    # (tied output: the output matmul reads all of token_embd too), from the weight inventory
    inv = {w["name"]: w for w in smollm2_detailed.start["weights"]}
    emb = inv["token_embd.weight"]
    rows = emb["bytes"] // emb["shape"][1]
    total = sum(w["bytes"] for w in inv.values())
    want = total + rows if "output.weight" not in inv else total - emb["bytes"] + rows
    gen = f.steps[f.steps["kind"] == "gen"]
    assert len(gen) and (gen["weight_bytes"] == want).all()
    assert (gen["kv_bytes"] > 0).all() and (gen["roof_frac"] > 0).all()
    r = CliRunner().invoke(main, ["summary", str(smollm2_detailed.path), "--format", "json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)["roofline"]
    assert data["machine"] == quick_peaks.key and data["gen"]["steps"] == len(gen)
    text = CliRunner().invoke(main, ["summary", str(smollm2_detailed.path)]).stdout
    assert "decode runs at" in text and "of this machine's memory bandwidth" in text


def test_summary_refuses_peaks_of_another_machine(
    smollm2_detailed: RunLog, quick_peaks: machine_peaks.Peaks, tmp_path: Path
) -> None:
    doc = quick_peaks.to_json()
    doc["machine"] = {**doc["machine"], "cpu": "Some Other CPU"}
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["summary", str(smollm2_detailed.path), "--peaks", str(other)])
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and "measured on Some Other CPU" in r.output
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(quick_peaks.to_json()))
    r = CliRunner().invoke(main, ["summary", str(smollm2_detailed.path), "--peaks", str(mine)])
    assert r.exit_code == 0 and "decode runs at" in r.stdout


def test_compare_sets_both_runs_against_the_roofs(
    smollm2_detailed: RunLog, quick_peaks: machine_peaks.Peaks, own_cache: Path
) -> None:
    machine_peaks.save(quick_peaks, own_cache)
    log = str(smollm2_detailed.path)
    r = CliRunner().invoke(main, ["compare", log, log, "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["roofline"]
    rows = {x["what"]: x for x in d["rows"]}
    # the same run twice: the same bytes per token, every ratio 1
    per_token = rows["decode MB read per token"]
    assert per_token["a"] == per_token["b"] > 0 and per_token["ratio"] == 1.0
    assert all(x["ratio"] == pytest.approx(1.0) for x in d["rows"])
    assert "1.00x the bytes" in d["why"]
    text = CliRunner().invoke(main, ["compare", log, log]).stdout
    assert "Against the roofs" in text and "decode % of bandwidth" in text


# Every type gguf-py names, probed in a child process (a type ggml cannot quantize ends it with
# SIGABRT): a matmul of a 256 x 256 weight of the type, and KQ over a K cache of the type (rows of
# 256 values, a whole number of every type's blocks). One line a probe, written before it runs.
_EVERY_TYPE = """
import json, sys, gguf
from llamacpp_instr.native import bindings
lib = bindings.load()
attn = dict(op=bindings.ATTN_KQ, type_v=1, head_dim_k=128, head_dim_v=64, n_head=2, n_head_kv=2,
            n_layer=1, kv_size=64, n_kv=64, pos0=61)
for t in gguf.GGMLQuantizationType:
    for what in ("matmul", "attention"):
        print(json.dumps({"type": t.name, "what": what}), flush=True)
        try:
            if what == "matmul":
                lib.probe(bindings.PROBE_MATMUL, 0, t.value, 1, 256, 1, 1)
            else:
                a = bindings.ProbeAttn(type_k=t.value, **attn)
                lib.probe(bindings.PROBE_ATTENTION, 0, 0, 1, 0, 3, 1, a)
            print(json.dumps({"rc": 0}), flush=True)
        except bindings.SessionError as e:
            print(json.dumps({"rc": e.code, "error": str(e)}), flush=True)
"""

# ggml_quantize_chunk of one row of 256 values in each type, each in a child of its own (fork): the
# types whose quantization ends the process, by ggml itself
_QUANTIZE = """
import ctypes, json, os, sys, gguf
ggml = ctypes.CDLL(sys.argv[1])
ggml.ggml_quantize_chunk.restype = ctypes.c_size_t
ggml.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                     ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
src = (ctypes.c_float * 256)(*[((i * 37) % 200 - 100) / 100 for i in range(256)])
dst = ctypes.create_string_buffer(256 * 16)
died = []
for t in gguf.GGMLQuantizationType:
    pid = os.fork()
    if pid == 0:
        os.close(2)  # ggml's backtrace
        ggml.ggml_quantize_chunk(t.value, src, dst, 0, 1, 256, None)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        died.append(t.name)
print(json.dumps(died))
"""


def _ggml_base() -> Path:
    from helpers.rpc_backend import lib_dir

    for name in ("libggml-base.so.0", "libggml-base.so"):
        if (lib_dir() / name).is_file():
            return lib_dir() / name
    raise AssertionError(f"no libggml-base in {lib_dir()}")


def test_no_type_ends_the_process_and_ggml_s_unquantizable_ones_are_refused(
    instr_api: Any,
) -> None:
    """The probe fills its tensors with ggml_quantize_chunk, which aborts on a type it quantizes
    only with an importance matrix and on one it cannot make from F32 values. Every type gguf-py
    names, as a weight and as a K cache: the process lives, and the types refused as invalid are
    exactly those whose quantization ggml itself ends the process on (asked apart, each in a
    forked child), each refusal naming the type and why."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", _EVERY_TYPE], capture_output=True, text=True, timeout=600
    )
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert r.returncode == 0, f"died ({r.returncode}) probing {lines[-1]}: {r.stderr[-1500:]}"
    probes = [{**a, **b} for a, b in zip(lines[::2], lines[1::2], strict=True)]
    q = subprocess.run(
        [sys.executable, "-c", _QUANTIZE, str(_ggml_base())],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "GGML_NO_BACKTRACE": "1"},  # (ggml's abort would attach gdb to each)
    )  # fmt: skip
    assert q.returncode == 0, q.stderr[-1500:]
    unquantizable = set(json.loads(q.stdout.splitlines()[-1]))
    # the pin's: an importance matrix (IQ2_XXS, IQ2_XS, IQ1_S) or no conversion from F32
    assert {"IQ2_XXS", "IQ2_XS", "IQ1_S", "I8", "I32", "F64"} <= unquantizable, unquantizable
    for what in ("matmul", "attention"):
        mine = [p for p in probes if p["what"] == what]
        refused = {p["type"] for p in mine if p["rc"] == bindings.ERR_INVALID_ARG}
        assert refused == unquantizable, (what, refused ^ unquantizable)
        for p in mine:
            if p["type"] in refused:
                assert p["type"].lower() in p["error"].lower(), p
                assert "imatrix" in p["error"] or "from F32" in p["error"], p
            else:  # it ran, or the CPU backend does not run that op on that type
                assert p["rc"] in (0, bindings.ERR_INTERNAL), p


def test_instr_peaks_refuses_a_type_it_cannot_probe(own_cache: Path) -> None:
    """One line naming the type and why, exit status 2, before anything is measured."""
    from helpers.support import instr

    r = instr("peaks", "--types", "f32,iq2_xxs", "--size-mib", "4")
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "iq2_xxs" in lines[0], lines
    assert "imatrix" in lines[0]
    assert not (own_cache / "peaks").exists()  # nothing measured, nothing saved
