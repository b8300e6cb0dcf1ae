"""Charts as inline SVG: axes with units, one ``class="mark"`` element per value, a tooltip
(``<title>``) on each mark. No script, no external resource."""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape

from ..report import FORMATTERS, Chart, Series

PALETTE = [
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
]
WIDTH = 760
LABEL_W = 150  # left margin for category labels
RIGHT = 60


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values from at or below ``lo`` to at or above ``hi``."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    t = math.floor(lo / step) * step
    ticks = [round(t, 12)]
    while ticks[-1] < hi - step * 1e-9:
        t += step
        ticks.append(round(t, 12))
    return ticks


def _tick_label(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:g}G"
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def _short(s: str, n: int = 22) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _svg(h: float, body: list[str], chart: Chart) -> str:
    return (
        f'<svg class="chart-svg" viewBox="0 0 {WIDTH} {h:.0f}" width="{WIDTH}" height="{h:.0f}" '
        f'role="img" aria-label="{escape(chart.title)}" xmlns="http://www.w3.org/2000/svg">'
        + "".join(body)
        + "</svg>"
    )


def _legend_rows(chart: Chart) -> list[list[tuple[int, str]]]:
    rows: list[list[tuple[int, str]]] = [[]]
    x = LABEL_W
    for i, s in enumerate(chart.series):
        w = 24 + 7 * min(len(s.name), 28)
        if rows[-1] and x + w > WIDTH - 20:
            rows.append([])
            x = LABEL_W
        rows[-1].append((i, s.name))
        x += w
    return rows


def _legend(chart: Chart, y: float) -> list[str]:
    out = []
    for row in _legend_rows(chart):
        x = LABEL_W
        for i, name in row:
            color = chart.series[i].color or PALETTE[i % len(PALETTE)]
            out.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{color}"/>')
            out.append(
                f'<text x="{x + 14}" y="{y + 9}" class="legend">{escape(_short(name, 28))}</text>'
            )
            x += 24 + 7 * min(len(name), 28)
        y += 16
    return out


def _legend_h(chart: Chart) -> int:
    return 16 * len(_legend_rows(chart)) + 4 if len(chart.series) > 1 else 0


def _x_axis(ticks: list[float], sx: object, y0: float, y1: float, label: str) -> list[str]:
    out = []
    for t in ticks:
        x = sx(t)  # type: ignore[operator]
        out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y1}" class="grid"/>')
        out.append(
            f'<text x="{x:.1f}" y="{y1 + 13}" class="tick" text-anchor="middle">{_tick_label(t)}</text>'
        )
    mid = (sx(ticks[0]) + sx(ticks[-1])) / 2  # type: ignore[operator]
    out.append(
        f'<text x="{mid:.1f}" y="{y1 + 30}" class="axis-label" text-anchor="middle">{escape(label)}</text>'
    )
    return out


def _y_axis(
    ticks: list[float],
    sy: Callable[[float], float],
    left: float,
    plot_w: float,
    top: float,
    plot_h: float,
    label: str,
) -> list[str]:
    """Horizontal grid lines with their values on the left, and the axis label turned upright."""
    out = []
    for t in ticks:
        out.append(
            f'<line x1="{left}" y1="{sy(t):.1f}" x2="{left + plot_w}" y2="{sy(t):.1f}" class="grid"/>'
        )
        out.append(
            f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" class="tick" text-anchor="end">{_tick_label(t)}</text>'
        )
    out.append(
        f'<text x="14" y="{top + plot_h / 2:.1f}" class="axis-label" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + plot_h / 2:.1f})">{escape(label)}</text>'
    )
    return out


APART_GAP = 14  # the space between the categories drawn apart and the others


def _apart_rule(x1: float, y: float) -> str:
    """The dashed rule between the categories a chart draws apart and the others, under their
    labels and across the plot to ``x1``."""
    return (
        f'<line x1="10" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" class="apart" '
        'stroke="#8c959f" stroke-width="1" stroke-dasharray="4 3"/>'
    )


