"""`instr to-perfetto`: the trace obeys Perfetto's import invariants and says what the log says."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import (
    FIXTURES,
    FUZZ_DERANDOMIZE,
    FUZZ_EXAMPLES,
    JSON,
    REAL_FIXTURES,
    plain_copy,
    read_log,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from llamacpp_instr.cli import main
from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.formats import convert as trace


def convert(log: Path, *args: str) -> tuple[Any, Path]:
    out = log.with_name(log.name + ".pftrace")
    r = CliRunner().invoke(main, ["to-perfetto", str(log), "-o", str(out), *args])
    return r, out


def check_trace(path: Path) -> dict[str, Any]:
    """Parse a trace and check what trace processor enforces on import; return per-track slices."""
    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    tracks: dict[int, pb.TrackDescriptor] = {}
    names: dict[int, str] = {}
    arg_names: dict[int, str] = {}
    stacks: dict[int, list[tuple[str, int, dict[str, Any]]]] = defaultdict(list)
    last_ts: dict[int, int] = defaultdict(int)
    slices: list[dict[str, Any]] = []
    counters: dict[str, list[float]] = defaultdict(list)
    assert trace.packet[0].sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    for p in trace.packet:
        assert p.trusted_packet_sequence_id == trace.packet[0].trusted_packet_sequence_id
        for e in p.interned_data.event_names:
            assert e.iid not in names
            names[e.iid] = e.name
        for e in p.interned_data.debug_annotation_names:
            assert e.iid not in arg_names
            arg_names[e.iid] = e.name
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            assert d.uuid not in tracks, "duplicate track uuid"
            if d.HasField("parent_uuid"):
                assert d.parent_uuid in tracks, "parent must be described first"
            tracks[d.uuid] = d
            continue
        assert p.HasField("track_event")
        assert p.HasField("timestamp")
        e = p.track_event
        assert e.track_uuid in tracks
        is_counter_track = tracks[e.track_uuid].HasField("counter")
        assert p.timestamp >= last_ts[e.track_uuid], "events on a track go forward in time"
        last_ts[e.track_uuid] = p.timestamp
        if e.type == pb.TrackEvent.TYPE_COUNTER:
            assert is_counter_track
            counters[tracks[e.track_uuid].name].append(e.double_counter_value)
        elif e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            assert not is_counter_track
            assert e.name_iid in names, "interned name used before its definition"
            args = {}
            for a in e.debug_annotations:
                assert a.name_iid in arg_names
                args[arg_names[a.name_iid]] = getattr(a, a.WhichOneof("value"))
            stacks[e.track_uuid].append((names[e.name_iid], p.timestamp, args))
        elif e.type == pb.TrackEvent.TYPE_SLICE_END:
            assert stacks[e.track_uuid], "END without BEGIN"
            name, ts, args = stacks[e.track_uuid].pop()
            slices.append(
                {
                    "track": tracks[e.track_uuid].name,
                    "name": name,
                    "ts": ts,
                    "dur": p.timestamp - ts,
                    "depth": len(stacks[e.track_uuid]),
                    "args": args,
                    "cat": list(e.categories),
                }
            )
        else:
            raise AssertionError(f"unexpected event type {e.type}")
    assert all(not s for s in stacks.values()), "unclosed slices"
    processes = [d for d in tracks.values() if d.HasField("process")]
    return {"slices": slices, "counters": counters, "processes": processes, "tracks": tracks}


def op_slices(res: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in res["slices"] if "op" in s["args"] and "node_index" in s["args"]]


@pytest.fixture(params=REAL_FIXTURES, ids=lambda p: p.name)
def fixture_log(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return plain_copy(request.param, tmp_path)


@pytest.mark.fast
def test_fixtures_exist() -> None:
    assert len(REAL_FIXTURES) >= 4


@pytest.mark.fast
def test_trace_invariants_and_content(fixture_log: Path) -> None:
    r, out = convert(fixture_log)
    assert r.exit_code == 0, r.output
    res = check_trace(out)
    recs = read_log(fixture_log)
    computes = [c for c in recs if c["type"] == "compute"]
    n_layer = recs[0]["model"]["n_layer"]
    ops = op_slices(res)
    # one op slice per timed op, with the log's durations
    assert len(ops) == sum(len(c.get("ops", [])) for c in computes)
    assert sorted(s["dur"] for s in ops) == sorted(o[2] for c in computes for o in c.get("ops", []))
    layers = [s for s in res["slices"] if s["name"].startswith("layer ")]
    assert len(layers) == sum(len(c["layers"]) for c in computes) >= n_layer * len(computes)
    assert sorted(s["dur"] for s in layers) == sorted(
        lay[2] for c in computes for lay in c["layers"]
    )
    steps = [s for s in res["slices"] if s["depth"] == 0 and s["track"].startswith("decode steps")]
    # an encoder's encodes (an image's, a sound's) on its own track
    encodes = {r["step"] for r in recs if r["type"] == "step_begin" and r["kind"] == "encode"}
    ends = [e for e in recs if e["type"] == "step_end" and e["step"] not in encodes]
    # a step's slice spans what it waited for: on several devices, an RPC server may still
    # compute, and the step's commands still run, after llama_decode returned
    devices = len((recs[0].get("machine") or {}).get("devices", []))
    last = {(e["ctx"], e["step"]): e["t_start"] + e["dur"] for e in ends}
    if devices > 1:
        for c in computes:
            key = (c["ctx"], c["step"])
            last[key] = max(last[key], c["t_start"] + c["dur"])
        for t in recs:
            if t["type"] == "transfers" and t["phase"] == "step":
                key = (t["ctx"], t["step"])
                last[key] = max([last[key]] + [t["t_start"] + r[9] for r in t["rows"]])
    assert sorted(s["dur"] for s in steps) == sorted(
        last[(e["ctx"], e["step"])] - e["t_start"] for e in ends
    )
    assert len(res["processes"]) == 1
    labels = list(res["processes"][0].process.process_labels)
    assert f"session {recs[0]['sid']}" in labels and f"level {recs[0]['level']}" in labels
    assert res["counters"]["KV cache cells"] == [float(e["kv_used"]) for e in ends]
    assert res["counters"]["memory: weights"] == [float(recs[0]["memory"]["weights"])]
    assert "wrote " in r.output and f"{len(ops)} ops" in r.output


@pytest.mark.fast
def test_op_args_carry_tensor_metadata(tmp_path: Path) -> None:
    log = plain_copy(FIXTURES / "tiny-llama-detailed.log.gz", tmp_path)
    res = check_trace(convert(log)[1])
    recs = read_log(log)
    nodes = {g["graph"]: g["nodes"] for g in recs if g["type"] == "graph"}
    mm = [s for s in op_slices(res) if s["args"]["op"] == "MUL_MAT" and "weight" in s["args"]]
    assert mm
    for s in mm:
        a = s["args"]
        assert a["weight"].startswith(f"blk.{a['layer']}.") or a["weight"] == "output.weight"
        assert a["weight_type"] == "f32"
        # FLOPs = 2*K*prod(out shape), K = the weight's inner dimension, computed by hand here
        node = nodes[a["graph"]][a["node_index"]]
        assert node["name"] == a["node"]
        w = next(src for src in node["src"] if src.get("kind") == "weight")
        prod = 1
        for d in node["shape"]:
            prod *= d
        assert a["est_flops"] == 2 * w["shape"][0] * prod
        assert a["gflop_per_s"] == pytest.approx(a["est_flops"] / s["dur"], rel=1e-3, abs=1e-3)


@pytest.mark.fast
def test_verbose_has_thread_tracks(tmp_path: Path) -> None:
    log = plain_copy(FIXTURES / "tiny-llama-verbose.log.gz", tmp_path)
    res = check_trace(convert(log)[1])
    threads = [s for s in res["slices"] if s["track"].startswith("thread ")]
    busy = [d for c in read_log(log) if c["type"] == "compute" for row in c["threads"] for d in row]
    assert sorted(s["args"]["busy_ns"] for s in threads) == sorted(d for d in busy if d > 0)
    assert any("out_mean" in s["args"] for s in op_slices(res))


@pytest.mark.fast
def test_json_format_same_content(fixture_log: Path) -> None:
    out = fixture_log.with_suffix(".json")
    r = CliRunner().invoke(
        main, ["to-perfetto", str(fixture_log), "--format", "json", "-o", str(out)]
    )
    assert r.exit_code == 0, r.output
    events = json.loads(out.read_text())
    pf = check_trace(convert(fixture_log)[1])
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == len(pf["slices"])
    assert Counter(e["name"] for e in xs) == Counter(s["name"] for s in pf["slices"])


@pytest.mark.fast
def test_selection(tmp_path: Path) -> None:
    log = plain_copy(FIXTURES / "tiny-llama-detailed.log.gz", tmp_path)
    res = check_trace(convert(log, "--layer", "1")[1])
    assert {s["args"]["layer"] for s in op_slices(res)} == {1}
    assert {s["name"] for s in res["slices"] if s["name"].startswith("layer")} == {"layer 1"}
    res = check_trace(convert(log, "--steps", "1:3")[1])
    assert sorted(
        s["args"]["step"] for s in res["slices"] if s["depth"] == 0 and "kind" in s["args"]
    ) == [1, 2]
    res = check_trace(convert(log, "--no-ops")[1])
    assert not op_slices(res) and any(s["name"].startswith("layer") for s in res["slices"])
    r, _ = convert(log, "--steps", "5:2")
    assert r.exit_code == 2 and r.output.startswith("error: ")


@pytest.mark.fast
@pytest.mark.parametrize(
    "name, fmt, expected",
    [
        ("session.log", "pftrace", "session.pftrace"),
        ("session.log", "json", "session.json"),
        ("x.log.gz", "pftrace", "x.pftrace"),
        ("x.log.gz", "json", "x.json"),
        ("run.2024.log", "pftrace", "run.2024.pftrace"),
        ("session", "pftrace", "session.pftrace"),
    ],
)
def test_default_output_replaces_the_extension(
    name: str, fmt: str, expected: str, tmp_path: Path
) -> None:
    """As the README promises: `instr to-perfetto session.log` writes session.pftrace (and
    session.json with --format json); a .gz goes first, so x.log.gz gives x.pftrace."""
    src = FIXTURES / "tiny-llama-detailed.log.gz"
    log = tmp_path / name
    if name.endswith(".gz"):
        log.write_bytes(src.read_bytes())
    else:
        log.write_text("".join(json.dumps(rec) + "\n" for rec in read_log(src)))
    r = CliRunner().invoke(main, ["to-perfetto", str(log), "--format", fmt])
    assert r.exit_code == 0, r.output
    out = tmp_path / expected
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == sorted([name, expected])
    assert f"wrote {out} " in r.output
    n_steps = sum(1 for rec in read_log(log) if rec["type"] == "step_end")
    if fmt == "json":
        events = json.loads(out.read_text())
        assert sum(1 for e in events if e["ph"] == "X" and e.get("cat") == "step") == n_steps
    else:
        res = check_trace(out)
        assert sum(1 for s in res["slices"] if s["depth"] == 0 and "kind" in s["args"]) == n_steps


@pytest.mark.fast
def test_several_sessions_become_several_processes(tmp_path: Path) -> None:
    a = plain_copy(FIXTURES / "tiny-llama-detailed.log.gz", tmp_path)
    b = plain_copy(FIXTURES / "tiny-qwen2-detailed-ubatch.log.gz", tmp_path)
    both = tmp_path / "both.log"
    both.write_bytes(a.read_bytes() + b.read_bytes())
    res = check_trace(convert(both)[1])
    assert len(res["processes"]) == 2


@pytest.mark.fast
def test_gz_converts_like_plain(tmp_path: Path) -> None:
    gz = FIXTURES / "tiny-llama-detailed.log.gz"
    plain = plain_copy(gz, tmp_path)
    copy = tmp_path / "g.log.gz"
    copy.write_bytes(gz.read_bytes())
    _, out_gz = convert(copy)
    _, out_plain = convert(plain)
    assert out_gz.read_bytes() == out_plain.read_bytes()  # deterministic, whatever the encoding


# ------------------------------------------------------------------ damaged and hostile input


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines(keepends=True)


@pytest.mark.fast
def test_damaged_log_converts_what_it_can(tmp_path: Path) -> None:
    log = plain_copy(FIXTURES / "tiny-llama-detailed.log.gz", tmp_path)
    lines = _lines(log)
    damaged = (
        lines[:3] + ["{not json\n", '{"type":"from_the_future","ts":1,"sid":"x"}\n'] + lines[3:-1]
    )
    damaged[-1] = damaged[-1][: len(damaged[-1]) // 2]  # truncated last line, no session_end
    bad = tmp_path / "bad.log"
    bad.write_text("".join(damaged))
    r, out = convert(bad)
    assert r.exit_code == 0, r.output
    assert "skipped 3 of" in r.output and "4 (invalid JSON)" in r.output
    assert (
        "5 (unknown record type 'from_the_future')" in r.output
        and "(truncated last line)" in r.output
    )
    # counted here from the lines that survive: the last step ended only if its step_end did
    survivors = []
    for line in damaged:
        try:
            survivors.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    last_step = [r["step"] for r in survivors if r["type"] == "step_begin"][-1]
    last_ended = any(r["type"] == "step_end" and r["step"] == last_step for r in survivors)
    assert last_ended is False  # its step_end is the line cut in half
    res = check_trace(out)
    steps = [s for s in res["slices"] if s["depth"] == 0 and "kind" in s["args"]]
    assert steps[-1]["args"]["step"] == last_step
    assert steps[-1]["args"]["ended"] is last_ended
    assert all(s["args"]["ended"] is True for s in steps[:-1])
    r, _ = convert(bad, "--strict")
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "line 4: invalid JSON" in r.output


@pytest.mark.fast
def test_missing_session_end_closes_open_steps(tmp_path: Path) -> None:
    log = plain_copy(FIXTURES / "tiny-llama-detailed.log.gz", tmp_path)
    recs = read_log(log)
    cut = max(i for i, r in enumerate(recs) if r["type"] == "step_end")
    kept = recs[:cut]  # the last step began (and computed) but never ended, and no session_end
    cutlog = tmp_path / "cut.log"
    cutlog.write_text("".join(json.dumps(r) + "\n" for r in kept))
    res = check_trace(convert(cutlog)[1])
    steps = [s for s in res["slices"] if s["depth"] == 0 and "kind" in s["args"]]
    assert steps[-1]["args"]["ended"] is False and steps[-1]["args"]["status"] == "not ended"
    assert all(s["args"]["ended"] for s in steps[:-1])


@pytest.mark.fast
@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty log"),
        (bytes(range(256)) * 64, "no session records"),
        (b"\x1f\x8b\x08\x00garbage", "cannot read log"),
        (b'{"a": 1}\n[1,2]\n', "no session records"),
    ],
)
def test_hostile_input_is_one_line_error(content: bytes, message: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.log"
    bad.write_bytes(content)
    r, _ = convert(bad)
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: ") and message in r.output and r.output.count("\n") == 1


@pytest.mark.fast
def test_missing_log_file(tmp_path: Path) -> None:
    r, _ = convert(tmp_path / "nope.log")
    assert r.exit_code == 2 and "log file not found" in r.output


FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=FUZZ_DERANDOMIZE,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _fixture_lines(name: str) -> list[str]:
    with gzip.open(FIXTURES / name, "rt", encoding="utf-8") as f:
        return f.readlines()


_SMALL = _fixture_lines("tiny-llama-minimal.log.gz")


def convert_both(log: Path, tmp_path: Path) -> None:
    """The production conversion (``instr to-perfetto``'s reader, layout and writers) to both
    formats: a one-line error or a complete trace, never a crash or a half-written file."""
    for fmt in trace.WRITERS:
        out = tmp_path / f"fuzz.{fmt}"
        out.unlink(missing_ok=True)
        try:
            trace.convert(log, out, fmt)
        except UserError:
            assert not out.exists()
        else:
            assert out.is_file()  # (empty when nothing in the log could be placed)
        assert not out.with_name(out.name + ".partial").exists()


@pytest.mark.fast
@FUZZ
@given(
    mutations=st.lists(
        st.tuples(st.integers(0, len(_SMALL) - 1), st.integers(0, 2000), st.binary(max_size=8)),
        max_size=6,
    ),
    drop=st.booleans(),
)
def test_fuzz_mutated_logs_never_crash(
    mutations: list[tuple[int, int, bytes]], drop: bool, tmp_path: Path
) -> None:
    lines = [ln.encode() for ln in _SMALL]
    for i, pos, junk in mutations:
        ln = lines[i]
        pos = min(pos, len(ln))
        lines[i] = ln[:pos] + junk + ln[pos + len(junk) :]
    if drop and len(lines) > 2:
        del lines[len(lines) // 2]
    data = b"".join(lines)
    log = tmp_path / "fuzz.log"
    log.write_bytes(data)
    convert_both(log, tmp_path)


_VERBOSE = [json.loads(ln) for ln in _fixture_lines("tiny-llama-verbose.log.gz")]


@pytest.mark.fast
@FUZZ
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(_VERBOSE) - 1), st.text(max_size=12), JSON),
        min_size=1,
        max_size=4,
    ),
    pick_existing=st.booleans(),
)
def test_fuzz_wrong_values_never_crash(
    edits: list[tuple[int, str, Any]], pick_existing: bool, tmp_path: Path
) -> None:
    """Records that parse but carry wrong types or values: skipped or converted, never a crash."""
    recs = [dict(r) for r in _VERBOSE]
    for i, key, value in edits:
        if pick_existing and recs[i]:
            key = sorted(recs[i])[len(key) % len(recs[i])]
        recs[i][key] = value
    log = tmp_path / "fuzz2.log"
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    convert_both(log, tmp_path)


def test_real_smollm2_detailed_log(smollm2_detailed: Any, tmp_path: Path) -> None:
    """The acceptance check of issue 4: a real DETAILED SmolLM2 log, validated and counted."""
    log = tmp_path / "smollm2.log"
    log.write_bytes(smollm2_detailed.path.read_bytes())
    r, out = convert(log)
    assert r.exit_code == 0, r.output
    res = check_trace(out)
    computes = smollm2_detailed.of("compute")
    assert len(op_slices(res)) == sum(len(c["ops"]) for c in computes)
    layers = [s for s in res["slices"] if s["name"].startswith("layer ")]
    assert len(layers) == 30 * len(computes)
    steps = [s for s in res["slices"] if s["depth"] == 0 and "kind" in s["args"]]
    assert [s["args"]["kind"] for s in steps] == ["prompt"] + ["gen"] * 15
    texts = "".join(s["args"].get("text", "") for s in steps[1:])
    assert texts == "".join(p for b in smollm2_detailed.of("step_begin")[1:] for p in b["pieces"])
