"""JSON: the report's machine-readable content (``Report.data``), raw values (NaN and infinities
as null, unless the report asks for its data as given)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..report import Report
from .base import Renderer


def _clean(v: Any) -> Any:
    # NaN/inf are not JSON: null, as the log itself does
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if hasattr(v, "item"):  # numpy scalars
        return _clean(v.item())
    return v


@dataclass
class Json(Renderer):
    name = "json"
    about = "json (all of it, raw values)"

    def render(self, report: Report) -> str:
        if report.json_as_given:
            return json.dumps(report.data, indent=2, default=str)
        data = report.data
        if not data and not isinstance(data, list):  # (an empty list is an answer: none)
            data = {
                "title": report.title,
                "facts": {f.label: f.value for f in report.facts},
                **{t.name: t.rows for t in report.tables()},
            }
        return json.dumps(_clean(data), indent=2, default=str) + "\n"
