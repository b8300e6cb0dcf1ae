"""The roofline as report pieces: the peaks table (``instr peaks``), the summary's section
(headline, roofline chart, per-step efficiency, per op type and per layer) and compare's."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from ..analysis import roofline
from ..session.machine_peaks import Peaks
from .report import Chart, Column, Fact, Report, Section, Series, Table, rows_of

MAX_POINTS = 120  # roofline chart points: the ops that take the most time


def peaks_report(p: Peaks) -> Report:
    types = sorted({t for d in p.devices for t in d.matmul_gflops})
    cols = [Column("device", "device"), Column("bandwidth_gbs", "bandwidth (GB/s)", "f1")]
    cols += [Column(f"mm_{t}", f"{t} matmul (GFLOP/s)", "f1") for t in types]
    if any(d.sync_ns is not None for d in p.devices):
        cols.append(Column("sync_us", "a graph started on the threads (us)", "f2"))
    rows = []
    for d in p.devices:
        row: dict[str, Any] = {"device": d.name, "bandwidth_gbs": d.bandwidth_gbs}
        row.update({f"mm_{t}": d.matmul_gflops.get(t) for t in types})
        if d.sync_ns is not None:
            row["sync_us"] = d.sync_ns / 1e3
        rows.append(row)
    table = Table("peaks", "Measured peaks", cols, rows, note="best of the timed runs")
    return Report(
        title="Peaks",
        subtitle=p.key,
        facts=[Fact("machine", p.key), Fact("measured", p.date)],
        sections=[Section("Peaks", tables=[table])],
        data=p.to_json(),
        csv_table="peaks",
    )


def _point_key(name: str) -> str:
    return re.sub(r"-\d+$", "", name)


def roofline_chart(ops: pd.DataFrame, peaks: Peaks) -> Chart | None:
    """Log-log: FLOPs/byte against GFLOP/s, the two roofs drawn, one point per op of the graph
    (its layers and steps together, prompt and generation apart), sized by total time, coloured
    by op type."""
    o = ops[(ops["est_flops"] > 0) & (ops["est_bytes"] > 0) & (ops["dur_ns"] > 0)]
    if o.empty:
        return None
    # the graph node's name without its layer suffix, worked out once per distinct name (the
    # names are a categorical: a million ops have a few hundred)
    names = o["name"].astype("category")
    keys = np.array([_point_key(str(c)) for c in names.cat.categories] + [""], dtype=object)
    o = o.assign(point=keys[names.cat.codes.to_numpy()], kind=o["_kind"])
    a = (
        o.groupby(["kind", "label", "point"], observed=True)[["est_flops", "est_bytes", "dur_ns"]]
        .sum()
        .reset_index()
        .sort_values("dur_ns", ascending=False)
        .head(MAX_POINTS)
    )
    dev = peaks.device()
    roofs = {"memory": dev.bandwidth_gbs}
    roofs.update({f"{t} matmul": v for t, v in dev.matmul_gflops.items()})
    skipped = int((ops["est_flops"] == 0).sum())
    return Chart(
        name="roofline",
        kind="roofline",
        title=f"Roofline of {dev.name} ({peaks.key})",
        x_label="arithmetic intensity (FLOPs/byte)",
        y_label="achieved GFLOP/s",
        categories=[f"{r.kind} {r.point} ({r.label})" for r in a.itertuples()],
        groups=[str(r.label) for r in a.itertuples()],
        x=(a["est_flops"] / a["est_bytes"]).tolist(),
        series=[Series("achieved GFLOP/s", (a["est_flops"] / a["dur_ns"]).tolist())],
        sizes=(a["dur_ns"] / 1e6).tolist(),
        roofs=roofs,
        value_fmt="f2",
        note=f"point area: total time (ms); ops without FLOPs ({skipped} timed ops: copies, "
        "views, gathers) are not drawn. Roofs: the measured bandwidth (slope) and matmul peaks "
        "(one line per type). A point above the slope ran from cache, not memory.",
    )


def efficiency_chart(steps: pd.DataFrame) -> Chart | None:
    s = steps[steps["roof_frac"].notna()]
    if s.empty:
        return None
    return Chart(
        name="step_efficiency",
        kind="line",
        title="Each step against its roof (generation: memory bandwidth; prompt: compute)",
        x_label="step",
        y_label="% of the roof",
        categories=[f"step {r.step} ({r.kind})" for r in s.itertuples()],
        x=s["step"].astype(float).tolist(),
        series=[Series("% of the roof", (s["roof_frac"] * 100).tolist())],
        value_fmt="f1",
    )


def _agg_table(ops: pd.DataFrame, key: str, title: str, top: int | None) -> Table:
    a = roofline.aggregate(ops, key).sort_values("dur_ns", ascending=False)
    a["total_ms"] = a["dur_ns"] / 1e6
    a["lost_ms"] = a["lost_ns"] / 1e6
    cols = [
        Column(key, key if key != "label" else "op type", "text" if key == "label" else "int"),
        Column("total_ms", "total (ms)", "f2"),
        Column("intensity", "FLOPs/byte", "f2"),
        Column("gflops_s", "GFLOP/s", "f2"),
        Column("gbs", "GB/s", "f2"),
        Column("roof_frac", "of the roof", "pct"),
        Column("bound", "bound by"),
        Column("lost_ms", "lost vs roof (ms)", "f2"),
    ]
    return Table(
        name=f"roof_by_{'op' if key == 'label' else key}",
        title=title,
        columns=cols,
        rows=rows_of(a.to_dict(orient="records"), [c.key for c in cols]),
        top=top,
        note="time-weighted: the least time at the roofs over the measured time; lost = measured "
        "- least (converters/roofline.py)",
    )


def section(f: Any, top: int | None = None) -> tuple[Section | None, dict[str, Any]]:
    """The summary's roofline section and its json data; (None, note) without peaks or ops."""
    peaks: Peaks | None = getattr(f, "peaks", None)
    if peaks is None:
        note = getattr(f, "peaks_note", "") or "no peaks"
        return None, {"note": note}
    ops = f.ops.assign(_kind=f.ops["step"].map(f.steps.set_index("step")["kind"].astype(str)))
    facts: list[Fact] = []
    data: dict[str, Any] = {"machine": peaks.key, "peaks_date": peaks.date}
    for kind in ("gen", "prompt"):
        h = roofline.headline(f.steps, kind)
        if h is not None:
            facts.append(
                Fact(f"{'decode' if kind == 'gen' else 'prompt'}", roofline.sentence(h, peaks))
            )
            data[kind] = h
    losers = roofline.losers(ops)
    if losers:
        facts.append(
            Fact(
                "time lost against the roof, most",
                ", ".join(
                    f"{x['label']} {x['lost_ns'] / 1e6:.2f} ms ({x['share']:.0%})" for x in losers
                ),
            )
        )
        data["lost"] = losers
    charts = [c for c in (roofline_chart(ops, peaks), efficiency_chart(f.steps)) if c is not None]
    tables = []
    if len(ops):
        tables.append(_agg_table(ops, "label", "Against the roof, per op type", top))
        if ops["layer"].notna().any():
            tables.append(
                _agg_table(ops[ops["layer"].notna()], "layer", "Against the roof, per layer", top)
            )
    data["by_op"] = tables[0].rows if tables else []
    return (
        Section(
            f"Against this machine's roofs ({peaks.key}, measured {peaks.date})",
            facts=facts,
            charts=charts,
            tables=tables,
        ),
        data,
    )


