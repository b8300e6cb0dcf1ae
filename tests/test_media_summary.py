"""``instr summary`` of a run with images or sounds: each one's time (load, preprocessing, encodes
by op type and by part of the encoder, the prefill of its tokens, its tokens), the first apart;
and no prompt or generation figure that counts an encode. Every figure is checked against the
records read with the json module alone."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import FIXTURES, read_log, write_log

from llamacpp_instr.cli import main

pytestmark = pytest.mark.fast

IMAGES = FIXTURES / "tiny-llama-gemma3-images-detailed.log.gz"
AUDIO = FIXTURES / "seeds" / "tiny-llama-qwen2a-audio-detailed.log.gz"
PLAIN = FIXTURES / "tiny-llama-detailed.log.gz"

Records = list[dict[str, Any]]


def _summary(log: Path, *args: str) -> Any:
    r = CliRunner().invoke(main, ["summary", str(log), *args])
    assert r.exit_code == 0, r.output
    return r.output


def _raw(recs: Records) -> dict[str, Any]:
    """What the records say, step by step: kind, tokens, dur, medium, ops (node, dur), graph."""
    begins = {r["step"]: r for r in recs if r["type"] == "step_begin"}
    steps = {}
    for e in (r for r in recs if r["type"] == "step_end"):
        b = begins[e["step"]]
        computes = [c for c in recs if c["type"] == "compute" and c["step"] == e["step"]]
        steps[e["step"]] = {
            "kind": b["kind"],
            "ctx": b["ctx"],
            "n_tokens": b["n_tokens"],
            "dur": e["dur"],
            "media": b.get("media"),
            "first": b.get("first"),
            "ops": [(c["graph"], o[0], o[2]) for c in computes for o in c.get("ops", [])],
        }
    graphs = {r["graph"]: r["nodes"] for r in recs if r["type"] == "graph"}
    return {"steps": steps, "graphs": graphs}


@pytest.mark.parametrize("log", [IMAGES, AUDIO], ids=lambda p: p.name)
def test_no_prompt_or_generation_figure_counts_an_encode(log: Path) -> None:
    raw = _raw(read_log(log))["steps"]
    decode = {k: s for k, s in raw.items() if s["kind"] != "encode"}
    assert len(decode) < len(raw)
    ov = json.loads(_summary(log, "--format", "json"))["overview"]
    prompt = [s for s in decode.values() if s["kind"] == "prompt"]
    assert ov["steps"] == len(decode)
    assert ov["prompt_tokens"] == sum(s["n_tokens"] for s in prompt)
    want_rate = sum(s["n_tokens"] for s in prompt) / (sum(s["dur"] for s in prompt) / 1e9)
    assert ov["prompt_tok_s"] == pytest.approx(want_rate, rel=1e-9)
    assert ov["decode_ns"] == sum(s["dur"] for s in decode.values())
    op_ns = sum(d for s in decode.values() for _, _, d in s["ops"])
    assert ov["op_ns"] == op_ns
    assert ov["op_time_coverage"] == pytest.approx(op_ns / ov["decode_ns"], rel=1e-9)
    # the time per op type holds the language model's ops: none of the encoder's graphs
    by_op = json.loads(_summary(log, "--format", "json"))["by_op"]
    assert sum(r["count"] for r in by_op) == sum(len(s["ops"]) for s in decode.values())
    assert "IM2COL" not in {r["op"] for r in by_op}


def _part(layer: int | None, n_layer: int) -> str:
    if layer is None:
        return "embedding"
    return "projector" if layer == n_layer else f"block {layer}"


@pytest.mark.parametrize("log", [IMAGES, AUDIO], ids=lambda p: p.name)
def test_each_mediums_time_as_the_records_say(log: Path) -> None:
    recs = read_log(log)
    raw = _raw(recs)
    steps, graphs = raw["steps"], raw["graphs"]
    n_layer = next(r for r in recs if r["type"] == "context")["model"]["n_layer"]
    data = json.loads(_summary(log, "--format", "json"))
    media = [r for r in recs if r["type"] == "media"]
    assert [m["media"] for m in data["media"]] == [r["id"] for r in media]
    for got, rec in zip(data["media"], media, strict=True):
        mine = [s for s in steps.values() if s["kind"] == "encode" and [rec["id"], 0] in s["media"]]
        prefill = [
            s for s in steps.values() if s["kind"] != "encode" and s["media"] == [rec["id"], 0]
        ]
        parts: dict[str, int] = {}
        for s in mine:
            for g, i, d in s["ops"]:
                p = _part(graphs[g][i]["layer"], n_layer)
                parts[p.split()[0]] = parts.get(p.split()[0], 0) + d
        assert got["tokens"] == rec["tokens"] and got["kind"] == rec["kind"]
        assert got["load_ms"] == rec["load"][1] / 1e6
        assert got["preprocess_ms"] == rec["preprocess"][1] / 1e6
        assert got["encodes"] == len(mine) >= 1
        assert got["encode_ms"] == pytest.approx(sum(s["dur"] for s in mine) / 1e6, abs=1e-9)
        assert got["embedding_ms"] == pytest.approx(parts.get("embedding", 0) / 1e6, abs=1e-9)
        assert got["blocks_ms"] == pytest.approx(parts.get("block", 0) / 1e6, abs=1e-9)
        assert got["projector_ms"] == pytest.approx(parts.get("projector", 0) / 1e6, abs=1e-9)
        assert got["prefill_steps"] == len(prefill) >= 1
        assert got["prefill_tokens"] == sum(s["n_tokens"] for s in prefill) == rec["tokens"]
        assert got["prefill_ms"] == pytest.approx(sum(s["dur"] for s in prefill) / 1e6, abs=1e-9)
        assert got["first"] == any(s["first"] for s in mine)


def test_the_first_image_apart_from_the_others() -> None:
    """The encodes by part and by op type: the first image's (its encoder's first encode) in
    one column, the other image's in the next."""
    recs = read_log(IMAGES)
    raw = _raw(recs)
    n_layer = next(r for r in recs if r["type"] == "context")["model"]["n_layer"]
    encodes = [s for s in raw["steps"].values() if s["kind"] == "encode"]
    assert [s["first"] for s in encodes] == [True, False]
    data = json.loads(_summary(IMAGES, "--format", "json"))
    for key, name in (("layer", "layer"), ("op", "op")):
        want: list[dict[str, int]] = [{}, {}]
        for k, s in enumerate(encodes):
            for g, i, d in s["ops"]:
                node = raw["graphs"][g][i]
                what = _part(node["layer"], n_layer) if key == "layer" else node["op"]
                if key == "op" and node.get("sub"):
                    what = f"{node['op']}:{node['sub']}"
                want[k][what] = want[k].get(what, 0) + d
        rows = data[f"encode_by_{key}"]
        assert {r[name]: round(r["first_ms"] * 1e6) for r in rows} == want[0]
        assert {r[name]: round(r["rest_mean_ms"] * 1e6) for r in rows} == want[1]
        assert {r["rest_media"] for r in rows} == {1}
    parts = [r["layer"] for r in data["encode_by_layer"]]
    assert parts == ["embedding", *[f"block {k}" for k in range(n_layer)], "projector"]


