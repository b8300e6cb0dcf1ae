"""The statistics of ``instr quant-eval`` (``llamacpp_instr.running.quant.evaluate``, whose module doc defines
them), as llama-perplexity's ``--kl-divergence`` computes them: numpy only."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llamacpp_instr.contract.errors import UserError

# llama.cpp skips base probabilities below e^-16 in the KL divergence sum
LOG_PROB_CUTOFF = -16.0
# llama.cpp's base file keeps logits down to (max logit - 16) and floors the rest there
STORED_LOGIT_RANGE = 16.0
# (JSON key, fraction) of the KLD percentiles reported, as llama-perplexity prints them
PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p90", 0.90),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p99_9", 0.999),
)
# bins of equal width over a chunk's positions for the KL divergence by context position
POSITION_BINS = 8


def mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    """llama.cpp's ``mean_and_uncertainty``: the mean and the standard error of the mean."""
    if count < 1:
        return 0.0, 0.0
    f = total / count
    df = total2 / count - f * f
    df = math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0
    return f, df


def covariance(suma: float, sumb: float, sumab: float, count: int) -> float:
    """llama.cpp's ``covariance``: the covariance of the two means."""
    if count < 10:
        return 0.0
    return (sumab / count - (suma / count) * (sumb / count)) / (count - 1)


