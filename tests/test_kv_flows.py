"""KV-cache flows (``instr to-perfetto --flows``) on real SmolLM2 runs: the arrows from each cache
write go to exactly the attention ops that read its cells, as the raw log says (llama.cpp's node
names ``cache_k_l{L}``, ``kq-{L}``, ``kqv-{L}`` and the steps' positions), in both trace formats."""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import packets, read_log

import llamacpp_instr
from llamacpp_instr.cli import main

pytestmark = pytest.mark.native

Pair = tuple[tuple[int, int], tuple[int, int]]  # ((step, node) written, (step, node) read)
WRITE = re.compile(r"cache_([kv])_l(\d+)\b")
READ = {"kq": "k", "kqv": "v"}


def expected_pairs(path: Path, layer: int | None = None) -> set[Pair]:
    """From the raw log: a write of layer L's K (V) cache in step S is read by every ``kq-L``
    (``kqv-L``) op after it until a step starts its sequence at or before the write's first
    position (llama.cpp then drops those cells)."""
    recs = read_log(path)
    graphs = {(r["ctx"], r["graph"]): r["nodes"] for r in recs if r["type"] == "graph"}
    first = {r["step"]: r["pos"][0] for r in recs if r["type"] == "step_begin"}
    ops: list[tuple[int, int, str, int, str, int]] = []  # step, node, role, layer, cache, pos
    offset: dict[int, int] = defaultdict(int)
    for r in recs:
        if r["type"] != "compute":
            continue
        nodes = graphs[(r["ctx"], r["graph"])]
        pos = first[r["step"]] + offset[r["step"]]  # this ubatch's first position
        offset[r["step"]] += r["n_tokens"]
        for op in r["ops"]:
            n = nodes[op[0]]
            m = WRITE.match(n["name"])
            if "kv_write" in n["flags"] and m:
                ops.append((r["step"], n["i"], "w", int(m[2]), m[1], pos))
            name, _, lay = n["name"].partition("-")
            if name in READ and lay.isdigit():
                ops.append((r["step"], n["i"], "r", int(lay), READ[name], pos))
    pairs = set()
    for k, (s, i, role, lay, cache, p) in enumerate(ops):
        if role != "w" or layer not in (None, lay):
            continue
        for t, j, role2, lay2, cache2, _ in ops[k + 1 :]:
            if any(first[u] <= p for u in range(s + 1, t + 1)):
                break  # cells dropped: none of them is read from here on
            if role2 == "r" and (lay2, cache2) == (lay, cache):
                pairs.add(((s, i), (t, j)))
    return pairs


def pftrace_pairs(data: bytes) -> set[Pair]:
    """Flows in a Perfetto trace, as (start slice, end slice) with each slice's step and node."""
    names: dict[int, str] = {}
    arg_names: dict[int, str] = {}
    steps: list[tuple[int, int]] = []  # ts, step
    starts: dict[int, tuple[int, int]] = {}
    ends: dict[int, tuple[int, int]] = {}
    ops: list[tuple[int, int, list[int], list[int]]] = []  # ts, node, flow starts, ends
    for p in packets(data):
        for e in p.interned_data.event_names:
            names[e.iid] = e.name
        for e in p.interned_data.debug_annotation_names:
            arg_names[e.iid] = e.name
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        args = {arg_names[a.name_iid]: a for a in e.debug_annotations}
        if e.type == e.TYPE_SLICE_BEGIN and (e.flow_ids or e.terminating_flow_ids):
            ops.append(
                (
                    p.timestamp,
                    args["node_index"].int_value,
                    [*e.flow_ids],
                    [*e.terminating_flow_ids],
                )
            )
        if e.type == e.TYPE_SLICE_BEGIN and "step" in e.categories:
            steps.append((p.timestamp, args["step"].int_value))
    steps.sort()
    for ts, node, out, into in ops:
        step = max(s for s in steps if s[0] <= ts)[1]
        for f in out:
            assert f not in starts, "a flow started twice"
            starts[f] = (step, node)
        for f in into:
            assert f not in ends, "a flow ended twice"
            ends[f] = (step, node)
    assert starts.keys() == ends.keys(), "flows without both ends"
    return {(starts[f], ends[f]) for f in starts}


