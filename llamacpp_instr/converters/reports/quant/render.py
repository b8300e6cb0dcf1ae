"""The quantization report (``instr quant-report``) as a ``Report``: where each model's bytes go,
and what a second quantization saves, for the shared renderers.

Charts keep their scales honest: the per-layer bars show transformer blocks only (the token
embedding and the output projection, often as large as several layers together, get a chart of
their own), and the bits-per-weight scale leaves out the norms (1-D F32 vectors, 32 bits by design
and a fraction of a percent of the bytes).
"""

from __future__ import annotations

from typing import Any

from ..report import Chart, Column, Fact, Report, Section, Series, Table

# F16 and BF16 both store 16 bits per weight: one compression figure covers both
VS_16BIT = "16-bit (F16/BF16)"


def _is_norm(role: str) -> bool:
    return role.endswith("_norm") or role.endswith("norm")


def _model_facts(t: dict[str, Any], mem: dict[str, Any]) -> list[Fact]:
    """A model's totals, and its run-time memory where a log gave it."""
    facts = [
        Fact("tensors", t["tensors"], "int"),
        Fact("size", t["bytes"], "bytes"),
        Fact("bits per weight", t["bpw"], "f2"),
        Fact("smaller than F32", t["vs_f32"], "ratio"),
        Fact(f"smaller than {VS_16BIT}", t["vs_16bit"], "ratio"),
    ]
    if mem:
        facts += [
            Fact("run-time weights", mem.get("weights", 0), "bytes"),
            Fact("run-time KV cache", mem.get("kv_cache", 0), "bytes"),
            Fact("run-time compute buffers", mem.get("compute", 0), "bytes"),
        ]
    return facts


def _bytes_charts(m: dict[str, Any], types: list[str]) -> list[Chart]:
    """A model's bytes per transformer block (blk.N tensors), stacked by type, and its tensors
    outside the blocks."""
    per: dict[int, dict[str, int]] = {}
    outside: list[dict[str, Any]] = []
    for x in m["tensors"]:
        if x["layer"] is None:
            outside.append(x)
        else:
            per.setdefault(int(x["layer"]), {}).setdefault(x["type"], 0)
            per[int(x["layer"])][x["type"]] += x["bytes"]
    layers = sorted(per)
    layer_types = [ty for ty in types if any(per[k].get(ty) for k in layers)]
    charts = []
    if layers:
        charts.append(
            Chart(
                name="bytes_per_layer",
                kind="stacked",
                title="Bytes per transformer layer, by tensor type",
                x_label="bytes (MB = 10^6 bytes)",
                y_label="layer",
                categories=[f"layer {k}" for k in layers],
                series=[
                    Series(ty, [float(per[k].get(ty, 0)) for k in layers]) for ty in layer_types
                ],
                value_fmt="bytes",
                note="The token embedding and output tensors are outside the layers: see below.",
            )
        )
    if outside:
        outside = sorted(outside, key=lambda x: -x["bytes"])
        charts.append(
            Chart(
                name="bytes_outside_layers",
                kind="bars",
                title="Tensors outside the layers",
                x_label="bytes (MB = 10^6 bytes)",
                y_label="tensor",
                categories=[f"{x['name']} ({x['type']})" for x in outside],
                series=[Series("bytes", [float(x["bytes"]) for x in outside])],
                value_fmt="bytes",
            )
        )
    return charts


