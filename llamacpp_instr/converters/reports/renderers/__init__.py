"""Renderers: a ``Report`` (``converters.report``) as text, markdown, csv, json or HTML.

``RENDERERS`` is the registry, and the one list of report formats: each is a ``Renderer``
(``base``) with its name, what it is (the ``--format`` help says it), its own options and
``render(report)``. ``render`` is the one entry point: every report of every command goes through
it (commands build their ``Report`` first: ``summary.summary_report``, ``quant.render.quant_report``,
...); ``llamacpp_instr.cli_shared.output.emit`` writes it to ``-o/--output`` or stdout. (``live`` is the
live view of ``instr follow``, not a report format.)
"""

from __future__ import annotations

from typing import Any

from llamacpp_instr.contract.errors import UserError

from ..report import Report
from .base import Renderer
from .csv import Csv
from .html import Html
from .json import Json
from .markdown import Markdown
from .text import Text

RENDERERS: dict[str, type[Renderer]] = {r.name: r for r in (Text, Markdown, Csv, Json, Html)}


def render(report: Report, fmt: str, **options: Any) -> str:
    """The report in format ``fmt``, with the options that format has (``top``: rows per table of
    text and markdown, None for all)."""
    renderer = RENDERERS.get(fmt)
    if renderer is None:
        raise UserError(f"unknown format {fmt!r}: choose one of {', '.join(RENDERERS)}")
    return renderer.make(**options).render(report)


__all__ = ["RENDERERS", "Renderer", "render"]
