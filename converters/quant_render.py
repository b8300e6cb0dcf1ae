"""Renderers for quantization reports: text (100 columns), markdown, csv, json and one-file HTML."""

from __future__ import annotations

import csv
import html
import io
from typing import Any

from .quant_report import dumps_json

MB = 1e6
# F16 and BF16 both store 16 bits per weight: one compression figure covers both
VS_16BIT = "16-bit (F16/BF16)"


def _table(rows: list[dict[str, Any]], cols: list[tuple[str, str, str]], md: bool) -> list[str]:
    """cols: (key, header, format spec)."""
    cells = [[format(r[k], f) if f else str(r[k]) for k, _, f in cols] for r in rows]
    heads = [h for _, h, _ in cols]
    if md:
        out = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        return out + ["| " + " | ".join(c) + " |" for c in cells]
    widths = [
        max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(heads)
    ]

    def line(vals: list[str]) -> str:
        return "  ".join(
            v.rjust(w) if k else v.ljust(w)
            for k, (v, w) in enumerate(zip(vals, widths, strict=True))
        )

    return [line(heads)] + [line(c) for c in cells]


def _mb(rows: list[dict[str, Any]], *keys: str) -> list[dict[str, Any]]:
    return [{**r, **{f"{k}_mb": r[k] / MB for k in keys}} for r in rows]


def render_text(data: dict[str, Any], md: bool = False, top: int = 12) -> str:
    out: list[str] = []
    h = (lambda s: f"## {s}") if md else (lambda s: s.upper())
    for m in data["models"]:
        t = m["totals"]
        out += [
            h(f"{t['model']} ({t['file_type']})"),
            f"{t['tensors']} tensors, {t['bytes'] / MB:.1f} MB, {t['bpw']:.2f} bits per weight; "
            f"{t['vs_f32']:.2f}x smaller than F32, {t['vs_16bit']:.2f}x smaller than {VS_16BIT}",
            "",
        ]
        if m.get("memory"):
            mem = m["memory"]
            out += [
                f"memory at run time: weights {mem.get('weights', 0) / MB:.1f} MB, KV cache "
                f"{mem.get('kv_cache', 0) / MB:.1f} MB, compute buffers {mem.get('compute', 0) / MB:.1f} MB",
                *(
                    f"  {b['buffer']}: weights {b['weights'] / MB:.1f} MB, KV {b['kv_cache'] / MB:.1f} MB, "
                    f"compute {b['compute'] / MB:.1f} MB"
                    for b in mem.get("buffers", [])
                ),
                "",
            ]
        out += ["by type:"] + _table(
            _mb(m["per_type"], "bytes"),
            [("type", "type", ""), ("tensors", "tensors", ""), ("bytes_mb", "MB", ".2f"),
             ("byte_share", "bytes %", ".1%"), ("element_share", "weights %", ".1%"), ("bpw", "bpw", ".3f")],  # fmt: skip
            md,
        )
        out += ["", "by role:"] + _table(
            _mb(m["per_role"], "bytes")[:top],
            [("role", "role", ""), ("tensors", "tensors", ""), ("bytes_mb", "MB", ".2f"),
             ("byte_share", "bytes %", ".1%"), ("bpw", "bpw", ".3f")],  # fmt: skip
            md,
        )
        out += ["", f"largest tensors (of {t['tensors']}):"] + _table(
            [{**r, "mb": r["bytes"] / MB} for r in m["tensors"][:top]],
            [("name", "tensor", ""), ("type", "type", ""), ("shape", "shape", ""), ("mb", "MB", ".3f"),
             ("bpw", "bpw", ".3f"), ("vs_f32", "vs F32", ".2f"), ("vs_16bit", f"vs {VS_16BIT}", ".2f")],  # fmt: skip
            md,
        )
        out.append("")
    cmp_ = data.get("comparison")
    if cmp_:
        for o in cmp_["others"]:
            out += [
                h(f"{o['model']} vs {cmp_['baseline']}"),
                f"{o['bytes_b'] / MB:.1f} MB vs {o['bytes_a'] / MB:.1f} MB: saves {o['saved'] / MB:.1f} MB "
                f"(baseline is {o['ratio']:.2f}x the size); {len(o['type_changes'])} tensors changed type",
                "",
            ]
            out += _table(
                _mb(
                    sorted(o["per_role"], key=lambda r: -r["bytes_a"]),
                    "bytes_a",
                    "bytes_b",
                    "saved",
                )[:top],
                [("role", "role", ""), ("bytes_a_mb", "MB base", ".2f"), ("bytes_b_mb", "MB other", ".2f"),
                 ("saved_mb", "saved MB", ".2f"), ("bpw_a", "bpw base", ".2f"), ("bpw_b", "bpw other", ".2f")],  # fmt: skip
                md,
            )
            if o["only_in_baseline"] or o["only_in_other"]:
                out.append(
                    f"warning: different models? {len(o['only_in_baseline'])} tensors only in the baseline, "
                    f"{len(o['only_in_other'])} only in {o['model']}; compared what matches"
                )
            out.append("")
    if data.get("error_vs_reference"):
        for name, rows in data["error_vs_reference"]:
            out += [h(f"dequantization error of {name} vs reference")] + _table(
                rows[:top],
                [("name", "tensor", ""), ("type", "type", ""), ("rmse", "RMSE", ""), ("max_abs", "max abs", ""),
                 ("snr_db", "SNR dB", "")],  # fmt: skip
                md,
            )
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def render_csv(data: dict[str, Any]) -> str:
    buf = io.StringIO()
    rows = [{"model": m["totals"]["model"], **r} for m in data["models"] for r in m["tensors"]]
    w = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["model"])
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


