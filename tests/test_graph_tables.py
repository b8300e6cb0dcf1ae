"""A node table once per structure (issue 37 §4): a graph built again the same (llama-server
rebuilds its graph on every step; a prompt split into ubatches of alternating sizes rebuilds it at
every ubatch) names the first graph's table instead of writing it again (`same_as`), within one
file; one that differs from a table written whole only in the numbers of shapes and bytes (another
token count, other KV cells) names it with the substitution of those numbers (`same_as` and
`subst`). Readers resolve both, and every output is the same as from the log with every table
written out whole."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.support import FUZZ_DERANDOMIZE, FUZZ_EXAMPLES, JSON, instr, make_run, subst_nodes
from hypothesis import given, settings
from hypothesis import strategies as st

from llamacpp_instr.contract.schema import CURRENT_SCHEMA_VERSION
from llamacpp_instr.converters.reading.decode.fields import MALFORMED
from llamacpp_instr.converters.reading.decode.graphs import AT_MAX, SUBST_MAX, Graph, graph_record


@pytest.fixture(scope="module")
def rebuilt(instr_api: Any, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 with its prompt in batches of 6 tokens and ubatches of 4: ubatches of 4 and 2
    tokens alternate, each rebuilding the graph."""
    out = tmp_path_factory.mktemp("tables") / "rebuilt.log"
    prompt = "one two three four five six seven eight nine ten eleven twelve thirteen"
    make_run(smollm2_path, out, "detailed", prompt=prompt, n_predict=4, n_batch=6, n_ubatch=4)
    return out


# the token counts of the batches of a llama-server-like run: prompts and chunks of prompts of
# several sizes, between runs of one-token steps, until the KV cache holds past 512 cells. The
# first is 4, the tiny model's query heads: no other count is a substitution of its table.
BATCHES = [4, 7, 1, 1, 2, 9, 1, 5, 1, 1, 3, 11, 6, 1, 2, 1, 8, 5, 1, 1] * 8


