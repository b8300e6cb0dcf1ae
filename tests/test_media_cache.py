"""``instr requests`` of a prompt that parted from its slot's cache at an image: the cache's
``diverged`` texts write each image token as ``[media]``, so the images are named from the
records (their ``media`` records' ids and hashes, the steps that decode them).

The fast tests take the images fixture (a real llama-mtmd-cli run: two images through a gemma3
projector) made two requests of one slot, each with its image, as llama-server writes them; the
native test runs llama-server with a projector on one slot, the same text with two images."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import (
    FIXTURES,
    by_type,
    data_url,
    exec_server,
    post_json,
    read_log,
    signal_server,
    write_log,
)

from llamacpp_instr.cli import main
from llamacpp_instr.converters.session.cache_media import Medium, partings

IMAGES = FIXTURES / "tiny-llama-gemma3-images-detailed.log.gz"
MS = 1_000_000
MEDIA = "[media]" * 8

Records = list[dict[str, Any]]


def _request(sid: str, rid: str, t0: int, t_first: int, t_end: int) -> dict[str, Any]:
    return (
        {"type": "request", "ts": t_end + MS, "sid": sid, "id": rid, "endpoint": "/completion"}
        | {"method": "POST", "status": 200, "outcome": "ok", "stream": False, "slot": 0}
        | {"t_arrive": t0 - MS, "wait": MS, "ttft": t_first - t0 + MS, "model": t_end - t0}
        | {"dur": t_end - t0 + 2 * MS}
    )


def two_requests(recs: Records, held: str = MEDIA, prompt: str = MEDIA) -> Records:
    """The fixture as two requests of slot 0: task-0 the text and image 1 (steps 1 to 4),
    task-1 the same text and image 2 (steps 5 on; its positions as if it followed the text it
    reused), whose cache parted from task-0's at the image (``held`` and ``prompt``: the
    ``diverged`` texts)."""
    recs = copy.deepcopy(recs)
    begins = {r["step"]: r for r in recs if r["type"] == "step_begin"}
    ends = {r["step"]: r for r in recs if r["type"] == "step_end"}
    assert [begins[s].get("media") for s in (3, 6)] == [[1, 0], [2, 0]]
    text = begins[3]["pos"][0]  # the text before image 1: what task-1 reuses
    shift = begins[6]["pos"][0] - text
    for s in range(6, max(begins) + 1):
        begins[s]["pos"] = [p - shift for p in begins[s]["pos"]]
    end = recs.pop()
    sid = end["sid"]
    a = _request(sid, "task-0", ends[1]["t_start"], ends[4]["t_start"] + ends[4]["dur"], 0)
    a["model"] = a["dur"] = ends[4]["t_start"] + ends[4]["dur"] - ends[1]["t_start"]
    a |= {"prompt_tokens": begins[4]["pos"][1] + 1, "gen_tokens": 0}
    a["cache"] = {"prompt": a["prompt_tokens"], "enabled": True, "held": 0, "common": 0}
    a["cache"]["reused"] = 0
    last = max(ends)
    b = _request(
        sid,
        "task-1",
        ends[5]["t_start"],
        ends[7]["t_start"] + ends[7]["dur"],
        ends[last]["t_start"] + ends[last]["dur"],
    )
    n = begins[7]["pos"][1] + 1
    b |= {"prompt_tokens": n - text, "gen_tokens": last - 7}
    b["cache"] = {"prompt": n, "enabled": True, "slot_by": "lru", "held": a["prompt_tokens"] + 1}
    b["cache"] |= {"common": text, "reused": text}
    b["cache"]["diverged"] = {"at": text, "before": "user\n", "held": held, "prompt": prompt}
    return [*recs, a, b, end]


def _requests(log: Path, *args: str) -> Any:
    r = CliRunner().invoke(main, ["requests", str(log), *args])
    assert r.exit_code == 0, r.output
    return r.output


def _medium(recs: Records, i: int) -> dict[str, Any]:
    return next(r for r in recs if r["type"] == "media" and r["id"] == i)


def _words(m: dict[str, Any]) -> str:
    return f"image {m['id']} (hash {m['hash']}, {m['bytes']:,} bytes)"


@pytest.mark.fast
def test_a_cache_miss_at_another_image_names_both_images(tmp_path: Path) -> None:
    recs = two_requests(read_log(IMAGES))
    log = write_log(tmp_path / "two.log", recs)
    one, two = _medium(recs, 1), _medium(recs, 2)
    assert one["hash"] != two["hash"]
    text = _requests(log)
    line = next(x for x in text.splitlines() if x.lstrip().startswith("prompt cache: reused 36"))
    assert f"the cache had {_words(one)}, the prompt {_words(two)}: a different image" in line
    assert MEDIA not in line
    rows = {r["id"]: r for r in json.loads(_requests(log, "--format", "json"))["requests"]}
    assert "cache_media" not in rows["task-0"]
    got = rows["task-1"]["cache_media"]
    keys = ("id", "kind", "hash", "bytes")
    assert got == {
        "held": {k: one[k] for k in keys},
        "prompt": {k: two[k] for k in keys},
        "held_by": "task-0",
    }


@pytest.mark.fast
def test_a_side_of_text_keeps_its_text(tmp_path: Path) -> None:
    """The cache held image 1 where the prompt has text: the image named, the text kept."""
    recs = two_requests(read_log(IMAGES), prompt="Describe")
    text = _requests(write_log(tmp_path / "text.log", recs))
    assert f"the cache had {_words(_medium(recs, 1))}, the prompt 'Describe'" in text
    assert "a different" not in text


@pytest.mark.fast
def test_no_image_named_where_the_cache_parted_at_text(tmp_path: Path) -> None:
    recs = two_requests(read_log(IMAGES), held="Describe", prompt="Name it")
    text = _requests(write_log(tmp_path / "words.log", recs))
    assert "the cache had 'Describe', the prompt 'Name it'" in text
    assert "hash" not in text
    rows = json.loads(_requests(write_log(tmp_path / "words.log", recs), "--format", "json"))
    assert all("cache_media" not in r for r in rows["requests"])


def _req(rid: str, t0: int, slot: int, cache: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "slot": slot, "t_arrive": t0, "wait": 0, "ttft": 10, "cache": cache}


def _cache(held: int, reused: int, parted: bool = False) -> dict[str, Any]:
    div = {"at": reused, "before": "", "held": MEDIA, "prompt": MEDIA} if parted else None
    return {"held": held, "reused": reused, "common": reused} | ({"diverged": div} if div else {})


MEDIA_OF = [Medium(1, "image", "aa" * 8, 10), Medium(2, "image", "bb" * 8, 20)]


@pytest.mark.fast
def test_a_cache_keeps_the_image_a_request_reused() -> None:
    """task-1 reused image 1 from task-0's cache and decoded no image; task-2 parted from
    task-1's cache at image 1, which task-1's prompt held without decoding it."""
    reqs = [
        _req("task-0", 0, 0, _cache(0, 0)),
        _req("task-1", 100, 0, _cache(40, 30)),
        _req("task-2", 200, 0, _cache(50, 5, parted=True)),
        _req("task-3", 300, 1, _cache(0, 0)),  # another slot: its own cache
    ]
    steps = [(5, [(0, 5)], 1), (205, [(0, 5)], 2), (305, [(1, 5)], 2)]
    got = partings(reqs, steps, MEDIA_OF)
    assert list(got) == ["task-2"]
    assert (got["task-2"].held, got["task-2"].prompt) == tuple(MEDIA_OF)
    assert got["task-2"].held_by == "task-1"


@pytest.mark.fast
def test_a_cache_the_log_did_not_see_filled_names_nothing() -> None:
    """The first request of a slot whose cache held tokens (filled before the log began), a
    slot that another request's task took, and one whose request never reached its first token:
    what they held is not known."""
    reqs = [_req("task-0", 0, 0, _cache(40, 5, parted=True))]
    assert partings(reqs, [(5, [(0, 5)], 2)], MEDIA_OF) == {}
    reqs = [
        _req("task-0", 0, 0, _cache(0, 0)) | {"tasks": [{"id": "task-9", "slot": 1}]},
        _req("task-1", 100, 1, _cache(40, 5, parted=True)),
    ]
    assert partings(reqs, [(5, [(0, 5)], 1), (105, [(1, 5)], 2)], MEDIA_OF) == {}
    reqs = [
        _req("task-0", 0, 0, _cache(0, 0)),
        _req("task-1", 50, 0, _cache(40, 0)) | {"ttft": None},
        _req("task-2", 100, 0, _cache(40, 5, parted=True)),
    ]
    steps = [(5, [(0, 5)], 1), (105, [(0, 5)], 2)]
    assert partings(reqs, steps, MEDIA_OF) == {}
    assert list(partings(reqs[::2], steps, MEDIA_OF)) == ["task-2"]


def _chat(port: int, image: Path, text: str) -> dict[str, Any]:
    url = data_url(image)
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "temperature": 0,
        "cache_prompt": True,
    }
    return dict(post_json(port, "/v1/chat/completions", body, timeout=600))


@pytest.mark.native
def test_a_servers_cache_miss_at_another_image_names_both(
    tools_bin: Path, smollm2_path: Path, media: dict[str, Path], mm_dir: Path
) -> None:
    """llama-server with a projector on one slot, the prompt cache on: the same text with two
    images. The second prompt parts from the cache at its image; the line names both images by
    the ids and hashes of their media records, as the encodes of each request name them."""
    from helpers.mmproj_gguf import write_vision_mmproj
    from helpers.png import write_png

    mmproj = write_vision_mmproj(
        mm_dir / "gemma3-cache.gguf", projector="gemma3", image_size=64, n_layer=1, n_embd=64
    )
    log = mm_dir / "cache.log"
    proc, port = exec_server(
        log, smollm2_path, "--mmproj", str(mmproj), "--parallel", "1", "-c", "1024", "-t", "2"
    )
    try:
        for image in (media["test-1.jpeg"], write_png(mm_dir / "gradient.png", 320, 200)):
            _chat(port, image, "Describe the picture in a few words.")
        signal_server(proc)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    recs = read_log(log)
    requests = sorted(by_type(recs, "request"), key=lambda r: r["t_arrive"])
    assert len(requests) == 2, err[-3000:]
    div = requests[1]["cache"]["diverged"]
    assert div["held"].startswith("[media]") and div["prompt"].startswith("[media]"), div
    # each request's image: the one its encode names
    encodes = {
        b["request"]: b["media"][0][0] for b in by_type(recs, "step_begin") if b["kind"] == "encode"
    }
    held, prompt = (_medium(recs, encodes[r["id"]]) for r in requests)
    assert held["hash"] != prompt["hash"]
    text = _requests(log)
    want = f"the cache had {_words(held)}, the prompt {_words(prompt)}: a different image"
    assert want in text, text
