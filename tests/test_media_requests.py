"""``instr requests`` of a request with images: its images' encodes named beside its text's and
its images' prefill as the parts of its first token's time.

The log is the images fixture (a real llama-mtmd-cli run: two images through a gemma3 projector)
made a server's: a ``request`` record around its steps, as llama-server writes one, and its
encodes naming the request and the slot's sequence they serve, as llama-server's do (llama-server
with a projector does not run under a session yet: its request record reads the prompt's tokens,
which an image's prompt does not give). Every figure is checked against the records."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import FIXTURES, read_log, write_log

from llamacpp_instr.cli import main

pytestmark = pytest.mark.fast

IMAGES = FIXTURES / "tiny-llama-gemma3-images-detailed.log.gz"
MS = 1_000_000

Records = list[dict[str, Any]]


def served(recs: Records, *, request: bool = True, target: bool = True) -> Records:
    """The fixture as one request of slot 0 served: its record from the first prompt after the
    warm-up to the last step; its encodes naming it (``request``) and slot 0 (``target``)."""
    recs = copy.deepcopy(recs)
    begins = {r["step"]: r for r in recs if r["type"] == "step_begin"}
    ends = {r["step"]: r for r in recs if r["type"] == "step_end"}
    decode = [s for s in sorted(ends) if begins[s]["kind"] != "encode" and s > 0]
    prompt = [s for s in decode if begins[s]["kind"] == "prompt"]
    first = ends[decode[0]]["t_start"]
    last_prompt = ends[prompt[-1]]["t_start"] + ends[prompt[-1]]["dur"]
    last = ends[decode[-1]]["t_start"] + ends[decode[-1]]["dur"]
    t_arrive = first - MS
    for b in begins.values():
        if b["kind"] == "encode":
            if request:
                b["request"] = "task-0"
            if target:
                b["target"] = [b["ctx"] - 1, 0]
    end = recs.pop()
    recs.append(
        {"type": "request", "ts": last + MS, "sid": end["sid"], "id": "task-0"}
        | {"endpoint": "/completion", "method": "POST", "status": 200, "outcome": "ok"}
        | {"stream": False, "t_arrive": t_arrive, "wait": MS, "ttft": last_prompt - t_arrive}
        | {"model": last - first, "dur": last - t_arrive + MS, "slot": 0}
        | {"prompt_tokens": sum(begins[s]["n_tokens"] for s in prompt)}
        | {"gen_tokens": len(decode) - len(prompt)}
    )
    return [*recs, end]


def _requests(log: Path, *args: str) -> Any:
    r = CliRunner().invoke(main, ["requests", str(log), *args])
    assert r.exit_code == 0, r.output
    return r.output


def _want(recs: Records) -> dict[str, Any]:
    """The request's media figures from the records alone."""
    begins = {r["step"]: r for r in recs if r["type"] == "step_begin"}
    ends = {r["step"]: r for r in recs if r["type"] == "step_end"}
    req = next(r for r in recs if r["type"] == "request")
    t0, t1 = req["t_arrive"] + req["wait"], req["t_arrive"] + req["ttft"]
    began = [s for s in ends if t0 <= ends[s]["t_start"] <= t1]
    encodes = [s for s in began if begins[s]["kind"] == "encode"]
    media = [s for s in began if begins[s]["kind"] != "encode" and "media" in begins[s]]
    text = [s for s in began if begins[s]["kind"] != "encode" and "media" not in begins[s]]
    assert len(encodes) == 2 and len(media) == 2 and len(text) == 3
    return {
        "media": sorted({m for s in encodes for m, _ in begins[s]["media"]}),
        "encodes": len(encodes),
        "encode_ms": sum(ends[s]["dur"] for s in encodes) / 1e6,
        "first_encode": any(begins[s]["first"] for s in encodes),
        "media_prefill_ms": sum(ends[s]["dur"] for s in media) / 1e6,
        "text_prefill_ms": sum(ends[s]["dur"] for s in text) / 1e6,
    }


@pytest.mark.parametrize(
    "named", [{}, {"target": False}, {"request": False}], ids=["both", "request", "target"]
)
def test_a_requests_encodes_beside_its_prefill(named: dict[str, bool], tmp_path: Path) -> None:
    """Found by the request they name, or (naming none) by the slot's sequence they serve and
    their time inside its prompt."""
    recs = served(read_log(IMAGES), **named)
    log = write_log(tmp_path / "served.log", recs)
    (row,) = json.loads(_requests(log, "--format", "json"))["requests"]
    want = _want(recs)
    got = row["media"]
    assert {k: got[k] for k in ("media", "encodes", "first_encode")} == {
        k: want[k] for k in ("media", "encodes", "first_encode")
    }
    for k in ("encode_ms", "media_prefill_ms", "text_prefill_ms"):
        assert got[k] == pytest.approx(want[k], abs=1e-9), k


def test_the_slow_first_token_names_its_images_encode(tmp_path: Path) -> None:
    recs = served(read_log(IMAGES))
    log = write_log(tmp_path / "served.log", recs)
    text = _requests(log)
    want = _want(recs)
    begins = [r for r in recs if r["type"] == "step_begin" and r["kind"] == "encode"]
    first = next(r for r in recs if r["type"] == "step_end" and r["step"] == begins[0]["step"])
    line = next(x for x in text.splitlines() if "first token of task-0" in x)
    assert f"encode of its images 1, 2: {want['encode_ms']:,.1f} ms" in line
    assert f"(the encoder's first in the process: {first['dur'] / 1e6:,.1f} ms)" in line
    assert f"prefill of its text: {want['text_prefill_ms']:,.1f} ms in 3 steps" in line
    assert f"prefill of the image tokens: {want['media_prefill_ms']:,.1f} ms in 2 steps" in line
    # the table's columns, in every format that shows it
    assert "encode (ms)" in text and "media prefill (ms)" in text
    csv = _requests(log, "--format", "csv").splitlines()
    head = csv[0].split(",")
    assert float(csv[1].split(",")[head.index("encode_ms")]) == pytest.approx(want["encode_ms"])


def test_another_requests_encodes_are_not_its_own(tmp_path: Path) -> None:
    recs = served(read_log(IMAGES))
    for r in recs:
        if r["type"] == "step_begin" and r["kind"] == "encode":
            r["request"] = "task-9"
    log = write_log(tmp_path / "other.log", recs)
    (row,) = json.loads(_requests(log, "--format", "json"))["requests"]
    assert "media" not in row
    assert "encode (ms)" not in _requests(log)


def test_requests_without_media_show_nothing_new() -> None:
    seed = FIXTURES / "seeds" / "smollm2-spec-minimal.log.gz"
    rows = json.loads(_requests(seed, "--format", "json"))["requests"]
    assert rows and all("media" not in r for r in rows)
    assert "encode (ms)" not in _requests(seed)
