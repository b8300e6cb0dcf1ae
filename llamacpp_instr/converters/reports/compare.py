"""Two runs of the same prompt on two quantizations (or builds), side by side.

Memory, prompt and generation tokens/s, time per op type and per layer, generated-token agreement,
and — when both logs are verbose with top-k logits — top-1 agreement and a KL-divergence estimate;
runs with images or sounds, their encoders side by side (``compare_media``).

Times per op type and per layer are per step, prompt and generation apart (the mean over each
kind's steps with op times): two runs that stopped after different numbers of tokens (one met
end-of-sequence), or one of them sampled, compare like for like where totals would not. Where
the runs differ in length or settings (threads, context, batch, flash attention, cache types,
level), the report says so first.

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
from . import compare_media, compare_requests, device_report, memory_report, roofline_report
from .report import Chart, Column, Fact, Report, Section, Series, Table
from .summary import by, overview, timed_steps

SAMPLED_NOTE = (
    "At least one run is sampled (op times on some steps only): each kind's steps with op "
    "times in each run."
)
KINDS = ("prompt", "gen")
# the settings two runs are compared on (the context's), with how the report names them
SETTINGS = {
    "n_threads": "threads",
    "n_ctx": "context",
    "n_batch": "batch",
    "n_ubatch": "ubatch",
    "flash_attn": "flash attention",
    "type_k": "K cache type",
    "type_v": "V cache type",
}


def _per_step(f: SessionFrames, key: str) -> tuple[pd.DataFrame, dict[str, int]]:
    """Time per ``key`` (op type or layer) per step, prompt and generation apart: each kind's
    ``by`` over its steps with op times, over their number (``{key, prompt_ms, gen_ms}``), and
    the number of such steps per kind."""
    steps = timed_steps(f)
    merged: pd.DataFrame | None = None
    counts: dict[str, int] = {}
    for kind in KINDS:
        ids = steps.loc[steps["kind"].astype(str) == kind, "step"]
        counts[kind] = len(ids)
        df = by(dataclasses.replace(f, ops=f.ops[f.ops["step"].isin(ids)]), key)
        df = df[[key, "total_ms"]].rename(columns={"total_ms": f"{kind}_ms"})
        df[f"{kind}_ms"] = df[f"{kind}_ms"].astype(float) / max(1, len(ids))
        merged = df if merged is None else pd.merge(merged, df, on=key, how="outer")
    assert merged is not None
    return merged.fillna(0.0), counts


def _both(a: SessionFrames, b: SessionFrames, key: str, how: str) -> list[dict[str, Any]]:
    """``_per_step`` of both runs side by side (``how``: outer for op types, inner for layers),
    with B over A per kind (None where A spent nothing), in the order of A's time per step."""
    (pa, _), (pb, _) = _per_step(a, key), _per_step(b, key)
    m = pd.merge(pa, pb, on=key, how=how, suffixes=("_a", "_b")).fillna(0.0)
    rows = []
    for r in m.to_dict(orient="records"):
        row: dict[str, Any] = {key: r[key]}
        for kind in KINDS:
            va, vb = float(r[f"{kind}_ms_a"]), float(r[f"{kind}_ms_b"])
            row |= {
                f"{kind}_ms_a": va,
                f"{kind}_ms_b": vb,
                f"{kind}_ratio": vb / va if va else None,
            }
        rows.append(row)
    if key == "op":
        rows.sort(key=lambda r: -(r["gen_ms_a"] + r["prompt_ms_a"]))
    else:  # layers in their order, those outside the layers last
        rows.sort(key=lambda r: (_layer_order(r[key]), str(r[key])))
    return rows


def _layer_order(layer: Any) -> float:
    try:
        n = float(layer)
    except (TypeError, ValueError):
        return float("inf")
    return n if n >= 0 else float("inf")


