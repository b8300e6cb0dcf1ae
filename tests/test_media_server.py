"""llama-server with a projector (--mmproj) under `instr exec`: a chat request with an image is one
request record, its image's encode and its image's and text's prefill named for it, and they
account for the server's own `timings` of it: `prompt_ms` (from the slot's start to its first
token: the encode, the decode of the image's embeddings and of the text) and `predicted_ms` (its
generation). The projector is a random-weight gemma3 (tests/helpers/mmproj_gguf.py), large enough
that the image's encode and prefill are most of the prompt's time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.support import by_type, data_url, exec_server, post_json, read_log, signal_server

pytestmark = pytest.mark.native


def _chat(port: int, image: Path, text: str) -> dict[str, Any]:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url(image)}},
                    {"type": "text", "text": text},
                ],
            }
        ],
        "max_tokens": 16,
        "temperature": 0,
        "cache_prompt": False,
    }
    return dict(post_json(port, "/v1/chat/completions", body, timeout=600))


@pytest.fixture(scope="module")
def image_server(
    tools_bin: Path, smollm2_path: Path, media: dict[str, Path], mm_dir: Path
) -> dict[str, Any]:
    from helpers.mmproj_gguf import write_vision_mmproj

    mmproj = write_vision_mmproj(
        mm_dir / "gemma3-server.gguf", projector="gemma3", image_size=512, n_layer=4, n_embd=192
    )
    log = mm_dir / "server.log"
    proc, port = exec_server(
        log, smollm2_path, "--mmproj", str(mmproj), "--parallel", "1", "-c", "2048", "-t", "2"
    )
    try:
        answers = [_chat(port, media["test-1.jpeg"], f"Describe the picture, {i}.") for i in (1, 2)]
        signal_server(proc)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return {"log": log, "answers": answers, "err": err}


def test_an_image_requests_parts_account_for_the_servers_timings(
    image_server: dict[str, Any],
) -> None:
    """Each request's row in `instr requests --format json`: its encode, its image's prefill and
    its text's prefill sum to the server's prompt_ms within 5 % (what is left is the server's own
    work between them), its generation to predicted_ms within 5 %; and in the raw records, its
    encode names its request and its slot, and the steps that decode the image hold its
    tokens."""
    recs = read_log(image_server["log"])
    requests = sorted(by_type(recs, "request"), key=lambda r: r["t_arrive"])
    assert len(requests) == 2, image_server["err"][-3000:]
    [medium] = [m for m in by_type(recs, "media")][:1]
    begins = {(b["ctx"], b["step"]): b for b in by_type(recs, "step_begin")}
    encodes = [b for b in begins.values() if b["kind"] == "encode"]
    assert [e["request"] for e in encodes] == [r["id"] for r in requests]
    assert all(e["target"][1] == r["slot"] for e, r in zip(encodes, requests, strict=True))
    r = subprocess.run(
        [sys.executable, "-m", "llamacpp_instr.cli", "requests", str(image_server["log"])]
        + ["--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {row["id"]: row for row in json.loads(r.stdout)["requests"]}
    for rec, answer in zip(requests, image_server["answers"], strict=True):
        row, timings = rows[rec["id"]], answer["timings"]
        m = row["media"]
        assert m["encodes"] == 1 and m["media"] == [medium["id"] + requests.index(rec)]
        prompt_ms = m["encode_ms"] + m["media_prefill_ms"] + m["text_prefill_ms"]
        assert abs(prompt_ms - timings["prompt_ms"]) <= 0.05 * timings["prompt_ms"], (
            m,
            timings,
        )
        gen = row["generation_ms"]
        assert abs(gen - timings["predicted_ms"]) <= 0.05 * timings["predicted_ms"], (gen, timings)
        assert answer["usage"]["prompt_tokens"] == timings["prompt_n"]
    steps = [b for b in begins.values() if b["kind"] != "encode" and "media" in b]
    assert sum(b["n_tokens"] for b in steps) == 2 * medium["tokens"]
