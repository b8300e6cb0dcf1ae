"""instr predict's intervals and thread counts no log ran, on tiny models.

The leave-one-out residuals the intervals are made of are what ``predict`` itself says of each
log from the others (two paths through the code: the log's own graphs, and the graphs llama.cpp
builds for the setting); the interval is ``t975(n)`` times their root mean square, worked out here
by hand. At a thread count no log ran each op keeps its class and moves by what ``instr peaks``
measured at both counts (peaks files written here, with made-up figures): the test works it out
op by op. Nothing here is timed: the accuracy of these predictions is bench/predict.py's.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.support import FIXTURES, RunLog, assert_one_line_error, instr, make_run


@pytest.mark.fast
def test_t975_is_students_t() -> None:
    from llamacpp_instr.deciding.prediction.intervals import T975, t975

    # textbook values of Student's t 97.5th percentile
    assert (t975(1), t975(2), t975(5), t975(10), t975(30)) == (12.706, 4.303, 2.571, 2.228, 2.042)
    assert t975(200) == 2.042 and t975(0) == 12.706
    try:
        from scipy import stats
    except ImportError:
        return
    assert all(abs(v - stats.t.ppf(0.975, k)) < 5e-4 for k, v in T975.items())


def _model(**kw: Any) -> Any:
    from llamacpp_instr.deciding.prediction.op_costs import CostModel

    return CostModel(**{"fits": {}, "roofs": {}, "fused": set(), "overhead": {}, **kw})


@pytest.mark.fast
def test_the_interval_by_hand() -> None:
    """10 tokens in 0.1 s at a level of 1.25: 80 tok/s. From the residuals 0.1, -0.2, 0.05:
    3.182 * sqrt((0.01 + 0.04 + 0.0025) / 3) = 0.42094 each way; at a thread count no log ran
    with no log held out across counts, the wider of that and the bench's error across counts
    (0.18), with one (0.3), 12.706 * 0.3; with attention beyond the logs' KV cells, at least the
    bench's error at depth (0.18: 80 x/÷ 1.197); with no residual, each side the wider of the
    bench's error (80 x/÷ e^0.18: 66.83 to 95.78) and the steps' 10th and 90th percentile ratios
    (1.04 and 1.36: 73.53 to 96.15): 66.83 to 96.15, and with steps spread wider (0.9 to 1.7:
    tokens/s 58.82 to 111.11) the steps'."""
    from llamacpp_instr.deciding.prediction.intervals import interval

    cpu = frozenset({"CPU"})
    m = _model(self_level={"gen": 1.25}, held_out={"gen": [0.1, -0.2, 0.05]})
    iv = interval(10, 1e8, m, "gen", cpu)
    half = 3.182 * math.sqrt(0.0525 / 3)
    assert half == pytest.approx(0.420939, rel=1e-5)
    assert (iv.value, iv.basis, iv.held_out) == (pytest.approx(80.0), "held-out", 3)
    assert iv.low == pytest.approx(80 * math.exp(-half)) and iv.high == pytest.approx(
        80 * math.exp(half)
    )
    iv = interval(10, 1e8, m, "gen", cpu, across=True)
    assert iv.basis == "bench" and iv.value == pytest.approx(80.0)
    assert (iv.low, iv.high) == (
        pytest.approx(80 * math.exp(-half)),
        pytest.approx(80 * math.exp(half)),
    )
    close = _model(self_level={"gen": 1.25}, held_out={"gen": [0.01]})
    iv = interval(10, 1e8, close, "gen", cpu, across=True)
    assert (iv.low, iv.high) == (
        pytest.approx(80 / math.exp(0.18)),
        pytest.approx(80 * math.exp(0.18)),
    )
    across = replace(m, held_out_threads={"gen": [0.3]})
    iv = interval(10, 1e8, across, "gen", cpu, across=True)
    assert iv.basis == "held-out" and iv.high == pytest.approx(80 * math.exp(12.706 * 0.3))
    iv = interval(10, 1e8, close, "gen", cpu, deeper=True)
    assert iv.high == pytest.approx(80 * math.exp(0.18)) and iv.held_out == 1
    steps = _model(
        self_level={"gen": 1.25}, self_ratios={"gen": np.array([1.0, 1.1, 1.2, 1.3, 1.4])}
    )
    iv = interval(10, 1e8, steps, "gen", cpu)
    assert iv.basis == "bench"
    assert (iv.low, iv.high) == (pytest.approx(66.83, abs=0.01), pytest.approx(96.15, abs=0.01))
    wide = _model(  # 0.8, 0.9, ... 1.8: the 10th percentile 0.9, the 90th 1.7
        self_level={"gen": 1.25}, self_ratios={"gen": np.linspace(0.8, 1.8, 11)}
    )
    iv = interval(10, 1e8, wide, "gen", cpu)
    assert (iv.low, iv.high) == (pytest.approx(58.82, abs=0.01), pytest.approx(111.11, abs=0.01))


