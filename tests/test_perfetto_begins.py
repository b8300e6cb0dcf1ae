"""``perfetto.begins``: the columns a flush's begins are made from (ints in bulk, negative ones
included; a value the same in every row; rows whose types differ) give the bytes the per-slice
encoder (``EventFields.begin``) makes."""

from __future__ import annotations

import io
from types import MappingProxyType
from typing import Any

import pytest
from test_perfetto_bulk_matches_reference import _begins_as_one_by_one

from llamacpp_instr.converters.formats.perfetto import write_perfetto_fast
from llamacpp_instr.converters.formats.perfetto.begins import Begins, columns
from llamacpp_instr.converters.formats.perfetto.events import EventFields
from llamacpp_instr.converters.formats.perfetto.packets import Interner
from llamacpp_instr.converters.traces.items import Slice, SliceRows, Track

pytestmark = pytest.mark.fast

I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def _check(flushes: list[list[tuple[int, str, str, dict[str, Any]]]]) -> None:
    """Each flush's slices (track, name, category, args) noted and encoded in bulk, asserted
    equal to the begins made one by one, with the same strings interned in the same order."""
    one, bulk = Interner(), Interner()
    _begins_as_one_by_one(flushes, Begins(bulk), EventFields(one))
    assert bulk.pending == one.pending


@pytest.mark.parametrize(
    "values",
    [
        [-1, -5, -(2**40)],  # (negative: ten bytes each)
        [I64_MIN, I64_MAX, 0, -1, 1],
        [0, 127, 128, 2**56, 2**62],
        [I64_MAX + 1, 3],  # (beyond int64: a string)
        [I64_MIN - 1, 3],
        [True, 1, False, 0],  # (True == 1, yet encodes otherwise)
        [1.0, 1, -0.0, 0],
        [None, "None", "null", 0],
        ["same", "same", "same"],  # (one value: a constant)
        [7, 7, 7],
        [2.5, 2.5, float("nan"), float("-inf")],
    ],
)
def test_a_column_as_one_by_one(values: list[Any]) -> None:
    slices = [(3 + r % 2, f"n{r % 3}", "copy", {"a": v, "b": r}) for r, v in enumerate(values)]
    _check([slices, list(reversed(slices))])


def test_rows_of_other_types_than_the_first() -> None:
    """Rows whose values' types differ from the first row's (each column then looked at on its
    own), and a column of one type among them."""
    rows = [
        {"x": 1, "y": "a", "z": 1.5},
        {"x": "1", "y": "a", "z": 2.5},
        {"x": 2, "y": "b", "z": 0.0},
    ]
    cols, types = columns(rows, ("x", "y", "z"))
    assert cols == [[1, "1", 2], ["a", "a", "b"], [1.5, 2.5, 0.0]]
    assert types == [None, str, float]  # (each column's own: x's mixed, y's and z's not)
    assert columns(rows[:1] + rows[2:], ("x", "y", "z"))[1] == [int, str, float]
    bools = [{"x": 1, "y": "a", "z": 1.5}, {"x": True, "y": "a", "z": 2.5}]  # (True == 1)
    assert columns(bools, ("x", "y", "z"))[1] == [None, str, float]
    _check([[(9, "s", "copy", r) for r in rows]])


def test_tracks_and_names_shared_across_categories() -> None:
    """The same tracks and names in two categories, and a track seen first with one name and
    then with another: each begin its own category and name."""
    flushes = [
        [(5, "a", "copy", {"k": 1}), (5, "b", "busy", {"k": 1}), (6, "a", "busy", {"k": 2})],
        [(6, "b", "copy", {"k": 3}), (5, "a", "busy", {"k": 4})],
    ]
    _check(flushes)


def _trace_of(rows: SliceRows, whole: bool) -> bytes:
    items: list[Any] = [Track(7, "t7", 1, "slices"), Track(8, "t8", 1, "slices")]
    items.append(Slice(7, "step 0", 0, 100, 0, "step", {"step": 0}))
    items += [rows] if whole else list(rows.items())
    out = io.BytesIO()
    write_perfetto_fast(items, out, compress=False)
    return out.getvalue()


@pytest.mark.parametrize(
    "flows",
    [
        {0: (1,), 1: (2,), 2: (3,)},  # (every row ends one: one segment)
        {0: (0, 2**64 - 1), 1: (5, 6), 2: (7, 8)},  # (ids at a fixed64's bounds)
        {0: (1,), 1: (2,), 7: (3,)},  # (as many entries as rows, one beyond them)
        {0: (1,), 1: (), 2: (3,)},  # (an empty entry: ends none)
        {0: (1,), 1: (2, 3), 2: (4,)},
    ],
)
def test_segments_with_flows_as_one_by_one(flows: dict[int, tuple[int, ...]]) -> None:
    """A ``SliceRows`` whose rows end flows writes what its slices write one by one."""
    rows = SliceRows("copy", 1)
    for r in range(3):
        rows.add(7 + r % 2, f"c{r}", 10 + r, 5, {"x": r, "y": "a"})
    rows.flows_in.update(flows)
    want = _trace_of(rows, whole=False)
    assert len(want) > 0 and _trace_of(rows, whole=True) == want


def test_args_not_dicts_among_dicts() -> None:
    """A group whose rows' args are dicts but one, a mapping (``columns`` then reads each name's
    values row by row): its begins as those made one by one."""
    rows: list[Any] = [{"x": r, "y": "ab"[r % 2], "z": r > 1} for r in range(4)]
    rows[2] = MappingProxyType(rows[2])
    assert columns(rows, ("x", "y", "z")) == (
        [[0, 1, 2, 3], list("abab"), [False] * 2 + [True] * 2],
        [None] * 3,
    )
    _check([[(4 + r % 2, "n", "copy", a) for r, a in enumerate(rows)]])
