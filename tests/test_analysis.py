"""The analysis API and `instr summary` / `export` / `workloads`, checked against the raw NDJSON."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner
from helpers.support import (
    FIXTURES,
    ODD_OPS,
    REAL_FIXTURES,
    edit_ops,
    plain_copy,
    read_log,
    rewrite_log,
)

from llamacpp_instr.cli import main
from llamacpp_instr.converters import load_session
from llamacpp_instr.converters.reports.summary import by, overview, workloads


@pytest.fixture(params=REAL_FIXTURES, ids=lambda p: p.name)
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return plain_copy(request.param, tmp_path)


def _encodes(recs: list[dict[str, Any]]) -> set[int]:
    """The steps that are an encoder's encodes (an image's, a sound's): not in the steps table."""
    return {r["step"] for r in recs if r["type"] == "step_begin" and r["kind"] == "encode"}


@pytest.mark.fast
def test_frames_match_the_raw_log(log: Path) -> None:
    recs = read_log(log)
    f = load_session(log)
    enc = _encodes(recs)
    computes = [r for r in recs if r["type"] == "compute" and r["step"] not in enc]
    ends = [r for r in recs if r["type"] == "step_end" and r["step"] not in enc]
    assert len(f.steps) == len(ends)
    assert f.steps["llama_decode_ns"].sum() == sum(e["dur"] for e in ends)
    assert (f.steps["dur_ns"] >= f.steps["llama_decode_ns"]).all()  # (until its outputs were read)
    assert len(f.ops) == sum(len(c.get("ops", [])) for c in computes)
    assert f.ops["dur_ns"].sum() == sum(o[2] for c in computes for o in c.get("ops", []))
    assert len(f.layers) == sum(len(c["layers"]) for c in computes)  # (a span per device)
    assert len(f.layers) >= recs[0]["model"]["n_layer"] * len(computes)
    assert len(f.weights) == len(recs[0]["weights"])
    assert f.weights["bytes"].sum() == sum(w["bytes"] for w in recs[0]["weights"])
    assert f.ops["dur_ns"].dtype == "int64" and isinstance(f.ops["op"].dtype, pd.CategoricalDtype)
    stats = [row for r in recs if r["type"] == "tensor_stats" for row in r["stats"]]
    assert len(f.tensor_stats) <= len(stats)  # stats of timed nodes (fused followers have none)
    topk = [x for r in recs if r["type"] == "topk" for row in r["rows"] for x in row["ids"]]
    assert f.topk["token"].tolist() == topk


@pytest.mark.fast
def test_summary_totals(log: Path) -> None:
    recs = read_log(log)
    f = load_session(log)
    ov = overview(f)
    begins = [r for r in recs if r["type"] == "step_begin"]
    assert ov["gen_tokens"] == sum(b["n_tokens"] for b in begins if b["kind"] == "gen")
    assert ov["prompt_tokens"] == sum(b["n_tokens"] for b in begins if b["kind"] == "prompt")
    enc = _encodes(recs)
    op_ns = sum(
        o[2]
        for r in recs
        if r["type"] == "compute" and r["step"] not in enc
        for o in r.get("ops", [])
    )
    assert ov["op_ns"] == op_ns
    if op_ns:
        t = by(f, "op")
        assert t["count"].sum() == len(f.ops)
        assert t["total_ms"].sum() == pytest.approx(op_ns / 1e6)
        assert t["share"].sum() == pytest.approx(1.0)
        layers = by(f, "layer")
        assert len(layers) == recs[0]["model"]["n_layer"] + (
            1 if f.ops["layer"].isna().any() else 0
        )


@pytest.mark.fast
def test_workload_counts_add_up(log: Path) -> None:
    f = load_session(log)
    rows = workloads(f)
    assert sum(r["count"] for r in rows) == len(f.ops)
    assert sum(r["total_ns"] for r in rows) == f.ops["dur_ns"].sum()
    for r in rows:
        if r["op"] == "MUL_MAT" and "axes" in r:
            out = r["output"]["shape"] + [1]
            assert out[0] == r["axes"]["M"] and out[1] == r["axes"]["N"]