@pytest.fixture(scope="module")
def twins(
    instr_api: Any, tiny_llama_f32: Path, tmp_path_factory: pytest.TempPathFactory
) -> list[Path]:
    """Two runs of the same setting (each covers the other), and one of it at 1 thread."""
    d = tmp_path_factory.mktemp("intervals")
    out = [make_run(tiny_llama_f32, d / f"t2-{k}.log", "detailed", n_predict=6) for k in (0, 1)]
    out.append(make_run(tiny_llama_f32, d / "t1.log", "detailed", n_predict=6, threads=1))
    return [r.log_path for r in out]


def _said(log: Path, others: list[Path]) -> dict[str, float]:
    """What predict says of ``log``'s own setting from ``others`` (the graphs llama.cpp builds),
    as the natural log of the measured time over the predicted: the held-out residual."""
    from llamacpp_instr.deciding.prediction import predict
    from llamacpp_instr.running.measuring import ThisMachine

    sessions = [predict.load_session(p) for p in others]
    sf = predict.load_session(log)
    machine = ThisMachine()
    target = predict.default_target(sf, None)
    p = predict.price(target, predict.fit(sessions, machine=machine), sessions, [], machine)
    m = predict.measured(sf)
    out = {}
    for kind, iv in (("prompt", p.prompt), ("gen", p.gen)):
        measured = m[kind]
        assert iv is not None and measured
        out[kind] = math.log(iv.value / measured)
    return out


