"""``layer_plan.MixedRows`` is made once per row widths (structure) and kept: computes with the
same widths and other values each get their own values, as the per-row reading reads them."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from llamacpp_instr.converters.reading.decode import layer_plan
from llamacpp_instr.converters.reading.decode.columns import layer_rows, layer_spans

pytestmark = pytest.mark.fast

T0 = 5_000


def _by_row(raw: list[list[Any]], t0: int) -> tuple[list[tuple[int, ...]], list[int]]:
    """The spans (start absolute) and devices (-1: none named), a row at a time, by hand."""
    spans = [(r[0], t0 + r[1], r[2], r[3]) for r in raw]
    return spans, [r[4] if len(r) == 5 else -1 for r in raw]


def test_the_same_widths_with_other_values() -> None:
    rnd = random.Random(7)
    widths = (5, 4, 4, 5, 5, 4)
    n = 0
    for _ in range(50):
        raw = [
            [rnd.randint(0, 30), rnd.randint(0, 10**9), rnd.randint(0, 10**6), 9] for _ in widths
        ]
        for r, w in zip(raw, widths, strict=True):
            if w == 5:
                r.append(rnd.randint(0, 3))
        spans, devices = layer_spans(raw, T0)
        want_spans, want_devices = _by_row(raw, T0)
        assert [tuple(s) for s in spans] == want_spans
        assert devices is not None and devices.tolist() == want_devices
        rows = layer_rows(raw, T0)
        assert rows is not None and rows.tolist() == [
            [*s, d] for s, d in zip(want_spans, want_devices, strict=True)
        ]
        n += 1
    assert n == 50
    assert layer_plan.mixed_rows(widths) is layer_plan.mixed_rows(widths)  # (made once)


def test_one_row_and_rows_all_of_five() -> None:
    for raw in (
        [[1, 2, 3, 4, 0]],
        [[1, 2, 3, 4, 0], [2, 6, 1, 1, 1]],
        [[1, 2, 3, 4], [2, 6, 1, 1, 1]],
    ):
        spans, devices = layer_spans(raw, T0)
        want_spans, want_devices = _by_row(raw, T0)
        assert [tuple(s) for s in spans] == want_spans
        assert devices is not None and devices.tolist() == want_devices


def test_what_the_plan_checks_is_each_compute_own() -> None:
    good = [[0, 10, 5, 3, 1], [1, 20, 4, 2]]
    assert layer_rows(good, T0) is not None
    for k, j, v in [(0, 4, -2), (0, 1, -1), (1, 2, -1), (0, 2, True), (1, 0, 1.5)]:
        bad = [list(r) for r in good]
        bad[k][j] = v
        assert layer_rows(bad, T0) is None, bad
        assert layer_rows(good, T0) is not None  # (nothing of the bad one kept)


def test_odd_widths_refused_and_the_plans_bounded() -> None:
    assert layer_plan.mixed_rows((4, 3)) is None
    assert layer_plan.mixed_rows((4, 6, 5)) is None
    assert layer_plan.mixed_rows((4, 4)) is layer_plan.FOUR
    for m in range(1, 2 * layer_plan._KNOWN_MAX):
        assert isinstance(layer_plan.mixed_rows((5,) * m), layer_plan.MixedRows)
    assert len(layer_plan._KNOWN) <= layer_plan._KNOWN_MAX
    mixed = layer_plan.MixedRows((5, 4))
    flat = np.arange(9)
    assert flat[mixed.at4].tolist() == [0, 1, 2, 3, 5, 6, 7, 8]
    assert mixed.device_at.tolist() == [4, 9] and mixed.at5.tolist()[-1] == 9