@pytest.mark.fast
def test_cli_summary_formats(tmp_path: Path) -> None:
    log = plain_copy(FIXTURES / "tiny-llama-detailed.log.gz", tmp_path)
    r = CliRunner().invoke(main, ["summary", str(log), "--format", "json", "--by", "layer"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert len(data["by_layer"]) == 2 + 1  # two layers, and the ops outside any layer
    for fmt in ("text", "markdown", "csv"):
        r = CliRunner().invoke(main, ["summary", str(log), "--format", fmt])
        assert r.exit_code == 0 and "MUL_MAT" in r.output


@pytest.mark.fast
def test_export_parquet_round_trips(tmp_path: Path) -> None:
    log = plain_copy(FIXTURES / "tiny-llama-verbose.log.gz", tmp_path)
    out = tmp_path / "tables"
    r = CliRunner().invoke(main, ["export", str(log), "-o", str(out)])
    assert r.exit_code == 0, r.output
    f = load_session(log)
    for name, df in f.tables().items():
        back = pd.read_parquet(out / f"{name}.parquet")
        pd.testing.assert_frame_equal(back, df, check_categorical=False)
    r = CliRunner().invoke(main, ["export", str(log), "--format", "csv", "-o", str(out)])
    assert r.exit_code == 0 and len(pd.read_csv(out / "ops.csv")) == len(f.ops)


@pytest.mark.fast
def test_workloads_cli(tmp_path: Path) -> None:
    log = plain_copy(FIXTURES / "tiny-llama-detailed.log.gz", tmp_path)
    out = tmp_path / "w.jsonl"
    r = CliRunner().invoke(main, ["export", str(log), "--workloads", "-o", str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sum(x["count"] for x in rows) == len(load_session(log).ops)


def test_real_smollm2_summary(smollm2_detailed: Any) -> None:
    f = load_session(smollm2_detailed.path)
    assert len(by(f, "layer")) == 30 + 1
    assert overview(f)["gen_tokens"] == 15
    assert overview(f)["op_time_coverage"] > 0.5


@pytest.mark.fast
@pytest.mark.parametrize("cmd", [["summary"], ["export", "--workloads"]])
def test_bad_input_one_line(cmd: list[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.log"
    bad.write_bytes(b"\x00\x01garbage\n")
    r = CliRunner().invoke(main, [*cmd, str(bad)])
    assert r.exit_code == 2 and r.output.startswith("error: ") and r.output.count("\n") == 1


@pytest.mark.fast
@pytest.mark.parametrize("case", list(ODD_OPS))
@pytest.mark.parametrize("cmd", ["summary", "export"])
def test_odd_values_report_or_one_line(cmd: str, case: str, tmp_path: Path) -> None:
    """An odd value in a compute record (a damaged or hand-edited log): the report is written, or
    the command says why in one line; never a traceback."""
    log = rewrite_log(
        FIXTURES / "tiny-llama-detailed.log.gz",
        tmp_path / "odd.log",
        lambda recs: edit_ops(recs, 1, ODD_OPS[case]),
    )
    args = [cmd, str(log)] + (["-o", str(tmp_path / "out")] if cmd == "export" else [])
    r = CliRunner().invoke(main, args)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    if r.exit_code:
        assert r.output.startswith("error: ") and r.output.count("\n") == 1, r.output


@pytest.mark.fast
def test_minimal_log_says_op_times_are_not_recorded(tmp_path: Path) -> None:
    """MINIMAL records no per-op times: the summary says so instead of a 0.0 % coverage."""
    log = plain_copy(FIXTURES / "tiny-llama-minimal.log.gz", tmp_path)
    recs = read_log(log)
    assert recs[0]["level"] == "minimal"
    assert not any("ops" in r for r in recs if r["type"] == "compute")
    assert overview(load_session(log))["op_time_coverage"] is None
    r = CliRunner().invoke(main, ["summary", str(log)])
    assert r.exit_code == 0, r.output
    assert re.search(r"^op-time coverage: +not recorded at level minimal$", r.output, re.M)
    assert "%" not in r.output.split("op-time coverage:")[1]
    assert "Time per op type" not in r.output  # no op table without op times
    r = CliRunner().invoke(main, ["summary", str(log), "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["overview"]["op_time_coverage"] is None
    r = CliRunner().invoke(main, ["summary", str(log), "--format", "markdown"])
    assert "- op-time coverage: not recorded at level minimal" in r.output


@pytest.mark.fast
def test_level_decides_whether_op_times_are_recorded(tmp_path: Path) -> None:
    """The level comes from session_start: the same records relabelled `detailed` (whose computes
    happen to hold no ops) report a real 0 % coverage, and a detailed log its measured share."""
    recs = read_log(FIXTURES / "tiny-llama-minimal.log.gz")
    recs[0]["level"] = "detailed"
    relabelled = tmp_path / "relabelled.log"
    relabelled.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert overview(load_session(relabelled))["op_time_coverage"] == 0.0
    r = CliRunner().invoke(main, ["summary", str(relabelled)])
    assert re.search(r"^op-time coverage \(timed ops / step time\): +0\.0%$", r.output, re.M)
    log = plain_copy(FIXTURES / "tiny-llama-detailed.log.gz", tmp_path)
    dr = read_log(log)
    op_ns = sum(o[2] for c in dr if c["type"] == "compute" for o in c["ops"])
    step_ns = sum(e["dur"] for e in dr if e["type"] == "step_end")
    assert overview(load_session(log))["op_time_coverage"] == pytest.approx(op_ns / step_ns)
