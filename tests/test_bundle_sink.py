"""BundleSink takes a write as bytes or as a list of parts: the same bundles either way."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest

from llamacpp_instr.converters.traces.sinks import BundleSink

pytestmark = pytest.mark.fast


def _bundle(data: bytes) -> bytes:
    # a bundle made visible: its length, then its bytes (the bundles' boundaries show)
    return b"<%d:" % len(data) + data + b">"


def _bundles(out: bytes) -> list[int]:
    """The bundles' lengths in ``_bundle``'s output."""
    sizes, at = [], 0
    while at < len(out):
        colon = out.index(b":", at)
        n = int(out[at + 1 : colon])
        sizes.append(n)
        at = colon + 1 + n + 1
    return sizes


def _writes() -> list[bytes]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in rng.integers(1, 90, 60)]


def _out(compress: bool | None, writes: list[Any]) -> bytes:
    out = io.BytesIO()
    sink = BundleSink(out, compress, _bundle, auto=700, chunk=256, threads=2)
    for w in writes:
        sink.write(w)
    sink.close()
    sink.shutdown()
    return out.getvalue()


def _as_parts(data: bytes) -> list[Any]:
    # in pieces of a few bytes: memoryviews of a uint8 buffer and bytes, as the writer hands them
    buf = np.frombuffer(data, dtype=np.uint8).copy()
    mv = memoryview(buf)
    cut = list(range(0, len(data), 7)) + [len(data)]
    return [
        mv[a:z] if k % 2 else bytes(mv[a:z])
        for k, (a, z) in enumerate(zip(cut, cut[1:], strict=False))
    ]


@pytest.mark.parametrize("compress", [True, None, False])
def test_parts_write_as_bytes(compress: bool | None) -> None:
    writes = _writes()
    want = _out(compress, writes)
    if compress is False:
        assert want == b"".join(writes)
    else:  # several bundles, each cut after the write that filled it
        sizes = _bundles(want)
        assert len(sizes) >= 3 and sum(sizes) == sum(map(len, writes))
    assert _out(compress, [_as_parts(w) for w in writes]) == want


def test_boundaries_follow_writes() -> None:
    """Writes grouped otherwise give other bundles (what the test above compares can differ)."""
    writes = _writes()
    regrouped = [b"".join(writes[k : k + 3]) for k in range(0, len(writes), 3)]
    assert _bundles(_out(True, regrouped)) != _bundles(_out(True, writes))


@pytest.mark.parametrize("cores, threads", [(1, 1), (2, 1), (3, 1), (4, 2), (16, 2)])
def test_compressing_threads_leave_two_cores(
    cores: int, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Perfetto writer compresses on the cores beyond the two that its process and the forked
    log reader keep busy: one thread at least, two at most."""
    from llamacpp_instr.converters.formats.perfetto import writer
    from llamacpp_instr.converters.reading import prefetch

    monkeypatch.setattr(prefetch, "cores", lambda: cores)
    assert writer.zlib_threads() == threads
