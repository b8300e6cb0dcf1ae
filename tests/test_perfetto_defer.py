"""Deferred flushes (``Flushes.flush``, ``DEFER_FLUSHES``): the trace is the one written with
every flush encoded at once, byte for byte, whatever the flushes intern and whenever track
descriptors come between them."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.support import FIXTURES
from test_perfetto_bulk_matches_reference import repeat_steps

from llamacpp_instr.converters.formats.perfetto import flushes as perfetto_flushes
from llamacpp_instr.converters.formats.perfetto import writer as perfetto_writer
from llamacpp_instr.converters.session.fold import iter_events_packed
from llamacpp_instr.converters.traces.items import (
    BulkItem,
    LayoutStats,
    Sample,
    Selection,
    Slice,
    Track,
)
from llamacpp_instr.converters.traces.layout import layout_bulk

pytestmark = pytest.mark.fast


def _items(steps: int) -> Iterator[BulkItem]:
    """Steps whose slices intern new strings (names, arg names) every step, a new track now and
    then, counters, and slices of several kinds with their args (encoded at the flush)."""
    yield Track(1, "p", None, "process")
    yield Track(2, "steps", 1, "slices")
    yield Track(3, "copies", 1, "slices")
    yield Track(4, "n", 1, "counter")
    ts = 1000
    for k in range(steps):
        yield Slice(2, f"step {k}", ts, 900, 0, "step", {"step": k, f"only_{k % 7}": "x"})
        if k % 23 == 3:
            yield Track(10 + k, f"late {k}", 1, "slices")
            yield Slice(10 + k, f"late {k}", ts + 1, 5, 1, "late", {"k": k})
        for j in range(6):
            args: dict[str, Any] = {"tensor": f"t{j}", "bytes": 100 * j + k, "mb_per_s": 1.5 * j}
            if j == 2:
                args[f"new_{k}"] = k  # a new arg name (interned when the slice comes)
            name = f"copy {k % 9} {j}" if j < 4 else f"copy fresh {k}"
            yield Slice(3, name, ts + 10 + 100 * j, 50, 1, "copy", args)
        yield Sample(4, ts + 5, float(k))
        ts += 1000


def _write(items: list[BulkItem], compress: bool | None, defer: int) -> tuple[bytes, list[int]]:
    """The trace, and how many flushes each drain wrote."""
    drains: list[int] = []
    saved = perfetto_flushes.DEFER_FLUSHES
    drain = perfetto_flushes.Flushes._drain

    def counted(f: perfetto_flushes.Flushes) -> None:
        if f.deferred:
            drains.append(len(f.deferred))
        drain(f)

    perfetto_flushes.DEFER_FLUSHES = defer
    perfetto_flushes.Flushes._drain = counted  # type: ignore[method-assign]
    try:
        out = io.BytesIO()
        perfetto_writer.write_perfetto_fast(iter(items), out, compress=compress)
    finally:
        perfetto_flushes.DEFER_FLUSHES = saved
        perfetto_flushes.Flushes._drain = drain  # type: ignore[method-assign]
    return out.getvalue(), drains


@pytest.mark.parametrize("compress", [False, True, None])
def test_deferred_flushes_same_bytes(
    compress: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(perfetto_writer, "FLUSH_ROWS", 40)  # a flush every few steps
    monkeypatch.setattr(perfetto_writer, "AUTO_COMPRESS", 20_000)  # (None: decided midway)
    monkeypatch.setattr(perfetto_writer, "CHUNK", 4096)
    items = list(_items(120))
    want, drains = _write(items, compress, 1)
    assert set(drains) <= {1}  # (1: each flush written as it comes)
    for defer in (2, 4, 7):
        got, drains = _write(items, compress, defer)
        assert max(drains) == defer and sum(drains) > 20  # several at a time
        assert got == want


def test_deferral_can_be_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that gave each deferred flush's head every string interned so far (not only
    those before its boundary) writes other bytes: the test above can fail."""
    monkeypatch.setattr(perfetto_writer, "FLUSH_ROWS", 40)
    items = list(_items(60))
    want, _ = _write(items, False, 1)

    def eager(f: perfetto_flushes.Flushes) -> None:
        deferred, f.deferred = f.deferred, []
        f.begins.encode()
        for batches, _ in deferred:
            f._encode(batches)

    monkeypatch.setattr(perfetto_flushes.Flushes, "_drain", eager)
    got, _ = _write(items, False, 4)
    assert got != want


@pytest.mark.parametrize(
    "name, deferred",
    [
        ("tiny-llama-rpc2-detailed", True),
        ("tiny-llama-vulkan-partial-detailed", True),
        ("tiny-llama-detailed", False),  # (a CPU log: no slice begins wait for the flush)
    ],
)
def test_deferred_device_logs(
    name: str, deferred: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logs with templated computes, layers (named at the flush by the general encoder: those
    flushes are not deferred) and device slices in bulk: the same bytes deferred or not."""
    log = repeat_steps(FIXTURES / f"{name}.log.gz", tmp_path / "r.log", 16)
    items = list(layout_bulk(iter_events_packed(log), Selection(), LayoutStats()))
    monkeypatch.setattr(perfetto_writer, "FLUSH_ROWS", 300)
    for compress in (False, True):
        want, _ = _write(items, compress, 1)
        got, drains = _write(items, compress, 4)
        assert (max(drains, default=0) > 1) == deferred
        assert got == want
