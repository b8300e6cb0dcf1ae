"""Memory shown (issue 34): the summary's Memory section, compare's footprint, load_session's
allocations and memory frames, and the trace's counters, each against the raw records."""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from helpers import support
from helpers.support import by_type, read_log, resolved, trace_slices
from test_memory import run_alone

from llamacpp_instr.converters import load_session

pytestmark = pytest.mark.native


@pytest.fixture(scope="module")
def runs(instr_api: Any, tiny_llama_f32: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("memrep")
    return {
        n_ctx: run_alone(
            tiny_llama_f32, d / f"ctx{n_ctx}.log", "detailed", n_predict=5, n_ctx=n_ctx
        )
        for n_ctx in (256, 512)
    }


def raw_live_at(records: list[dict[str, Any]], ts: int) -> dict[tuple[int, str], int]:
    """Bytes per device and purpose live at ``ts``, from the raw records alone."""
    made: dict[int, dict[str, Any]] = {}
    freed: dict[int, int] = {}
    for r in records:
        if r["type"] == "memory_alloc":
            made.setdefault(r["id"], r)
        elif r["type"] == "memory_free":
            freed[r["id"]] = r["ts"]
    out: dict[tuple[int, str], int] = defaultdict(int)
    for i, r in made.items():
        if r["ts"] <= ts and freed.get(i, ts + 1) > ts:
            out[(r["device"], r["purpose"])] += r["bytes"]
    return out


def instr(*args: str) -> subprocess.CompletedProcess[str]:
    """``support.instr``, which must succeed."""
    r = support.instr(*args, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def test_summary_memory_section_matches_the_records(runs: dict) -> None:
    log = runs[256].log_path
    records = read_log(log)
    first_step = min(r["t_start"] for r in by_type(records, "step_end"))
    expected = raw_live_at(records, first_step)
    assert expected, "no buffers in the log"
    data = json.loads(instr("summary", str(log), "--format", "json").stdout)
    rows = {(r["device"], r["purpose"]): r for r in data["memory"]}
    names = {d["index"]: d["name"] for d in records[0]["machine"]["devices"]}
    assert len(rows) == len(expected)
    for (device, purpose), size in expected.items():
        row = rows[(names[device], purpose)]
        assert row["at_start"] == size
        assert row["peak"] >= size
    kv = data["kv_cache"]
    assert len(kv) == 1
    decoded = sum(r["n_tokens"] for r in by_type(records, "step_end"))
    assert kv[0]["peak_used"] == decoded and kv[0]["cells"] == 256
    assert 0 < data["rss_peak"]["rss_file"] < data["rss_peak"]["rss"]
    text = instr("summary", str(log)).stdout
    assert "Memory per device and purpose" in text and "KV cache cells" in text


def test_compare_reads_the_footprint_off_one_table(runs: dict) -> None:
    out = instr("compare", str(runs[256].log_path), str(runs[512].log_path), "--format", "json")
    rows = {(r["device"], r["purpose"]): r for r in json.loads(out.stdout)["footprint"]}
    assert rows[("CPU", "kv_cache")]["ratio"] == pytest.approx(2.0)  # twice the cells
    assert rows[("CPU", "weights")]["ratio"] == 1.0  # the same model
    for dev in {d for d, _ in rows}:
        parts = [r["a"] for (d, p), r in rows.items() if d == dev and p != "total"]
        assert rows[(dev, "total")]["a"] == sum(parts)


def test_load_session_has_allocations_and_memory_frames(runs: dict) -> None:
    log = runs[256].log_path
    records = read_log(log)
    f = load_session(log)
    ids = {r["id"] for r in by_type(records, "memory_alloc")}
    assert set(f.allocations["id"]) == ids
    freed = {r["id"] for r in by_type(records, "memory_free")}
    assert set(f.allocations.loc[f.allocations["freed"].notna(), "id"]) == freed
    ends = by_type(records, "step_end")
    assert len(f.memory) == len(ends) > 0
    assert list(f.memory["rss"]) == [e["memory"]["rss"] for e in ends]
    cache = ends[0]["memory"]["kv"][0][0]  # the process's serial for the context's cache
    assert list(f.memory[f"kv{cache}_used"]) == [e["memory"]["kv"][0][1] for e in ends]
    assert "allocations" in f.tables() and "memory" in f.tables()


def test_trace_counts_bytes_per_device_and_purpose(runs: dict, tmp_path: Path) -> None:
    log = runs[256].log_path
    records = read_log(log)
    out = tmp_path / "t.pftrace"
    instr("to-perfetto", str(log), "-o", str(out))
    data = out.read_bytes()
    slices, tracks = trace_slices(data)
    names = {d["index"]: d["name"] for d in records[0]["machine"]["devices"]}
    last: dict[str, float] = {}
    for r in resolved(data):
        if r[0] == "event" and r[7] is not None:
            last[tracks[r[1]]["name"]] = r[7]
    end_ts = max(r["ts"] for r in records)
    expected = raw_live_at(records, end_ts)
    assert expected
    for (device, purpose), size in expected.items():
        assert last[f"memory {names[device]}: {purpose}"] == float(size)
    instants = [s for s in slices if s["track"] == "memory: buffers"]
    made = len({r["id"] for r in by_type(records, "memory_alloc")})
    assert len(instants) == made + len(by_type(records, "memory_free"))
    assert all(s["dur"] == 0 for s in instants)
