"""Two runs of the same prompt on two quantizations (or builds), side by side.

Memory, prompt and generation tokens/s, time per op type and per layer, generated-token agreement,
and — when both logs are verbose with top-k logits — top-1 agreement and a KL-divergence estimate.

The KL estimate uses only the top-k logits each log kept: each step's distribution is the softmax
over A's top-k tokens (B's logit for a token outside its own top-k is taken as B's k-th logit, an
upper bound on it), so it approximates KL(A || B) restricted to A's most likely tokens.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pandas as pd

from ..analysis.frames import SessionFrames
from . import device_report, memory_report, roofline_report
from .report import Chart, Column, Fact, Report, Section, Series, Table
from .summary import by, overview, timed_steps

SAMPLED_NOTE = (
    "At least one run is sampled (op times on some steps only): times are the mean per "
    "generation step with op times in each run, not totals."
)


def _by_gen_step(f: SessionFrames, key: str, top: int | None = None) -> Any:
    """``by(f, key)`` over the generation steps with op times, as the mean per such step: what
    a sampled run and a full one can be compared on."""
    steps = timed_steps(f)
    gen = steps.loc[steps["kind"] == "gen", "step"]
    sub = dataclasses.replace(f, ops=f.ops[f.ops["step"].isin(gen)])
    df = by(sub, key, top)
    n = max(1, len(gen))
    df["total_ms"] = df["total_ms"] / n
    df["count"] = (df["count"] / n).round().astype(int)
    return df


def _kl(a: dict[str, Any], b: dict[str, Any]) -> float:
    la, lb = a["logits"], b["logits"]
    bmap = dict(zip(b["ids"], lb, strict=False))
    floor = min(lb)
    ma = max(la)
    pa = [math.exp(x - ma) for x in la]
    za = sum(pa)
    qb_logits = [bmap.get(i, floor) for i in a["ids"]]
    mb = max(qb_logits)
    qb = [math.exp(x - mb) for x in qb_logits]
    zb = sum(qb)
    return sum(
        (p / za) * math.log((p / za) / (q / zb)) for p, q in zip(pa, qb, strict=True) if p > 0
    )


def compare_sessions(
    a: SessionFrames, b: SessionFrames, gen_a: list[int], gen_b: list[int]
) -> dict[str, Any]:
    oa, ob = overview(a), overview(b)
    out: dict[str, Any] = {
        "a": {
            "model": oa["model"],
            "memory": a.info.memory,
            **{k: oa[k] for k in ("prompt_tok_s", "gen_tok_s", "gen_tokens")},
        },
        "b": {
            "model": ob["model"],
            "memory": b.info.memory,
            **{k: ob[k] for k in ("prompt_tok_s", "gen_tok_s", "gen_tokens")},
        },
        "gen_speedup_b_over_a": ob["gen_tok_s"] / oa["gen_tok_s"] if oa["gen_tok_s"] else 0.0,
    }
    footprint = memory_report.footprint_rows(a, b)  # both logs recorded their buffers
    if footprint:
        out["footprint"] = footprint
    if a.info.model.get("n_vocab") != b.info.model.get("n_vocab") or a.info.model.get(
        "n_layer"
    ) != b.info.model.get("n_layer"):
        out["warning"] = "the two sessions are of different models; comparing what matches"
    devices = device_report.compare(a, b)  # runs on several devices: what moved per device
    if devices is not None:
        out["devices"] = devices
    rows, why = roofline_report.compare_rows(a, b)
    if rows:
        out["roofline"] = {"rows": rows, "why": why}
    sa, sb = a.sampling(), b.sampling()
    sampled = bool(sa.describe() or sb.describe())
    n = min(len(gen_a), len(gen_b))
    same = sum(1 for x, y in zip(gen_a, gen_b, strict=False) if x == y)
    first_diff = next((i for i in range(n) if gen_a[i] != gen_b[i]), None)
    out["tokens"] = {
        "compared": n,
        "agree": same,
        "agreement": same / n if n else 0.0,
        "first_divergence": first_diff,
    }
    per = by
    if sampled:
        # never totals of some steps against totals of all: the mean per recorded gen step
        out["sampled"] = {"a": sa.describe(), "b": sb.describe(), "note": SAMPLED_NOTE}
        per = _by_gen_step
        if sa.mixed or sb.mixed:
            # minimal steps carry no token ids: the generated text is not in the log
            out["tokens"] = {"unavailable": "not recorded (sampled: minimal steps carry no tokens)"}
    ops_a, ops_b = per(a, "op"), per(b, "op")
    m = pd.merge(
        ops_a[["op", "total_ms", "count"]],
        ops_b[["op", "total_ms", "count"]],
        on="op",
        how="outer",
        suffixes=("_a", "_b"),
    ).fillna(0)
    out["per_op"] = m.sort_values("total_ms_a", ascending=False).to_dict(orient="records")
    la, lb = per(a, "layer"), per(b, "layer")
    ml = pd.merge(
        la[["layer", "total_ms"]],
        lb[["layer", "total_ms"]],
        on="layer",
        how="inner",
        suffixes=("_a", "_b"),
    )
    out["per_layer"] = ml.to_dict(orient="records")
    if not a.topk.empty and not b.topk.empty:
        ta = {s: g for s, g in a.topk[a.topk["row"] == 0].groupby("step")}
        tb = {s: g for s, g in b.topk[b.topk["row"] == 0].groupby("step")}
        common = sorted(set(ta) & set(tb))
        top1 = 0
        kls = []
        for s in common:
            ga, gb = ta[s].sort_values("rank"), tb[s].sort_values("rank")
            top1 += int(ga["token"].iloc[0] == gb["token"].iloc[0])
            kls.append(
                _kl(
                    {"ids": ga["token"].tolist(), "logits": ga["logit"].tolist()},
                    {"ids": gb["token"].tolist(), "logits": gb["logit"].tolist()},
                )
            )
        out["logits"] = {
            "steps": len(common),
            "top1_agreement": top1 / len(common) if common else 0.0,
            "kl_mean": sum(kls) / len(kls) if kls else 0.0,
            "kl_max": max(kls) if kls else 0.0,
            "kl_per_step": kls,
        }
    return out


AGREEMENT_NOTE = (
    "Free-running agreement: each run fed back its own tokens, so after the first divergence the "
    "two runs continue from different text and later tokens are not comparable one to one. It "
    "says how soon outputs differ, not how much quality a quantization loses; for that, use "
    "`instr quant-eval BASE.gguf QUANT.gguf`: both models teacher-forced on the same tokens, "
    "perplexity and full-vocabulary KL divergence as llama-perplexity computes them."
)


def compare_report(c: dict[str, Any]) -> Report:
    """``instr compare`` as a report: the same content in every format."""
    a, b = c["a"], c["b"]
    facts = [
        Fact("A", a["model"]),
        Fact("B", b["model"]),
        Fact("generation tokens/s A", a["gen_tok_s"], "f1"),
        Fact("generation tokens/s B", b["gen_tok_s"], "f1"),
        Fact("generation speed B/A", c["gen_speedup_b_over_a"], "ratio"),
        Fact("prompt tokens/s A", a["prompt_tok_s"], "f1"),
        Fact("prompt tokens/s B", b["prompt_tok_s"], "f1"),
    ]
    sampled = c.get("sampled")
    if sampled:
        facts += [Fact(f"sampled {k.upper()}", sampled[k]) for k in ("a", "b") if sampled[k]]
    sections = [_memory_section(c), _op_section(c), _layer_section(c), _agreement_section(c)]
    if "roofline" in c:
        sections.append(roofline_report.compare_section(c["roofline"]))
    if "devices" in c:  # runs on several devices
        sections.append(device_report.compare_section(c["devices"]))
    return Report(
        title="Session comparison",
        subtitle=f"A: {a['model']} · B: {b['model']}",
        facts=facts,
        sections=sections,
        warnings=[c["warning"]] if "warning" in c else [],
        data=c,
        csv_table="per_op",
    )


def _memory_section(c: dict[str, Any]) -> Section:
    a, b = c["a"], c["b"]
    mem_rows = []
    for key, label in (("weights", "weights"), ("kv_cache", "KV cache"), ("compute", "compute")):
        va, vb = a["memory"].get(key, 0), b["memory"].get(key, 0)
        mem_rows.append({"what": label, "a": va, "b": vb, "ratio": vb / va if va else None})
    return Section(
        "Memory",
        charts=[
            Chart(
                name="memory",
                kind="bars",
                title="Memory by kind",
                x_label="bytes (MB = 10^6 bytes)",
                y_label="kind",
                categories=[r["what"] for r in mem_rows],
                series=[
                    Series("A", [float(r["a"]) for r in mem_rows]),
                    Series("B", [float(r["b"]) for r in mem_rows]),
                ],
                value_fmt="bytes",
            )
        ],
        tables=[
            Table(
                "memory",
                "Memory",
                [
                    Column("what", "kind"),
                    Column("a", "A", "bytes"),
                    Column("b", "B", "bytes"),
                    Column("ratio", "B/A", "ratio"),
                ],
                mem_rows,
            ),
            *([memory_report.footprint_table(c["footprint"])] if c.get("footprint") else []),
        ],
    )


def _op_section(c: dict[str, Any]) -> Section:
    sampled = c.get("sampled")  # times per generation step with op times, not totals
    op_rows: list[dict[str, Any]] = []
    for r in c["per_op"]:
        ra, rb = float(r["total_ms_a"]), float(r["total_ms_b"])
        op_rows.append(
            {
                "op": str(r["op"]),
                "count_a": int(r["count_a"]),
                "total_ms_a": ra,
                "count_b": int(r["count_b"]),
                "total_ms_b": rb,
                "ratio": rb / ra if ra else None,
            }
        )
    shown = [r for r in op_rows if r["ratio"] is not None][:15]
    return Section(
        "Time per op type",
        text=(sampled["note"] if sampled else "All steps of each run.")
        + " A ratio above 1 means B spent longer on that op type than A.",
        charts=(
            [
                Chart(
                    name="op_time_ratio",
                    kind="diverging",
                    title="Time per op type, B relative to A (B/A; 1 = the same)",
                    x_label="B time / A time",
                    y_label="op type",
                    categories=[r["op"] for r in shown],
                    series=[Series("B/A", [float(r["ratio"]) for r in shown])],
                    baseline=1.0,
                    lower_is_better=True,
                    value_fmt="ratio",
                    note="Op types in the order of A's total time; blue: B faster, red: B slower.",
                )
            ]
            if shown
            else []
        ),
        tables=[
            Table(
                "per_op",
                "Time per op type",
                [
                    Column("op", "op type"),
                    Column("count_a", "count A", "int"),
                    Column("total_ms_a", "A (ms)", "f2"),
                    Column("count_b", "count B", "int"),
                    Column("total_ms_b", "B (ms)", "f2"),
                    Column("ratio", "B/A", "ratio"),
                ],
                op_rows,
                top=12,
            )
        ],
    )


def _layer_section(c: dict[str, Any]) -> Section:
    sampled = c.get("sampled")  # times per generation step with op times, not totals
    layer_rows: list[dict[str, Any]] = [
        {
            "layer": str(r["layer"]),
            "total_ms_a": float(r["total_ms_a"]),
            "total_ms_b": float(r["total_ms_b"]),
        }
        for r in c["per_layer"]
    ]
    # transformer layers in the chart; the ops outside them (the output projection above all)
    # would set its scale, so they are in the table only
    in_layers = [r for r in layer_rows if r["layer"] not in ("none", "-1")]
    layer_charts = [
        Chart(
            name="per_layer",
            kind="bars",
            title="Time per transformer layer, "
            + ("mean per generation step with op times" if sampled else "all steps"),
            x_label="time (ms)",
            y_label="layer",
            categories=[f"layer {r['layer']}" for r in in_layers],
            series=[
                Series("A", [r["total_ms_a"] for r in in_layers]),
                Series("B", [r["total_ms_b"] for r in in_layers]),
            ],
            value_fmt="f2",
            note="Ops outside the layers (embedding, final norm, output projection) are in the "
            "table below as layer none.",
        )
    ]
    return Section(
        "Time per layer",
        charts=layer_charts if in_layers else [],
        tables=[
            Table(
                "per_layer",
                "Time per layer",
                [
                    Column("layer", "layer"),
                    Column("total_ms_a", "A (ms)", "f2"),
                    Column("total_ms_b", "B (ms)", "f2"),
                ],
                layer_rows,
            )
        ],
    )


def _agreement_section(c: dict[str, Any]) -> Section:
    t = c["tokens"]
    agree_facts = (
        [Fact("generated tokens", t["unavailable"])]
        if "unavailable" in t
        else [
            Fact("generated tokens compared", t["compared"], "int"),
            Fact("identical", t["agree"], "int"),
            Fact("agreement", t["agreement"], "pct"),
            Fact(
                "first divergence at token",
                t["first_divergence"] if t["first_divergence"] is not None else "none",
            ),
        ]
    )
    if "logits" in c:
        lg = c["logits"]
        agree_facts += [
            Fact("steps with top-k logits in both", lg["steps"], "int"),
            Fact("top-1 agreement", lg["top1_agreement"], "pct"),
            Fact("KL(A||B) estimate, mean (top-k only)", lg["kl_mean"], "f4"),
            Fact("KL(A||B) estimate, max (top-k only)", lg["kl_max"], "f4"),
        ]
    return Section("Output agreement (free-running)", facts=agree_facts, text=AGREEMENT_NOTE)
