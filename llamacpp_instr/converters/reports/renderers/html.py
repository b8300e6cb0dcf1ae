"""One self-contained HTML page: no CDN, no network, nothing but this file.

Facts as a grid, charts as inline SVG (``svg.py``), tables as real ``<table>``s that sort when a
header is clicked (a few lines of inline script; each cell carries its raw value in ``data-v``).
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from ..report import Chart, Fact, Report, Section, Table
from .base import Renderer
from .svg import render_chart

STYLE = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--bg:#fff;--alt:#f6f8fa;--accent:#4e79a7}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
  background:var(--bg);max-width:980px;margin:2em auto;padding:0 1em}
h1{font-size:1.6em;margin:0 0 .2em}h2{font-size:1.25em;margin:2em 0 .5em;
  border-bottom:1px solid var(--line);padding-bottom:.25em}
.subtitle{color:var(--muted);margin:0 0 1em}
.warn{background:#fff8c5;border:1px solid #d4a72c;padding:.5em .8em;border-radius:6px;margin:.5em 0}
dl.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(210px,1fr));gap:.5em;margin:1em 0}
dl.facts div{background:var(--alt);border-radius:6px;padding:.5em .7em}
dl.facts dt{color:var(--muted);font-size:.85em}dl.facts dd{margin:0;font-size:1.1em;
  font-variant-numeric:tabular-nums}
figure{margin:1.2em 0}figcaption{font-weight:600;margin-bottom:.3em}
figure .note,.table-note{color:var(--muted);font-size:.9em}
svg .grid{stroke:#e6e9ed;stroke-width:1}svg .base{stroke:#59636e;stroke-width:1.2}
svg text{font-size:11px;fill:#333}svg .axis-label{font-size:12px;fill:var(--muted)}
svg .val{font-size:10px;fill:#555}svg .front{stroke:#e15759;stroke-width:1.5;stroke-dasharray:4 3}
svg .mark:hover{opacity:.75}
table{border-collapse:collapse;margin:.6em 0 1.2em;width:100%;font-variant-numeric:tabular-nums}
caption{text-align:left;font-weight:600;padding:.3em 0}
th,td{padding:.3em .6em;border-bottom:1px solid var(--line);text-align:left;white-space:nowrap}
th{background:var(--alt);cursor:pointer;user-select:none;position:sticky;top:0}
th.num,td.num{text-align:right}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
tbody tr:nth-child(even){background:#fbfcfd}
.scroll{max-height:34em;overflow:auto;border:1px solid var(--line);border-radius:6px}
.wide{overflow-x:auto}
.scroll table{margin:0}
footer{color:var(--muted);font-size:.85em;margin:3em 0 1em}
"""

# Click a header to sort by it (numbers as numbers, from data-v); click again to reverse.
SCRIPT = """
document.querySelectorAll("table.sortable th").forEach(function (th, _) {
  th.addEventListener("click", function () {
    var table = th.closest("table"), body = table.tBodies[0];
    var col = Array.prototype.indexOf.call(th.parentNode.children, th);
    var num = th.classList.contains("num");
    var asc = th.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", asc ? "ascending" : "descending");
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = a.cells[col].dataset.v, y = b.cells[col].dataset.v;
      var c = num ? (parseFloat(x) || 0) - (parseFloat(y) || 0) : String(x).localeCompare(String(y));
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
"""


def _facts(items: list[Fact]) -> str:
    if not items:
        return ""
    cells = "".join(
        f"<div><dt>{escape(f.label)}</dt><dd>{escape(f.show())}</dd></div>" for f in items
    )
    return f'<dl class="facts">{cells}</dl>'


def _raw(v: object) -> str:
    return "" if v is None else escape(str(v), quote=True)


def _table(t: Table) -> str:
    head = "".join(
        f'<th scope="col"{" class=num" if c.is_numeric else ""}>{escape(c.label)}</th>'
        for c in t.columns
    )
    body = []
    for r in t.rows:
        tds = "".join(
            f'<td{" class=num" if c.is_numeric else ""} data-v="{_raw(r.get(c.key))}">'
            f"{escape(c.show(r.get(c.key)))}</td>"
            for c in t.columns
        )
        body.append(f"<tr>{tds}</tr>")
    table = (
        f'<table class="sortable" data-table="{escape(t.name)}" data-rows="{len(t.rows)}">'
        f"<caption>{escape(t.title)}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )
    note = f'<p class="table-note">{escape(t.note)}</p>' if t.note else ""
    # long tables scroll within the page; wide ones sideways
    wrapped = f'<div class="{"scroll" if len(t.rows) > 25 else "wide"}">{table}</div>'
    return wrapped + note


def _chart(c: Chart) -> str:
    note = f'<p class="note">{escape(c.note)}</p>' if c.note else ""
    return (
        f'<figure class="chart" data-chart="{escape(c.name)}" data-kind="{c.kind}" '
        f'data-marks="{c.n_marks}"><figcaption>{escape(c.title)}</figcaption>'
        f"{render_chart(c)}{note}</figure>"
    )


def _section(s: Section) -> str:
    parts = [f"<section><h2>{escape(s.title)}</h2>"]
    if s.text:
        parts.append(f"<p>{escape(s.text)}</p>")
    parts.append(_facts(s.facts))
    parts += [_chart(c) for c in s.charts]
    parts += [_table(t) for t in s.tables if t.shown_in("html")]
    parts.append("</section>")
    return "".join(parts)


@dataclass
class Html(Renderer):
    name = "html"
    about = "html (one self-contained page with charts and sortable tables)"

    def render(self, report: Report) -> str:
        warnings = "".join(f'<p class="warn">warning: {escape(w)}</p>' for w in report.warnings)
        subtitle = f'<p class="subtitle">{escape(report.subtitle)}</p>' if report.subtitle else ""
        return (
            '<!doctype html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{escape(report.title)}</title><style>{STYLE}</style></head><body>"
            f"<header><h1>{escape(report.title)}</h1>{subtitle}</header>{warnings}"
            f"{_facts(report.facts)}{''.join(_section(s) for s in report.sections)}"
            "<footer>Made by llamacpp-instr from measured session data. Click a table header to "
            f"sort.</footer><script>{SCRIPT}</script></body></html>\n"
        )
