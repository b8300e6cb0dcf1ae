"""llama-server's request records keep what a replay sends again (at detailed, under `instr
exec`): each request's body as the client sent it, its images as their hash and size and never
their bytes, and the tokens its first task sampled; a body past 1 MiB is left out and said so;
`--no-bodies` keeps none. Checked against the bodies sent, the image's own bytes hashed here, and
the tokens the server's response gives (`return_tokens`)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from helpers.support import by_type, data_url, exec_server, post_json, read_log, signal_server

from llamacpp_instr.contract.media_hash import media_hash

pytestmark = pytest.mark.native

COMPLETION = {"prompt": "The capital of France is", "n_predict": 6, "temperature": 0.0}
COMPLETION |= {"return_tokens": True, "cache_prompt": False}


def _chat(url: str) -> dict[str, Any]:
    return {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": "What is it?"},
                ],
            }
        ],
        "max_tokens": 4,
    }


BIG = {"prompt": "Hello", "n_predict": 2, "padding": "x" * (1 << 20)}


@pytest.fixture(scope="module")
def server_args(mm_dir: Path) -> tuple[str, ...]:
    """A small projector (gemma3's, 2 blocks 64 wide, 256-pixel images), so that the server takes
    the image."""
    from helpers.mmproj_gguf import write_vision_mmproj

    mmproj = write_vision_mmproj(mm_dir / "bodies-gemma3.gguf", projector="gemma3")
    return ("--mmproj", str(mmproj), "-c", "1024", "-t", "2")


def _serve(
    log: Path, model: Path, image: Path, args: tuple[str, ...], *instr_args: str
) -> list[dict[str, Any]]:
    proc, port = exec_server(log, model, *args, instr_args=instr_args)
    try:
        answers = [
            post_json(port, "/completion", COMPLETION),
            post_json(port, "/v1/chat/completions", _chat(data_url(image))),
            post_json(port, "/completion", BIG),
        ]
        signal_server(proc)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return answers


def test_a_request_record_keeps_its_body_and_tokens(
    smollm2_path: Path, media: dict[str, Path], server_args: tuple[str, ...], tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    image = media["test-1.jpeg"]
    answers = _serve(log, smollm2_path, image, server_args)
    assert answers[1].get("choices"), answers[1]
    records = sorted(by_type(read_log(log), "request"), key=lambda r: r["t_arrive"])
    assert [r["endpoint"] for r in records] == ["/completion", "/v1/chat/completions"] + [
        "/completion"
    ]
    done, chat, big = records
    # the body as sent, and the tokens the response gives
    assert done["body"] == COMPLETION and done["body_bytes"] == len(json.dumps(COMPLETION))
    assert done["gen_ids"] == answers[0]["tokens"] and len(done["gen_ids"]) == 6
    # the image: its hash and size, its data URL's head; the rest of the body as sent
    part = chat["body"]["messages"][0]["content"][0]
    assert part == {
        "type": "image_url",
        "image_url": {
            "url": {
                "instr_media": {
                    "hash": media_hash(image.read_bytes()),
                    "bytes": image.stat().st_size,
                    "prefix": "data:image/jpeg;base64,",
                }
            }
        },
    }
    assert chat["body"]["messages"][0]["content"][1] == {"type": "text", "text": "What is it?"}
    assert chat["body"]["max_tokens"] == 4 and len(chat["gen_ids"]) == chat["gen_tokens"] + 1
    assert base64.b64encode(image.read_bytes()).decode()[40:80] not in log.read_text()
    # past 1 MiB: no body, and why; its tokens still
    assert "body" not in big and big["body_left_out"] == "size"
    assert big["body_bytes"] > 1 << 20 and len(big["gen_ids"]) == 2


def test_no_bodies_keeps_none(
    smollm2_path: Path, media: dict[str, Path], server_args: tuple[str, ...], tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    _serve(log, smollm2_path, media["test-1.jpeg"], server_args, "--no-bodies")
    records = by_type(read_log(log), "request")
    assert len(records) == 3
    for r in records:
        assert not {"body", "body_left_out", "body_bytes", "gen_ids"} & set(r), r
