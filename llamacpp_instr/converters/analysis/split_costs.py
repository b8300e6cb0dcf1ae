"""What running on several devices cost in measured runs, beyond the ops: what ``instr predict``
adds to a setting whose graph ggml's scheduler splits across devices.

- **A split's host time beyond its ops:** ggml's scheduler hands each split to its device and
  waits for it; the host time from launch to end, less the ops the device timed in it, is what a
  split costs on that device beyond its ops (a GPU's command buffers, submission and fence; on
  lavapipe, the driver's own work on the same cores). Per device and kind of step (prompt or
  generation), the median over the logs' splits.
- **A copy between devices:** each input the scheduler copied to a split's device, timed on the
  host, fitted per link (source and destination device) as ``fixed + bytes * per_byte`` by least
  squares, or, from one size, scaled from it.

Both from the ``splits`` and ``copies`` tables of a log on several devices (``frames_devices``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Link:
    """A copy's host time over one link: ``fixed + per_byte * bytes`` (ns)."""

    fixed: float
    per_byte: float
    n: int

    def time(self, n_bytes: float) -> float:
        return self.fixed + self.per_byte * n_bytes


@dataclass
class SplitCosts:
    """Per (device, kind): a split's host time beyond its ops; per (source, destination): a
    copy's time."""

    extra: dict[tuple[str, str], float] = field(default_factory=dict)
    links: dict[tuple[str, str], Link] = field(default_factory=dict)


def _link(sizes: np.ndarray, durs: np.ndarray) -> Link:
    if len(np.unique(sizes)) >= 2:
        slope, intercept = np.polyfit(sizes.astype(np.float64), durs.astype(np.float64), 1)
        if slope > 0 and intercept >= 0:
            return Link(fixed=float(intercept), per_byte=float(slope), n=len(sizes))
    fixed = float(np.min(durs))
    mean_b = float(np.mean(sizes))
    per_byte = max(float(np.mean(durs)) - fixed, 0.0) / mean_b if mean_b > 0 else 0.0
    return Link(fixed=fixed, per_byte=per_byte, n=len(sizes))


def fit(sessions: Iterable[Any]) -> SplitCosts:
    """The split and copy costs of the sessions that ran on several devices."""
    extras: dict[tuple[str, str], list[float]] = defaultdict(list)
    copies: dict[tuple[str, str], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for sf in sessions:
        splits = getattr(sf, "splits", None)
        if splits is None or splits.empty or sf.ops.empty or "device" not in sf.ops.columns:
            continue
        kinds = sf.steps.set_index("step")["kind"].astype(str)
        ops = sf.ops
        by_compute = {k: g for k, g in ops.groupby(["step", "ubatch"], sort=False)}
        for row in splits.itertuples(index=False):
            g = by_compute.get((row.step, row.ubatch))
            if g is None:
                continue
            nodes = g["node"].to_numpy()
            mine = (nodes >= row.node_start) & (nodes < row.node_end)
            op_ns = float(g["dur_ns"].to_numpy()[mine].sum())
            kind = str(kinds.get(row.step, ""))
            extras[(str(row.device), kind)].append(max(float(row.launch_ns) - op_ns, 0.0))
        cp = getattr(sf, "copies", None)
        if cp is not None and not cp.empty:
            for (src, dst), rows in cp.groupby(["src", "dst"], sort=False, observed=True):
                b, d = copies[(str(src), str(dst))]
                b += rows["bytes"].astype(float).tolist()
                d += rows["dur_ns"].astype(float).tolist()
    out = SplitCosts()
    out.extra = {k: float(np.median(v)) for k, v in extras.items() if v}
    out.links = {k: _link(np.asarray(b), np.asarray(d)) for k, (b, d) in copies.items() if b}
    return out


def host_time(sf: Any) -> dict[tuple[int, int], float]:
    """Per compute (step, ubatch), the host time its splits took, inputs included: what a
    step's time beyond them is made of (graph build, inputs, outputs)."""
    splits = getattr(sf, "splits", None)
    if splits is None or splits.empty:
        return {}
    t = (splits["t_end"] - splits["t_start"]).astype(float)
    return {
        (int(s), int(u)): float(v)
        for (s, u), v in t.groupby([splits["step"], splits["ubatch"]]).sum().items()
    }
