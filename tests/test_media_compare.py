"""``instr compare`` of two runs with images or sounds: their encoders side by side (encode time,
per op type, per part of the encoder, tokens per medium), every figure from the records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import FIXTURES, read_log

from llamacpp_instr.cli import main

pytestmark = pytest.mark.fast

IMAGES = FIXTURES / "tiny-llama-gemma3-images-detailed.log.gz"
AUDIO = FIXTURES / "seeds" / "tiny-llama-qwen2a-audio-detailed.log.gz"
PLAIN = FIXTURES / "tiny-llama-detailed.log.gz"


def _compare(a: Path, b: Path, *args: str) -> Any:
    r = CliRunner().invoke(main, ["compare", str(a), str(b), *args])
    assert r.exit_code == 0, r.output
    return r.stdout


def _raw(log: Path) -> dict[str, Any]:
    """A run's encodes from its records: each one's time, first, embeddings, its ops (label,
    part, dur), and its media."""
    recs = read_log(log)
    ctx = next(r for r in recs if r["type"] == "context")
    n_layer = ctx["model"]["n_layer"]
    graphs = {r["graph"]: r["nodes"] for r in recs if r["type"] == "graph"}
    begins = {r["step"]: r for r in recs if r["type"] == "step_begin" and r["kind"] == "encode"}
    out = []
    for e in (r for r in recs if r["type"] == "step_end" and r["step"] in begins):
        ops = []
        for c in (c for c in recs if c["type"] == "compute" and c["step"] == e["step"]):
            for o in c["ops"]:
                n = graphs[c["graph"]][o[0]]
                layer = n["layer"]
                part = (
                    "embedding"
                    if layer is None
                    else "projector" if layer == n_layer else f"block {layer}"
                )
                label = f"{n['op']}:{n['sub']}" if n.get("sub") else n["op"]
                ops.append((label, part, o[2]))
        out.append(
            {"dur": e["dur"], "first": begins[e["step"]]["first"], "n": e["n_tokens"], "ops": ops}
        )
    media = [r for r in recs if r["type"] == "media"]
    return {"encodes": out, "media": media, "encoder": ctx["model"]["architecture"]}


def _per_encode(raw: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    encs = raw["encodes"]
    pool = [e for e in encs if not e["first"]] or encs
    by: list[dict[str, float]] = [{}, {}]
    for e in pool:
        for label, part, d in e["ops"]:
            for i, key in enumerate((label, part)):
                by[i][key] = by[i].get(key, 0.0) + d
    ops, parts = ({x: v / len(pool) / 1e6 for x, v in b.items()} for b in by)
    return ops, parts


def test_two_encoders_side_by_side() -> None:
    """A gemma3 projector's two images against a qwen2a projector's sound."""
    c = json.loads(_compare(IMAGES, AUDIO, "--format", "json"))
    enc = c["encoders"]
    ra, rb = _raw(IMAGES), _raw(AUDIO)
    rows = {r["what"]: r for r in enc["rows"]}
    for run, raw in (("a", ra), ("b", rb)):
        encs, media = raw["encodes"], raw["media"]
        pool = [e for e in encs if not e["first"]] or encs
        assert rows["media"][run] == len(media)
        assert rows["encodes"][run] == len(encs)
        assert rows["tokens per medium"][run] == sum(m["tokens"] for m in media) / len(media)
        assert rows["an encode (ms)"][run] == pytest.approx(
            sum(e["dur"] for e in pool) / len(pool) / 1e6
        )
        assert rows["the encoder's first encode (ms)"][run] == pytest.approx(
            sum(e["dur"] for e in encs if e["first"]) / 1e6
        )
        assert enc[run]["encoders"] == [raw["encoder"]]
    for i, key in enumerate(("op", "layer")):
        wa, wb = _per_encode(ra)[i], _per_encode(rb)[i]
        got = {r[key]: r for r in enc[f"per_{key}"]}
        assert set(got) == set(wa) | set(wb)
        for name, r in got.items():
            assert r["a_ms"] == (pytest.approx(wa[name]) if name in wa else None)
            assert r["b_ms"] == (pytest.approx(wb[name]) if name in wb else None)
    parts = [r["layer"] for r in enc["per_layer"]]
    assert parts == ["embedding", "block 0", "block 1", "projector"]
    assert "encoder: A gemma3, B qwen2a" in c["differences"]
    assert "media kinds: A image, B audio" in c["differences"]
    # the decode's per-op table compares the language model's ops only
    assert "IM2COL" not in {r["op"] for r in c["per_op"]}
    text = _compare(IMAGES, AUDIO)
    assert "Encoders" in text and "An encode's time per part of the encoder" in text


def test_a_run_without_encodes_against_one_with() -> None:
    c = json.loads(_compare(PLAIN, IMAGES, "--format", "json"))
    assert c["encoders"]["a"] is None and c["encoders"]["b"]["encodes"] == 2
    assert "encoder: A none, B gemma3" in c["differences"]
    assert "encoders" not in json.loads(_compare(PLAIN, PLAIN, "--format", "json"))
    assert "Encoders" not in _compare(PLAIN, PLAIN)
