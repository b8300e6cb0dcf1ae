"""A mixture of experts' routing, per layer, from ``SessionFrames.experts`` (issue 52 §5): the load
of each expert (tokens routed to it over the session's steps), how uneven it is (the busiest
expert's tokens over the mean, and the entropy of the routing in bits), the share of the layer's
experts each ubatch touched (what a MUL_MAT_ID had to read), and the hottest experts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas loads with the frames, not with this module
    from .frames import SessionFrames

HOTTEST = 3


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
    by_step: list[list[int]] = field(default_factory=list)  # per step in order: load per expert

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


def layer_routing(f: SessionFrames) -> tuple[int, list[LayerRouting]]:
    """The model's experts per layer and each recorded layer's routing (empty without routing)."""
    ex = f.experts
    if ex.empty:
        return 0, []
    # the records' n_expert (an expert no token went to has no row)
    n_expert = max(int(ex.attrs.get("n_expert", 0)), int(ex["expert"].max()) + 1)
    steps = sorted(set(ex["step"].tolist()))
    step_pos = {s: i for i, s in enumerate(steps)}
    gen = set(f.steps.loc[f.steps["kind"] == "gen", "step"].tolist()) if len(f.steps) else set()
    out = []
    for layer, g in ex.groupby("layer", sort=True):
        load = [0] * n_expert
        weight = [0.0] * n_expert
        by_step = [[0] * n_expert for _ in steps]
        for step, e, t, w in zip(g["step"], g["expert"], g["tokens"], g["weight"], strict=True):
            load[int(e)] += int(t)
            weight[int(e)] += float(w)
            by_step[step_pos[int(step)]][int(e)] += int(t)
        per_ub = g.groupby(["step", "ubatch"])["expert"].nunique()
        shares = (per_ub / n_expert).tolist()
        gen_shares = [
            v / n_expert
            for (step, _), v in per_ub.items()  # type: ignore[misc]
            if int(step) in gen
        ]
        total = sum(load)
        mean = total / n_expert
        out.append(
            LayerRouting(
                layer=int(layer),  # type: ignore[call-overload]
                n_expert=n_expert,
                tokens=total,
                load=load,
                weight=weight,
                imbalance=max(load) / mean if mean else 0.0,
                entropy_bits=entropy_bits(load),
                touched=sum(shares) / len(shares) if shares else 0.0,
                touched_gen=sum(gen_shares) / len(gen_shares) if gen_shares else None,
                by_step=by_step,
            )
        )
    return n_expert, out
