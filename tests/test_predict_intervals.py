"""instr predict's intervals (issue 53 §2) and thread counts no log ran (§5), on tiny models.

The leave-one-out residuals the intervals are made of are what ``predict`` itself says of each
log from the others (two paths through the code: the log's own graphs, and the graphs llama.cpp
builds for the setting); the interval is ``t975(n)`` times their root mean square, worked out here
by hand. At a thread count no log ran each op is priced on its class's line at the roofs of that
count (the compute roofs scaled with the threads, the bandwidth kept), which the test works out
op by op from the roofs; the interval spans the bounds, the flat one being the source thread
count's own price. Nothing here is timed: the accuracy of these predictions is bench/predict.py's.
"""

from __future__ import annotations

import json
import math
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
    3.182 * sqrt((0.01 + 0.04 + 0.0025) / 3) = 0.42094 each way; at a thread count no log ran,
    from the bounds' own tokens/s (40 and 160) out; with no residual, the wider of the bench's
    error (80 x/÷ e^0.2: 65.50 to 97.71) and the steps' 10th and 90th percentile ratios (1.04
    and 1.36: 73.53 to 96.15): 65.50 to 97.71, and with steps spread wider (0.9 to 1.7:
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
    iv = interval(10, 1e8, m, "gen", cpu, bounds=(2e8, 5e7))
    assert iv.basis == "thread bounds" and iv.value == pytest.approx(80.0)
    assert iv.low == pytest.approx(40 * math.exp(-half))
    assert iv.high == pytest.approx(160 * math.exp(half))
    across = replace(m, held_out_threads={"gen": [0.3]})
    iv = interval(10, 1e8, across, "gen", cpu, bounds=(2e8, 5e7))
    assert iv.basis == "held-out" and iv.high == pytest.approx(80 * math.exp(12.706 * 0.3))
    steps = _model(
        self_level={"gen": 1.25}, self_ratios={"gen": np.array([1.0, 1.1, 1.2, 1.3, 1.4])}
    )
    iv = interval(10, 1e8, steps, "gen", cpu)
    assert iv.basis == "bench"
    assert (iv.low, iv.high) == (pytest.approx(65.50, abs=0.01), pytest.approx(97.71, abs=0.01))
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

    sessions = [predict.load_session(p) for p in others]
    sf = predict.load_session(log)
    p = predict.price(predict.default_target(sf, None), predict.fit(sessions), sessions, [])
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
    thread counts, priced from the others' (the bandwidth saturated: no peaks in this cache)."""
    from llamacpp_instr.deciding.prediction import predict

    monkeypatch.setenv("LLAMACPP_INSTR_CACHE", str(tmp_path))
    a, b, one = twins
    model = predict.fit([predict.load_session(p) for p in (a, b)])
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

    across = predict.fit([predict.load_session(p) for p in (a, one)])
    assert across.held_out == {}
    said = [_said(a, [one]), _said(one, [a])]
    for kind in ("prompt", "gen"):
        got = across.held_out_threads[kind]
        assert got == pytest.approx([s[kind] for s in said], rel=1e-6, abs=1e-9)


@pytest.mark.fast
def test_each_op_at_one_thread_from_a_two_thread_log() -> None:
    """The committed tiny log ran 2 threads. At 1, each op of its graphs keeps its class; of its
    time beyond the class's fixed cost, its bytes at the rate its weight matrix streamed at stay
    (the rate saturates) and the rest, compute, doubles. The rate of a matmul is the best a
    generation step of the log read its matrix at (that role's and type's matmuls' bytes over
    their time), of another op the best any generation step's ops reached: worked out here from
    the log's op times."""
    from llamacpp_instr.deciding.prediction import op_threads
    from llamacpp_instr.deciding.prediction.op_costs import GraphCosts, Where
    from llamacpp_instr.deciding.prediction.op_fit import fit
    from llamacpp_instr.deciding.prediction.predict import load_session

    sf = load_session(FIXTURES / "tiny-llama-detailed.log.gz")
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
    one = op_threads.scale(model, 1)
    kinds = {"memory": 0, "compute": 0}
    for gc in costs.values():
        cpu = ["CPU"] * len(gc.labels)
        at2, missing = model.price(gc, cpu, 2)
        at1, missing1 = one.price(gc, cpu, 1)
        assert missing == missing1 == []
        for k in np.flatnonzero(at2):
            lab, typ = gc.labels[k], gc.types[k]
            cls = model.lookup(Where("CPU", 2), gc.tokens[k], lab, typ, gc.roles[k])
            assert cls is not None
            weight = typ if lab.startswith("MUL_MAT") and not typ.startswith("kv ") else ""
            rate = rates.get(f"{weight}:{gc.roles[k]}", rates[weight]) if weight else rates[""]
            beyond = at2[k] - cls.fixed
            memory = min(beyond, gc.bytes[k] / rate)
            assert at1[k] == pytest.approx(cls.fixed + memory + 2 * (beyond - memory), rel=1e-9)
            if beyond > 0 and memory == beyond:
                kinds["memory"] += 1
                assert at1[k] == pytest.approx(at2[k], rel=1e-12)
            elif beyond > 0 and memory < beyond / 2:
                kinds["compute"] += 1
                assert at1[k] - cls.fixed > 1.5 * beyond
    assert kinds["memory"] >= 5 and kinds["compute"] >= 5, kinds


def test_one_thread_from_a_two_thread_log_is_predicted(tiny_detailed: RunLog) -> None:
    """predict --threads 1 from a 2-thread log (it was refused): a prediction, said to be priced
    from 2 threads, whose interval runs from every op taking twice its time (at least half the
    2-thread speed) to the 2-thread prediction itself (no op slower)."""
    r = instr("predict", str(tiny_detailed.path), "--threads", "1", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    at2 = json.loads(instr("predict", str(tiny_detailed.path), "--format", "json").stdout)
    assert "priced from the logs' 2" in doc["threads_from"]
    assert at2["threads_from"] is None
    for key in ("prompt_tokens_per_s", "gen_tokens_per_s"):
        iv, own = doc[key], at2[key]
        assert iv["basis"] == "thread bounds"
        assert iv["high"] == pytest.approx(own["value"], rel=1e-9)
        assert own["value"] / 2 <= iv["low"] <= iv["value"] <= iv["high"]
    text = instr("predict", str(tiny_detailed.path), "--threads", "1").stdout
    assert "threads: 1 threads priced from the logs' 2" in text


def test_threads_beyond_the_cpus_are_not_covered(tiny_detailed: RunLog) -> None:
    n = int(tiny_detailed.start["machine"]["n_cpus"]) + 1
    r = instr("predict", str(tiny_detailed.path), "--threads", str(n))
    assert_one_line_error(r, "not covered")
    assert f"the CPU at {n} threads" in r.stdout and "CPUs" in r.stdout
    assert f"--threads {n}" in r.stdout and "not predicted" in r.stdout


def test_more_threads_than_a_log_without_its_cpus_ran_are_not_covered(
    instr_api: Any, tmp_path: Path
) -> None:
    """The committed fixture's log does not name its machine's CPUs: fewer threads than it ran
    are predicted, more are not (they could be more than the machine has)."""
    from helpers.tiny_gguf import write_tiny_model

    log = FIXTURES / "tiny-llama-detailed.log.gz"
    model = write_tiny_model(tmp_path / "tiny.gguf", arch="llama", seed=7, n_ctx_train=1024)
    r = instr("predict", str(log), "--model", str(model), "--threads", "4")
    assert_one_line_error(r, "not covered")
    assert "do not say how many CPUs" in r.stdout
    r = instr("predict", str(log), "--model", str(model), "--threads", "1")
    assert r.returncode == 0, (r.stdout, r.stderr)


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
