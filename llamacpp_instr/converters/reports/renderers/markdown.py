"""Markdown (GitHub flavour): facts as a list, tables as pipe tables."""

from __future__ import annotations

from dataclasses import dataclass

from ..report import Report, Table
from .base import Renderer


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def table(t: Table, top: int | None) -> list[str]:
    rows = t.shown_rows(top)
    out = [f"**{t.title}**", ""]
    out.append("| " + " | ".join(_cell(c.label) for c in t.columns) + " |")
    out.append("|" + "".join("---:|" if c.is_numeric else "---|" for c in t.columns))
    for r in rows:
        out.append("| " + " | ".join(_cell(c.show(r.get(c.key))) for c in t.columns) + " |")
    if len(rows) < len(t.rows):
        out += ["", f"_{len(t.rows) - len(rows)} more rows; `--top 0` shows all._"]
    if t.note:
        out += ["", t.note]
    return out


@dataclass
class Markdown(Renderer):
    name = "markdown"
    about = "markdown"
    top: int | None = None  # rows per table (None: all)

    def render(self, report: Report) -> str:
        out = [f"# {report.title}"]
        if report.subtitle:
            out += ["", report.subtitle]
        out += [f"\n> warning: {w}" for w in report.warnings]
        if report.facts:
            out += [""] + [f"- {f.label}: {f.show()}" for f in report.facts]
        for s in report.sections:
            if not (s.facts or s.text or any(t.shown_in("markdown") for t in s.tables)):
                continue
            out += ["", f"## {s.title}"]
            if s.text:
                out += ["", s.text]
            if s.facts:
                out += [""] + [f"- {f.label}: {f.show()}" for f in s.facts]
            for t in s.tables:
                if not t.shown_in("markdown"):
                    continue
                out += [""] + table(t, self.top)
        return "\n".join(out) + "\n"