def _hbars(chart: Chart) -> str:
    """bars (grouped), stacked and diverging: categories down the y axis, values along x."""
    stacked = chart.kind == "stacked"
    n_s = len(chart.series)
    cats = chart.categories
    bar_h = 14 if (stacked or n_s == 1) else max(6, 16 - 2 * n_s)
    group_h = (bar_h if stacked else bar_h * n_s) + 6
    top = 8
    legend_h = _legend_h(chart)
    apart = chart.apart if 0 < chart.apart < len(cats) else 0
    plot_h = len(cats) * group_h + (APART_GAP if apart else 0)
    h = top + plot_h + 40 + legend_h
    base = chart.baseline
    vals = [v for s in chart.series for v in s.values if v is not None and math.isfinite(v)]
    if stacked:
        sums = [
            sum(s.values[i] for s in chart.series if s.values[i] and s.values[i] > 0)
            for i in range(len(cats))
        ]
        lo, hi = 0.0, max(sums + [0.0])
    else:
        lo, hi = min(vals + [base]), max(vals + [base])
    ticks = _nice_ticks(lo, hi)
    x0, x1 = LABEL_W, WIDTH - RIGHT

    def sx(v: float) -> float:
        return x0 + (v - ticks[0]) / (ticks[-1] - ticks[0]) * (x1 - x0)

    body = _x_axis(ticks, sx, top, top + plot_h, chart.x_label)
    fmt = FORMATTERS[chart.value_fmt]
    if apart:
        body.append(_apart_rule(x1, top + apart * group_h + APART_GAP / 2 - 3))
    for i, cat in enumerate(cats):
        gy = top + i * group_h + (APART_GAP if apart and i >= apart else 0)
        body.append(
            f'<text x="{x0 - 6}" y="{gy + (group_h - 6) / 2 + 4:.1f}" class="cat" text-anchor="end">'
            f"<title>{escape(cat)}</title>{escape(_short(cat))}</text>"
        )
        acc = 0.0
        for k, s in enumerate(chart.series):
            v = s.values[i]
            v = 0.0 if v is None or not math.isfinite(v) else v
            color = s.color or PALETTE[k % len(PALETTE)]
            if stacked:
                a, b = sx(acc), sx(acc + max(v, 0.0))
                y = gy
                acc += max(v, 0.0)
            else:
                a, b = sorted((sx(base), sx(v)))
                y = gy + k * bar_h
                if chart.kind == "diverging" and n_s == 1:
                    good = v < base if chart.lower_is_better else v >= base
                    color = PALETTE[0] if good else PALETTE[3]
            tip = f"{cat} · {s.name}: {fmt(v)}"
            body.append(
                f'<rect class="mark" x="{a:.1f}" y="{y:.1f}" width="{max(b - a, 0.0):.1f}" '
                f'height="{bar_h - 1}" fill="{color}" data-value="{v}"><title>{escape(tip)}</title></rect>'
            )
            if not stacked and n_s == 1:
                body.append(
                    f'<text x="{b + 4:.1f}" y="{y + bar_h - 3:.1f}" class="val">{escape(fmt(v))}</text>'
                )
    if chart.kind == "diverging":
        body.append(
            f'<line x1="{sx(base):.1f}" y1="{top}" x2="{sx(base):.1f}" y2="{top + plot_h}" class="base"/>'
        )
    if n_s > 1:
        body += _legend(chart, top + plot_h + 40)
    return _svg(h, body, chart)


def _histogram(chart: Chart) -> str:
    s = chart.series[0]
    n = len(s.values)
    top, left, bottom = 10, 60, 50
    plot_w, plot_h = WIDTH - left - RIGHT, 200
    h = top + plot_h + bottom
    ticks = _nice_ticks(0.0, max(s.values + [0.0]))

    def sy(v: float) -> float:
        return top + plot_h - (v - ticks[0]) / (ticks[-1] - ticks[0]) * plot_h

    body = _y_axis(ticks, sy, left, plot_w, top, plot_h, chart.y_label)
    bw = plot_w / max(n, 1)
    every = max(1, math.ceil(n / 10))
    for i, v in enumerate(s.values):
        x = left + i * bw
        tip = f"{chart.categories[i]}: {v:g}"
        body.append(
            f'<rect class="mark" x="{x + 1:.1f}" y="{sy(v):.1f}" width="{max(bw - 2, 1):.1f}" '
            f'height="{top + plot_h - sy(v):.1f}" fill="{s.color or PALETTE[0]}" data-value="{v}">'
            f"<title>{escape(tip)}</title></rect>"
        )
        if i % every == 0:
            body.append(
                f'<text x="{x + bw / 2:.1f}" y="{top + plot_h + 13}" class="tick" text-anchor="middle">'
                f"{escape(chart.categories[i])}</text>"
            )
    body.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{h - 12}" class="axis-label" text-anchor="middle">{escape(chart.x_label)}</text>'
    )
    return _svg(h, body, chart)


