"""The per-layer error of quantized models (``llamacpp_instr.running.quant.layers``) as report sections."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..report import Chart, Column, Fact, Report, Section, Series, Table

COLUMNS = [
    Column("layer", "layer", "int"),
    Column("l_out_rel_rms", "residual rel. RMS error", "f4"),
    Column("l_out_cosine", "residual cosine", "f4"),
    Column("growth", "growth over previous layer", "f4"),
    Column("attn_out_rel_rms", "attention output rel. RMS error", "f4"),
    Column("ffn_out_rel_rms", "FFN output rel. RMS error", "f4"),
]


def layers_sections(result: dict[str, Any], base: str) -> list[Section]:
    """A chart of the residual stream's error per layer (every model), then a section per model
    naming the layer where the error grows most, with the per-layer table."""
    models = result["models"]
    if not models or not models[0]["layers"]:
        return []
    layers = [r["layer"] for r in models[0]["layers"]]
    chart = Chart(
        name="layer_error",
        kind="line",
        title=f"Relative RMS error of the residual stream after each layer, vs {base}",
        x_label="layer",
        y_label="||Q - B|| / ||B||",
        x=[float(x) for x in layers],
        series=[
            Series(Path(m["path"]).name, [float(r.get("l_out_rel_rms", 0.0)) for r in m["layers"]])
            for m in models
        ],
        value_fmt="f4",
        note=f"Over {result['tokens']} tokens; the same tokens for every model.",
    )
    split = Chart(
        name="layer_error_split",
        kind="bars",
        title=f"Where the error comes out of each layer: {Path(models[0]['path']).name}",
        x_label="relative RMS error of the block's output",
        y_label="layer",
        categories=[f"layer {x}" for x in layers],
        series=[
            Series(
                "attention output",
                [float(r.get("attn_out_rel_rms", 0.0)) for r in models[0]["layers"]],
            ),
            Series(
                "FFN output", [float(r.get("ffn_out_rel_rms", 0.0)) for r in models[0]["layers"]]
            ),
        ],
        value_fmt="f4",
    )
    out = [
        Section(
            "Where the error enters",
            text="Each model and the base run the same tokens; the outputs of every layer are "
            "copied natively while the graph runs and compared: relative RMS error ||Q-B||/||B|| "
            "and cosine similarity.",
            charts=[chart, split],
        )
    ]
    for m in models:
        name = Path(m["path"]).name
        out.append(
            Section(
                f"Per layer: {name}",
                facts=[
                    Fact("error grows most at layer", m["worst_layer"]),
                    Fact("by (relative RMS error)", m["worst_growth"], "f4"),
                    Fact("residual error after the last layer", m["final_rel_rms"], "f4"),
                ],
                tables=[Table("layer_error", f"Per layer, vs {base}", COLUMNS, m["layers"])],
            )
        )
    return out


def layers_report(result: dict[str, Any], base: str) -> Report:
    return Report(
        title="Where the quantization error enters",
        subtitle=f"vs {base}",
        sections=layers_sections(result, base),
        data=result,
        csv_table="layer_error",
    )
