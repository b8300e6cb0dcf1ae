"""Memory per image does not grow: llama-server with a projector, recorded by `instr exec` at
detailed, takes 200 images (each a different picture, so that nothing is answered from a cache),
three slots at a time; its resident memory after the 200th image is within a bound of what it was
after the 50th. Whatever the instrument keeps per image (the image's load note, its media record,
the encode's step and op rows, the graph of its compute) must be let go once written: a leak of a
bitmap's pixels, or of an encode's rows, would show here as kilobytes per image.

The bound's sensitivity is checked on the same server: with llama-server's own prompt cache in
host memory left on (`--cache-ram`, its default), which keeps every request's state, the same
measure grows past the bound."""

from __future__ import annotations

import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.support import exec_server, post_json, signal_server

pytestmark = pytest.mark.native

IMAGES = 200
WARM = 50  # images before the first measure: the allocator's arenas and the server's pools grown
# bytes of resident memory a further image may add, at most: under the smallest per-image state a
# leak would keep (the bitmap's 12 KiB of pixels, its 48 KiB of preprocessed floats, an encode's
# op rows). With one malloc arena (below) the server's RSS grew 0 to 3,932 bytes an image over 150
# to 400 images, run to run (the most on a machine busy with other work); with glibc's default
# arenas, one per thread, it moved by 1.3 to 7 KiB an image either way
PER_IMAGE_MAX = 8192


def png(i: int, side: int = 48) -> bytes:
    """A ``side``-pixel RGB picture of its own for each ``i`` (a gradient its number shifts)."""
    rows = b"".join(
        b"\0" + bytes((x * 5 + i) % 256 for x in range(side) for _ in range(3)) for _ in range(side)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    head = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", head)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _server_pid(parent: int) -> int:
    """llama-server's pid: ``parent`` itself when instr exec became it, else its child."""
    from test_replay_server import _child_server

    if Path(f"/proc/{parent}/comm").read_text().startswith("llama-server"):
        return parent
    child = _child_server(parent)
    assert child is not None, "no llama-server under instr exec"
    return child


def growth_per_image(
    smollm2_path: Path, mmproj: Path, log: Path, *server_args: str
) -> tuple[float, int, int]:
    """Bytes of resident memory per image from the WARM-th image to the last, and the two RSS:
    the server on one malloc arena (MALLOC_ARENA_MAX=1), so that the HTTP threads' arenas do not
    move its RSS by pages either way."""
    import base64
    import os

    arenas = os.environ.get("MALLOC_ARENA_MAX")
    os.environ["MALLOC_ARENA_MAX"] = "1"
    try:
        proc, port = exec_server(
            log, smollm2_path, "--mmproj", str(mmproj), "--parallel", "3", "-c", "1536", "-t", "1",
            *server_args,
        )  # fmt: skip
    finally:
        if arenas is None:
            del os.environ["MALLOC_ARENA_MAX"]
        else:
            os.environ["MALLOC_ARENA_MAX"] = arenas
    pid = _server_pid(proc.pid)
    # its log lines read as they come: 200 requests' worth would fill the pipe and stop the server
    assert proc.stderr is not None
    drain = threading.Thread(target=proc.stderr.read, daemon=True)
    drain.start()

    def ask(i: int) -> None:
        url = "data:image/png;base64," + base64.b64encode(png(i)).decode()
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1}
        post_json(port, "/v1/chat/completions", body, timeout=300)

    try:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(ask, range(WARM)))
            first = _rss(pid)
            list(pool.map(ask, range(WARM, IMAGES)))
            last = _rss(pid)
    finally:
        signal_server(proc)
        proc.wait(120)
    return (last - first) / (IMAGES - WARM), first, last


@pytest.fixture(scope="module")
def small_projector(mm_dir: Path) -> Path:
    from helpers.mmproj_gguf import write_vision_mmproj

    # 64-pixel images in patches of 16, pooled 2 by 2: four tokens an image, an encode of
    # milliseconds
    return write_vision_mmproj(
        mm_dir / "leaks-gemma3.gguf", projector="gemma3", image_size=64, scale_factor=2
    )


def test_memory_per_image_does_not_grow(
    tools_bin: Path, smollm2_path: Path, small_projector: Path, tmp_path: Path
) -> None:
    per, first, last = growth_per_image(
        smollm2_path, small_projector, tmp_path / "images.log", "--cache-ram", "0"
    )
    print(f"RSS {first / 2**20:.1f} MiB after {WARM} images, {last / 2**20:.1f} MiB after "
          f"{IMAGES}: {per:,.0f} bytes an image")  # fmt: skip
    assert per <= PER_IMAGE_MAX, (per, first, last)
    recs = (tmp_path / "images.log").read_text().count('"type":"media"')
    assert recs >= IMAGES  # every image recorded: the instrument did its per-image work


def test_the_bound_sees_a_server_that_keeps_each_request(
    tools_bin: Path, smollm2_path: Path, small_projector: Path, tmp_path: Path
) -> None:
    per, first, last = growth_per_image(smollm2_path, small_projector, tmp_path / "kept.log")
    print(f"with llama-server's prompt cache in host memory: {per:,.0f} bytes an image")
    assert per > PER_IMAGE_MAX, (per, first, last)
