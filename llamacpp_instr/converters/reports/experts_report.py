"""``instr experts``: a mixture of experts' routing per layer, as a report.

The figures are ``analysis.expert_load``'; this module lays them out: a table per layer (tokens,
imbalance, entropy, share of experts each ubatch touched, the hottest experts), and a heatmap of
each expert's share of its layer's tokens (SVG in the HTML report)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from llamacpp_instr.contract.errors import UserError

from ..analysis.expert_load import LayerCopies, LayerRouting, layer_copies, layer_routing
from ..session.expert_routing import no_routing
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
        from .memory_report import expert_tensors

        levels = set(f.steps["level"].astype(str)) if len(f.steps) else set()
        level = "detailed" if levels & {"detailed", "verbose"} else str(f.info.level)
        raise UserError(no_routing(log, level, len(expert_tensors(f))))
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
    moved = layer_copies(f)
    sections = [section] + ([copies_section(moved)] if moved else [])
    return Report(
        title=f"Expert routing of session {f.info.sid}",
        subtitle=f"{n_expert} experts, {len(layers)} layers, {n_steps} steps",
        sections=sections,
        data={
            "n_expert": n_expert,
            "steps": sorted(set(f.experts["step"].tolist())),
            "layers": [lr.row() for lr in layers],
            "copies_by_layer": [c.row() for c in moved],
        },
        csv_table="layers",
    )


COPY_COLUMNS = [
    Column("layer", "layer", "int"),
    Column("kind", "steps"),
    Column("route", "copied"),
    Column("copies_per_step", "copies per step", "f1"),
    Column("bytes_per_step", "bytes per step", "bytes"),
    Column("ms_per_step", "ms per step", "f3"),
    Column("expert_weight_bytes_per_step", "of it expert weights", "bytes"),
    Column("expert_weight_pct", "share of those tensors (%)", "f1"),
]


def copies_section(moved: list[LayerCopies]) -> Section:
    """Per layer, what the scheduler copied between devices for it (the experts on another
    device than the rest: their inputs and outputs, and ggml's op offload of the experts used)."""
    rows = []
    for c in moved:
        r = c.row()
        share = c.weight_share
        r["expert_weight_pct"] = None if share is None else 100 * share
        rows.append(r)
    return Section(
        "What moved, per layer",
        tables=[Table("copies_by_layer", "Copies per layer and step", COPY_COLUMNS, rows)],
        text=(
            "the scheduler's copies of each layer's tensors (patch 0003's record: host time of "
            "each copy, its bytes), per step of each kind; expert weights are copied where an op "
            "runs on another device than they are held on (ggml's op offload, a large ubatch), "
            "only the experts that ubatch used: their share of the tensors' bytes"
        ),
    )
