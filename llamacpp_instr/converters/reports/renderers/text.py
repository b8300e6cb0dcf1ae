"""Plain text for a terminal: facts as ``label: value`` lines, tables in aligned columns."""

from __future__ import annotations

from dataclasses import dataclass

from ..report import Fact, Report, Table
from .base import Renderer


def facts(items: list[Fact]) -> list[str]:
    width = max((len(f.label) for f in items), default=0)
    return [f"{f.label + ':':<{width + 1}} {f.show()}" for f in items]


def table(t: Table, top: int | None) -> list[str]:
    rows = t.shown_rows(top)
    cells = [[c.show(r.get(c.key)) for c in t.columns] for r in rows]
    widths = [max([len(c.label)] + [len(row[i]) for row in cells]) for i, c in enumerate(t.columns)]

    def line(values: list[str]) -> str:
        parts = [
            v.rjust(w) if c.is_numeric else v.ljust(w)
            for v, w, c in zip(values, widths, t.columns, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [t.title, line([c.label for c in t.columns])]
    out += [line(row) for row in cells]
    if len(rows) < len(t.rows):
        out.append(f"({len(t.rows) - len(rows)} more rows; --top 0 shows all)")
    if t.note:
        out.append(t.note)
    return out


@dataclass
class Text(Renderer):
    name = "text"
    about = "text (terminal)"
    top: int | None = None  # rows per table (None: all)

    def render(self, report: Report) -> str:
        out = [report.title]
        if report.subtitle:
            out.append(report.subtitle)
        out += [f"warning: {w}" for w in report.warnings]
        if report.facts:
            out += [""] + facts(report.facts)
        for s in report.sections:
            if not (s.facts or s.text or any(t.shown_in("text") for t in s.tables)):
                continue  # charts only: nothing to show in text
            out += ["", s.title, "-" * len(s.title)]
            if s.text:
                out.append(s.text)
            if s.facts:
                out += facts(s.facts)
            for t in s.tables:
                if not t.shown_in("text"):
                    continue
                out += [""] + table(t, self.top)
        return "\n".join(out) + "\n"