def _model_tables(m: dict[str, Any], top: int | None) -> list[Table]:
    """A model's bytes by tensor type and by role, and its largest tensors."""
    return [
        Table(
            "per_type",
            "By tensor type",
            [
                Column("type", "type"),
                Column("tensors", "tensors", "int"),
                Column("bytes", "size", "bytes"),
                Column("byte_share", "share of bytes", "pct"),
                Column("element_share", "share of weights", "pct"),
                Column("bpw", "bits per weight", "f3"),
            ],
            list(m["per_type"]),
        ),
        Table(
            "per_role",
            "By role",
            [
                Column("role", "role"),
                Column("tensors", "tensors", "int"),
                Column("bytes", "size", "bytes"),
                Column("byte_share", "share of bytes", "pct"),
                Column("bpw", "bits per weight", "f3"),
            ],
            list(m["per_role"]),
            top=top,
        ),
        Table(
            "largest_tensors",
            f"Largest tensors (of {m['totals']['tensors']})",
            [
                Column("name", "tensor"),
                Column("type", "type"),
                Column("shape", "shape"),
                Column("bytes", "size", "bytes"),
                Column("bpw", "bits per weight", "f3"),
                Column("vs_f32", "vs F32", "ratio"),
                Column("vs_16bit", f"vs {VS_16BIT}", "ratio"),
            ],
            list(m["tensors"]),
            top=top if top is not None else 12,
        ),
    ]


def _buffers_table(buffers: list[dict[str, Any]]) -> Table:
    """The run-time memory of a log's buffers."""
    return Table(
        "memory_buffers",
        "Run-time memory by buffer",
        [
            Column("buffer", "buffer"),
            Column("weights", "weights", "bytes"),
            Column("kv_cache", "KV cache", "bytes"),
            Column("compute", "compute", "bytes"),
        ],
        list(buffers),
    )


def _model_section(m: dict[str, Any], top: int | None, types: list[str]) -> Section:
    t = m["totals"]
    mem = m.get("memory") or {}
    tables = _model_tables(m, top)
    if mem.get("buffers"):
        tables.append(_buffers_table(mem["buffers"]))
    return Section(
        f"{t['model']} ({t['file_type']})",
        facts=_model_facts(t, mem),
        charts=_bytes_charts(m, types),
        tables=tables,
    )


def _bpw_chart(models: list[dict[str, Any]]) -> Chart | None:
    """Bits per weight by role for the quantized roles; norms (F32 by design) left out."""
    roles = [
        r["role"]
        for r in sorted(models[0]["per_role"], key=lambda r: -r["bytes"])
        if not _is_norm(r["role"])
    ]
    if not roles:
        return None
    norms = sorted({r["role"] for m in models for r in m["per_role"] if _is_norm(r["role"])})
    series = []
    for m in models:
        bpw = {r["role"]: r["bpw"] for r in m["per_role"]}
        series.append(Series(m["totals"]["model"], [float(bpw.get(role, 0.0)) for role in roles]))
    return Chart(
        name="bpw_by_role",
        kind="bars",
        title="Bits per weight by tensor role",
        x_label="bits per weight",
        y_label="role",
        categories=roles,
        series=series,
        value_fmt="f2",
        note=(
            f"Not shown: {', '.join(norms)} (1-D F32 vectors, 32 bits per weight by design, a "
            "fraction of a percent of the bytes)."
            if norms
            else ""
        ),
    )


