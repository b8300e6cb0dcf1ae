"""Does a log come from a busy machine? The verdict from its steps table.

On a quiet machine, steps of the same shape take about the same time; on a machine whose cores
another process holds, some of them wait for a core and take many times longer (the first log a
user made here: a 7 ms step with a p50 of 223 ms and a p90 of 3.3 s). Every figure from such a
log is then an upper bound on time, and a prediction priced from it is unreliable.

The rule:

- Steps are compared with steps of the same shape only: the same kind (prompt, generation), the
  same context, the same number of tokens, and a KV position in the same power-of-two band
  (positions 64 to 127, say), so that a growing KV cache never makes a quiet step look slow: a
  step's work grows with its position at most twice within a band.
- A step is *slow* at more than ``SLOW`` (3) times its group's fast steps, the group's 10th
  percentile (groups of at least ``MIN_GROUP`` steps; a smaller one has no meaningful
  percentile): its fast steps are those no other process delayed, where the median of a machine
  busy most of the time is itself delayed (the user's log above: 30 times the step's own time).
- A kind (generation, prompt) is flagged when at least ``MIN_STEPS`` (8) of its steps are in
  such groups and at least ``SLOW_SHARE`` (10 %) of them, and two at least, are slow. A group's
  first ``WARMUP`` (2) steps are never counted slow: they warm up, not wait (the first touches
  the weights; ggml's CUDA backend runs a graph's first two computes uncaptured, loading each
  kernel's code at its first launch, and captures the graph on the second: on an H200 a 1B's
  first two decode steps took 3 to 15 times the others).
- The figures shown: that share; the kind's p90/p50 of the steps' durations over their group's
  median; and p50/p10, its groups' medians over their fast steps (the median of those ratios).
  A quiet machine's are both under ``QUIET_P90`` (1.5); a contended one's many times that,
  either one (p90/p50 was 3 to 10, with 13 to 18 of 63 steps slow, in runs of SmolLM2 on 2
  threads against 4 processes burning the same 2 cores 150 ms of every 200).

No committed fixture (tests/fixtures) is flagged: most have at most 3 steps of one shape (too
few to tell); the CUDA ones have 15 generation steps, of which only the first two are slow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

SLOW = 3.0  # a slow step: over this many times its group's 10th percentile
SLOW_SHARE = 0.10  # a kind is flagged with this share of its steps slow (and 2 at least)
MIN_GROUP = 3  # steps of one shape needed for a median
MIN_STEPS = 8  # steps of a kind in such groups needed for a verdict
QUIET_P90 = 1.5  # p90/p50 of a quiet machine's steps of one shape: under this
WARMUP = 2  # a group's first steps, never counted slow

KIND_NAMES = {"gen": "generation", "prompt": "prompt"}


@dataclass
class KindSpread:
    """One kind's steps against their groups' medians."""

    kind: str
    steps: int  # steps in groups of MIN_GROUP or more
    slow: int  # of them, over SLOW times their group's 10th percentile
    p90_p50: float  # p90 of the steps' durations over their group's median
    p50_fast: float  # the median step's duration over its group's 10th percentile
    flagged: bool

    def row(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "steps": self.steps,
            "slow_steps": self.slow,
            "p90_over_p50": round(self.p90_p50, 3),
            "p50_over_p10": round(self.p50_fast, 3),
            "flagged": self.flagged,
        }


@dataclass
class Contention:
    """The verdict: ``flagged`` when some kind's steps spread like a contended machine's."""

    kinds: list[KindSpread] = field(default_factory=list)

    @property
    def flagged(self) -> bool:
        return any(k.flagged for k in self.kinds)

    def line(self) -> str:
        """What the figures are worth, in one line ("" for a log not flagged)."""
        bad = [k for k in self.kinds if k.flagged]
        if not bad:
            return ""
        spreads = "; ".join(
            f"{KIND_NAMES.get(k.kind, k.kind)} p90/p50 = {k.p90_p50:.1f}, p50/p10 = "
            f"{k.p50_fast:.1f}, {k.slow} of {k.steps} steps over {SLOW:g}x the fastest tenth's time"
            for k in bad
        )
        return (
            f"steps spread like a contended machine's: {spreads} (a quiet machine: both under "
            f"{QUIET_P90:g}, none over {SLOW:g}x); figures from this log are upper bounds "
            "on time, predictions from it are unreliable: rerun on an idle machine"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "flagged": self.flagged,
            "note": self.line(),
            "by_kind": [k.row() for k in self.kinds],
        }


def _band(pos0: pd.Series) -> np.ndarray:
    """The power-of-two band of each step's first KV position (0 and 1: band 0)."""
    p = np.maximum(pos0.fillna(0).to_numpy(np.float64), 1.0)
    return np.floor(np.log2(p)).astype(np.int64)


def verdict(steps: pd.DataFrame) -> Contention:
    """The verdict on a session's steps table (``SessionFrames.steps``)."""
    out = Contention()
    if steps.empty or "dur_ns" not in steps:
        return out
    s = steps
    if "status" in s:
        s = s[s["status"].fillna(0).astype("int64") == 0]
    s = s[s["dur_ns"].fillna(0) > 0]
    if s.empty:
        return out
    kind = s["kind"].astype(str)
    keys = pd.DataFrame(
        {
            "kind": kind.to_numpy(),
            "ctx": s["ctx"].fillna(-1).to_numpy() if "ctx" in s else 0,
            "n": s["n_tokens"].fillna(0).to_numpy(),
            "band": _band(s["pos0"]) if "pos0" in s else 0,
            "dur": s["dur_ns"].to_numpy(np.float64),
        }
    )
    g = keys.groupby(["kind", "ctx", "n", "band"], sort=False)["dur"]
    keys["median"] = g.transform("median")
    keys["fast"] = g.transform(lambda d: float(np.percentile(d, 10)))
    keys["size"] = g.transform("size")
    keys["nth"] = g.cumcount()  # (the steps table is in step order)
    keys = keys[keys["size"] >= MIN_GROUP]
    for k in ("gen", "prompt"):
        rows = keys[keys["kind"] == k]
        if rows.empty:
            continue
        spread = (rows["dur"] / rows["median"]).to_numpy()
        slow = int(((rows["dur"] > SLOW * rows["fast"]) & (rows["nth"] >= WARMUP)).sum())
        p90 = float(np.percentile(spread, 90)) / float(np.percentile(spread, 50))
        p50 = float(np.median((rows["median"] / rows["fast"]).to_numpy()))
        flagged = len(spread) >= MIN_STEPS and slow >= max(2, SLOW_SHARE * len(spread))
        out.kinds.append(KindSpread(k, len(spread), slow, p90, p50, flagged))
    return out
