"""A mixture of experts' routing, per layer, from ``SessionFrames.experts``: the load
of each expert (tokens routed to it over the session's steps), how uneven it is (the busiest
expert's tokens over the mean, and the entropy of the routing in bits), the share of the layer's
experts each ubatch touched (what a MUL_MAT_ID had to read), and the hottest experts."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pandas loads with the frames, not with this module
    from .frames import SessionFrames

HOTTEST = 3
# the cells (steps x layers x experts) of the per-step load a report holds at most, or four per
# routing row where the rows are more: beyond it ``load_by_step`` is left out (None), since a log
# of many steps of a few rows each would make it far larger than the log
BY_STEP_CELLS = 1 << 22


@dataclass
class LayerRouting:
    layer: int
    n_expert: int
    tokens: int  # token-expert assignments (a token counts once per expert it went to)
    load: list[int]  # per expert: tokens routed to it over the steps
    weight: list[float]  # per expert: the sum of those tokens' routing weights (NaN: not read)
    imbalance: float  # max over mean of ``load``
    entropy_bits: float  # of the routing distribution (log2 n_expert when perfectly even)
    touched: float  # mean share of the experts each ubatch routed to
    touched_gen: float | None  # the same over generation steps only (None: none)
    # per step with routing, in order: the load per expert (None: over ``BY_STEP_CELLS``)
    by_step: list[list[int]] | None = field(default_factory=list)

    @property
    def hottest(self) -> list[tuple[int, float]]:
        """The busiest experts and their share of the layer's tokens."""
        order = sorted(range(self.n_expert), key=lambda e: (-self.load[e], e))[:HOTTEST]
        return [(e, self.load[e] / self.tokens if self.tokens else 0.0) for e in order]

    def row(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "tokens": self.tokens,
            "imbalance": self.imbalance,
            "entropy_bits": self.entropy_bits,
            "entropy_max_bits": math.log2(self.n_expert),
            "touched_share": self.touched,
            "touched_share_gen": self.touched_gen,
            "hottest": [[e, s] for e, s in self.hottest],
            "load": self.load,
            "weight": [None if math.isnan(w) else w for w in self.weight],
            "load_by_step": self.by_step,
        }


def entropy_bits(counts: list[int]) -> float:
    total = sum(counts)
    if total <= 0:
        return 0.0
    return -sum(c / total * math.log2(c / total) for c in counts if c > 0)


