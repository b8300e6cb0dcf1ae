"""What every report format is: a ``Renderer`` (the registry is ``renderers.RENDERERS``)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from ..report import Report


@dataclass
class Renderer:
    """A report format: ``render(report)`` gives the report as text. ``name`` is its ``--format``
    choice and ``about`` says what it is in that option's help; its own options (``top`` in text
    and markdown) are its fields, so that a command can hand every renderer the same ones
    (``make``)."""

    name: ClassVar[str]
    about: ClassVar[str]

    @classmethod
    def make(cls, **options: Any) -> Renderer:
        """This renderer with the options it has; the others are not its business."""
        mine = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in options.items() if k in mine})

    def render(self, report: Report) -> str:
        raise NotImplementedError