def test_every_renderer_shows_each_images_time(tmp_path: Path) -> None:
    for fmt in ("text", "markdown", "html"):
        out = _summary(IMAGES, "--format", fmt)
        assert "Each image&#x27;s time" in out or "Each image's time" in out, fmt
        assert "320x200" in out and "640x488" in out
    csv = _summary(IMAGES, "--format", "csv", "--by", "media").splitlines()
    assert csv[0].startswith("media,kind,size,tokens,load_ms,preprocess_ms")
    assert [line.split(",")[:3] for line in csv[1:]] == [
        ["1", "image", "640x488"],
        ["2", "image", "320x200"],
    ]
    assert "Each sound's time" in _summary(AUDIO)


@pytest.mark.parametrize("log", [IMAGES, AUDIO], ids=lambda p: p.name)
def test_each_mediums_way_drawn_as_its_figures(log: Path) -> None:
    """The HTML's picture: a bar per medium, its encoder's first on top, its parts stacked as
    the json's figures (the encode's ops by part, and the rest of it); the per-medium table of
    the page and the terminal in two, none cut, csv's whole."""
    rows = json.loads(_summary(log, "--format", "json"))["media"]
    rows.sort(key=lambda r: not r["first"])
    html = _summary(log, "--format", "html")
    figure = re.search(r'<figure class="chart" data-chart="media_way".*?</figure>', html, re.S)
    assert figure is not None
    values = [float(v) for v in re.findall(r'class="mark"[^>]*data-value="([^"]+)"', figure[0])]
    parts = ("load_ms", "preprocess_ms", "embedding_ms", "blocks_ms", "projector_ms")
    want = []
    for r in rows:
        ops = r["embedding_ms"] + r["blocks_ms"] + r["projector_ms"]
        want += [*(r[k] or 0 for k in parts), max(r["encode_ms"] - ops, 0), r["prefill_ms"]]
    assert values == pytest.approx(want, abs=1e-6)
    assert ('class="apart"' in figure[0]) == (len(rows) > 1)
    for fmt in ("html", "text"):
        out = _summary(log, "--format", fmt)
        for title in ("its load, preprocessing, encodes and prefill", "what it is, and its"):
            assert out.count(title) == 1, (fmt, title)


def test_a_run_without_media_shows_nothing_new() -> None:
    text = _summary(PLAIN)
    assert "image" not in text and "sound" not in text and "encode" not in text
    data = json.loads(_summary(PLAIN, "--format", "json"))
    assert not {"media", "encode_by_op", "encode_by_layer"} & set(data)
    r = CliRunner().invoke(main, ["summary", str(PLAIN), "--format", "csv", "--by", "media"])
    assert r.exit_code == 2 and "no images or sounds in this log" in r.output


def test_a_tokens_time_names_the_encodes_in_its_gaps(tmp_path: Path) -> None:
    """The encodes between two decode steps are the gap's "encode", not its unrecorded time,
    and no token's time."""
    recs = read_log(IMAGES)
    raw = _raw(recs)["steps"]
    ends = {r["step"]: r for r in recs if r["type"] == "step_end"}
    encodes = [ends[k] for k, s in raw.items() if s["kind"] == "encode"]
    kinds = json.loads(_summary(IMAGES, "--format", "json"))["between_steps"]["kinds"]
    assert sum(k["encode_ms"] for k in kinds) == pytest.approx(
        sum(e["dur"] for e in encodes) / 1e6, abs=1e-9
    )
    for k in kinds:
        parts = ("decode", "sampling", "program", "recording", "unrecorded", "draft")
        total = sum(k[f"{p}_ms"] for p in parts)
        assert k["per_token_ms"] == pytest.approx(total / k["tokens"], rel=1e-9)
    # a log without encodes (here one whose host records came with it: the sound's, its
    # encodes left out) has no encode column
    recs = [r for r in read_log(AUDIO) if r["type"] != "step_begin" or r["kind"] != "encode"]
    plain = json.loads(_summary(write_log(tmp_path / "plain.log", recs), "--format", "json"))
    assert all("encode_ms" not in k for k in plain["between_steps"]["kinds"])
