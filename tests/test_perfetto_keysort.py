"""The Perfetto writer's one-pass sort of a flush's row keys (``perfetto/keysort.py``): the order
``np.lexsort`` gives, whichever way the keys pack (one int64, a complex, or not at all)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamacpp_instr.converters.formats.perfetto import keysort
from llamacpp_instr.converters.formats.perfetto.keysort import key_sort

pytestmark = pytest.mark.fast

# timestamps: a flush's few ms, a long session's range, or all of int64 (nothing packs)
_TS = st.sampled_from([(0, 10**6), (10**15, 10**15 + 10**13), (-(2**63), 2**63 - 1)])


def _keys(rng: np.random.Generator, n: int, ts: tuple[int, int]) -> list[np.ndarray]:
    batch = np.sort(rng.integers(0, 5, n))
    t = rng.integers(ts[0], ts[1], n, dtype=np.int64, endpoint=True)
    if n:
        t[rng.random(n) < 0.3] = t[0]  # (ties on the timestamp: the other columns decide)
    rank = rng.integers(0, 3, n)
    tie = rng.integers(-6, 7, n)
    seq = rng.permutation(n).astype(np.int64)  # (distinct: every key is)
    return [batch, t, rank, tie, seq]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1), st.integers(0, 300), _TS)
def test_key_sort_is_lexsort(seed: int, n: int, ts: tuple[int, int]) -> None:
    keys = _keys(np.random.default_rng(seed), n, ts)
    assert key_sort(keys).tolist() == np.lexsort(keys[::-1]).tolist()


def test_each_packing_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The three ways are each used (and each gives lexsort's order)."""
    rng = np.random.default_rng(7)
    seen: list[str] = []
    real = np.argsort

    def argsort(a: np.ndarray, **kw: object) -> np.ndarray:
        seen.append(a.dtype.kind)
        return real(a, **kw)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(keysort.np, "argsort", argsort)
    for ts, kind in [((0, 10**6), "i"), ((0, 2**48), "c"), ((-(2**63), 2**63 - 1), None)]:
        seen.clear()
        keys = _keys(rng, 200, ts)
        assert key_sort(keys).tolist() == np.lexsort(keys[::-1]).tolist()
        assert seen == ([kind] if kind else [])
