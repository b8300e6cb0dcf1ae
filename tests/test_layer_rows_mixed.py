"""``columns.layer_rows`` packs rows of four and five elements (a device log's layers) through one
flat list: the same arrays, and the same refusals (None: the per-row reading then converts or
reports), as the packing it replaced, kept here as ``_reference``."""

from __future__ import annotations

import random
from array import array
from itertools import chain
from typing import Any

import numpy as np
import pytest
from helpers.support import FIXTURES, read_log

from llamacpp_instr.converters.reading.decode.columns import layer_rows, layer_spans

pytestmark = pytest.mark.fast

T0 = 1_000_000


def _reference(raw: Any, t0: int) -> np.ndarray | None:
    """``layer_rows`` as it was before the rows of four were padded and packed flat (main ddadaef)."""
    if type(raw) is not list or not raw:
        return None
    try:
        flat = list(chain.from_iterable(raw))
        widths = set(map(len, raw))
        if widths == {4} and len(flat) == 4 * len(raw):
            a = np.frombuffer(array("q", flat), np.int64).reshape(-1, 4).copy()
        elif widths <= {4, 5} and all(type(r) is list for r in raw):
            rows = [r if len(r) == 5 else [*r, -1] for r in raw]
            if not all(type(v) is int for v in chain.from_iterable(rows)):
                return None
            if min(r[4] for r in raw if len(r) == 5) < 0:
                return None
            a = np.array(rows, np.int64)
        else:
            return None
        lo, hi = a.min(axis=0), a.max(axis=0)
        if lo[1] < 0 or lo[2] < 0 or t0 + int(hi[1]) >= 1 << 63:
            return None
        a[:, 1] += t0
        return a
    except (TypeError, ValueError, OverflowError):
        return None


def _same(raw: Any, t0: int = T0) -> np.ndarray | None:
    """``layer_rows(raw, t0)``, asserted equal to the reference's (None or the same array)."""
    got, want = layer_rows(raw, t0), _reference(raw, t0)
    if want is None:
        assert got is None, raw
        return None
    assert got is not None, raw
    assert got.dtype == np.int64 and got.shape == want.shape, raw
    assert np.array_equal(got, want), raw
    return got


MIXED = [[0, 10, 5, 3, 1], [1, 20, 4, 2], [2, 30, 6, 7, 0], [3, 40, 1, 1]]


def test_mixed_rows_give_every_row_a_device() -> None:
    got = _same(MIXED)
    assert got is not None
    want = [[0, T0 + 10, 5, 3, 1], [1, T0 + 20, 4, 2, -1], [2, T0 + 30, 6, 7, 0]]
    want.append([3, T0 + 40, 1, 1, -1])
    assert got.tolist() == want
    rows, dev = layer_spans(got, T0)
    assert [tuple(r) for r in rows] == [tuple(r[:4]) for r in want]
    assert dev is not None and dev.tolist() == [1, -1, 0, -1]


def _with(k: int, j: int, v: Any, rows: list[list[Any]] = MIXED) -> list[list[Any]]:
    """``rows`` with row ``k``'s element ``j`` set to ``v``."""
    out = [list(r) for r in rows]
    out[k][j] = v
    return out


BAD_VALUES = [True, False, 1.0, 2.5, "3", None, [1], {"a": 1}, 1 << 63, -(1 << 63) - 1]


@pytest.mark.parametrize("v", BAD_VALUES, ids=repr)
def test_a_value_that_is_no_int64_is_refused_in_any_column(v: Any) -> None:
    # rows 0 and 2 have five elements, rows 1 and 3 four
    cases = [_with(k, j, v) for k in range(4) for j in range(len(MIXED[k]))]
    assert len(cases) == 18
    for raw in cases:
        assert _same(raw) is None


def test_bools_pass_only_where_every_row_has_four() -> None:
    four = [r[:4] for r in MIXED]
    got = _same(_with(1, 3, True, four))  # the reference's fast path took it as 1
    assert got is not None and got[1, 3] == 1
    assert _same(_with(1, 3, True)) is None  # with rows of five: refused, as before


def test_negative_values_where_they_were_refused() -> None:
    assert _same(_with(0, 4, -1)) is None  # a device -1 named in a row: refused
    assert _same(_with(2, 4, -7)) is None
    assert _same(_with(1, 1, -1)) is None  # negative start
    assert _same(_with(3, 2, -1)) is None  # negative duration
    assert _same(MIXED, (1 << 63) - 35) is None  # an absolute start beyond int64
    # a negative layer or op count was packed as it is: still
    for raw in (_with(0, 0, -1), _with(1, 3, -2), _with(2, 3, -(1 << 63))):
        got = _same(raw)
        assert got is not None and got[:, [0, 3]].min() < 0


@pytest.mark.parametrize(
    "raw",
    [
        [],
        "rows",
        None,
        [[0, 1, 2]],
        [[0, 1, 2, 3, 4, 5]],
        MIXED + [[0, 1, 2]],
        MIXED + [[0, 1, 2, 3, 4, 5]],
        MIXED + [(4, 50, 1, 1)],
        MIXED + [(4, 50, 1, 1, 0)],
        [(0, 1, 2, 3, 0), [1, 2, 3, 4]],
        MIXED + ["abcd"],
        MIXED + ["abcde"],
        MIXED + [{"a": 0, "b": 1, "c": 2, "d": 3}],
        MIXED + [7],
        ["abcd", [0, 1, 2, 3]],
    ],
    ids=repr,
)
def test_odd_shapes_are_refused_as_before(raw: Any) -> None:
    assert _same(raw) is None


def test_rows_of_five_only() -> None:
    five = [r if len(r) == 5 else [*r, 2] for r in MIXED]
    got = _same(five)
    assert got is not None and got[:, 4].tolist() == [1, 2, 0, 2]


def test_random_rows_against_the_reference() -> None:
    rnd = random.Random(38)
    odd: list[Any] = [True, False, -1, -2, 0.5, "1", None, 1 << 63, 0]
    n_arrays = n_none = 0
    for _ in range(3000):
        raw: list[Any] = []
        for _ in range(rnd.randint(1, 8)):
            row: list[Any] = [rnd.randint(0, 40), rnd.randint(0, 10**6), rnd.randint(0, 900)]
            row.append(rnd.randint(1, 20))
            if rnd.random() < 0.6:
                row.append(rnd.randint(0, 3))
            if rnd.random() < 0.04:
                row[rnd.randrange(len(row))] = rnd.choice(odd)
            if rnd.random() < 0.01:
                row = row[:3] if rnd.random() < 0.5 else [*row, 0, 0]
            raw.append(row)
        if _same(raw, rnd.choice([0, T0, (1 << 63) - 10**6])) is None:
            n_none += 1
        else:
            n_arrays += 1
    assert n_arrays > 1000 and n_none > 300  # both outcomes exercised


LOGS = [
    FIXTURES / "tiny-llama-rpc2-detailed.log.gz",
    FIXTURES / "tiny-llama-vulkan-partial-detailed.log.gz",
]


@pytest.mark.parametrize("path", LOGS, ids=[p.name.split("-detailed")[0] for p in LOGS])
def test_device_logs_layers_as_before(path: Any) -> None:
    widths: set[int] = set()
    n = 0
    for rec in read_log(path):
        if rec["type"] == "compute" and rec.get("layers"):
            got = _same(rec["layers"], rec["t_start"])
            assert got is not None
            widths |= set(map(len, rec["layers"]))
            n += 1
    assert n > 0 and 5 in widths  # (rows of four too in the partial offload)
