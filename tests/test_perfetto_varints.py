"""The bulk varints (``varint_len`` both ways: one search for a few values, passes for many;
``varint_bytes``; ``pieces._varints``, lengths mixed) are ``varint``'s, value by value."""

from __future__ import annotations

import numpy as np
import pytest

from llamacpp_instr.converters.formats.perfetto.pieces import _varints
from llamacpp_instr.converters.formats.perfetto.protowire import varint, varint_bytes, varint_len

pytestmark = pytest.mark.fast


def _values(n: int, top_bits: int, negative: bool) -> np.ndarray:
    rng = np.random.default_rng(top_bits * 7 + n)
    bits = rng.integers(0, top_bits + 1, n)
    v = np.array([int(rng.integers(0, 1 << b)) if b else 0 for b in bits.tolist()], np.int64)
    edges = [0, 127, 128, 16383, 16384, (1 << 56) - 1, 1 << 56, (1 << 63) - 1]
    edges = [e for e in edges if e < 1 << top_bits]
    v[: len(edges)] = edges
    if negative:
        v[len(edges) : len(edges) + 3] = [-1, -(1 << 63), -300]
    return v


@pytest.mark.parametrize("n", [50, 5000])  # (below and above varint_len's switch)
@pytest.mark.parametrize("top_bits", [7, 21, 56, 63])
@pytest.mark.parametrize("negative", [False, True])
def test_bulk_varints_are_varints(n: int, top_bits: int, negative: bool) -> None:
    v = _values(n, top_bits, negative)
    want = [varint(x) for x in v.tolist()]
    nb = varint_len(v)
    assert nb.tolist() == [len(w) for w in want]
    assert varint_len(v.reshape(-1, 5)).tolist() == nb.reshape(-1, 5).tolist()
    w = int(nb.max())
    mat = _varints(v, nb, w)
    assert mat.shape == (n, w)
    assert [bytes(r[:k]) for r, k in zip(mat, nb.tolist(), strict=True)] == want
    for k in sorted(set(nb.tolist())):
        rows = np.flatnonzero(nb == k)
        got = varint_bytes(v[rows], k)
        assert got.shape == (len(rows), k)
        assert [bytes(r) for r in got] == [want[i] for i in rows.tolist()]