def differences(a: SessionFrames, b: SessionFrames) -> list[str]:
    """How the two runs differ in length (prompt tokens, generated tokens) and settings (the
    context's, and the level), one phrase each: what makes their totals unlike."""
    out = []
    oa, ob = overview(a), overview(b)
    for key, name in (("prompt_tokens", "prompt tokens"), ("gen_tokens", "generated tokens")):
        if oa[key] != ob[key]:
            out.append(f"{name}: A {oa[key]}, B {ob[key]}")
    ca, cb = a.info.context or {}, b.info.context or {}
    for key, name in SETTINGS.items():
        if key in ca and key in cb and ca[key] != cb[key]:
            out.append(f"{name}: A {ca[key]}, B {cb[key]}")
    if a.info.level != b.info.level:
        out.append(f"level: A {a.info.level}, B {b.info.level}")
    return out


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


def _side(f: SessionFrames, ov: dict[str, Any]) -> dict[str, Any]:
    """One session's model, memory and speeds (``ov``: its ``overview``)."""
    return {
        "model": ov["model"],
        "memory": f.info.memory,
        **{k: ov[k] for k in ("prompt_tok_s", "gen_tok_s", "gen_tokens")},
    }


def _differences(a: SessionFrames, b: SessionFrames) -> dict[str, Any]:
    """How the runs differ (``differences``; ``encoders``: their images' or sounds' encoders),
    and a ``warning`` when they do or their models differ."""
    out: dict[str, Any] = {}
    warnings = []
    if a.info.model.get("n_vocab") != b.info.model.get("n_vocab") or a.info.model.get(
        "n_layer"
    ) != b.info.model.get("n_layer"):
        warnings.append("the two sessions are of different models; comparing what matches")
    encoders = compare_media.compare_encoders(a, b)  # runs with images or sounds
    out["differences"] = differences(a, b) + (
        compare_media.differences(encoders) if encoders is not None else []
    )
    if encoders is not None:
        out["encoders"] = encoders
    if out["differences"]:
        warnings.append(
            "the runs differ (" + "; ".join(out["differences"]) + "): op and layer times are "
            "compared per step, prompt and generation apart, not as totals"
        )
    if warnings:
        out["warning"] = "; ".join(warnings)
    return out


def _token_agreement(gen_a: list[int], gen_b: list[int]) -> dict[str, Any]:
    """How many of the generated tokens agree, and where they first differ."""
    n = min(len(gen_a), len(gen_b))
    same = sum(1 for x, y in zip(gen_a, gen_b, strict=False) if x == y)
    first_diff = next((i for i in range(n) if gen_a[i] != gen_b[i]), None)
    return {
        "compared": n,
        "agree": same,
        "agreement": same / n if n else 0.0,
        "first_divergence": first_diff,
    }


def _logit_agreement(a: SessionFrames, b: SessionFrames) -> dict[str, Any] | None:
    """Over the steps both logged top logits of: how often the top token agrees, and the KL
    divergence of their top logits (None unless both logged some)."""
    if a.topk.empty or b.topk.empty:
        return None
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
    return {
        "steps": len(common),
        "top1_agreement": top1 / len(common) if common else 0.0,
        "kl_mean": sum(kls) / len(kls) if kls else 0.0,
        "kl_max": max(kls) if kls else 0.0,
        "kl_per_step": kls,
    }


def compare_sessions(
    a: SessionFrames, b: SessionFrames, gen_a: list[int], gen_b: list[int]
) -> dict[str, Any]:
    oa, ob = overview(a), overview(b)
    out: dict[str, Any] = {
        "a": _side(a, oa),
        "b": _side(b, ob),
        "gen_speedup_b_over_a": ob["gen_tok_s"] / oa["gen_tok_s"] if oa["gen_tok_s"] else 0.0,
    }
    footprint = memory_report.footprint_rows(a, b)  # both logs recorded their buffers
    if footprint:
        out["footprint"] = footprint
    out.update(_differences(a, b))
    devices = device_report.compare(a, b)  # runs on several devices: what moved per device
    if devices is not None:
        out["devices"] = devices
    rows, why = roofline_report.compare_rows(a, b)
    if rows:
        out["roofline"] = {"rows": rows, "why": why}
    sa, sb = a.sampling(), b.sampling()
    out["tokens"] = _token_agreement(gen_a, gen_b)
    if sa.describe() or sb.describe():
        # each kind's steps with op times, in both runs (never some steps against all)
        out["sampled"] = {"a": sa.describe(), "b": sb.describe(), "note": SAMPLED_NOTE}
        if sa.mixed or sb.mixed:
            # minimal steps carry no token ids: the generated text is not in the log
            out["tokens"] = {"unavailable": "not recorded (sampled: minimal steps carry no tokens)"}
    out["steps_timed"] = {"a": _per_step(a, "op")[1], "b": _per_step(b, "op")[1]}
    out["per_op"] = _both(a, b, "op", "outer")
    out["per_layer"] = _both(a, b, "layer", "inner")
    logits = _logit_agreement(a, b)
    if logits is not None:
        out["logits"] = logits
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
    if "encoders" in c:  # runs with images or sounds
        sections.append(compare_media.section(c["encoders"]))
    if "requests" in c:  # a server's recording and its replay
        sections.append(compare_requests.section(c["requests"]))
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


