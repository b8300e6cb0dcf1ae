"""Renderers: a ``Report`` (``converters.report``) as text, markdown, csv, json or HTML.

Every command's ``--format`` goes through ``render``; ``-o`` through ``write``.
"""

from __future__ import annotations

from pathlib import Path

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
    if fmt == "text":
        return text.render(report, top)
    if fmt == "markdown":
        return markdown.render(report, top)
    return _RENDERERS[fmt](report)  # type: ignore[operator]


def write(report: Report, fmt: str, output: Path | None, top: int | None = None) -> str | None:
    """Render; write to ``output`` if given (returning None) or return the text for stdout."""
    out = render(report, fmt, top)
    if output is None:
        return out
    try:
        output.write_text(out, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror}") from None
    return None


__all__ = ["FORMATS", "render", "write"]