def _comparison_section(o: dict[str, Any], baseline: str, top: int | None) -> Section:
    facts = [
        Fact(f"size of {baseline} (baseline)", o["bytes_a"], "bytes"),
        Fact(f"size of {o['model']}", o["bytes_b"], "bytes"),
        Fact("saved", o["saved"], "bytes"),
        Fact("baseline / other", o["ratio"], "ratio"),
        Fact("tensors that changed type", len(o["type_changes"]), "int"),
    ]
    layers = sorted(
        (r for r in o["per_layer"] if isinstance(r["layer"], int)), key=lambda r: r["layer"]
    )
    roles = sorted(o["per_role"], key=lambda r: -r["bytes_a"])
    charts = []
    if layers:
        charts.append(
            Chart(
                name="saved_per_layer",
                kind="diverging",
                title=f"Bytes saved per layer by {o['model']} (vs {baseline})",
                x_label="bytes saved (MB = 10^6 bytes); negative: larger than the baseline",
                y_label="layer",
                categories=[f"layer {r['layer']}" for r in layers],
                series=[Series("saved", [float(r["saved"]) for r in layers])],
                value_fmt="bytes",
            )
        )
    charts.append(
        Chart(
            name="saved_per_role",
            kind="diverging",
            title=f"Bytes saved per role by {o['model']} (vs {baseline})",
            x_label="bytes saved (MB = 10^6 bytes); negative: larger than the baseline",
            y_label="role",
            categories=[r["role"] for r in roles],
            series=[Series("saved", [float(r["saved"]) for r in roles])],
            value_fmt="bytes",
        )
    )
    tables = [
        Table(
            "comparison_per_role",
            "By role, side by side",
            [
                Column("role", "role"),
                Column("bytes_a", "baseline", "bytes"),
                Column("bytes_b", "other", "bytes"),
                Column("saved", "saved", "bytes"),
                Column("bpw_a", "bpw baseline", "f2"),
                Column("bpw_b", "bpw other", "f2"),
            ],
            roles,
            top=top,
        ),
        Table(
            "type_changes",
            "Tensors that got a different type",
            [Column("name", "tensor"), Column("type_a", "baseline"), Column("type_b", "other")],
            [
                {"name": r["name"], "type_a": r["type_a"], "type_b": r["type_b"]}
                for r in o["per_tensor"]
                if r["type_a"] != r["type_b"]
            ],
            top=top,
        ),
    ]
    warnings = ""
    if o["only_in_baseline"] or o["only_in_other"]:
        warnings = (
            f"Different models? {len(o['only_in_baseline'])} tensors only in the baseline, "
            f"{len(o['only_in_other'])} only in {o['model']}; compared what matches."
        )
    return Section(
        f"{o['model']} vs {baseline}", facts=facts, charts=charts, tables=tables, text=warnings
    )


def quant_report(data: dict[str, Any], top: int | None = 12) -> Report:
    """``data`` from ``inventory.report_data`` as a report."""
    models = data["models"]
    types = sorted({t["type"] for m in models for t in m["tensors"]})
    sections = [_model_section(m, top, types) for m in models]
    bpw = _bpw_chart(models)
    if bpw:
        sections.append(Section("Bits per weight", charts=[bpw]))
    cmp_ = data.get("comparison")
    if cmp_:
        sections += [_comparison_section(o, cmp_["baseline"], top) for o in cmp_["others"]]
    for name, rows in data.get("error_vs_reference") or []:
        sections.append(
            Section(
                f"Dequantization error of {name} vs the reference",
                tables=[
                    Table(
                        "error_vs_reference",
                        "Per tensor, largest RMSE first",
                        [
                            Column("name", "tensor"),
                            Column("type", "type"),
                            Column("rmse", "RMSE", "f4"),
                            Column("max_abs", "max abs", "f4"),
                            Column("snr_db", "SNR (dB)", "f1"),
                        ],
                        list(rows),
                        top=top,
                    )
                ],
            )
        )
    # every tensor of every model: csv's table, and a sortable listing in html
    all_rows = [{"model": m["totals"]["model"], **r} for m in models for r in m["tensors"]]
    keys = list(all_rows[0]) if all_rows else ["model"]
    labels = {"vs_16bit": f"vs {VS_16BIT}", "vs_f32": "vs F32", "bpw": "bits per weight"}
    fmts = {"elements": "int", "bytes": "int", "bpw": "f3", "vs_f32": "f2", "vs_16bit": "f2"}
    sections.append(
        Section(
            "All tensors",
            tables=[
                Table(
                    "tensors",
                    "Every tensor of every model",
                    [Column(k, labels.get(k, k), fmts.get(k, "text")) for k in keys],
                    all_rows,
                    only=("html", "csv"),
                )
            ],
        )
    )
    names = ", ".join(m["totals"]["model"] for m in models)
    return Report(
        title="Quantization report",
        subtitle=names,
        sections=sections,
        data=data,
        csv_table="tensors",
        json_as_given=True,  # raw values, exactly as report_data made them
    )
