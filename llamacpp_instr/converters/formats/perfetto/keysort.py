"""The order of a flush's rows by their keys (batch, ts, rank, tie, seq), as ``np.lexsort`` gives
it, sorted in one pass where the keys pack into one number.

``np.lexsort`` sorts by each of the five columns in turn. ``merge``'s rows come in long runs
already in key order (the single rows, then each template's blocks one after another), which one
stable sort (timsort) of a single key merges in less time (rpc-smol, 34k rows a flush: 0.65 ->
0.2 ms; the general encoder's rows, begins then ends, sort no faster so). Each column is
taken from its least value within its range (mixed radix): the whole key in one int64 where the
ranges' product allows (a flush of a few steps: well under 2**63), else as a complex number
(batch and ts in its real part, rank, tie and seq in its imaginary part: each below 2**53, so
exact in a float64; numpy orders complex numbers by real part, then imaginary), else the five
passes. The keys are distinct (seq differs within a batch), so any exact order is the order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_EXACT = 1 << 53  # integers below this are exact in a float64
_I64 = 1 << 63


def key_sort(keys: list[Any]) -> Any:
    """The order of the rows whose key columns (int64, most significant first) are ``keys``."""
    n = len(keys[0])
    if n < 2:
        return np.arange(n, dtype=np.intp)
    lows, spans = [], []
    for c in keys:
        lo = int(c.min())
        lows.append(lo)
        spans.append(int(c.max()) - lo + 1)
    total = 1
    for s in spans:
        total *= s
    if total < _I64:
        return np.argsort(_packed(keys, lows, spans, 0, len(keys)), kind="stable")
    split = 2  # (batch, ts) and (rank, tie, seq)
    hi = spans[0] * spans[1]
    lo_span = 1
    for s in spans[split:]:
        lo_span *= s
    if hi <= _EXACT and lo_span <= _EXACT:
        c = np.empty(n, dtype=np.complex128)
        c.real = _packed(keys, lows, spans, 0, split)
        c.imag = _packed(keys, lows, spans, split, len(keys))
        return np.argsort(c, kind="stable")
    return np.lexsort(keys[::-1])


def packed(keys: list[Any]) -> Any:
    """The rows' keys (``keys``: int64 columns, most significant first) as one int64 each, in the
    same order (mixed radix from each column's least value); None where they do not fit."""
    lows, spans = [], []
    total = 1
    for c in keys:
        lo = int(c.min())
        lows.append(lo)
        spans.append(int(c.max()) - lo + 1)
        total *= spans[-1]
    if total >= _I64:
        return None
    return _packed(keys, lows, spans, 0, len(keys))


def _packed(keys: list[Any], lows: list[int], spans: list[int], a: int, z: int) -> Any:
    """Columns ``a`` to ``z`` of ``keys`` as one int64 (mixed radix; it fits, see ``key_sort``)."""
    out = keys[a] - lows[a]
    for j in range(a + 1, z):
        out = out * spans[j] + (keys[j] - lows[j])
    return out
