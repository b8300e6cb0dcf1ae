"""``template_fill.fill`` fills every template of a flush at once (the timestamps' varints and the
ops' rates of all in one pass): each template's blocks come out as they do filled alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.support import FIXTURES
from test_perfetto_bulk_matches_reference import repeat_steps

from llamacpp_instr.converters.formats.perfetto import templates, write_perfetto_fast
from llamacpp_instr.converters.formats.perfetto import writer as perfetto_writer
from llamacpp_instr.converters.session.fold import iter_events_packed
from llamacpp_instr.converters.traces.items import LayoutStats, Selection
from llamacpp_instr.converters.traces.layout import layout_bulk

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    "name", ["tiny-llama-rpc2-detailed.log.gz", "tiny-llama-vulkan-partial-detailed.log.gz"]
)
def test_templates_filled_together_as_alone(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = repeat_steps(FIXTURES / name, tmp_path / "r.log", 12)
    calls: list[tuple[Any, Any, Any]] = []
    fill = templates.fill

    def spy(groups: Any, store: Any) -> Any:
        got = fill(groups, store)
        calls.append((store, list(groups), got))
        return got

    monkeypatch.setattr(templates, "fill", spy)
    monkeypatch.setattr(perfetto_writer, "FLUSH_ROWS", 600)
    items = layout_bulk(iter_events_packed(log), Selection(), LayoutStats())
    write_perfetto_fast(items, _Sink(), compress=False)
    together = [c for c in calls if len(c[1]) > 1 and c[2] is not None]
    assert together, "no flush with two templates"
    rated = 0
    for store, groups, got in together:
        assert len(got) == len(groups)
        for g, f in zip(groups, got, strict=True):
            alone = fill([g], store)
            assert alone is not None
            (a,) = alone
            assert np.array_equal(a[2], f[2])  # the packets
            for x, y in zip(a[0] + a[1], f[0] + f[1], strict=True):  # the keys
                assert np.array_equal(x, y)
            rated += len(g[0].rate_idx) > 0
    assert rated  # (templates with ops: their rates were filled)


class _Sink:
    def write(self, data: bytes) -> int:
        return len(data)