def _xy(chart: Chart) -> str:
    """line and scatter: numeric x and y."""
    top, left, bottom = 10, 60, 50
    plot_w, plot_h = WIDTH - left - RIGHT, 220
    legend_h = _legend_h(chart)
    h = top + plot_h + bottom + legend_h
    ys = [v for s in chart.series for v in s.values if v is not None and math.isfinite(v)]
    xt = _nice_ticks(min(chart.x + [0.0]) if chart.kind == "line" else min(chart.x), max(chart.x))
    yt = _nice_ticks(min(ys + [0.0]), max(ys + [0.0]))

    def sx(v: float) -> float:
        return left + (v - xt[0]) / (xt[-1] - xt[0]) * plot_w

    def sy(v: float) -> float:
        return top + plot_h - (v - yt[0]) / (yt[-1] - yt[0]) * plot_h

    body = _x_axis(xt, sx, top, top + plot_h, chart.x_label)
    body += _y_axis(yt, sy, left, plot_w, top, plot_h, chart.y_label)
    fmt = FORMATTERS[chart.value_fmt]
    for k, s in enumerate(chart.series):
        color = s.color or PALETTE[k % len(PALETTE)]
        pts = [(sx(x), sy(y)) for x, y in zip(chart.x, s.values, strict=True)]
        if chart.kind == "line" and len(pts) > 1:
            d = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            body.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        if chart.kind == "scatter" and chart.front:
            d = " ".join(f"{pts[i][0]:.1f},{pts[i][1]:.1f}" for i in chart.front)
            body.append(f'<polyline points="{d}" class="front" fill="none"/>')
        r = 2.5 if chart.kind == "line" else 5
        for i, ((px, py), x, y) in enumerate(zip(pts, chart.x, s.values, strict=True)):
            label = chart.categories[i] if i < len(chart.categories) else f"{x:g}"
            on_front = chart.kind == "scatter" and i in chart.front
            body.append(
                f'<circle class="mark{" on-front" if on_front else ""}" cx="{px:.1f}" cy="{py:.1f}" '
                f'r="{r}" fill="{color}" data-value="{y}"><title>{escape(f"{label}: {fmt(y)}")}</title></circle>'
            )
            if chart.kind == "scatter":
                body.append(
                    f'<text x="{px + 7:.1f}" y="{py + 4:.1f}" class="val">{escape(_short(label, 18))}</text>'
                )
    if len(chart.series) > 1:
        body += _legend(chart, top + plot_h + 40)
    return _svg(h, body, chart)


def _heatmap(chart: Chart) -> str:
    rows, cols = chart.categories, chart.columns
    top, cell_h = 70, 14
    plot_w = WIDTH - LABEL_W - RIGHT
    cw = plot_w / max(len(cols), 1)
    h = top + len(rows) * cell_h + 30
    vals = [v for r in chart.matrix for v in r if v is not None and math.isfinite(v)]
    hi = max(vals + [1e-12])
    fmt = FORMATTERS[chart.value_fmt]
    body = []
    for j, c in enumerate(cols):
        x = LABEL_W + j * cw + cw / 2
        body.append(
            f'<text x="{x:.1f}" y="{top - 6}" class="tick" text-anchor="start" '
            f'transform="rotate(-45 {x:.1f} {top - 6})">{escape(_short(c, 16))}</text>'
        )
    for i, rname in enumerate(rows):
        y = top + i * cell_h
        body.append(
            f'<text x="{LABEL_W - 6}" y="{y + cell_h - 3}" class="cat" text-anchor="end">{escape(_short(rname))}</text>'
        )
        for j, c in enumerate(cols):
            v = chart.matrix[i][j]
            v = 0.0 if v is None or not math.isfinite(v) else v
            # square root: a 5 us op next to a 200 us matmul still shows
            t = math.sqrt(max(v, 0.0) / hi)
            col = f"rgb({int(255 - 177 * t)},{int(255 - 134 * t)},{int(255 - 88 * t)})"
            body.append(
                f'<rect class="mark" x="{LABEL_W + j * cw:.1f}" y="{y}" width="{cw - 1:.1f}" '
                f'height="{cell_h - 1}" fill="{col}" data-value="{v}">'
                f"<title>{escape(f'{rname} · {c}: {fmt(v)}')}</title></rect>"
            )
    body.append(
        f'<text x="{LABEL_W}" y="{h - 8}" class="axis-label">{escape(chart.x_label)} · rows: '
        f"{escape(chart.y_label)} · darker = more (square-root scale, max {escape(fmt(hi))})</text>"
    )
    return _svg(h, body, chart)


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Powers of ten covering [lo, hi]."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return [10.0**e for e in range(a, max(b, a + 1) + 1)]


