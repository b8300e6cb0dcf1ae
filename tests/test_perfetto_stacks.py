"""``stacks.gather`` (every template's timestamps of a flush at once) gives what the template by
template path (``template_fill._stacked_sorted``) gives: the same matrices, gids and durations, and
None for the same flushes (rows out of their template's order, a timestamp a byte longer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.support import FIXTURES
from test_perfetto_bulk_matches_reference import repeat_steps

from llamacpp_instr.converters.formats.perfetto import stacks, template_fill, write_perfetto_fast
from llamacpp_instr.converters.formats.perfetto import writer as perfetto_writer
from llamacpp_instr.converters.session.fold import iter_events_packed
from llamacpp_instr.converters.traces.items import LayoutStats, Selection
from llamacpp_instr.converters.traces.layout import layout_bulk

pytestmark = pytest.mark.fast


def _edit(k: int, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Repeats whose rows sort unlike their template's (equal timestamps, ops swapped) or whose
    timestamps are a byte longer as varints."""
    for c in [r for r in recs if r["type"] == "compute" and len(r.get("ops") or ()) > 9]:
        ops = c["ops"]
        if k == 5:
            ops[6][1] = ops[5][1]
        elif k == 6:
            ops[8][1], ops[9][1] = ops[9][1], ops[8][1]
    if k == 8:
        for r in recs:
            for f in ("ts", "t_start"):
                if f in r:
                    r[f] += 1 << 42
    return recs


def _old(groups: list[Any]) -> Any:
    got = [template_fill._stacked_sorted(tm, blocks) for tm, blocks in groups]
    if any(g is None for g in got):
        return None
    return got


@pytest.mark.parametrize(
    "name",
    [
        "tiny-llama-rpc2-detailed.log.gz",
        "tiny-llama-vulkan-partial-detailed.log.gz",
        "tiny-llama-detailed.log.gz",
    ],
)
@pytest.mark.parametrize("edit", [None, _edit])
def test_gather_as_template_by_template(
    name: str, edit: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = repeat_steps(FIXTURES / name, tmp_path / "r.log", 12, edit)
    seen: list[tuple[Any, Any]] = []
    gather = stacks.gather

    def spy(groups: Any) -> Any:
        got = gather(groups)
        seen.append((list(groups), got))
        return got

    monkeypatch.setattr(template_fill, "gather", spy)
    monkeypatch.setattr(perfetto_writer, "FLUSH_ROWS", 600)
    items = layout_bulk(iter_events_packed(log), Selection(), LayoutStats())
    write_perfetto_fast(items, _Sink(), compress=False)
    compared = several = refused = 0
    for groups, got in seen:
        assert got is not False  # (no value beyond 2**62 here: the fast path says)
        if not groups:
            continue
        old = _old(groups)
        if old is None:
            assert got is None
            refused += 1
            continue
        assert got is not None
        ts_all, flat, gids, durs = got
        assert len(ts_all) == len(groups)
        for (ts, _, _), mine in zip(old, ts_all, strict=True):
            assert mine.shape == ts.shape and np.array_equal(mine, ts)
        assert np.array_equal(gids, np.concatenate([g for _, g, _ in old] + [gids[:0]]))
        assert np.array_equal(durs, np.concatenate([d for _, _, d in old] + [durs[:0]]))
        assert np.array_equal(flat, np.concatenate([ts.reshape(-1) for ts, _, _ in old]))
        compared += 1
        several += len(groups) > 1
    assert compared  # (flushes with templates: else nothing was compared)
    if edit is not None:
        assert refused  # (the edited repeats: their flushes are refused by both)
    if "rpc" in name or "vulkan" in name:
        assert several  # (a device log's flush has a template per device)


class _Head:
    def __init__(self, ts: int, dur: int) -> None:
        self.ts, self.start, self.dur = ts, ts, dur


class _CB:
    def __init__(self, ts: int, layer: tuple[int, int] | None) -> None:
        self.slice = _Head(ts, 10)
        self.layers = [] if layer is None else [_Head(*layer)]


class _Bl:
    def __init__(self, ts: int, layer: tuple[int, int] | None = None) -> None:
        self.cb, self.group = _CB(ts, layer), -1


class _Tm:
    def __init__(self, nb: int, perm: list[int], static_ok: list[bool], n_l: int) -> None:
        self.nb = nb
        self.layout = stacks.Layout(np.array(perm), np.array(static_ok), n_l, 0)


def test_gather_leaves_big_values_to_the_old_path() -> None:
    """A value beyond 2**62: ``gather`` cannot tell (``False``), the old path takes it."""
    tm = _Tm(9, [0, 1], [False], 0)
    assert stacks.gather([(tm, [(0, None, _Bl(1 << 62))])]) is False
    assert stacks.gather([(tm, [(0, None, _Bl(1 << 57))])]) is not False


def test_gather_checks_order_and_lengths() -> None:
    """Equal timestamps pass only where the static keys order them; a timestamp shorter or
    longer as a varint than the template's is refused."""
    perm = [0, 2, 3, 1]  # compute begin, layer begin, layer end, compute end
    ok, tie_unordered = [True, True, True], [True, True, False]
    equal_ends = (0, None, _Bl(200, (202, 8)))  # the layer ends as its compute does
    assert stacks.gather([(_Tm(2, perm, ok, 1), [equal_ends])]) not in (None, False)
    assert stacks.gather([(_Tm(2, perm, tie_unordered, 1), [equal_ends])]) is None
    # (the next block, in another template, is unchecked against the first's last row)
    two = [(_Tm(2, perm, ok, 1), [equal_ends]), (_Tm(2, perm, ok, 1), [(1, None, _Bl(150))])]
    two[1][0].layout = stacks.Layout(np.array([0, 1]), np.array([False]), 0, 0)
    got = stacks.gather(two)
    assert got not in (None, False)
    assert [x.tolist() for x in got[0]] == [[[200, 202, 210, 210]], [[150, 160]]]
    assert stacks.gather([(_Tm(3, perm, ok, 1), [equal_ends])]) is None  # 2 bytes, not 3
    assert stacks.gather([(_Tm(1, perm, ok, 1), [equal_ends])]) is None  # nor 1
    late = (0, None, _Bl(200, (202, 9)))  # the layer ends after its compute
    assert stacks.gather([(_Tm(2, perm, ok, 1), [late])]) is None


class _Sink:
    def write(self, data: bytes) -> int:
        return len(data)