_PALETTE = [
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
]


def _svg_stacked_layers(m: dict[str, Any], types: list[str]) -> str:
    """Bytes per layer, stacked by type."""
    per: dict[Any, dict[str, int]] = {}
    for t in m["tensors"]:
        per.setdefault(t["layer"] if t["layer"] is not None else "other", {}).setdefault(
            t["type"], 0
        )
        per[t["layer"] if t["layer"] is not None else "other"][t["type"]] += t["bytes"]
    keys = sorted((k for k in per if k != "other"), key=int) + (["other"] if "other" in per else [])
    W, H, pad = 760, 240, 40
    bw = (W - 2 * pad) / max(1, len(keys))
    top = max(sum(v.values()) for v in per.values())
    parts = [
        f'<svg width="{W}" height="{H + 60}" xmlns="http://www.w3.org/2000/svg" font-size="10">'
    ]
    for i, k in enumerate(keys):
        y: float = H
        for ti, ty in enumerate(types):
            b = per[k].get(ty, 0)
            if not b:
                continue
            hgt = b / top * (H - pad)
            y -= hgt
            parts.append(
                f'<rect x="{pad + i * bw:.1f}" y="{y:.1f}" width="{bw * 0.8:.1f}" height="{hgt:.1f}" '
                f'fill="{_PALETTE[ti % len(_PALETTE)]}"><title>layer {k}: {ty} {b / MB:.2f} MB</title></rect>'
            )
        if len(keys) <= 40 or i % 5 == 0:
            parts.append(f'<text x="{pad + i * bw:.1f}" y="{H + 14}">{k}</text>')
    for ti, ty in enumerate(types):
        parts.append(
            f'<rect x="{pad + ti * 90}" y="{H + 28}" width="10" height="10" fill="{_PALETTE[ti % len(_PALETTE)]}"/>'
        )
        parts.append(f'<text x="{pad + ti * 90 + 14}" y="{H + 37}">{html.escape(ty)}</text>')
    parts.append(
        f'<text x="{pad}" y="12">bytes per layer, stacked by type (max {top / MB:.2f} MB)</text></svg>'
    )
    return "".join(parts)


def _svg_bpw_by_role(models: list[dict[str, Any]]) -> str:
    roles = sorted({r["role"] for m in models for r in m["per_role"]})
    W, row_h, pad = 760, 14, 110
    H = len(roles) * (row_h * len(models) + 4) + 40
    top = max(r["bpw"] for m in models for r in m["per_role"]) or 1
    parts = [f'<svg width="{W}" height="{H}" xmlns="http://www.w3.org/2000/svg" font-size="10">']
    y = 20
    for role in roles:
        parts.append(f'<text x="0" y="{y + 10}">{html.escape(role)}</text>')
        for mi, m in enumerate(models):
            r = next((x for x in m["per_role"] if x["role"] == role), None)
            if r:
                w = r["bpw"] / top * (W - pad - 60)
                parts.append(
                    f'<rect x="{pad}" y="{y}" width="{w:.1f}" height="{row_h - 2}" fill="{_PALETTE[mi % len(_PALETTE)]}">'
                    f'<title>{html.escape(m["totals"]["model"])}: {r["bpw"]:.2f} bpw</title></rect>'
                    f'<text x="{pad + w + 4:.1f}" y="{y + 10}">{r["bpw"]:.2f}</text>'
                )
            y += row_h
        y += 4
    parts.append("</svg>")
    return "".join(parts)


def render_html(data: dict[str, Any], title: str = "Quantization report") -> str:
    models = data["models"]
    types = sorted({t["type"] for m in models for t in m["tensors"]})
    body = [f"<h1>{html.escape(title)}</h1>"]
    for mi, m in enumerate(models):
        t = m["totals"]
        body.append(
            f'<h2 style="color:{_PALETTE[mi % len(_PALETTE)]}">{html.escape(t["model"])} ({html.escape(t["file_type"])})</h2>'
            f"<p>{t['tensors']} tensors, {t['bytes'] / MB:.1f} MB, {t['bpw']:.2f} bits per weight, "
            f"{t['vs_f32']:.2f}x smaller than F32, {t['vs_16bit']:.2f}x smaller than {VS_16BIT}</p>"
        )
        body.append(_svg_stacked_layers(m, types))
    body.append("<h2>Bits per weight by tensor role</h2>" + _svg_bpw_by_role(models))
    body.append("<h2>Tables</h2><pre>" + html.escape(render_text(data)) + "</pre>")
    style = "body{font-family:sans-serif;max-width:800px;margin:2em auto}pre{font-size:11px;overflow-x:auto}"
    return f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{style}</style></head><body>{''.join(body)}</body></html>\n"


def render(data: dict[str, Any], fmt: str, top: int = 12) -> str:
    """``data`` from ``report_data`` in ``fmt``; ``top`` rows per table in text and markdown."""
    if fmt == "json":
        return dumps_json(data)
    if fmt == "csv":
        return render_csv(data)
    if fmt == "html":
        return render_html(data)
    return render_text(data, md=fmt == "markdown", top=top)
