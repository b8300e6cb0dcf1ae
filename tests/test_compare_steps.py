"""instr compare of runs of different lengths and settings (issue 71 §6): op and layer times per
step, prompt and generation apart, and the differences said first.

The per-step figures are worked out here from the logs' raw records (each compute's ops, the node
table of its graph, each step's kind): the time of an op type in a kind's steps over the number
of those steps.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from helpers.support import RunLog, instr, make_run

pytestmark = pytest.mark.native


@pytest.fixture(scope="module")
def runs(
    instr_api: Any, tiny_llama_f32: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[RunLog, RunLog]:
    """A: 12 generated on 2 threads; B: 4 generated on 1 thread (the same prompt)."""
    d = tmp_path_factory.mktemp("compare-steps")
    a = RunLog(make_run(tiny_llama_f32, d / "a.log", "detailed", n_predict=12))
    b = RunLog(make_run(tiny_llama_f32, d / "b.log", "detailed", n_predict=4, threads=1))
    return a, b


def _per_step(run: RunLog) -> dict[tuple[str, str], float]:
    """(kind, op type) -> ms per step of that kind, from the raw records."""
    kinds = {s["step"]: s["kind"] for s in run.of("step_begin")}
    graphs = {g["graph"]: g["nodes"] for g in run.of("graph")}
    total: dict[tuple[str, str], float] = defaultdict(float)
    for c in run.of("compute"):
        nodes = graphs[c["graph"]]
        for op in c.get("ops", []):
            n = nodes[op[0]]
            label = n["op"] + (f":{n['sub']}" if n.get("sub") else "")
            total[(kinds[c["step"]], label)] += op[2] / 1e6
    count = {k: sum(1 for v in kinds.values() if v == k) for k in ("prompt", "gen")}
    return {key: v / count[key[0]] for key, v in total.items()}


def test_runs_of_different_lengths_compare_per_step(runs: tuple[RunLog, RunLog]) -> None:
    a, b = runs
    r = instr("compare", str(a.path), str(b.path), "--format", "json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    assert "generated tokens: A 11, B 3" in c["differences"]
    assert "threads: A 2, B 1" in c["differences"]
    assert "differ" in c["warning"] and "per step" in c["warning"]
    want_a, want_b = _per_step(a), _per_step(b)
    rows = {row["op"]: row for row in c["per_op"]}
    assert {op for _k, op in want_a} | {op for _k, op in want_b} == set(rows)
    for (kind, op), ms in want_a.items():
        assert rows[op][f"{kind}_ms_a"] == pytest.approx(ms, rel=1e-9)
    for (kind, op), ms in want_b.items():
        assert rows[op][f"{kind}_ms_b"] == pytest.approx(ms, rel=1e-9)
        if rows[op][f"{kind}_ms_a"]:
            assert rows[op][f"{kind}_ratio"] == pytest.approx(ms / rows[op][f"{kind}_ms_a"])
    # the layers add up to the same per step as the op types
    for run in ("a", "b"):
        for kind in ("prompt", "gen"):
            layers = sum(x[f"{kind}_ms_{run}"] for x in c["per_layer"])
            ops = sum(x[f"{kind}_ms_{run}"] for x in c["per_op"])
            assert layers == pytest.approx(ops, rel=1e-9)
    text = instr("compare", str(a.path), str(b.path)).stdout.splitlines()
    said = next(i for i, x in enumerate(text) if x.startswith("warning: the runs differ"))
    assert said < next(i for i, x in enumerate(text) if x.startswith("generation tokens/s A"))
    text = "\n".join(text)
    assert "generation B/A" in text and "prompt B/A" in text


def test_runs_alike_say_no_difference(runs: tuple[RunLog, RunLog]) -> None:
    a, _b = runs
    c = json.loads(instr("compare", str(a.path), str(a.path), "--format", "json").stdout)
    assert c["differences"] == [] and "warning" not in c
    assert all(x["gen_ratio"] in (None, pytest.approx(1.0)) for x in c["per_op"])