def _runs(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of equal rows of sorted ``keys`` (columns) begins, and its length."""
    n = len(keys[0])
    change = np.zeros(max(n - 1, 0), bool)
    for k in keys:
        change |= k[1:] != k[:-1]
    first = np.flatnonzero(np.r_[True, change]) if n else np.zeros(0, np.int64)
    return first, np.diff(np.r_[first, n])


def layer_routing(f: SessionFrames) -> tuple[int, list[LayerRouting]]:
    """The model's experts per layer and each recorded layer's routing (empty without routing):
    array work over the rows, each layer's tables of ``n_expert`` cells (the records bound the
    experts and layers by their compute's graph)."""
    ex = f.experts
    if ex.empty:
        return 0, []
    # the records' n_expert (an expert no token went to has no row)
    n_expert = max(int(ex.attrs.get("n_expert", 0)), int(ex["expert"].max()) + 1)
    cols = {c: ex[c].to_numpy() for c in ("step", "ubatch", "layer", "expert", "tokens")}
    weight = ex["weight"].to_numpy(dtype=np.float64)
    steps = np.unique(cols["step"])
    gen = set(f.steps.loc[f.steps["kind"] == "gen", "step"].tolist()) if len(f.steps) else set()
    # each layer's load per step, dense, within a budget the rows pay for
    dense = len(steps) * n_expert * len(np.unique(cols["layer"])) <= max(BY_STEP_CELLS, 4 * len(ex))
    # rows by layer, then step, ubatch and expert
    order = np.lexsort((cols["expert"], cols["ubatch"], cols["step"], cols["layer"]))
    layer = cols["layer"][order]
    out = []
    for first, n in zip(*_runs(layer), strict=True):
        k = order[first : first + n]
        step, ub, e, t = (cols[c][k] for c in ("step", "ubatch", "expert", "tokens"))
        load = np.bincount(e, weights=t, minlength=n_expert).astype(np.int64).tolist()
        wsum = np.zeros(n_expert)
        np.add.at(wsum, e, weight[k])
        # per (step, ubatch): the experts it names (each once per ubatch)
        ub_first, ub_n = _runs(step, ub)
        shares = (ub_n / n_expert).tolist()
        gen_shares = [sh for sh, s in zip(shares, step[ub_first].tolist(), strict=True) if s in gen]
        by_step = None
        if dense:
            grid = np.zeros((len(steps), n_expert), np.int64)
            np.add.at(grid, (np.searchsorted(steps, step), e), t)
            by_step = grid.tolist()
        total = sum(load)
        mean = total / n_expert
        out.append(
            LayerRouting(
                layer=int(layer[first]),
                n_expert=n_expert,
                tokens=total,
                load=load,
                weight=wsum.tolist(),
                imbalance=max(load) / mean if mean else 0.0,
                entropy_bits=entropy_bits(load),
                touched=sum(shares) / len(shares) if shares else 0.0,
                touched_gen=sum(gen_shares) / len(gen_shares) if gen_shares else None,
                by_step=by_step,
            )
        )
    return n_expert, out


# a copy's layer: a node of layer N (``ffn_norm-3 (reshaped)``, ``ffn_moe_topk-3``) or a weight of
# block N (``blk.3.ffn_up_exps.weight``: ggml's op offload, copying the experts used)
_COPY_LAYER = re.compile(r"^blk\.(\d+)\.|-(\d+)(?: \(.*\))?$")


@dataclass
class LayerCopies:
    """What the scheduler copied for one layer in one kind of step, per step (mean): to and from
    the device its experts run on, the expert weights among it (op offload) and their share of
    those tensors' bytes (the experts used)."""

    layer: int
    kind: str  # "prompt" or "gen"
    route: str  # "SRC -> DST"
    copies: float
    bytes: float
    time_ns: float
    weight_bytes: float  # of it, expert weights (ggml copies only the experts a ubatch used)
    weight_share: float | None  # weight_bytes over the bytes of the expert tensors copied

    def row(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "kind": self.kind,
            "route": self.route,
            "copies_per_step": self.copies,
            "bytes_per_step": self.bytes,
            "ms_per_step": self.time_ns / 1e6,
            "expert_weight_bytes_per_step": self.weight_bytes,
            "expert_weight_share": self.weight_share,
        }


def layer_copies(f: SessionFrames) -> list[LayerCopies]:
    """Per layer, kind of step and route, the scheduler's copies of the layer's tensors (a log
    on several devices; [] without copies), per step of that kind."""
    cp = f.copies
    if cp is None or cp.empty or f.steps.empty:
        return []
    kinds = dict(zip(f.steps["step"], f.steps["kind"].astype(str), strict=True))
    n_steps: dict[str, int] = {}
    for k in kinds.values():
        n_steps[k] = n_steps.get(k, 0) + 1
    whole = {str(w.get("name")): int(w.get("bytes", 0)) for w in f.info.weights or []}
    acc: dict[tuple[int, str, str], list[float]] = {}
    for step, name, n, src, dst, dur in cp[
        ["step", "tensor", "bytes", "src", "dst", "dur_ns"]
    ].itertuples(False):
        m = _COPY_LAYER.search(str(name))
        kind = kinds.get(int(step))
        if m is None or kind not in ("prompt", "gen"):
            continue
        layer = int(m.group(1) or m.group(2))
        a = acc.setdefault((layer, kind, f"{src} -> {dst}"), [0.0, 0.0, 0.0, 0.0, 0.0])
        a[0] += 1
        a[1] += float(n)
        a[2] += float(dur)
        if m.group(1) is not None and "_exps" in str(name):
            a[3] += float(n)
            a[4] += float(whole.get(str(name), 0))
    out = []
    for (layer, kind, route), (c, b, t, wb, wt) in sorted(acc.items()):
        s = n_steps[kind]
        out.append(
            LayerCopies(
                layer, kind, route, c / s, b / s, t / s, wb / s, wb / wt if wt > 0 else None
            )
        )
    return out
