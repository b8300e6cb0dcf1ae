"""The Perfetto writer leaves nothing of a flush behind once it is written, with the cyclic
collector off as ``instr to-perfetto`` runs (``commands/to_perfetto.py``): a reference cycle
between what a flush holds (a segment and its pending group once pointed at each other) is
never freed then, and peak memory grows with the log's length."""

from __future__ import annotations

import gc
import io
from pathlib import Path

import pytest
from helpers.support import FIXTURES
from test_perfetto_bulk_matches_reference import repeat_steps

from llamacpp_instr.converters.formats.perfetto import segments
from llamacpp_instr.converters.formats.perfetto import writer as perfetto_writer
from llamacpp_instr.converters.formats.perfetto.begins import Pending
from llamacpp_instr.converters.formats.perfetto.segments import Seg
from llamacpp_instr.converters.session.fold import iter_events_packed
from llamacpp_instr.converters.traces.items import LayoutStats, Selection
from llamacpp_instr.converters.traces.layout import layout_bulk

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("compress", [False, True])
def test_flushes_leave_no_cycles(
    compress: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = repeat_steps(FIXTURES / "tiny-llama-rpc2-detailed.log.gz", tmp_path / "r.log", 16)
    items = list(layout_bulk(iter_events_packed(log), Selection(), LayoutStats()))
    monkeypatch.setattr(perfetto_writer, "FLUSH_ROWS", 300)  # (many flushes)
    made = 0

    class Counted(Seg):
        __slots__ = ()

        def __init__(self, *args: object) -> None:
            nonlocal made
            made += 1
            super().__init__(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(segments, "Seg", Counted)
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        perfetto_writer.write_perfetto_fast(iter(items), io.BytesIO(), compress=compress)
        left = sum(isinstance(o, (Seg, Pending)) for o in gc.get_objects())
    finally:
        if was:
            gc.enable()
    assert made > 10  # (the log's device rows did go through segments)
    assert left == 0