@pytest.fixture(scope="module")
def served(instr_api: Any, tiny_llama_f32: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama decoding BATCHES one after another (each batch one ubatch and one graph)."""
    import llama_cpp

    import llamacpp_instr

    out = tmp_path_factory.mktemp("tables") / "served.log"
    llm = llama_cpp.Llama(
        model_path=str(tiny_llama_f32), n_ctx=1024, n_batch=64, n_threads=1, verbose=False
    )
    try:
        with llamacpp_instr.session(llm, out, "detailed"):
            k = 0
            for n in BATCHES:
                llm.eval([5 + (k + j) % 200 for j in range(n)])
                k += n
    finally:
        llm.close()
    assert k > 512
    return out


def _raw(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _expanded(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with every table named (`same_as`, `subst`) written out whole, as before
    this change."""
    tables: dict[tuple[str, int, int], list[Any]] = {}
    out = []
    for r in recs:
        if r["type"] == "graph":
            if "same_as" in r:
                nodes = tables[(r["sid"], r["ctx"], r["same_as"])]
                if "subst" in r:
                    nodes = subst_nodes(nodes, r["subst"], r.get("subst_at", []))
                r = {k: v for k, v in r.items() if k not in ("same_as", "subst", "subst_at")}
                r["nodes"] = nodes
            tables[(r["sid"], r["ctx"], r["graph"])] = r["nodes"]
        out.append(r)
    return out


def test_a_graph_built_again_names_the_first_table(rebuilt: Path) -> None:
    recs = _raw(rebuilt)
    graphs = [r for r in recs if r["type"] == "graph"]
    same = [g for g in graphs if "same_as" in g and "subst" not in g]
    by_id = {g["graph"]: g for g in graphs}
    whole = {g["graph"]: g for g in graphs if "nodes" in g}
    assert same, [(g["graph"], g["n_tokens"]) for g in graphs]
    for g in same:
        assert "nodes" not in g
        first = by_id[g["same_as"]]  # written before, in this file, whole or by subst
        assert "nodes" in first or "subst" in first
        assert recs.index(first) < recs.index(g)
        assert first["n_tokens"] == g["n_tokens"]
    # every graph a compute ran is defined: whole, or by the table it names
    assert {c["graph"] for c in recs if c["type"] == "compute"} <= {g["graph"] for g in graphs}
    # the distinct tables (by what they hold) are each written once
    bodies = [json.dumps(g["nodes"]) for g in whole.values()]
    assert len(bodies) == len(set(bodies))


def _outputs(log: Path, out: Path) -> dict[str, bytes]:
    def run(*args: str) -> bytes:  # stdout as bytes, compared byte for byte
        r = subprocess.run(
            [sys.executable, "-m", "llamacpp_instr.cli", *args], capture_output=True, timeout=600
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    out.mkdir()
    run("to-perfetto", str(log), "-o", str(out / "t.pftrace"))
    run("to-perfetto", str(log), "--format", "json", "-o", str(out / "t.json"))
    run("export", str(log), "-o", str(out / "export"))
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    files["summary.json"] = run("summary", str(log), "--format", "json")
    files["summary.txt"] = run("summary", str(log))
    return files


@pytest.mark.native
@pytest.mark.parametrize("run", ["rebuilt", "served"])
def test_outputs_are_the_same_as_from_whole_tables(
    run: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    rebuilt: Path = request.getfixturevalue(run)
    whole = tmp_path / "whole" / rebuilt.name
    whole.parent.mkdir()
    whole.write_text("".join(json.dumps(r) + "\n" for r in _expanded(_raw(rebuilt))))
    raw = tmp_path / "raw" / rebuilt.name
    raw.parent.mkdir()
    raw.write_text(rebuilt.read_text())
    assert whole.stat().st_size > raw.stat().st_size
    a = _outputs(raw, tmp_path / "out-raw")
    b = _outputs(whole, tmp_path / "out-whole")
    assert sorted(a) == sorted(b) and len(a) >= 5
    for name in a:
        assert a[name] == b[name], name


def test_a_table_named_but_missing_is_skipped_and_counted(rebuilt: Path, tmp_path: Path) -> None:
    """A file cut before the table a graph names (a damaged log): the graph record is skipped
    and counted, the rest converts."""
    recs = _raw(rebuilt)
    same = next(r for r in recs if r["type"] == "graph" and "same_as" in r)
    named = next(r for r in recs if r["type"] == "graph" and r["graph"] == same["same_as"])
    cut = tmp_path / "cut.log"
    cut.write_text("".join(json.dumps(r) + "\n" for r in recs if r is not named))
    r = instr("summary", str(cut))
    assert r.returncode == 0, r.stderr
    assert "skipped" in (r.stdout + r.stderr)


@pytest.mark.native
@pytest.mark.parametrize("run", ["rebuilt", "served"])
def test_run_logs_stay_valid(
    run: str, request: pytest.FixtureRequest, schema_validator: Any
) -> None:
    recs = _raw(request.getfixturevalue(run))
    assert recs[0]["schema_version"] == CURRENT_SCHEMA_VERSION
    assert any("same_as" in r for r in recs)
    for rec in recs:
        schema_validator.validate(rec)


def test_the_tests_reader_resolves_tables(rebuilt: Path) -> None:
    """support.read_log gives every graph record its nodes (the tests read them directly)."""
    from helpers.support import read_log

    graphs = [g for g in read_log(rebuilt) if g["type"] == "graph"]
    assert any("same_as" in g for g in graphs)
    assert all(g["nodes"] for g in graphs)


def test_a_table_differing_in_numbers_names_one_with_subst(served: Path) -> None:
    """Batches of other sizes (and other KV cells) write their tables as substitutions of one
    written whole: far fewer whole tables than token counts, and a subst far smaller."""
    recs = _raw(served)
    graphs = [r for r in recs if r["type"] == "graph"]
    by_id = {g["graph"]: g for g in graphs}
    subst = [g for g in graphs if "subst" in g]
    whole = [g for g in graphs if "nodes" in g]
    assert subst, [(g["graph"], g["n_tokens"]) for g in graphs]
    for g in subst:
        base = by_id[g["same_as"]]
        assert "nodes" in base  # written whole: no chains
        assert recs.index(base) < recs.index(g)
        olds = [(where, old) for where, old, _ in g["subst"]]
        assert len(olds) == len(set(olds)) and all(old != new for _, old, new in g["subst"])
        assert len(json.dumps(g)) * 10 < len(json.dumps(base))
    # every token count but 1 (whose shapes have a dimension fewer) had a batch after the first
    counts = {g["n_tokens"] for g in graphs}
    assert len(counts) == len(set(BATCHES)) > len({g["n_tokens"] for g in whole})
    assert len(whole) < len(subst)


def _elements(shape: list[int]) -> int:
    return math.prod(shape)


def _shape(*dims: int) -> list[int]:
    """A shape as the log writes it: up to its last dimension that is not 1."""
    d = list(dims)
    while len(d) > 1 and d[-1] == 1:
        d.pop()
    return d


def test_substituted_tables_are_the_graphs_own(served: Path) -> None:
    """The tables read through `subst` say what the graph built for their batch is: its token
    input holds the record's token count, the attention's query and key heads (4 and 2 of 64)
    that count of tokens, its scores as many KV cells (a multiple of 256) as its mask, and each
    f32 result its elements' bytes."""
    from helpers.support import read_log

    graphs = [r for r in read_log(served) if r["type"] == "graph"]
    assert sum("subst" in g for g in graphs) >= 10
    n_kvs = set()
    for g in graphs:
        n_tok = g["n_tokens"]
        srcs = {x["name"]: x for n in g["nodes"] for x in n["src"] if "name" in x}
        assert srcs["inp_tokens"]["shape"] == [n_tok] and srcs["inp_tokens"]["bytes"] == 4 * n_tok
        n_kv = srcs["attn_inp_kq_mask"]["shape"][0]
        assert n_kv % 256 == 0
        n_kvs.add(n_kv)
        heads = {(n["name"], len(n["shape"])): n["shape"] for n in g["nodes"]}
        for name, dims in (("Qcur-0", (64, 4, n_tok)), ("Kcur-0", (64, 2, n_tok))):
            assert heads[(name, len(_shape(*dims)))] == _shape(*dims)
        assert heads[("kq-0", len(_shape(n_kv, n_tok, 4)))] == _shape(n_kv, n_tok, 4)
        results = [n for n in g["nodes"] if n["dtype"] == "f32" and "noop" not in n["flags"]]
        assert len(results) > 20
        for n in results:
            assert n["bytes"] == 4 * _elements(n["shape"]), (g["graph"], n)
    assert len(n_kvs) >= 3  # the KV cells grew past 256 and 512


def test_a_value_meaning_two_things_is_set_by_position(served: Path) -> None:
    """The first table is of 4 tokens, as many as the tiny model's query heads: its 4s in the
    place of the tokens become the next batch's 7, and those of the heads stay 4, written by
    their position (`subst_at`): the substitution alone would change the heads too."""
    graphs = [r for r in _raw(served) if r["type"] == "graph"]
    first, second = graphs[:2]
    assert (first["n_tokens"], second["n_tokens"]) == (4, 7) and "nodes" in first
    assert second["same_as"] == first["graph"] and second["subst_at"]

    def q_heads(nodes: list[Any]) -> list[list[int]]:
        return [n["shape"] for n in nodes if n["name"] == "Qcur-0" and len(n["shape"]) == 3]

    assert q_heads(subst_nodes(first["nodes"], second["subst"], second["subst_at"]))[0] == [
        64,
        4,
        7,
    ]
    assert q_heads(subst_nodes(first["nodes"], second["subst"], []))[0] == [64, 7, 7]


# --- hostile subst: the reader bounds and checks it -----------------------------------------------

_BASE = {
    "type": "graph",
    "ts": 1,
    "sid": "0123456789abcdef",
    "ctx": 0,
    "graph": 1,
    "n_tokens": 3,
    "nodes": [
        {
            "i": 0,
            "name": "a",
            "op": "ADD",
            "sub": None,
            "layer": None,
            "shape": [8, 3],
            "dtype": "f32",
            "bytes": 96,
            "src": [
                {"name": "w", "kind": "weight", "type": "f32", "shape": [8, 3], "bytes": 96},
            ],
            "flags": [],
        },
        {
            "i": 1,
            "name": "b",
            "op": "MUL",
            "sub": None,
            "layer": 0,
            "shape": [8],
            "dtype": "f32",
            "bytes": 32,
            "src": [{"node": 0}],
            "flags": [],
        },
    ],
}


def _named(subst: Any) -> dict[str, Any]:
    return {k: _BASE[k] for k in ("type", "ts", "sid", "ctx", "n_tokens")} | {
        "graph": 2,
        "same_as": 1,
        "subst": subst,
    }


@pytest.mark.fast
def test_subst_is_applied_to_every_shape_and_bytes() -> None:
    tables: dict[tuple[int, int], Graph] = {}
    base = graph_record(json.loads(json.dumps(_BASE)), tables)
    g = graph_record(_named([[1, 3, 5], [4, 96, 160]]), tables)
    assert [n.shape for n in g.nodes] == [[8, 5], [8]]
    assert [n.bytes for n in g.nodes] == [160, 32]
    assert g.nodes[0].src == [
        {"name": "w", "kind": "weight", "type": "f32", "shape": [8, 5], "bytes": 160}
    ]
    assert g.nodes[1] is base.nodes[1]  # a node no triple changes is the base's
    assert base.nodes[0].shape == [8, 3]  # the base is left as it was
    assert tables[(0, 2)] is g  # a later same_as may name it
    # a value is replaced only in the place named: 8 in dimension 0, not 32 bytes nor a 3
    h = graph_record(_named([[0, 8, 16]]) | {"graph": 3}, tables)
    assert [n.shape for n in h.nodes] == [[16, 3], [16]]
    assert [n.bytes for n in h.nodes] == [96, 32]
    assert h.nodes[0].src[0]["shape"] == [16, 3]


@pytest.mark.fast
@pytest.mark.parametrize(
    "subst",
    [
        [[3, 5]],
        [[1, 3, 5, 7]],
        [[1, 3, 5], [1, 3, 6]],
        [[1, 3, 3]],
        [[1, 3, True]],
        [[True, 3, 5]],
        [[1, 3.0, 5]],
        [[1, "3", 5]],
        [[1, 3, -5]],
        [[-1, 3, 5]],
        [[5, 3, 5]],
        [[1, 3, 2**63]],
        [[1, 2**70, 5]],
        [[1, 3, None]],
        {"3": 5},
        "3,5",
        None,
        [[0, k, k + 1] for k in range(SUBST_MAX + 1)],
        [[0, k, k + 1] for k in range(0, 200_000, 2)],
    ],
)
def test_a_hostile_subst_is_malformed(subst: Any) -> None:
    tables: dict[tuple[int, int], Graph] = {}
    graph_record(json.loads(json.dumps(_BASE)), tables)
    with pytest.raises(MALFORMED):
        graph_record(_named(subst), tables)
    assert list(tables) == [(0, 1)]


@pytest.mark.fast
def test_subst_at_sets_numbers_by_position() -> None:
    """The numbers counted in the order the record writes them: node 0's shape (0, 1) and bytes
    (2), its leaf source's shape (3, 4) and bytes (5), node 1's shape (6) and bytes (7)."""
    tables: dict[tuple[int, int], Graph] = {}
    graph_record(json.loads(json.dumps(_BASE)), tables)
    g = graph_record(_named([[1, 3, 5]]) | {"subst_at": [[4, 3], [7, 64]]}, tables)
    assert [n.shape for n in g.nodes] == [[8, 5], [8]]
    assert g.nodes[0].src[0]["shape"] == [8, 3]  # kept by its position
    assert [n.bytes for n in g.nodes] == [96, 64]
    # the tests' own reader agrees
    nodes = subst_nodes(_BASE["nodes"], [[1, 3, 5]], [[4, 3], [7, 64]])
    assert [n["shape"] for n in nodes] == [[8, 5], [8]] and nodes[1]["bytes"] == 64
    assert nodes[0]["src"][0]["shape"] == [8, 3]


@pytest.mark.fast
@pytest.mark.parametrize(
    "at",
    [
        [],
        [[8, 1]],
        [[1, 5], [1, 6]],
        [[1]],
        [[1, 2, 3]],
        [[1, -2]],
        [[True, 2]],
        [[1, 2.0]],
        [[1, 2**64]],
        {"1": 2},
        [[k, 1] for k in range(AT_MAX + 1)],
        [[k, 1] for k in range(100_000)],
    ],
)
def test_a_hostile_subst_at_is_malformed(at: Any) -> None:
    tables: dict[tuple[int, int], Graph] = {}
    graph_record(json.loads(json.dumps(_BASE)), tables)
    with pytest.raises(MALFORMED):
        graph_record(_named([[1, 3, 5]]) | {"subst_at": at}, tables)
    rec = _named([]) | {"subst_at": [[1, 5]]}
    del rec["subst"]
    with pytest.raises(MALFORMED):  # subst_at only with subst
        graph_record(rec, tables)
    assert list(tables) == [(0, 1)]


@pytest.mark.fast
def test_subst_without_same_as_is_malformed() -> None:
    rec = json.loads(json.dumps(_BASE)) | {"subst": [[1, 3, 5]]}
    with pytest.raises(MALFORMED):
        graph_record(rec, {})


@pytest.mark.fast
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=FUZZ_DERANDOMIZE)
@given(
    subst=JSON | st.lists(st.lists(st.integers(-(2**70), 2**70), max_size=4), max_size=300),
    src_shape=JSON,
    at=st.none() | JSON | st.lists(st.lists(st.integers(-3, 12), max_size=3), max_size=5),
)
def test_fuzz_subst_never_crashes(subst: Any, src_shape: Any, at: Any) -> None:
    """Whatever subst and subst_at hold, and whatever the named table's leaf sources hold: a
    graph, or one of the errors that skip a malformed record."""
    base = json.loads(json.dumps(_BASE))
    base["nodes"][0]["src"][0]["shape"] = src_shape
    tables: dict[tuple[int, int], Graph] = {}
    graph_record(base, tables)
    try:
        g = graph_record(_named(subst) | ({} if at is None else {"subst_at": at}), tables)
    except MALFORMED:
        return
    assert len(g.nodes) == 2 and len(subst) <= SUBST_MAX


def test_a_log_with_a_hostile_subst_converts_the_rest(served: Path, tmp_path: Path) -> None:
    """A damaged subst in a real log: that graph record is skipped and counted, the rest
    converts (one line of output per problem, no traceback)."""
    recs = _raw(served)
    bad = next(r for r in recs if "subst" in r)
    bad["subst"] = [[1, 1, 2]] * 3
    log = tmp_path / "bad.log"
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    r = instr("summary", str(log))
    assert r.returncode == 0, r.stderr
    assert "skipped" in (r.stdout + r.stderr) and "Traceback" not in r.stderr


@pytest.mark.fast
def test_node_values_of_another_type_are_converted() -> None:
    """A table's values that are not of their type are converted as ``int``/``str`` would (the
    plain ones are taken as they are), and a value that does not convert is malformed."""
    node = {
        "i": "0", "name": 7, "op": "MUL", "sub": 3, "layer": 2.0, "shape": [4.0, "2"],
        "dtype": "f32", "bytes": "32", "src": [{"node": 0}, "junk"], "flags": [1],
    }  # fmt: skip
    rec = {"type": "graph", "ctx": 1, "graph": 5, "n_tokens": 1, "nodes": [node]}
    g = graph_record(rec, {})
    (n,) = g.nodes
    assert (n.i, n.name, n.sub, n.layer, n.shape, n.bytes) == (0, "7", "3", 2, [4, 2], 32)
    assert type(n.i) is int and type(n.layer) is int and all(type(d) is int for d in n.shape)
    assert n.src == [{"node": 0}] and n.flags == ["1"]
    for key, bad in (("i", "x"), ("shape", [1, "y"]), ("bytes", None), ("layer", [])):
        with pytest.raises(MALFORMED):
            graph_record({**rec, "nodes": [{**node, key: bad}]}, {})