def test_the_held_out_residuals_are_what_predict_says(
    twins: list[Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """fit's leave-one-out residuals over two logs equal what predict says of each log's own
    setting from the other alone; the interval of predict from both is t975(2) times their root
    mean square. A log at a thread count the others did not run goes to the residuals across
    thread counts, priced from the others' with the peaks of both counts (none without them)."""
    from llamacpp_instr.deciding.prediction import predict
    from llamacpp_instr.running.measuring import ThisMachine

    monkeypatch.setenv("LLAMACPP_INSTR_CACHE", str(tmp_path))
    a, b, one = twins
    model = predict.fit([predict.load_session(p) for p in (a, b)], machine=ThisMachine())
    said = [_said(a, [b]), _said(b, [a])]
    for kind in ("prompt", "gen"):
        assert model.held_out[kind] == pytest.approx([s[kind] for s in said], rel=1e-6, abs=1e-9)
    assert model.held_out_threads == {}
    r = instr(
        "predict", str(a), str(b), "--format", "json", env={"LLAMACPP_INSTR_CACHE": str(tmp_path)}
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    for kind, key in (("prompt", "prompt_tokens_per_s"), ("gen", "gen_tokens_per_s")):
        iv = doc[key]
        res = np.array([s[kind] for s in said])
        half = 4.303 * math.sqrt(float(np.mean(res * res)))
        assert (iv["basis"], iv["held_out"]) == ("held-out", 2)
        assert iv["low"] == pytest.approx(iv["value"] * math.exp(-half), rel=1e-6)
        assert iv["high"] == pytest.approx(iv["value"] * math.exp(half), rel=1e-6)

    across = predict.fit([predict.load_session(p) for p in (a, one)], machine=ThisMachine())
    assert across.held_out == {} and across.held_out_threads == {}  # no peaks
    write_peaks(tmp_path, a, PEAKS)
    across = predict.fit([predict.load_session(p) for p in (a, one)], machine=ThisMachine())
    assert across.held_out == {}
    said = [_said(a, [one]), _said(one, [a])]
    for kind in ("prompt", "gen"):
        got = across.held_out_threads[kind]
        assert got == pytest.approx([s[kind] for s in said], rel=1e-6, abs=1e-9)


def write_peaks(
    cache: Path,
    log: Path,
    at: dict[int, tuple[float, float, float]],
    dates: dict[int, str] | None = None,
) -> None:
    """Peaks files in ``cache`` for the machine ``log`` was made on: per thread count, a CPU of
    the given bandwidth (GB/s), cost of starting a graph on the threads (ns) and F32 matmul
    throughput (GFLOP/s), measured at ``dates`` (default: all at one time)."""
    from llamacpp_instr.converters.session import machine_peaks as mp
    from llamacpp_instr.deciding.prediction.predict import load_session

    machine = load_session(log).info.machine
    for n, (bw, sync, f32) in at.items():
        cpu = mp.DevicePeaks("CPU", "cpu", "made up", bw, {"f32": f32}, sync_ns=sync)
        date = (dates or {}).get(n, "2026-01-01T00:00:00Z")
        mp.save(mp.Peaks(machine, n, date, [cpu]), cache)


# made-up peaks: one thread streams 11 GB/s, two 20; a graph on 2 threads costs 1.5 us more
# than on one; an F32 matmul runs 40 GFLOP/s on one thread, 70 on two
PEAKS = {1: (11.0, 0.0, 40.0), 2: (20.0, 1500.0, 70.0)}


def _parts(node: Any) -> int:
    """The parts ggml-cpu splits a node into: a matmul's output elements, SET_ROWS's rows set
    (its index's length), another op's rows (its output's dimensions after the first)."""
    shape = list(node.shape) + [1] * (4 - len(node.shape))
    if node.op.startswith("MUL_MAT"):
        return int(np.prod(shape))
    if node.op == "SET_ROWS":
        return int(np.prod(node.src[1]["shape"]))
    return int(shape[1] * shape[2] * shape[3])


@pytest.mark.fast
def test_each_op_at_one_thread_from_a_two_thread_log() -> None:
    """The committed tiny log ran 2 threads. At 1, each op of its graphs keeps its class; of its
    time beyond the class's fixed cost, its bytes at the rate its weight matrix streamed at take
    20/11 the time (the bandwidths measured at 2 and 1), and the rest, compute, 70/40 the time
    for an F32 matmul (the matmul throughputs measured at 2 and 1), for another op all its parts
    on one thread instead of half (an op of one row: its time). The threads' meeting after each
    op is in its time at 2 threads: no op sheds the 1.5 us a graph of one op costs at 2 threads,
    which a compute pays once (its host time 1.5 us less at 1). The rate of a matmul is the best
    a generation step of the log read its matrix at (that role's and type's matmuls' bytes over
    their time), of another op the best any generation step's ops reached: worked out here from
    the log's op times."""
    from llamacpp_instr.deciding.prediction import op_threads
    from llamacpp_instr.deciding.prediction.op_costs import GraphCosts, Where
    from llamacpp_instr.deciding.prediction.op_fit import fit
    from llamacpp_instr.deciding.prediction.predict import load_session
    from llamacpp_instr.deciding.prediction.thread_scale import CpuPeaks

    log = FIXTURES / "tiny-llama-detailed.log.gz"
    sf = load_session(log)
    costs = {gid: GraphCosts.of(g) for gid, g in sf.graphs.items()}
    ops = sf.ops.copy()
    pairs = list(zip(ops["graph"].astype(int), ops["node"].astype(int), strict=True))
    ops["moved"] = [costs[g].bytes[n] for g, n in pairs]
    ops["kind"] = [
        costs[g].types[n] if costs[g].labels[n].startswith("MUL_MAT") else "" for g, n in pairs
    ]
    ops["role"] = [costs[g].roles[n] for g, n in pairs]
    ops.loc[ops["kind"].str.startswith("kv "), "kind"] = ""

    gen_steps = set(sf.steps.loc[sf.steps["kind"].astype(str) == "gen", "step"])
    ops = ops[ops["step"].isin(gen_steps)]  # generation's steps: each reads every weight once

    def best(rows: Any) -> float:
        per = rows.groupby("step")[["moved", "dur_ns"]].sum()
        return float((per["moved"] / per["dur_ns"]).max())

    matmuls = ops[ops["kind"] != ""]
    rates = {"": best(ops)} | {t: best(r) for t, r in matmuls.groupby("kind")}
    rates |= {f"{t}:{role}": best(r) for (t, role), r in matmuls.groupby(["kind", "role"])}
    assert "f32" in rates and len(rates) >= 8  # the tiny model's weights are f32, in 6+ roles
    model = fit([sf])
    for t, rate in rates.items():
        assert model.stream[(Where("CPU", 2), t)] == pytest.approx(rate, rel=1e-9)
    assert op_threads.scale(model, 1, {}) is None  # no peaks: not priced
    # (the fixture's log does not name its machine: the peaks as predict reads them from files)
    peaks = {n: CpuPeaks(n, bw, sync, {"f32": f32}) for n, (bw, sync, f32) in PEAKS.items()}
    one = op_threads.scale(model, 1, peaks)
    assert one is not None
    for kind in ("prompt", "gen"):
        at2 = model.overhead[(Where("CPU", 2), kind)]
        assert one.overhead_at(1, kind) == pytest.approx(max(at2 - 1500.0, 0.0), rel=1e-12)
    assert op_threads.unmeasured_types(one, 1, peaks) == []
    # a peaks file measured without the F32 matmul (instr peaks --types): priced by the threads
    older = {n: replace(p, matmul={}) for n, p in peaks.items()}
    by_threads = op_threads.scale(model, 1, older)
    assert by_threads is not None and op_threads.unmeasured_types(by_threads, 1, older) == ["f32"]
    kinds = {"memory": 0, "compute": 0, "one row": 0}
    for gc in costs.values():
        cpu = ["CPU"] * len(gc.labels)
        at2, missing = model.price(gc, cpu, 2)
        at1, missing1 = one.price(gc, cpu, 1)
        old1, _ = by_threads.price(gc, cpu, 1)
        assert missing == missing1 == []
        for k in np.flatnonzero(at2):
            lab, typ = gc.labels[k], gc.types[k]
            cls = model.lookup(Where("CPU", 2), gc.tokens[k], lab, typ, gc.roles[k])
            assert cls is not None
            parts = _parts(gc.graph.nodes[k])
            beyond = at2[k] - cls.fixed
            if parts == 1:
                kinds["one row"] += 1
                assert at1[k] == pytest.approx(at2[k], rel=1e-12)
                continue
            weight = typ if lab.startswith("MUL_MAT") and not typ.startswith("kv ") else ""
            rate = rates.get(f"{weight}:{gc.roles[k]}", rates[weight]) if weight else rates[""]
            rest = max(beyond, 0.0)
            memory = min(rest, gc.bytes[k] / rate)
            by_parts = math.ceil(parts / 2) / parts
            faster = 40 / 70 if weight == "f32" else by_parts
            compute = (rest - memory) / faster
            assert at1[k] == pytest.approx(cls.fixed + memory * 20 / 11 + compute, rel=1e-9)
            plain = cls.fixed + memory * 20 / 11 + (rest - memory) / by_parts
            assert old1[k] == pytest.approx(plain, rel=1e-9)
            if rest > 0 and memory > rest / 2:
                kinds["memory"] += 1
            elif rest > 0:
                kinds["compute"] += 1
    assert min(kinds.values()) >= 3, kinds


def test_one_thread_from_a_two_thread_log_is_predicted(
    tiny_detailed: RunLog, tmp_path: Path
) -> None:
    """predict --threads 1 from a 2-thread log: without this machine's peaks at 1 thread, not
    covered, naming the instr peaks to run; with them (made up), a prediction said to be priced
    from 2 threads at the bandwidths measured, each op said memory-bound, compute-bound or on
    one thread, whose interval is the bench's error across thread counts (no log held out);
    slower than at 2 threads, and faster than every op taking twice its time."""
    env = {"LLAMACPP_INSTR_CACHE": str(tmp_path)}
    r = instr("predict", str(tiny_detailed.path), "--threads", "1", env=env)
    assert_one_line_error(r, "not covered")
    assert "instr peaks --thread-counts 2,1 --force" in r.stdout
    write_peaks(tmp_path, tiny_detailed.path, PEAKS)
    r = instr("predict", str(tiny_detailed.path), "--threads", "1", "--format", "json", env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    at2 = json.loads(instr("predict", str(tiny_detailed.path), "--format", "json", env=env).stdout)
    assert "priced from the logs' 2" in doc["threads_from"] and "20.0 GB/s" in doc["threads_from"]
    assert at2["threads_from"] is None and at2["op_bounds"] == {}
    for key, kind in (("prompt_tokens_per_s", "prompt"), ("gen_tokens_per_s", "gen")):
        iv, own = doc[key], at2[key]
        assert iv["basis"] == "bench"
        assert iv["high"] / iv["value"] >= math.exp(0.18) - 1e-9
        assert own["value"] / 2 < iv["value"] < own["value"]
        shares = doc["op_bounds"][kind]
        assert set(shares) <= {"memory-bound", "compute-bound", "on one thread"}
        assert sum(sum(v.values()) for v in shares.values()) == pytest.approx(1.0)
        assert "MUL_MAT f32" in {op for v in shares.values() for op in v}
    text = instr("predict", str(tiny_detailed.path), "--threads", "1", env=env).stdout
    assert "threads: 1 threads priced from the logs' 2" in text
    assert "memory-bound" in text and "on one thread" in text
    # this machine is the log's: the generated token's matmuls of the model's shapes measured
    # at both counts (the largest, its output's 256 x 512 F32), said; with --no-probe, not
    assert "f32 256x512" in doc["measured_matmuls"]
    assert all(math.isfinite(v) and v > 0 for v in doc["measured_matmuls"].values())
    assert "measured: a generated token's matmuls on this machine" in text
    r = instr(
        "predict", str(tiny_detailed.path), "--threads", "1", "--no-probe", "--format", "json",
        env=env,
    )  # fmt: skip
    assert json.loads(r.stdout)["measured_matmuls"] == {}


@pytest.mark.fast
def test_a_generated_tokens_matmul_moves_by_the_one_column_matmul_measured() -> None:
    """With the one-column matmul's throughput measured at both counts (F32: 50 GFLOP/s at 2
    threads, 30 at 1), each matmul of one column reading an F32 weight takes 50/30 of its time
    beyond its class's fixed cost at 1 thread, whatever its bytes' rate; every other op is priced
    as without it (worked out here from the model's own price at 2 threads)."""
    from llamacpp_instr.deciding.prediction import op_threads
    from llamacpp_instr.deciding.prediction.op_costs import GraphCosts, Where, rows
    from llamacpp_instr.deciding.prediction.op_fit import fit
    from llamacpp_instr.deciding.prediction.predict import load_session
    from llamacpp_instr.deciding.prediction.thread_scale import CpuPeaks

    sf = load_session(FIXTURES / "tiny-llama-detailed.log.gz")
    model = fit([sf])
    peaks = {n: CpuPeaks(n, bw, sync, {"f32": f32}) for n, (bw, sync, f32) in PEAKS.items()}
    gemv = {n: replace(p, gemv={"f32": {1: 30.0, 2: 50.0}[n]}) for n, p in peaks.items()}
    plain, measured = op_threads.scale(model, 1, peaks), op_threads.scale(model, 1, gemv)
    assert plain is not None and measured is not None
    moved = 0
    for g in sf.graphs.values():
        gc = GraphCosts.of(g)
        cpu = ["CPU"] * len(gc.labels)
        at2, _ = model.price(gc, cpu, 2)
        a, _ = plain.price(gc, cpu, 1)
        b, _ = measured.price(gc, cpu, 1)
        for k in np.flatnonzero(at2):
            lab, typ = gc.labels[k], gc.types[k]
            one_column = lab == "MUL_MAT" and typ == "f32" and rows(g.nodes[k], g) == 1
            if one_column and _parts(g.nodes[k]) > 1:
                cls = model.lookup(Where("CPU", 2), gc.tokens[k], lab, typ, gc.roles[k])
                assert cls is not None
                want = cls.fixed + max(at2[k] - cls.fixed, 0.0) * 50 / 30
                assert b[k] == pytest.approx(want, rel=1e-9)
                moved += 1
            else:
                assert b[k] == pytest.approx(a[k], rel=1e-12)
    assert moved >= 6  # the generation steps' weight matmuls


class _FakeMatmulProbe:
    """The native probe as GemvProbe calls it: each call recorded; a weight of ``k`` x ``m`` runs
    in ``times[(k, m)]`` (ns at the first count, at the second)."""

    def __init__(self, times: dict[tuple[int, int], tuple[int, int]]) -> None:
        self.times = times
        self.calls: list[dict[str, int]] = []

    def probe(self, kind: int, device: int, type_id: int, n_threads: int, size: int, n: int,
              n_runs: int, attn: Any = None, m: int = 0, n_weights: int = 0,
              n_threads_b: int = 0) -> Any:  # fmt: skip
        from types import SimpleNamespace

        self.calls.append(
            dict(kind=kind, type=type_id, threads=n_threads, k=size, n=n, m=m,
                 n_weights=n_weights, threads_b=n_threads_b)
        )  # fmt: skip
        a, b = self.times[(size, m)]
        return SimpleNamespace(best_ns=a, best_ns_b=b, total_ns=a * n_runs, total_ns_b=b * n_runs)


@pytest.mark.fast
def test_a_shape_probed_before_weighs_by_the_graph_at_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shape an earlier prediction of the process measured is not measured again, and weighs by
    its bytes in the graph being priced: a shape not probed (256x128, 10 of its 400 bytes, beyond
    the 90 % the probed ones hold) moves by the probed ones' speed-ups weighted by this graph's
    bytes (300 and 90), as in a process that measured nothing before, not by the first graph's
    (100 and 300)."""
    from types import SimpleNamespace

    from llamacpp_instr.running.probes import gemv_probe

    a, b, c = ("f32", 256, 512), ("f32", 512, 256), ("f32", 256, 128)
    sizes = {"first": {a: 100, b: 300}, "second": {a: 300, b: 90, c: 10}}
    monkeypatch.setattr(gemv_probe, "one_column", lambda g: dict(sizes[g.name]))
    times = {(256, 512): (1000, 2000), (512, 256): (700, 1000)}
    want = (300 * 0.5 + 90 * 0.7) / 390

    def second(after_first: bool) -> tuple[float | None, int]:
        monkeypatch.setattr(gemv_probe, "_MEASURED", {})
        lib = _FakeMatmulProbe(times)
        if after_first:
            gemv_probe.GemvProbe(lib, 0, 2, 1).prepare(SimpleNamespace(name="first"))
        before = len(lib.calls)
        probe = gemv_probe.GemvProbe(lib, 0, 2, 1)
        probe.prepare(SimpleNamespace(name="second"))
        return probe.speedup(c), len(lib.calls) - before

    assert second(False) == (pytest.approx(want), 2)
    assert second(True) == (pytest.approx(want), 0)


@pytest.mark.fast
def test_a_generated_tokens_matmul_moves_by_the_probe_of_its_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1 thread from the tiny model's 2-thread log, the probe of each weight shape faked: the
    shapes probed are the graphs' one-column matmuls holding 90 % of their bytes, largest first
    (the prompt's 256x512 and 512x256, then generation's 256x256: 2.6, 1.0 and 1.0 of its 5.2
    MB; not 256x128), each once, at 2 threads and 1 in turn, as many weights as hold 256 MiB; each
    such matmul takes its shape's measured time at 2 over its time at 1 of its time beyond its
    class's fixed cost, 256x128 the bytes-weighted mean of the F32 shapes probed; the peaks'
    one-column matmul (F32: 50 GFLOP/s at 2, 30 at 1) prices nothing that was probed."""
    from llamacpp_instr.deciding.prediction import op_threads
    from llamacpp_instr.deciding.prediction.op_costs import GraphCosts, Where, rows
    from llamacpp_instr.deciding.prediction.op_fit import fit
    from llamacpp_instr.deciding.prediction.predict import load_session
    from llamacpp_instr.deciding.prediction.thread_scale import CpuPeaks
    from llamacpp_instr.running.probes import gemv_probe

    monkeypatch.setattr(gemv_probe, "_MEASURED", {})  # (nothing this process measured)
    sf = load_session(FIXTURES / "tiny-llama-detailed.log.gz")
    model = fit([sf])
    peaks = {
        n: CpuPeaks(n, bw, sync, {"f32": f32}, gemv={"f32": {1: 30.0, 2: 50.0}[n]})
        for n, (bw, sync, f32) in PEAKS.items()
    }
    scaled = op_threads.scale(model, 1, peaks)
    assert scaled is not None
    # (time at 2 threads, at 1): 256x512 twice as long at 1 thread, 512x256 1/0.7, 256x256 1/0.8
    lib = _FakeMatmulProbe(
        {(256, 512): (1000, 2000), (512, 256): (700, 1000), (256, 256): (800, 1000)}
    )
    where = Where("CPU", 1)
    probe = gemv_probe.GemvProbe(lib, 0, 2, 1)
    scaled = replace(scaled, scaled={where: replace(scaled.scaled[where], probe=probe)})
    # the bytes-weighted mean, by the bytes of the graph each was first probed in
    mean = (1572864 * 0.5 + 524288 * 0.7 + 1048576 * 0.8) / (1572864 + 524288 + 1048576)
    speedup = {(256, 512): 0.5, (512, 256): 0.7, (256, 256): 0.8, (256, 128): mean}
    moved: dict[tuple[int, int], int] = {}
    for g in sf.graphs.values():
        gc = GraphCosts.of(g)
        cpu = ["CPU"] * len(gc.labels)
        at2, _ = model.price(gc, cpu, 2)
        at1, _ = scaled.price(gc, cpu, 1)
        for k in np.flatnonzero(at2):
            lab, typ, node = gc.labels[k], gc.types[k], g.nodes[k]
            if lab == "MUL_MAT" and typ == "f32" and rows(node, g) == 1 and _parts(node) > 1:
                cls = model.lookup(Where("CPU", 2), gc.tokens[k], lab, typ, gc.roles[k])
                assert cls is not None
                _, k_, m_ = node.src[0]["type"], *node.src[0]["shape"]
                want = cls.fixed + max(at2[k] - cls.fixed, 0.0) / speedup[(k_, m_)]
                assert at1[k] == pytest.approx(want, rel=1e-9)
                moved[(k_, m_)] = moved.get((k_, m_), 0) + 1
    assert set(moved) == set(speedup)
    assert [(c["k"], c["m"]) for c in lib.calls] == [(256, 512), (512, 256), (256, 256)]
    for c in lib.calls:
        assert (c["kind"], c["type"], c["threads"], c["threads_b"], c["n"]) == (1, 0, 2, 1, 1)
        assert c["n_weights"] == -(-(256 << 20) // (c["k"] * c["m"] * 4))


def test_a_measured_speed_up_is_bounded_by_the_threads() -> None:
    """Peaks that read 1 -> 2 threads as more than 2x (a one-column matmul at 20 then 50 GFLOP/s,
    a matmul at 30 then 70) move an op split over both threads by 2x at most, either way; one
    measured below it moves by what was measured."""
    from llamacpp_instr.deciding.prediction.thread_scale import COMPUTE, CpuPeaks, ThreadScale

    one = CpuPeaks(1, 20.0, 0.0, {"f16": 30.0, "q8_0": 40.0}, gemv={"f16": 20.0, "q8_0": 20.0})
    two = CpuPeaks(2, 25.0, 0.0, {"f16": 70.0, "q8_0": 60.0}, gemv={"f16": 50.0, "q8_0": 30.0})
    up, down = ThreadScale(one, two, {}), ThreadScale(two, one, {})
    # (no stream rate: the whole time is compute; 64 parts: split over every thread)
    assert up.time(1000.0, 0.0, "f16", "", 64, columns=8) == (500.0, COMPUTE)
    assert down.time(1000.0, 0.0, "f16", "", 64, columns=8) == (2000.0, COMPUTE)
    assert up.time(1000.0, 0.0, "f16", "", 64, columns=1)[0] == 500.0
    assert down.time(1000.0, 0.0, "f16", "", 64, columns=1)[0] == 2000.0
    assert up.time(1000.0, 0.0, "q8_0", "", 64, columns=8)[0] == pytest.approx(1000 * 40 / 60)
    assert down.time(1000.0, 0.0, "q8_0", "", 64, columns=1)[0] == pytest.approx(1000 * 30 / 20)


def test_peaks_measured_apart_are_said_to_be(tiny_detailed: RunLog, tmp_path: Path) -> None:
    """The peaks of the two counts measured 25 minutes apart: the prediction says so and names the
    measurement in turns; measured together, it says nothing of it."""
    env = {"LLAMACPP_INSTR_CACHE": str(tmp_path)}
    write_peaks(
        tmp_path, tiny_detailed.path, PEAKS,
        {1: "2026-01-01T00:00:00Z", 2: "2026-01-01T00:25:00Z"},
    )  # fmt: skip
    doc = json.loads(
        instr("predict", str(tiny_detailed.path), "-t", "1", "--format", "json", env=env).stdout
    )
    assert "measured 25 minutes apart" in doc["threads_from"]
    assert "instr peaks --thread-counts 2,1 --force" in doc["threads_from"]
    write_peaks(tmp_path, tiny_detailed.path, PEAKS)
    doc = json.loads(
        instr("predict", str(tiny_detailed.path), "-t", "1", "--format", "json", env=env).stdout
    )
    assert "apart" not in doc["threads_from"]


def test_threads_beyond_the_cpus_are_not_covered(tiny_detailed: RunLog) -> None:
    n = int(tiny_detailed.start["machine"]["n_cpus"]) + 1
    r = instr("predict", str(tiny_detailed.path), "--threads", str(n))
    assert_one_line_error(r, "not covered")
    assert f"the CPU at {n} threads" in r.stdout and "CPUs" in r.stdout
    assert f"--threads {n}" in r.stdout and "not predicted" in r.stdout


def test_more_threads_than_a_log_without_its_cpus_ran_are_not_covered(
    instr_api: Any, tmp_path: Path
) -> None:
    """The committed fixture's log does not name its machine's CPUs: more threads than it ran are
    not covered (they could be more than the machine has), and fewer neither, its machine's
    peaks being found by its name (the instr peaks to run is named)."""
    from helpers.tiny_gguf import write_tiny_model

    log = FIXTURES / "tiny-llama-detailed.log.gz"
    model = write_tiny_model(tmp_path / "tiny.gguf", arch="llama", seed=7, n_ctx_train=1024)
    r = instr("predict", str(log), "--model", str(model), "--threads", "4")
    assert_one_line_error(r, "not covered")
    assert "do not say how many CPUs" in r.stdout
    r = instr(
        "predict", str(log), "--model", str(model), "--threads", "1",
        env={"LLAMACPP_INSTR_CACHE": str(tmp_path)},
    )  # fmt: skip
    assert_one_line_error(r, "not covered")
    assert "instr peaks --thread-counts 2,1" in r.stdout


@pytest.mark.fast
def test_a_prompt_op_beyond_its_row_class_is_priced_from_a_larger_one() -> None:
    """A 127-token prompt's op, whose own row class (16+) the logs ran only in ubatches of 32
    (4x less work), is priced on the line of the 128+ class that did more work (a prompt of 512
    tokens prices one of 127): no extrapolation, and no longer "not covered"; an op of one row
    keeps its own class even beyond it (a token at a depth no log generated at is not priced
    from a prompt's matmuls)."""
    from llamacpp_instr.deciding.prediction.op_costs import Fit, Where

    cpu = Where("CPU", 2)
    small = Fit(fixed=100.0, slope=2.0, work_lo=10.0, work_hi=100.0, n=8)
    large = Fit(fixed=100.0, slope=1.5, work_lo=300.0, work_hi=1000.0, n=8)
    one = Fit(fixed=100.0, slope=3.0, work_lo=5.0, work_hi=20.0, n=8)
    key = ("MUL_MAT", "q4_1", "ffn_up")
    m = _model(fits={(cpu, "16+", *key): small, (cpu, "128+", *key): large, (cpu, "1", *key): one})
    assert m.lookup(cpu, "16+", *key, work=80.0) is small  # within its own class
    assert m.lookup(cpu, "16+", *key, work=400.0) is large  # beyond it, within the larger
    assert m.lookup(cpu, "16+", *key, work=5000.0) is small  # beyond both: its own, flagged
    assert small.beyond(5000.0) == 50.0
    assert m.lookup(cpu, "1", *key, work=400.0) is one  # a token's own class as it is


def test_a_prediction_from_a_busy_log_says_so_first(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """A log whose generation steps spread like a contended machine's (3 of 15 made 20 times
    slower, as another process holding the cores does) gets instr summary's verdict as the
    prediction's first line, and in its JSON."""
    log = make_run(tiny_llama_f32, tmp_path / "busy.log", "detailed", n_predict=16).log_path
    lines = log.read_text().splitlines()
    slowed = 0
    for k, line in enumerate(lines):
        rec = json.loads(line)
        if rec["type"] == "step_end" and rec["step"] in (10, 11, 15):  # (none a first two)
            rec["dur"] *= 20
            lines[k] = json.dumps(rec)
            slowed += 1
    assert slowed == 3
    log.write_text("\n".join(lines) + "\n")
    r = instr("predict", str(log))
    assert r.returncode == 0, r.stderr
    title, first = r.stdout.splitlines()[:2]  # the report's title, then its warnings
    assert title == "Prediction (instr predict)"
    assert first.startswith("warning: a log from a busy machine:") and "contended" in first
    doc = json.loads(instr("predict", str(log), "--format", "json").stdout)
    (said,) = doc["contended"]
    found = re.search(r"(\d+) of (\d+) steps over", said)
    assert found and int(found[1]) >= 3, said  # (the machine's own spikes may add some)
