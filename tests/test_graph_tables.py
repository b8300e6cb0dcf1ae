"""A node table once per structure (issue 37 §4): a graph built again the same (llama-server
rebuilds its graph on every step; a prompt split into ubatches of alternating sizes rebuilds it at
every ubatch) names the first graph's table instead of writing it again (`same_as`), within one
file. Readers resolve it, and every output is the same as from the log with every table written
out whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import make_run


@pytest.fixture(scope="module")
def rebuilt(instr_api: Any, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 with its prompt in batches of 6 tokens and ubatches of 4: ubatches of 4 and 2
    tokens alternate, each rebuilding the graph."""
    out = tmp_path_factory.mktemp("tables") / "rebuilt.log"
    prompt = "one two three four five six seven eight nine ten eleven twelve thirteen"
    make_run(smollm2_path, out, "detailed", prompt=prompt, n_predict=4, n_batch=6, n_ubatch=4)
    return out


def _raw(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _expanded(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with every `same_as` table written out whole, as before this change."""
    tables: dict[tuple[str, int, int], list[Any]] = {}
    out = []
    for r in recs:
        if r["type"] == "graph":
            if "same_as" in r:
                nodes = tables[(r["sid"], r["ctx"], r["same_as"])]
                r = {k: v for k, v in r.items() if k != "same_as"}
                r["nodes"] = nodes
            tables[(r["sid"], r["ctx"], r["graph"])] = r["nodes"]
        out.append(r)
    return out


def test_a_graph_built_again_names_the_first_table(rebuilt: Path) -> None:
    recs = _raw(rebuilt)
    graphs = [r for r in recs if r["type"] == "graph"]
    same = [g for g in graphs if "same_as" in g]
    whole = {g["graph"]: g for g in graphs if "nodes" in g}
    assert same, [(g["graph"], g["n_tokens"]) for g in graphs]
    for g in same:
        assert "nodes" not in g
        first = whole[g["same_as"]]  # written before, in this file
        assert recs.index(first) < recs.index(g)
        assert first["n_tokens"] == g["n_tokens"]
    # every graph a compute ran is defined: whole, or by the table it names
    assert {c["graph"] for c in recs if c["type"] == "compute"} <= {g["graph"] for g in graphs}
    # the distinct tables (by what they hold) are each written once
    bodies = [json.dumps(g["nodes"]) for g in whole.values()]
    assert len(bodies) == len(set(bodies))


def _outputs(log: Path, out: Path) -> dict[str, bytes]:
    def instr(*args: str) -> bytes:
        r = subprocess.run(
            [sys.executable, "-m", "llamacpp_instr.cli", *args], capture_output=True, timeout=600
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    out.mkdir()
    instr("to-perfetto", str(log), "-o", str(out / "t.pftrace"))
    instr("to-perfetto", str(log), "--format", "json", "-o", str(out / "t.json"))
    instr("export", str(log), "-o", str(out / "export"))
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    files["summary.json"] = instr("summary", str(log), "--format", "json")
    files["summary.txt"] = instr("summary", str(log))
    return files


def test_outputs_are_the_same_as_from_whole_tables(rebuilt: Path, tmp_path: Path) -> None:
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
    r = subprocess.run(
        [sys.executable, "-m", "llamacpp_instr.cli", "summary", str(cut)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert "skipped" in (r.stdout + r.stderr)


def test_run_logs_stay_valid(rebuilt: Path, schema_validator: Any) -> None:
    recs = _raw(rebuilt)
    assert any("same_as" in r for r in recs)
    for rec in recs:
        schema_validator.validate(rec)


def test_the_tests_reader_resolves_tables(rebuilt: Path) -> None:
    """support.read_log gives every graph record its nodes (the tests read them directly)."""
    from support import read_log

    graphs = [g for g in read_log(rebuilt) if g["type"] == "graph"]
    assert any("same_as" in g for g in graphs)
    assert all(g["nodes"] for g in graphs)
