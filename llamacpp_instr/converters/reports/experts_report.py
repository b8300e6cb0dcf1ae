"""``instr experts``: a mixture of experts' routing per layer, as a report (issue 52 §5).

The figures are ``analysis.experts``'; this module lays them out: a table per layer (tokens,
imbalance, entropy, share of experts each ubatch touched, the hottest experts), and a heatmap of
each expert's share of its layer's tokens (SVG in the HTML report)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..analysis.experts import LayerRouting, layer_routing
from ..errors import UserError
from ..session.experts import NO_ROUTING
from .report import Chart, Column, Fact, Report, Section, Table

if TYPE_CHECKING:  # pandas loads with the frames, not with this module
    from ..analysis.frames import SessionFrames

COLUMNS = [
    Column("layer", "layer", "int"),
    Column("tokens", "tokens routed", "int"),
    Column("imbalance", "imbalance (max/mean)", "f2"),
    Column("entropy_bits", "entropy (bits)", "f2"),
    Column("touched_pct", "experts touched per ubatch (%)", "f1"),
    Column("touched_gen_pct", "... per generation step (%)", "f1"),
    Column("hottest", "hottest experts (share of tokens)"),
]


def _row(lr: LayerRouting) -> dict[str, Any]:
    return {
        "layer": lr.layer,
        "tokens": lr.tokens,
        "imbalance": lr.imbalance,
        "entropy_bits": lr.entropy_bits,
        "touched_pct": 100 * lr.touched,
        "touched_gen_pct": None if lr.touched_gen is None else 100 * lr.touched_gen,
        "hottest": ", ".join(f"{e} ({100 * s:.0f}%)" for e, s in lr.hottest),
    }


def experts_report(f: SessionFrames, log: Any = "the log") -> Report:
    """Per layer: the experts' load, imbalance, entropy, share touched, hottest experts. A log
    without routing records is a ``UserError`` (one line)."""
    n_expert, layers = layer_routing(f)
    if not layers:
        raise UserError(NO_ROUTING.format(log=log))
    heat = Chart(
        name="expert_load",
        kind="heatmap",
        title="Each expert's share of its layer's tokens (%)",
        x_label="expert",
        y_label="layer",
        categories=[str(lr.layer) for lr in layers],
        columns=[str(e) for e in range(n_expert)],
        matrix=[[100 * c / lr.tokens if lr.tokens else 0.0 for c in lr.load] for lr in layers],
        value_fmt="f1",
    )
    worst = max(layers, key=lambda lr: lr.imbalance)
    n_steps = len(set(f.experts["step"].tolist()))
    section = Section(
        "Routing per layer",
        facts=[
            Fact("experts per layer", n_expert, "int"),
            Fact("layers with routing", len(layers), "int"),
            Fact("steps with routing", n_steps, "int"),
            Fact("most uneven layer", f"{worst.layer} ({worst.imbalance:.2f}x the mean)"),
            Fact("entropy if even (bits)", math.log2(n_expert), "f2"),
        ],
        charts=[heat],
        tables=[Table("layers", "Layers", COLUMNS, [_row(lr) for lr in layers])],
        text=(
            "imbalance: the busiest expert's tokens over the mean; entropy: of the routing over "
            "the experts, in bits; touched: the share of the layer's experts a ubatch routed to "
            "(what its expert matmuls read). One MUL_MAT_ID computes all its experts: no time "
            "per expert is measured."
        ),
    )
    return Report(
        title=f"Expert routing of session {f.info.sid}",
        subtitle=f"{n_expert} experts, {len(layers)} layers, {n_steps} steps",
        sections=[section],
        data={
            "n_expert": n_expert,
            "steps": sorted(set(f.experts["step"].tolist())),
            "layers": [lr.row() for lr in layers],
        },
        csv_table="layers",
    )
