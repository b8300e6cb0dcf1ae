"""The interval of a prediction (``instr predict``, ``instr plan``): a 95 % prediction interval
made of the logs themselves, predicted from each other.

Leave one out over the logs (``op_fit._held_out``): each log's setting is predicted by the model
of the other logs alone, where they cover it, and ``r`` is the natural log of its measured time
over that prediction. With ``n`` such residuals, the interval is the prediction times
``exp(+-t975(n) * s)``, ``s = sqrt(mean(r^2))``: the residuals' spread about 0 (a bias widens it
rather than being corrected), ``t975`` Student's t distribution's 97.5th percentile at ``n``
degrees of freedom: the two-sided 95 % prediction interval of one more residual where they are
normal with mean 0, the spread estimated from ``n`` of them (few logs, a wide interval). A
residual includes the held-out run's own noise (another process slowing it), as the setting's
run will. 95 % and not 90 %: a 90 % interval holds 90 % of the time on average, so less often on
about half of the grids, where the aim is that at least 90 % hold on every grid (as the
distribution-free jackknife+ at 95 % guarantees 90 %); each grid's coverage is in
docs/accuracy.md (bench/predict.py).

A setting whose attention ops read more KV cells than the logs' did (a deeper context: priced
per KV cell, an extrapolation, or measured at that depth by the probe, ``kv_probe``, whose time
is added as measured rather than scaled by the logs' level) is at least ``BENCH_DEPTH_HALF`` each
way, the model's error on the bench's depth grid.

A thread count no log ran (``op_threads``): where logs at another thread count than the others'
were held out (each priced from the others' count with the peaks of both), their residuals
(``held_out_threads``) make the interval as above; otherwise it is the model's error across
thread counts on ``bench/predict.py``'s thread grid, ``BENCH_THREADS_HALF`` each way (or the
same-thread residuals' half-width, the wider).

Where no log could be held out (one log, or none the others cover), nothing in the logs says how
far a setting not run can be from its price. The interval is then the model's own error on
``bench/predict.py``'s grids, ``BENCH_HALF`` each way (a grid of 2 or 3 cells has no held-out
log either, and the steps' spread alone is narrower than the model's error on it), or the spread
of the measured-over-priced ratio over the logs' own steps (its 10th to 90th percentiles), the
wider; ``basis`` says which kind of interval it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llamacpp_instr.deciding.prediction.op_costs import CostModel

# the half-width (natural log) of an interval no held-out log makes: the 95th percentile of
# |ln(measured / predicted)| over bench/predict.py's predictions on its CPU (both columns),
# Vulkan and RPC grids, which each grid prints (0.16 over today's 80 with the thread grid's;
# busier hours' runs, up to 0.22), rounded up: a +-18 % interval, as the thread and depth grids'
BENCH_HALF = 0.18
# the same across thread counts, and beyond the KV cells the logs read (attention priced per KV
# cell: kv_costs): the half-width bench/predict.py's thread and depth grids check (--threads-grid,
# --depth-grid: two models, one log each; each grid prints the 95th percentile of
# |ln(measured / predicted)| beside it): a +-18 % interval, inside the +-20 % they are held to
BENCH_THREADS_HALF = 0.18
BENCH_DEPTH_HALF = 0.18
# Student's t distribution's 97.5th percentile at 1, 2, ... 30 degrees of freedom (a two-sided
# 95 % interval), as statistics tables give it
T975 = dict(enumerate((
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
), start=1))  # fmt: skip


@dataclass
class Interval:
    value: float
    low: float
    high: float
    # what the interval is made of: "held-out" (the logs predicted from each other, ``held_out``
    # of them) or "bench" (no log could be held out: the model's error on the bench's grids, or
    # the logs' own steps' spread, the wider)
    basis: str = "bench"
    held_out: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "basis": self.basis,
            "held_out": self.held_out,
        }


def t975(dof: int) -> float:
    """Student's t distribution's 97.5th percentile at ``dof`` degrees of freedom (``T975``; the
    table's last, 30's, beyond it: a little wider than the normal's 1.960)."""
    return T975[min(max(dof, 1), len(T975))]


def half_width(residuals: list[float] | None) -> float | None:
    """``t975(n) * sqrt(mean(r^2))`` of ``n`` residuals (module doc); None without any."""
    if not residuals:
        return None
    r = np.asarray(residuals, np.float64)
    return t975(len(r)) * float(np.sqrt(np.mean(r * r)))


def interval(
    tokens: int,
    ns: float,
    model: CostModel,
    kind: str,
    devices: frozenset[str],
    across: bool = False,
    warm: bool = False,
    deeper: bool = False,
    measured: float = 0.0,
) -> Interval:
    """Tokens/s for ``tokens`` in ``ns`` as priced, scaled by the logs' measured time over the
    model's price of it (``CostModel.level`` on the target's ``devices``; ``warm``: of steps
    that did not start their context), plus ``measured`` ns the probe measured rather than the
    model priced (attention beyond the logs' KV cells: ``kv_probe``; not scaled), with its 95 %
    interval (module doc); ``across``: at a thread count no log ran; ``deeper``: attention ops
    priced beyond the KV cells measured."""
    level = model.level(kind, devices, warm) or 1.0
    value = 1e9 * tokens / (ns * level + measured)
    half = half_width(model.held_out.get(kind))
    if deeper:
        half = max(half or 0.0, BENCH_DEPTH_HALF)
    if across:
        over = half_width(model.held_out_threads.get(kind))
        if over is not None:
            n = len(model.held_out_threads[kind])
            return Interval(value, value * np.exp(-over), value * np.exp(over), "held-out", n)
        return _bench(model, kind, value, level, max(BENCH_THREADS_HALF, half or 0.0))
    if half is not None:
        n = len(model.held_out.get(kind, []))
        basis = "held-out" if n else "bench"
        return Interval(value, value * np.exp(-half), value * np.exp(half), basis, n)
    return _bench(model, kind, value, level, BENCH_HALF)


def _bench(model: CostModel, kind: str, value: float, level: float, half: float) -> Interval:
    """The interval no held-out log makes about ``value``: ``half`` each way about the level,
    or the spread of the logs' own steps' measured over priced (10th to 90th percentiles), the
    wider."""
    ratios = model.self_ratios.get(kind)
    base = model.self_level.get(kind)
    if ratios is None or not len(ratios) or not base or base <= 0:
        ratios = np.array([level])
    lo = min(float(np.percentile(ratios, 10)) / level, np.exp(-half))
    hi = max(float(np.percentile(ratios, 90)) / level, np.exp(half))
    return Interval(value=value, low=value / hi, high=value / lo)
