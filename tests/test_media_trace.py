"""``instr to-perfetto`` of a run with images or sounds: an encoder track per encoder context with
each encode's slice, its computes, layers and ops as a decode step's are drawn; each medium's load
and preprocessing on the media lanes; a flow from each encode through the decode steps that carry
its embeddings. Checked against the records read with the json module alone, on the trace as
Perfetto's protos decode it (``test_perfetto.check_trace``: what trace processor enforces on
import), and the fast writer against the reference writer."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import (
    FIXTURES,
    assert_same_trace,
    fast_trace,
    plain_copy,
    read_log,
    record_edits,
    reference_trace,
    resolved,
    with_edits,
)
from hypothesis import HealthCheck, given, settings
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from test_perfetto import check_trace, convert, op_slices

from llamacpp_instr.cli import main
from llamacpp_instr.contract.errors import UserError

pytestmark = pytest.mark.fast

IMAGES = FIXTURES / "tiny-llama-gemma3-images-detailed.log.gz"
AUDIO = FIXTURES / "seeds" / "tiny-llama-qwen2a-audio-detailed.log.gz"


@pytest.mark.parametrize("log", [IMAGES, AUDIO], ids=lambda p: p.name)
def test_the_encoder_track_draws_each_encode(log: Path, tmp_path: Path) -> None:
    recs = read_log(log)
    plain = plain_copy(log, tmp_path)
    r, out = convert(plain)
    assert r.exit_code == 0, r.output
    res = check_trace(out)
    ctx = next(x for x in recs if x["type"] == "context")
    noun = "sound" if ctx["encoder"]["modality"] == "audio" else "image"
    name = f"{noun} encoder {ctx['model']['architecture']} (ctx {ctx['ctx']})"
    on = [s for s in res["slices"] if s["track"] == name]
    begins = {x["step"]: x for x in recs if x["type"] == "step_begin" and x["kind"] == "encode"}
    ends = {x["step"]: x for x in recs if x["type"] == "step_end" and x["step"] in begins}
    encodes = [s for s in on if s["depth"] == 0]
    assert [s["args"]["step"] for s in encodes] == sorted(begins)
    for s in encodes:
        b, e = begins[s["args"]["step"]], ends[s["args"]["step"]]
        assert (s["ts"], s["dur"]) == (e["t_start"], e["dur"])
        assert s["args"]["first"] == b["first"] and s["args"]["embeddings"] == e["n_tokens"]
        assert s["args"]["media"] == " ".join(f"{m}:{k}" for m, k in b["media"])
        assert s["name"].startswith(f"encode #{b['step']} {noun} {b['media'][0][0]}")
    computes = [c for c in recs if c["type"] == "compute" and c["step"] in begins]
    ops = [s for s in op_slices(res) if s["track"] == name]
    assert sorted(s["dur"] for s in ops) == sorted(o[2] for c in computes for o in c["ops"])
    layers = [s for s in on if s["name"].startswith("layer ")]
    assert sorted((s["name"], s["dur"]) for s in layers) == sorted(
        (f"layer {x[0]}", x[2]) for c in computes for x in c["layers"]
    )
    # no decode figure of an encode: tokens/s counts the decode steps alone
    decodes = [x for x in recs if x["type"] == "step_end" and x["step"] not in begins]
    assert len(res["counters"]["tokens/s"]) == len(decodes)


@pytest.mark.parametrize("log", [IMAGES, AUDIO], ids=lambda p: p.name)
def test_each_mediums_load_and_preprocessing(log: Path, tmp_path: Path) -> None:
    recs = read_log(log)
    r, out = convert(plain_copy(log, tmp_path))
    assert r.exit_code == 0, r.output
    res = check_trace(out)
    lanes = [s for s in res["slices"] if s["track"].startswith("media")]
    media = [x for x in recs if x["type"] == "media"]
    tops = sorted((s for s in lanes if s["depth"] == 0), key=lambda s: s["args"]["media"])
    assert [s["args"]["media"] for s in tops] == [m["id"] for m in media]
    for s, m in zip(tops, media, strict=True):
        assert s["args"]["hash"] == m["hash"] and s["args"]["tokens"] == m["tokens"]
        t1 = max(m["load"][0] + m["load"][1], m["preprocess"][0] + m["preprocess"][1])
        assert (s["ts"], s["dur"]) == (m["load"][0], t1 - m["load"][0])
        inner = [x for x in lanes if x["depth"] == 1 and s["ts"] <= x["ts"] < s["ts"] + s["dur"]]
        inner = [x for x in inner if x["track"] == s["track"]]
        assert sorted((x["name"], x["ts"], x["dur"]) for x in inner) == sorted(
            [("load", *m["load"]), ("preprocess", *m["preprocess"])]
        )


def test_a_flow_from_each_encode_to_the_steps_of_its_embeddings() -> None:
    """Each encode's slice starts a flow that the decode steps carrying its medium slice carry on
    (``flow_ids``: Perfetto chains them in time order), one flow per medium slice."""
    recs = read_log(IMAGES)
    assert_same_trace(IMAGES)  # (the fast writer's trace is the reference's)
    events = [e for e in resolved(fast_trace(IMAGES)[0]) if e[0] == "event"]
    begins = [e for e in events if e[2] == pb.TrackEvent.TYPE_SLICE_BEGIN and e[5] == ("step",)]
    by_step = {dict(e[6])["step"][1]: e for e in begins}
    flows: dict[int, list[int]] = {}
    for b in (x for x in recs if x["type"] == "step_begin" and "media" in x):
        e = by_step[b["step"]]
        assert not e[9], "no flow is terminated: a medium's embeddings may take several steps"
        pairs = b["media"] if b["kind"] == "encode" else [b["media"]]
        assert len(e[8]) == len(pairs)
        for f in e[8]:
            flows.setdefault(f, []).append(b["step"])
    media = {m["id"] for m in recs if m["type"] == "media"}
    assert len(flows) == len(media)  # (a slice each here)
    for steps in flows.values():
        kinds = [next(x["kind"] for x in recs if x.get("step") == s) for s in steps]
        assert kinds == ["encode", "prompt"]


def test_the_chrome_json_flows_go_through_the_steps(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    r = CliRunner().invoke(main, ["to-perfetto", str(IMAGES), "--format", "json", "-o", str(out)])
    assert r.exit_code == 0, r.output
    flows = [e for e in json.loads(out.read_text()) if e.get("cat") == "media_flow"]
    by_id: dict[Any, list[str]] = {}
    for e in sorted(flows, key=lambda e: e["ts"]):
        by_id.setdefault(e["id"], []).append(e["ph"])
    assert sorted(by_id.values()) == [["s", "t"], ["s", "t"]]


_RECS = read_log(IMAGES)


@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "40")),
    deadline=None,
    derandomize="FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(edits=record_edits(_RECS))
def test_fuzz_the_same_trace_from_both_writers(
    edits: list[tuple[int, str, Any]], tmp_path: Path
) -> None:
    """The images log with wrong types or values in any record (its media records, encodes and
    encoder context among them): the same trace, or the same failure, from both writers."""
    recs = with_edits(_RECS, edits)
    log = tmp_path / "fuzz.log"
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    try:
        want: Any = resolved(reference_trace(log))
    except (ValueError, OverflowError, UserError) as exc:
        want = type(exc)
    try:
        got: Any = resolved(fast_trace(log, compress=False, flush_rows=1)[0])
    except (ValueError, OverflowError, UserError) as exc:
        got = type(exc)
    assert got == want