def _steps_text(c: dict[str, Any]) -> str:
    """What the per-step times are the mean over."""
    n = c.get("steps_timed") or {}
    each = "; ".join(
        f"{run.upper()}: {v.get('prompt', 0)} prompt, {v.get('gen', 0)} generation"
        for run, v in sorted(n.items())
    )
    sampled = c.get("sampled")
    return (
        "Time per step, prompt and generation apart: each kind's time over its steps with op "
        f"times ({each})." + (f" {sampled['note']}" if sampled else "")
    )


def _kind_columns() -> list[Column]:
    cols = []
    for kind, name in (("prompt", "prompt"), ("gen", "generation")):
        cols += [
            Column(f"{kind}_ms_a", f"{name} A (ms/step)", "f3"),
            Column(f"{kind}_ms_b", f"{name} B (ms/step)", "f3"),
            Column(f"{kind}_ratio", f"{name} B/A", "ratio"),
        ]
    return cols


def _op_section(c: dict[str, Any]) -> Section:
    op_rows = [dict(r, op=str(r["op"])) for r in c["per_op"]]
    # the chart: generation's ratio, the decode two runs are compared on (the prompt's where an
    # op ran in no generation step)
    shown = []
    for r in op_rows:
        ratio = r["gen_ratio"] if r["gen_ratio"] is not None else r["prompt_ratio"]
        if ratio is not None:
            shown.append((r["op"], float(ratio)))
    shown = shown[:15]
    return Section(
        "Time per op type",
        text=_steps_text(c) + " A ratio above 1 means B spent longer on that op type than A.",
        charts=(
            [
                Chart(
                    name="op_time_ratio",
                    kind="diverging",
                    title="Time per op type per generation step, B relative to A (B/A; 1 = the "
                    "same)",
                    x_label="B time / A time",
                    y_label="op type",
                    categories=[op for op, _ in shown],
                    series=[Series("B/A", [v for _, v in shown])],
                    baseline=1.0,
                    lower_is_better=True,
                    value_fmt="ratio",
                    note="Op types in the order of A's time per step; the prompt's ratio for an "
                    "op no generation step ran; blue: B faster, red: B slower.",
                )
            ]
            if shown
            else []
        ),
        tables=[
            Table(
                "per_op",
                "Time per op type per step",
                [Column("op", "op type"), *_kind_columns()],
                op_rows,
                top=12,
            )
        ],
    )


def _layer_section(c: dict[str, Any]) -> Section:
    layer_rows = [dict(r, layer=str(r["layer"])) for r in c["per_layer"]]
    # transformer layers in the chart; the ops outside them (the output projection above all)
    # would set its scale, so they are in the table only
    in_layers = [r for r in layer_rows if r["layer"] not in ("none", "-1")]
    layer_charts = [
        Chart(
            name="per_layer",
            kind="bars",
            title="Time per transformer layer per generation step",
            x_label="time (ms)",
            y_label="layer",
            categories=[f"layer {r['layer']}" for r in in_layers],
            series=[
                Series("A", [r["gen_ms_a"] for r in in_layers]),
                Series("B", [r["gen_ms_b"] for r in in_layers]),
            ],
            value_fmt="f3",
            note="Ops outside the layers (embedding, final norm, output projection) are in the "
            "table below as layer none.",
        )
    ]
    return Section(
        "Time per layer",
        text=_steps_text(c),
        charts=layer_charts if in_layers else [],
        tables=[
            Table(
                "per_layer",
                "Time per layer per step",
                [Column("layer", "layer"), *_kind_columns()],
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