def _roofline(chart: Chart) -> str:
    """Log-log roofline: the bandwidth roof as a slope, each compute roof as a ceiling, the points
    sized by ``sizes`` (area) and coloured by ``groups``, with a legend of the groups."""
    top, left, bottom = 10, 60, 50
    plot_w, plot_h = WIDTH - left - RIGHT, 300
    groups = list(dict.fromkeys(chart.groups))
    legend = Chart(chart.name, "roofline", "", "", "", series=[_series(g) for g in groups])
    legend_h = _legend_h(legend)
    h = top + plot_h + bottom + legend_h
    ys = [v for v in chart.series[0].values if v > 0]
    bw = chart.roofs.get("memory", 0.0)
    ceilings = {k: v for k, v in chart.roofs.items() if k != "memory" and v > 0}
    peak = max(ceilings.values(), default=max(ys + [1.0]))
    xs = [x for x in chart.x if x > 0]
    xt = _log_ticks(min(xs + [0.1]), max(xs + [peak / bw if bw else 10.0, 10.0]) * 2)
    yt = _log_ticks(min(ys + [peak / 100]), peak * 2)
    lx0, lx1, ly0, ly1 = (
        math.log10(xt[0]),
        math.log10(xt[-1]),
        math.log10(yt[0]),
        math.log10(yt[-1]),
    )

    def sx(v: float) -> float:
        return left + (math.log10(v) - lx0) / (lx1 - lx0) * plot_w

    def sy(v: float) -> float:
        return top + plot_h - (math.log10(v) - ly0) / (ly1 - ly0) * plot_h

    body = _x_axis(xt, sx, top, top + plot_h, chart.x_label)
    body += _y_axis(yt, sy, left, plot_w, top, plot_h, chart.y_label)
    if bw > 0:
        # the slope from the left edge up to where it meets the highest ceiling
        x_a = max(xt[0], yt[0] / bw)
        x_b = min(xt[-1], peak / bw)
        body.append(
            f'<line class="roof" x1="{sx(x_a):.1f}" y1="{sy(bw * x_a):.1f}" x2="{sx(x_b):.1f}" '
            f'y2="{sy(bw * x_b):.1f}" stroke="#333" stroke-width="2"/>'
        )
        body.append(
            f'<text x="{sx(x_a) + 4:.1f}" y="{sy(bw * x_a) - 6:.1f}" class="val">'
            f"memory {bw:.1f} GB/s</text>"
        )
    labelled: list[float] = []  # y of the ceilings labelled so far: labels must not overlap
    for k, (name, v) in enumerate(sorted(ceilings.items(), key=lambda kv: -kv[1])):
        x_a = max(xt[0], v / bw) if bw > 0 else xt[0]
        dash = "" if k == 0 else ' stroke-dasharray="4 3"'
        body.append(
            f'<line class="roof" x1="{sx(x_a):.1f}" y1="{sy(v):.1f}" x2="{left + plot_w}" '
            f'y2="{sy(v):.1f}" stroke="#333" stroke-width="{2 if k == 0 else 1}"{dash}>'
            f"<title>{escape(f'{name}: {v:.1f} GFLOP/s')}</title></line>"
        )
        if all(abs(sy(v) - y) >= 11 for y in labelled):
            labelled.append(sy(v))
            body.append(
                f'<text x="{left + plot_w - 4}" y="{sy(v) - 3:.1f}" class="val" '
                f'text-anchor="end">{escape(f"{name} {v:.0f}")}</text>'
            )
    fmt = FORMATTERS[chart.value_fmt]
    big = max(chart.sizes + [1e-12])
    for i, (x, y) in enumerate(zip(chart.x, chart.series[0].values, strict=True)):
        if not (x > 0 and y > 0):
            continue
        g = chart.groups[i] if i < len(chart.groups) else ""
        color = PALETTE[groups.index(g) % len(PALETTE)] if g in groups else PALETTE[0]
        size = chart.sizes[i] if i < len(chart.sizes) else 0.0
        r = 2.5 + 12 * math.sqrt(max(size, 0.0) / big)
        tip = f"{chart.categories[i]}: {fmt(y)} GFLOP/s at {x:.3g} FLOPs/byte, {size:.3g} ms"
        body.append(
            f'<circle class="mark" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="{r:.1f}" fill="{color}" '
            f'fill-opacity="0.7" data-value="{y}"><title>{escape(tip)}</title></circle>'
        )
    if len(groups) > 1:
        body += _legend(legend, top + plot_h + 40)
    return _svg(h, body, chart)


def _series(name: str) -> Series:
    return Series(name, [])


def render_chart(chart: Chart) -> str:
    if chart.kind in ("bars", "stacked", "diverging"):
        return _hbars(chart)
    if chart.kind == "histogram":
        return _histogram(chart)
    if chart.kind in ("line", "scatter"):
        return _xy(chart)
    if chart.kind == "heatmap":
        return _heatmap(chart)
    if chart.kind == "roofline":
        return _roofline(chart)
    raise ValueError(f"unknown chart kind {chart.kind!r}")
