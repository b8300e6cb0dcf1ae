"""`instr export --dataset`: sessions appended to a hive-partitioned Parquet dataset, queried with
DuckDB (a real query engine, as users would) across sessions."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import FIXTURES

from llamacpp_instr.cli import main

pytestmark = pytest.mark.fast

LOGS = [FIXTURES / "tiny-llama-detailed.log.gz", FIXTURES / "tiny-qwen2-detailed-ubatch.log.gz"]


def raw(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def test_two_sessions_queried_together_with_duckdb(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    ds = tmp_path / "dataset"
    for log in LOGS:
        r = CliRunner().invoke(main, ["export", str(log), "--dataset", str(ds)])
        assert r.exit_code == 0, r.output
    # exporting again replaces the session's files: no duplicate rows
    assert CliRunner().invoke(main, ["export", str(LOGS[0]), "--dataset", str(ds)]).exit_code == 0

    expected = {}
    for log in LOGS:
        recs = raw(log)
        start = recs[0]
        ops = sum(len(c["ops"]) for c in recs if c["type"] == "compute")
        steps = sum(r["type"] == "step_end" for r in recs)
        mm = sum(
            1
            for c in recs
            if c["type"] == "compute"
            for op in c["ops"]
            for g in [next(g for g in recs if g["type"] == "graph" and g["graph"] == c["graph"])]
            if g["nodes"][op[0]]["op"] == "MUL_MAT"
        )
        expected[start["sid"]] = (start["model"]["name"], steps, ops, mm, start["wall_time"][:10])

    con = duckdb.connect()
    rows = con.sql(f"""
        select s.sid, s.model, s.date, count(*) as steps,
               (select count(*) from read_parquet('{ds}/ops/**/*.parquet', hive_partitioning=true) o
                 where o.sid = s.sid) as ops,
               (select count(*) from read_parquet('{ds}/ops/**/*.parquet', hive_partitioning=true) o
                 where o.sid = s.sid and o.op = 'MUL_MAT') as matmuls
        from read_parquet('{ds}/steps/**/*.parquet', hive_partitioning=true) s
        group by s.sid, s.model, s.date order by s.sid
        """).fetchall()
    assert len(rows) == 2
    for sid, model, date, steps, ops, mm in rows:
        name, want_steps, want_ops, want_mm, want_date = expected[sid]
        assert model == name.replace(" ", "_")
        assert (steps, ops, mm) == (want_steps, want_ops, want_mm)
        assert str(date) == want_date


def test_dataset_needs_exactly_one_destination(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["export", str(LOGS[0])])
    assert r.exit_code == 2 and "exactly one of -o/--output and --dataset" in r.output
    r = CliRunner().invoke(
        main, ["export", str(LOGS[0]), "--dataset", str(tmp_path / "d"), "--format", "csv"]
    )
    assert r.exit_code == 2 and "--dataset is Parquet only" in r.output
