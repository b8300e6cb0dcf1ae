"""Renderers: a ``Report`` (``converters.report``) as text, markdown, csv, json or HTML.

``render`` is the one entry point: every report of every command goes through it (commands build
their ``Report`` first: ``summary.summary_report``, ``quant_render.quant_report``, ...);
``llamacpp_instr.commands.emit`` writes it to ``-o/--output`` or stdout.
"""

from __future__ import annotations

from ..errors import UserError
from ..report import Report
from . import csv, html, json, markdown, text

FORMATS = ("text", "markdown", "csv", "json", "html")

_RENDERERS = {
    "text": text.render,
    "markdown": markdown.render,
    "csv": csv.render,
    "json": json.render,
    "html": html.render,
}


def render(report: Report, fmt: str, top: int | None = None) -> str:
    """The report in ``fmt``; ``top`` limits the rows of text and markdown tables (0 = all)."""
    if fmt not in _RENDERERS:
        raise UserError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "csv" and report.no_csv:
        raise UserError(report.no_csv)
    if fmt == "text":
        return text.render(report, top)
    if fmt == "markdown":
        return markdown.render(report, top)
    return _RENDERERS[fmt](report)  # type: ignore[operator]


__all__ = ["FORMATS", "render"]