def median(sorted_values: np.ndarray) -> float:
    n = len(sorted_values)
    if n % 2 == 0:
        return float(0.5 * (sorted_values[n // 2] + sorted_values[n // 2 - 1]))
    return float(sorted_values[n // 2])


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """llama.cpp's ``percentile``: linear interpolation at ``fraction * (n - 1)``, in float32."""
    n = len(sorted_values)
    if fraction <= 0:
        return float(sorted_values[0])
    if fraction >= 1:
        return float(sorted_values[-1])
    p = float(np.float32(fraction) * np.float32(n - 1))
    ip = int(p)
    p -= ip
    return float((1 - p) * sorted_values[ip] + p * sorted_values[min(ip + 1, n - 1)])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (max subtracted first, as llama.cpp does)."""
    x = logits.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    return x


@dataclass
class Accumulator:
    """The running sums of one quant against the base (llama.cpp's ``kl_divergence_result``) and
    the per-token KLD and dp values (for the median and percentiles)."""

    capacity: int
    sum_nll: float = 0.0
    sum_nll2: float = 0.0
    sum_nll_base: float = 0.0
    sum_nll_base2: float = 0.0
    sum_nll_nll_base: float = 0.0
    # the same three over the base's exact nll (not capped as in llama.cpp's base file)
    sum_nll_exact_base: float = 0.0
    sum_nll_exact_base2: float = 0.0
    sum_nll_nll_exact_base: float = 0.0
    sum_kld: float = 0.0
    sum_kld2: float = 0.0
    sum_p_diff: float = 0.0
    sum_p_diff2: float = 0.0
    sum_p_diff4: float = 0.0
    n_same_top: int = 0
    count: int = 0
    kld: np.ndarray = field(init=False)
    p_diff: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.kld = np.zeros(self.capacity, dtype=np.float64)
        self.p_diff = np.zeros(self.capacity, dtype=np.float64)

    def add(
        self,
        nll: np.ndarray,
        nll_base: np.ndarray,
        nll_base_stored: np.ndarray,
        kld: np.ndarray,
        same_top: np.ndarray,
        p_diff: np.ndarray,
    ) -> None:
        n = len(nll)
        self.sum_nll += float(np.sum(nll))
        self.sum_nll2 += float(np.sum(nll * nll))
        self.sum_nll_base += float(np.sum(nll_base_stored))
        self.sum_nll_base2 += float(np.sum(nll_base_stored * nll_base_stored))
        self.sum_nll_nll_base += float(np.sum(nll * nll_base_stored))
        self.sum_nll_exact_base += float(np.sum(nll_base))
        self.sum_nll_exact_base2 += float(np.sum(nll_base * nll_base))
        self.sum_nll_nll_exact_base += float(np.sum(nll * nll_base))
        self.sum_kld += float(np.sum(kld))
        self.sum_kld2 += float(np.sum(kld * kld))
        p2 = p_diff * p_diff
        self.sum_p_diff += float(np.sum(p_diff))
        self.sum_p_diff2 += float(np.sum(p2))
        self.sum_p_diff4 += float(np.sum(p2 * p2))
        self.n_same_top += int(np.count_nonzero(same_top))
        self.kld[self.count : self.count + n] = kld
        self.p_diff[self.count : self.count + n] = p_diff
        self.count += n

    def summary(self) -> dict[str, Any]:
        """The statistics llama-perplexity prints at the end of a ``--kl-divergence`` run."""
        n = self.count
        if n < 2:
            raise UserError(f"only {n} token(s) scored: too few for statistics")
        log_ppl, log_ppl_err = mean_and_uncertainty(self.sum_nll, self.sum_nll2, n)
        log_base, log_base_err = mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, n)
        cov = covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, n)
        ratio_var = log_ppl_err**2 + log_base_err**2 - 2.0 * cov
        exact, exact_err = mean_and_uncertainty(
            self.sum_nll_exact_base, self.sum_nll_exact_base2, n
        )
        exact_cov = covariance(
            self.sum_nll, self.sum_nll_exact_base, self.sum_nll_nll_exact_base, n
        )
        exact_var = log_ppl_err**2 + exact_err**2 - 2.0 * exact_cov
        kld_mean, kld_err = mean_and_uncertainty(self.sum_kld, self.sum_kld2, n)
        values = np.sort(self.kld[:n])
        dp_mean, dp_err = mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, n)
        mse, mse_err = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, n)
        rms = math.sqrt(mse)
        same = self.n_same_top / n
        kld: dict[str, float] = {"mean": kld_mean, "mean_err": kld_err, "median": median(values)}
        for key, frac in PERCENTILES:
            kld[key] = percentile(values, frac)
        kld["max"] = float(values[-1])
        kld["min"] = float(values[0])
        return {
            "ppl": math.exp(log_ppl),
            "ppl_err": math.exp(log_ppl) * log_ppl_err,
            "ln_ppl_ratio": log_ppl - log_base,
            "ln_ppl_ratio_err": math.sqrt(max(ratio_var, 0.0)),
            "ppl_ratio": math.exp(log_ppl - log_base),
            "ln_ppl_ratio_exact": log_ppl - exact,
            "ln_ppl_ratio_exact_err": math.sqrt(max(exact_var, 0.0)),
            "kld": kld,
            "delta_p": {
                "mean": dp_mean,
                "mean_err": dp_err,
                "rms": rms,
                "rms_err": 0.5 / rms * mse_err if rms > 0 else 0.0,
                "max_abs": float(np.max(np.abs(self.p_diff[:n]))),
            },
            "same_top_p": 100.0 * same,
            "same_top_p_err": 100.0 * math.sqrt(same * (1.0 - same) / (n - 1)),
            "base_ppl": math.exp(log_base),
        }


@dataclass
class ByPosition:
    """One quant's KL divergence summed per chunk position over the chunks: positions ``start ..
    start + n - 1`` (the logits at position ``p`` predicting the token at ``p + 1``)."""

    n: int
    start: int = 0
    sum_kld: np.ndarray = field(init=False)
    sum_kld2: np.ndarray = field(init=False)
    chunks: int = 0

    def __post_init__(self) -> None:
        self.sum_kld = np.zeros(self.n, dtype=np.float64)
        self.sum_kld2 = np.zeros(self.n, dtype=np.float64)

    def add(self, first: int, kld: np.ndarray) -> None:
        """The KLD of positions ``first .. first + len(kld) - 1`` of one chunk."""
        i = first - self.start
        self.sum_kld[i : i + len(kld)] += kld
        self.sum_kld2[i : i + len(kld)] += kld * kld

    def bins(self, n_bins: int = POSITION_BINS) -> list[dict[str, Any]]:
        """Bins of equal width over the positions: first and last position, tokens, the mean KLD
        and its uncertainty (``mean_and_uncertainty``)."""
        edges = np.linspace(0, self.n, min(n_bins, self.n) + 1).round().astype(int)
        out = []
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            count = int(b - a) * self.chunks
            mean, err = mean_and_uncertainty(
                float(self.sum_kld[a:b].sum()), float(self.sum_kld2[a:b].sum()), count
            )
            at = (int(a) + self.start, int(b - 1) + self.start)
            out.append({"first": at[0], "last": at[1], "tokens": count, "mean": mean, "err": err})
        return out


def compare_block(
    base_logits: np.ndarray, quant_logits: Sequence[np.ndarray], targets: np.ndarray
) -> tuple[np.ndarray, list[tuple[np.ndarray, ...]]]:
    """Per-token values of a block of rows: the base's nll, and for each quant (nll, nll_base,
    nll_base_stored, kld, same_top, p_diff)."""
    rows = np.arange(len(targets))
    lb = log_softmax(base_logits)
    nll_base = -lb[rows, targets]
    top_base = np.argmax(base_logits, axis=1)
    # llama.cpp's base file floors log-probabilities at (max logit - 16) - log-sum-exp: the
    # base's nll as the second pass reads it is capped at 16 + lse (lse = -log p of the top token)
    nll_base_stored = np.minimum(nll_base, STORED_LOGIT_RANGE - lb[rows, top_base])
    pb = np.exp(lb)
    pb[lb <= LOG_PROB_CUTOFF] = 0.0
    out: list[tuple[np.ndarray, ...]] = []
    for ql in quant_logits:
        lq = log_softmax(ql)
        nll = -lq[rows, targets]
        np.subtract(lb, lq, out=lq)  # log p - log q, in place: one temporary fewer
        kld = np.einsum("ij,ij->i", pb, lq)
        del lq
        same_top = np.argmax(ql, axis=1) == top_base
        p_diff = np.exp(-nll) - np.exp(-nll_base)
        out.append((nll, nll_base, nll_base_stored, kld, same_top, p_diff))
    return nll_base, out
