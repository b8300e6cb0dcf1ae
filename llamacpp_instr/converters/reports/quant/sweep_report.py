"""The quantization sweep (``instr quant-sweep``) as a report: size, speed and quality together,
with the Pareto fronts marked (no other type is both smaller and closer to the base, or both
faster and closer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..report import Chart, Column, Fact, Report, Section, Series, Table

COLUMNS = [
    Column("type", "type"),
    Column("bytes", "file size", "bytes"),
    Column("bpw", "bits per weight", "f2"),
    Column("weights_mem", "weights in memory", "bytes"),
    Column("prompt_speed_ratio", "prompt speed vs base", "ratio"),
    Column("gen_speed_ratio", "generation speed vs base", "ratio"),
    Column("gen_tok_s", "generation tok/s", "f1"),
    Column("ppl", "perplexity", "f3"),
    Column("kld_mean", "KL divergence, mean", "f4"),
    Column("kld_p99", "KL divergence, p99", "f4"),
    Column("same_top_p", "same top token (%)", "f2"),
    Column("front", "on the size-quality front"),
]


def pareto_front(xs: list[float], ys: list[float]) -> list[int]:
    """Indices of the points no other point beats on both (lower x and lower y), by x."""
    order = sorted(range(len(xs)), key=lambda i: (xs[i], ys[i]))
    front: list[int] = []
    best = float("inf")
    for i in order:
        if ys[i] < best:
            front.append(i)
            best = ys[i]
    return front


def sweep_report(data: dict[str, Any]) -> Report:
    rows = []
    for m in data["models"]:
        rows.append({**m, "weights_mem": m["memory"].get("weights", 0)})
    # quantized types only on the charts: the base is the reference (KLD 0)
    q = rows[1:]
    size_front = pareto_front([r["bytes"] for r in q], [r["kld_mean"] for r in q])
    speed_front = pareto_front(
        [-(r["gen_speed_ratio"] or 0.0) for r in q], [r["kld_mean"] for r in q]
    )
    on_front = {q[i]["type"] for i in size_front}
    for r in rows:
        r["front"] = "yes" if r["type"] in on_front else ""
    labels = [r["type"] for r in q]
    charts = [
        Chart(
            name="size_vs_kld",
            kind="scatter",
            title="File size against quality loss (lower left is better)",
            x_label="file size (bytes)",
            y_label="mean KL divergence vs base",
            categories=labels,
            x=[float(r["bytes"]) for r in q],
            series=[Series("KLD", [float(r["kld_mean"]) for r in q])],
            front=sorted(size_front, key=lambda i: q[i]["bytes"]),
            value_fmt="f4",
            note="The dashed line joins the Pareto front: no other type is both smaller and closer.",
        ),
        Chart(
            name="speed_vs_kld",
            kind="scatter",
            title="Generation speed against quality loss (lower right is better)",
            x_label="generation tokens/s relative to the base",
            y_label="mean KL divergence vs base",
            categories=labels,
            x=[float(r["gen_speed_ratio"] or 0.0) for r in q],
            series=[Series("KLD", [float(r["kld_mean"]) for r in q])],
            front=sorted(speed_front, key=lambda i: q[i]["gen_speed_ratio"] or 0.0),
            value_fmt="f4",
            note="The dashed line joins the Pareto front: no other type is both faster and closer.",
        ),
    ]
    base = rows[0]
    return Report(
        title="Quantization sweep",
        subtitle=f"{Path(data['base']).name}: {', '.join(data['types'])}",
        facts=[
            Fact("base", base["type"]),
            Fact("base size", base["bytes"], "bytes"),
            Fact("base perplexity", base["ppl"], "f3"),
            Fact("base generation tok/s", base["gen_tok_s"], "f1"),
            Fact("tokens scored", data.get("tokens_scored"), "int"),
            Fact("speed repetitions (interleaved)", data["reps"], "int"),
        ],
        sections=[
            Section("Size, speed and quality", charts=charts),
            Section(
                "Every type",
                text="Speeds are medians over interleaved repetitions, as ratios to the base measured "
                "in the same runs; quality is measured teacher-forced on the same tokens for every "
                "type (as llama-perplexity --kl-divergence).",
                tables=[Table("sweep", "Every type", COLUMNS, rows)],
            ),
        ],
        data=data,
        csv_table="sweep",
    )
