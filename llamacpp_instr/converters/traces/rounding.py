"""Python's ``round(v, 3)`` for arrays of floats, as both trace writers show op rates (and for
one float, ``op_args.mb_per_s``: a copy's or an RPC command's rate, with ``ROUNDER``).

``round3`` gives each value exactly as Python rounds it, or NaN where numpy cannot be sure: the
writers then ask Python for those few (``op_args.op_rates``).

Why it is exact elsewhere: ``p = fl(v * 1000)`` is within ``|p| * 2**-53`` of the exact product
(one rounding to nearest). If ``p`` is farther than that from a half-integer, the exact product
rounds to the same integer ``N`` as ``p``, and ``N / 1000`` (one correctly rounded division) is
the double nearest the decimal ``N/1000``: Python's result. The margin used is 2**-50, eight
times the error bound (the two writers had 2**-50 and 2**-51: both safe; the wider one is kept,
and only a few more values near a boundary go to Python, which rounds them the same). The
distance ``p - floor(p) - 0.5`` is computed exactly for ``|p| < 2**50``; larger values go to
Python too.
"""

from __future__ import annotations

import numpy as np

EXACT = 1 << 53  # integers up to this convert to float64 exactly
ROUNDER = 1.5 * 2.0**52  # x + ROUNDER - ROUNDER: x rounded to an integer, for 0 <= x < 2**51
MARGIN = 2.0**-50  # relative distance from a rounding boundary below which Python decides


def round3(x: np.ndarray) -> np.ndarray:
    """``round(v, 3)`` of each value as Python rounds it, or NaN where that is not certain."""
    p = x * 1000.0
    y = np.rint(p) / 1000.0
    margin = np.abs(p - np.floor(p) - 0.5)
    unsafe = (margin <= np.abs(p) * MARGIN) | (np.abs(p) >= 2.0**50)
    return np.where(unsafe, np.nan, y)


def exact_float(v: int) -> float:
    """``float(v)`` if ``0 <= v <= EXACT`` (exact), else 0.0 (the caller asks Python then)."""
    return float(v) if 0 <= v <= EXACT else 0.0