def json_pairs(data: bytes) -> set[Pair]:
    """Flows in a Chrome JSON trace: each ``s``/``f`` event bound to the op slice around it."""
    events = json.loads(data)
    steps = sorted((e["ts"], e["args"]["step"]) for e in events if e.get("cat") == "step")
    # each thread's op slices by start, so that the slices around an event are looked for among
    # those that start at most the thread's longest slice before it (a scan of every op took 19 s)
    slices: dict[int, list[tuple[float, float, dict[str, Any]]]] = defaultdict(list)
    for o in events:
        if o.get("cat") == "op" and o["dur"] > 0:
            slices[o["tid"]].append((o["ts"], o["ts"] + o["dur"], o))
    starts: dict[int, list[float]] = {}
    longest: dict[int, float] = {}
    for tid, rows in slices.items():
        rows.sort(key=lambda r: r[0])
        starts[tid] = [r[0] for r in rows]
        longest[tid] = max(end - ts for ts, end, _ in rows)
    flows: dict[int, dict[str, tuple[int, int]]] = defaultdict(dict)
    for e in events:
        if e["ph"] not in ("s", "f"):
            continue
        assert e["ph"] == "s" or e["bp"] == "e"
        tid, at = e["tid"], e["ts"]
        first = bisect_left(starts[tid], at - longest[tid])
        last = bisect_left(starts[tid], at)  # the slices that start before the event
        (op,) = [o for ts, end, o in slices[tid][first:last] if at < end]
        step = max(s for s in steps if s[0] <= op["ts"])[1]
        assert e["ph"] not in flows[e["id"]]
        flows[e["id"]][e["ph"]] = (step, op["args"]["node_index"])
    assert all(len(f) == 2 for f in flows.values()), "flows without both ends"
    return {(f["s"], f["f"]) for f in flows.values()}


def convert(log: Path, out: Path, *args: str) -> str:
    res = CliRunner().invoke(main, ["to-perfetto", str(log), "-o", str(out), "--flows", *args])
    assert res.exit_code == 0, res.output
    return res.output


def test_flows_of_a_run(smollm2_detailed: Any, tmp_path: Path) -> None:
    log = smollm2_detailed.path
    n_layer = smollm2_detailed.start["model"]["n_layer"]
    n = len(smollm2_detailed.of("step_begin"))  # one sequence, positions only growing
    want = expected_pairs(log)
    # every write is read by its own step's and each later step's attention: K and V per layer
    assert len(want) == 2 * n_layer * n * (n + 1) // 2
    output = convert(log, tmp_path / "t.pftrace")
    assert f"{len(want)} KV cache flows" in output
    assert pftrace_pairs((tmp_path / "t.pftrace").read_bytes()) == want
    convert(log, tmp_path / "t.json", "--format", "json")
    assert json_pairs((tmp_path / "t.json").read_bytes()) == want


def test_flows_of_one_layer_and_some_steps(smollm2_detailed: Any, tmp_path: Path) -> None:
    log = smollm2_detailed.path
    convert(log, tmp_path / "t.pftrace", "--layer", "7", "--steps", "2:6")
    got = pftrace_pairs((tmp_path / "t.pftrace").read_bytes())
    want = {(w, r) for w, r in expected_pairs(log, layer=7) if 2 <= w[0] < 6 and 2 <= r[0] < 6}
    assert got == want and len(want) == 2 * 4 * 5 // 2


def test_reused_prefix_drops_the_cells_after_it(smollm2_path: Path, tmp_path: Path) -> None:
    """llama-cpp-python keeps the cached prefix two prompts share and evaluates from there: the
    writes past the prefix (the first prompt's end and its generated tokens) are read no more."""
    import llama_cpp

    log = tmp_path / "s.log"
    llm = llama_cpp.Llama(str(smollm2_path), n_ctx=256, n_threads=2, verbose=False)
    with llamacpp_instr.session(llm, log, level="detailed"):
        llm.create_completion("The capital of France is", max_tokens=3, temperature=0)
        # " Paris" is the first completion's first token: the cells from its second are dropped
        llm.create_completion("The capital of France is Paris and", max_tokens=3, temperature=0)
    begins = [r for r in read_log(log) if r["type"] == "step_begin"]
    restart = next(
        b for a, b in zip(begins, begins[1:], strict=False) if b["pos"][0] <= a["pos"][1]
    )
    # the second prompt really reused a prefix, up to a step's first cell
    assert restart["pos"][0] == begins[2]["pos"][0] == 6
    want = expected_pairs(log)
    # what step 2 wrote (at position 6) is read in its own step, and by nothing after the restart
    assert any(w[0] == 2 for w, _ in want)
    assert not {(w, r) for w, r in want if w[0] == 2 and r[0] >= restart["step"]}
    # while the first prompt's cells, and its first token's, are still read after it
    assert {0, 1} == {w[0] for w, r in want if w[0] < restart["step"] <= r[0]}
    convert(log, tmp_path / "s.pftrace")
    assert pftrace_pairs((tmp_path / "s.pftrace").read_bytes()) == want


def test_flows_need_ops(smollm2_detailed: Any, tmp_path: Path) -> None:
    out = tmp_path / "t.pftrace"
    res = CliRunner().invoke(
        main, ["to-perfetto", str(smollm2_detailed.path), "-o", str(out), "--flows", "--no-ops"]
    )
    assert res.exit_code == 2 and "--flows" in res.output and not out.exists()


@pytest.mark.parametrize("layer", [None, 3])
def test_api_function_draws_the_same_flows(
    smollm2_detailed: Any, tmp_path: Path, layer: Any
) -> None:
    out = llamacpp_instr.to_perfetto(
        smollm2_detailed.path, tmp_path / "t.pftrace", flows=True, layer=layer
    )
    assert pftrace_pairs(out.read_bytes()) == expected_pairs(smollm2_detailed.path, layer)