def compare_rows(a: Any, b: Any) -> tuple[list[dict[str, Any]], str]:
    """Decode and prompt efficiency of two runs side by side, and how much of B's decode slowdown
    is simply more bytes read per token."""
    rows: list[dict[str, Any]] = []
    ha, hb = roofline.headline(a.steps, "gen"), roofline.headline(b.steps, "gen")
    pa, pb = roofline.headline(a.steps, "prompt"), roofline.headline(b.steps, "prompt")

    def row(what: str, x: float | None, y: float | None, fmt: str) -> None:
        ratio = y / x if x and y is not None and not np.isnan(x) else None
        rows.append({"what": what, "a": x, "b": y, "ratio": ratio, "fmt": fmt})

    if ha and hb:
        row(
            "decode MB read per token",
            ha["bytes_per_token"] / 1e6,
            hb["bytes_per_token"] / 1e6,
            "f2",
        )
        row("decode ms per token", ha["ms_per_token"], hb["ms_per_token"], "f2")
        row("decode GB/s achieved", ha["gbs"], hb["gbs"], "f1")
        row("decode % of bandwidth", ha["fraction"] * 100, hb["fraction"] * 100, "f1")
    if pa and pb:
        row("prompt % of compute roof", pa["fraction"] * 100, pb["fraction"] * 100, "f1")
    why = ""
    if ha and hb and ha["ms_per_token"] > 0 and ha["bytes_per_token"] > 0:
        t = hb["ms_per_token"] / ha["ms_per_token"]
        by = hb["bytes_per_token"] / ha["bytes_per_token"]
        why = (
            f"B decodes at {t:.2f}x A's time per token and reads {by:.2f}x the bytes: "
            f"{by:.2f}x of the {t:.2f}x is simply more bytes, the rest ({t / by:.2f}x) the "
            f"bandwidth it reaches ({ha['fraction']:.0%} vs {hb['fraction']:.0%})"
        )
    return rows, why


def compare_section(d: dict[str, Any]) -> Section:
    """``d``: ``{"rows", "why"}`` as ``compare_rows`` gives them (stored in compare's data)."""
    cols = [
        Column("what", "measure"),
        Column("a", "A", "f2"),
        Column("b", "B", "f2"),
        Column("ratio", "B / A", "ratio"),
    ]
    rows = [{k: r[k] for k in ("what", "a", "b", "ratio")} for r in d["rows"]]
    return Section(
        "Against the roofs",
        facts=[Fact("decode slowdown", d["why"])] if d["why"] else [],
        tables=[Table("roofline", "Efficiency against this machine's roofs", cols, rows)],
    )
