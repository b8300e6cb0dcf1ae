"""Issue 52 §5: a mixture of experts' routing in the trace (a counter of the experts each layer
used, per compute) and per request of a server, checked against the log's experts records read
apart (tests/support.read_log)."""

from __future__ import annotations

import json
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import by_type, read_log

from llamacpp_instr.cli import main

N_EXPERT = 8


def _used_per_compute(recs: list[dict[str, Any]]) -> dict[int, list[float]]:
    """Per layer, in log order: the number of experts each compute's router sent tokens to."""
    out: dict[int, list[float]] = defaultdict(list)
    for r in by_type(recs, "experts"):
        used: dict[int, set[int]] = defaultdict(set)
        for layer, e, tokens, _ in r["rows"]:
            if tokens:
                used[layer].add(e)
        for layer in sorted(used):
            out[layer].append(float(len(used[layer])))
    return dict(out)


def test_the_trace_counts_each_layers_experts_per_compute(
    moe_small_detailed: Path, tmp_path: Path
) -> None:
    from test_perfetto import check_trace

    want = _used_per_compute(read_log(moe_small_detailed))
    assert sorted(want) == [0, 1, 2, 3]
    out = tmp_path / "t.pftrace"
    r = CliRunner().invoke(main, ["to-perfetto", str(moe_small_detailed), "-o", str(out)])
    assert r.exit_code == 0, r.output
    counters = check_trace(out)["counters"]
    got = {int(k.rsplit(" ", 1)[1]): v for k, v in counters.items() if k.startswith("experts used")}
    assert got == want
    # a generated token goes to 2 of the 8 experts of each layer
    assert all(v[-1] == 2.0 for v in got.values())
    # one layer selected: its track only; Chrome JSON: the same samples
    r = CliRunner().invoke(
        main, ["to-perfetto", str(moe_small_detailed), "-o", str(out), "--layer", "2"]
    )
    assert r.exit_code == 0, r.output
    names = [k for k in check_trace(out)["counters"] if k.startswith("experts used")]
    assert names == ["experts used: layer 2"]
    js = tmp_path / "t.json"
    r = CliRunner().invoke(
        main, ["to-perfetto", str(moe_small_detailed), "-o", str(js), "--format", "json"]
    )
    assert r.exit_code == 0, r.output
    events = json.loads(js.read_text())
    samples: dict[int, list[float]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "C" and e["name"].startswith("experts used"):
            samples[int(e["name"].rsplit(" ", 1)[1])].append(e["args"]["experts"])
    assert dict(samples) == want


def test_a_log_without_routing_has_no_expert_track(
    moe_small_detailed: Path, tmp_path: Path
) -> None:
    from test_perfetto import check_trace

    bare = tmp_path / "bare.log"
    bare.write_text(
        "".join(
            line
            for line in moe_small_detailed.read_text().splitlines(keepends=True)
            if '"type":"experts"' not in line
        )
    )
    out = tmp_path / "bare.pftrace"
    assert CliRunner().invoke(main, ["to-perfetto", str(bare), "-o", str(out)]).exit_code == 0
    assert not [k for k in check_trace(out)["counters"] if k.startswith("experts")]


@pytest.mark.fast
def test_a_requests_experts_are_its_own_steps_routing_and_shared_steps_are_not_split() -> None:
    from llamacpp_instr.converters.session.request_experts import request_experts

    ms = 1_000_000
    # slot 0's request holds steps 0 and 1, slot 1's steps 1 and 2; step 1 carries both
    rows = [
        ((0 * ms, ms, 4, [(0, 4)]), 0),
        ((2 * ms, ms, 2, [(0, 1), (1, 1)]), 1),
        ((4 * ms, ms, 3, [(1, 3)]), 2),
        ((6 * ms, ms, 1, [(1, 1)]), 3),  # routing not recorded (a step at minimal, say)
    ]
    routed = {
        0: [(0, 1, 4), (0, 2, 4), (1, 5, 8)],
        1: [(0, 3, 2), (0, 4, 2), (1, 3, 4)],
        2: [(0, 1, 6), (1, 7, 3), (1, 6, 3)],
    }
    reqs = [
        {"id": "a", "slot": 0, "t_arrive": 0, "wait": 0, "model": 3 * ms, "dur": 3 * ms},
        {"id": "b", "slot": 1, "t_arrive": ms, "wait": ms, "model": 5 * ms, "dur": 5 * ms},
    ]
    got = request_experts(reqs, rows, routed, N_EXPERT)
    a, b = got["a"].row(), got["b"].row()
    assert (a["steps"], a["shared_steps_not_split"]) == (1, 1)
    assert (b["steps"], b["shared_steps_not_split"]) == (1, 1)
    assert [x["load"] for x in a["layers"]] == [[0, 4, 4, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 8, 0, 0]]
    assert [x["load"] for x in b["layers"]] == [[0, 6, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 3, 3]]
    assert a["experts_used_per_layer"] == 1.5 and b["experts_used_per_layer"] == 1.5
    assert a["hottest"][0] == [1, 5, 1.0]


def test_a_real_llama_server_says_which_experts_each_request_routed_to(
    tools_bin: Path, moe_small: Path, tmp_path: Path
) -> None:

    from helpers.support import exec_server, instr, post_completion, signal_server, wait_requests

    log = tmp_path / "server.log"
    server, port = exec_server(
        log,
        moe_small,
        *["--parallel", "1", "-c", "1024", "-t", "2"],
        instr_args=("--level", "detailed"),
    )
    prompts = ["The capital of France is", "Rivers run to the sea and", "One, two, three,"]
    try:
        for p in prompts:
            body = {"prompt": p, "n_predict": 4, "temperature": 0, "ignore_eos": True}
            post_completion(port, body, timeout=300)
        wait_requests(log, len(prompts))
    finally:
        signal_server(server, signal.SIGTERM)
        server.wait(60)
    recs = read_log(log)
    reqs = by_type(recs, "request")
    assert len(reqs) == len(prompts)
    begins = {r["step"]: r for r in by_type(recs, "step_begin")}
    routed: dict[int, list[list[int]]] = defaultdict(list)
    for r in by_type(recs, "experts"):
        routed[r["step"]] += [row[:3] for row in r["rows"]]
    assert routed, "the server's log has no routing"
    # each request: the routing of the steps of its slot that began while it held the slot
    want: dict[str, dict[int, list[int]]] = {}
    for q in reqs:
        t0 = q["t_arrive"] + q["wait"]
        load: dict[int, list[int]] = defaultdict(lambda: [0] * N_EXPERT)
        for step, b in begins.items():
            seqs = {s[0] for s in b.get("seqs") or [[0]]}
            if t0 <= b["ts"] <= t0 + q["model"] and q["slot"] in seqs:
                for layer, e, tokens in routed.get(step, []):
                    load[layer][e] += tokens
        want[q["id"]] = dict(load)
    out = instr("requests", str(log), "--format", "json")
    assert out.returncode == 0, out.stderr
    got = {g["id"]: g["experts"] for g in json.loads(out.stdout)["requests"]}
    assert sorted(got) == sorted(want)
    for rid, x in got.items():
        assert x["shared_steps_not_split"] == 0  # one slot: no step carried two requests
        assert {la["layer"]: la["load"] for la in x["layers"]} == want[rid]
        # 4 generated tokens (the first from the prompt's step), 2 experts each in every layer
        assert x["steps"] >= 4 and all(sum(v) >= 2 * 4 for v in want[rid].values())
    text = instr("requests", str(log))
    assert text.returncode == 0 and "Experts per request" in text.stdout
