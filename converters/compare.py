"""Two runs of the same prompt on two quantizations (or builds), side by side.

Memory, prompt and generation tokens/s, time per op type and per layer, generated-token agreement,
and — when both logs are verbose with top-k logits — top-1 agreement and a KL-divergence estimate.

The KL estimate uses only the top-k logits each log kept: each step's distribution is the softmax
over A's top-k tokens (B's logit for a token outside its own top-k is taken as B's k-th logit, an
upper bound on it), so it approximates KL(A || B) restricted to A's most likely tokens.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from .frames import SessionFrames
from .summary import by, overview


def generated_tokens(path: object) -> list[int]:
    """The tokens a run fed back during generation (its own choices), in order."""
    from .session import load

    sessions = load(path)  # type: ignore[arg-type]
    steps = sorted((s for s in sessions[0].steps if s.kind == "gen"), key=lambda s: s.index)
    return [t for s in steps for t in s.tokens]


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
    if a.info.model.get("n_vocab") != b.info.model.get("n_vocab") or a.info.model.get(
        "n_layer"
    ) != b.info.model.get("n_layer"):
        out["warning"] = "the two sessions are of different models; comparing what matches"
    n = min(len(gen_a), len(gen_b))
    same = sum(1 for x, y in zip(gen_a, gen_b, strict=False) if x == y)
    first_diff = next((i for i in range(n) if gen_a[i] != gen_b[i]), None)
    out["tokens"] = {
        "compared": n,
        "agree": same,
        "agreement": same / n if n else 0.0,
        "first_divergence": first_diff,
    }
    ops_a, ops_b = by(a, "op"), by(b, "op")
    m = pd.merge(
        ops_a[["op", "total_ms", "count"]],
        ops_b[["op", "total_ms", "count"]],
        on="op",
        how="outer",
        suffixes=("_a", "_b"),
    ).fillna(0)
    out["per_op"] = m.sort_values("total_ms_a", ascending=False).to_dict(orient="records")
    la, lb = by(a, "layer"), by(b, "layer")
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


def render_text(c: dict[str, Any]) -> str:
    MB = 1e6
    a, b = c["a"], c["b"]
    lines = [f"A: {a['model']}", f"B: {b['model']}"]
    if "warning" in c:
        lines.append(f"warning: {c['warning']}")
    for key, label in (
        ("weights", "weights"),
        ("kv_cache", "KV cache"),
        ("compute", "compute buffers"),
    ):
        va, vb = a["memory"].get(key, 0), b["memory"].get(key, 0)
        lines.append(
            f"memory {label:16s} A {va / MB:9.1f} MB   B {vb / MB:9.1f} MB   B/A {vb / va if va else 0:.2f}"
        )
    lines.append(f"prompt tok/s  A {a['prompt_tok_s']:9.1f}   B {b['prompt_tok_s']:9.1f}")
    lines.append(
        f"gen tok/s     A {a['gen_tok_s']:9.1f}   B {b['gen_tok_s']:9.1f}   B/A {c['gen_speedup_b_over_a']:.2f}"
    )
    t = c["tokens"]
    lines.append(
        f"generated tokens: {t['agree']}/{t['compared']} identical ({t['agreement']:.0%})"
        + (
            f", first divergence at token {t['first_divergence']}"
            if t["first_divergence"] is not None
            else ""
        )
    )
    if "logits" in c:
        lg = c["logits"]
        lines.append(
            f"logits over {lg['steps']} steps: top-1 agreement {lg['top1_agreement']:.0%}, "
            f"KL(A||B) estimate mean {lg['kl_mean']:.4f}, max {lg['kl_max']:.4f}"
        )
    lines += ["", "time per op type (ms):", f"{'op':<14}{'A':>10}{'B':>10}{'B/A':>8}"]
    for r in c["per_op"][:12]:
        ratio = r["total_ms_b"] / r["total_ms_a"] if r["total_ms_a"] else 0.0
        lines.append(
            f"{str(r['op']):<14}{r['total_ms_a']:>10.2f}{r['total_ms_b']:>10.2f}{ratio:>8.2f}"
        )
    return "\n".join(lines) + "\n"


def render_markdown(c: dict[str, Any]) -> str:
    text = render_text(c)
    head, _, _ = text.partition("\ntime per op type (ms):")
    rows = ["| op | A ms | B ms | B/A |", "|---|---|---|---|"]
    for r in c["per_op"]:
        ratio = r["total_ms_b"] / r["total_ms_a"] if r["total_ms_a"] else 0.0
        rows.append(f"| {r['op']} | {r['total_ms_a']:.2f} | {r['total_ms_b']:.2f} | {ratio:.2f} |")
    return "\n".join(["```", head.rstrip(), "```", "", "Time per op type:", "", *rows]) + "\n"


def render_csv(c: dict[str, Any]) -> str:
    lines = ["op,count_a,total_ms_a,count_b,total_ms_b"]
    for r in c["per_op"]:
        lines.append(
            f"{r['op']},{int(r['count_a'])},{r['total_ms_a']:.6f},{int(r['count_b'])},{r['total_ms_b']:.6f}"
        )
    return "\n".join(lines) + "\n"


def render_html(c: dict[str, Any]) -> str:
    """One self-contained page: time per op type for both runs as an inline SVG bar chart."""
    import html

    ops = c["per_op"][:15]
    top = max([max(r["total_ms_a"], r["total_ms_b"]) for r in ops] + [1e-9])
    row_h, pad, W = 16, 110, 760
    parts = [
        f'<svg width="{W}" height="{len(ops) * (2 * row_h + 6) + 20}" xmlns="http://www.w3.org/2000/svg" font-size="10">'
    ]
    y = 10
    for r in ops:
        parts.append(f'<text x="0" y="{y + 12}">{html.escape(str(r["op"]))}</text>')
        for k, (key, color) in enumerate((("total_ms_a", "#4e79a7"), ("total_ms_b", "#f28e2b"))):
            w = r[key] / top * (W - pad - 70)
            parts.append(
                f'<rect x="{pad}" y="{y + k * row_h}" width="{w:.1f}" height="{row_h - 2}" fill="{color}"/>'
                f'<text x="{pad + w + 4:.1f}" y="{y + k * row_h + 11}">{r[key]:.2f} ms</text>'
            )
        y += 2 * row_h + 6
    parts.append("</svg>")
    legend = (
        f'<p><span style="color:#4e79a7">A: {html.escape(c["a"]["model"])}</span><br>'
        f'<span style="color:#f28e2b">B: {html.escape(c["b"]["model"])}</span></p>'
    )
    style = "body{font-family:sans-serif;max-width:800px;margin:2em auto}pre{font-size:11px}"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Session comparison</title>"
        f"<style>{style}</style></head><body><h1>Session comparison</h1>{legend}"
        f"<h2>Time per op type</h2>{''.join(parts)}<h2>Summary</h2><pre>{html.escape(render_text(c))}</pre>"
        "</body></html>\n"
    )
