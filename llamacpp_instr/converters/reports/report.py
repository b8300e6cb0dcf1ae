"""The report model: what every report (summary, compare, quant-report, ...) is, before it is text.

A command computes a ``Report`` (facts, tables and charts holding raw values); the shared renderers
in ``converters.renderers`` turn it into text, markdown, csv, json or one self-contained HTML page.
No report formats its own output, and no renderer knows which command made the report: in the
spirit of pyinstrument's ``renderers/``, one model and many renderers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llamacpp_instr.contract.units import fmt_bytes

# How a column's or a fact's value is shown in text, markdown and HTML (csv and json keep the raw
# value). Each takes the value and returns a string.
Formatter = Callable[[Any], str]


def _num(spec: str) -> Formatter:
    def f(v: Any) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "–"
        return format(v, spec)

    return f


def fmt_pct(v: Any) -> str:
    """A fraction as a percentage: 0.123 -> 12.3%."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v * 100:.1f}%"


def fmt_ratio(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:.2f}x"


FORMATTERS: dict[str, Formatter] = {
    "text": lambda v: "–" if v is None else str(v),
    "int": _num(",d"),
    "f1": _num(".1f"),
    "f2": _num(".2f"),
    "f3": _num(".3f"),
    "f4": _num(".4f"),
    "pct": fmt_pct,
    "bytes": fmt_bytes,
    "mib": lambda v: fmt_bytes(v, "MiB"),  # a column of memory figures read against each other
    "ratio": fmt_ratio,
}


@dataclass
class Column:
    key: str  # key in each row dict (and the csv/json field name)
    label: str  # header, with its unit: "total (ms)"
    fmt: str = "text"  # a FORMATTERS key: how its values show
    numeric: bool | None = None  # right-aligned and sorted as a number (default: fmt != text)

    @property
    def is_numeric(self) -> bool:
        return self.numeric if self.numeric is not None else self.fmt != "text"

    def show(self, v: Any) -> str:
        return FORMATTERS[self.fmt](v)


@dataclass
class Table:
    name: str  # identifier: csv file section, json key
    title: str
    columns: list[Column]
    rows: list[dict[str, Any]]
    note: str = ""
    # text and markdown show the first `top` rows (csv, json and html show all)
    top: int | None = None
    # the formats that show this table (empty: all); e.g. a full listing only in html
    only: tuple[str, ...] = ()
    # every row, whatever ``top`` says (a table already bounded, whose rows read together)
    whole: bool = False

    def shown_in(self, fmt: str) -> bool:
        return not self.only or fmt in self.only

    def shown_rows(self, top: int | None) -> list[dict[str, Any]]:
        if self.whole:
            return self.rows
        limit = top if top is not None else self.top
        return self.rows if not limit else self.rows[:limit]


@dataclass
class Series:
    """One named series of a chart: y values for the chart's categories (or x values)."""

    name: str
    values: list[float]
    color: str | None = None


@dataclass
class Chart:
    """A chart of raw values; the HTML renderer draws it as inline SVG, one mark per value.

    kinds:
    - ``bars``: horizontal bars, one group per category, one bar per series (grouped);
    - ``stacked``: horizontal bars, one per category, the series stacked (these and ``bars``
      draw their first ``apart`` categories apart from the others: a gap and a rule between);
    - ``diverging``: horizontal bars around zero (or around 1 with ``baseline=1``: ratios);
    - ``histogram``: vertical bars over ``categories`` (bin labels), one series;
    - ``line``: one or more series over ``x`` values;
    - ``heatmap``: ``matrix[row][col]`` over ``categories`` (rows) x ``columns``;
    - ``scatter``: points (``x``, first series' values), labelled by ``categories``, with an
      optional ``front`` (indices of points joined as a line, e.g. a Pareto front);
    - ``roofline``: log-log points (``x`` FLOPs/byte, first series' GFLOP/s) sized by ``sizes``,
      coloured by ``groups``, under the ``roofs``.
    """

    name: str
    kind: str
    title: str
    x_label: str  # with its unit
    y_label: str
    categories: list[str] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    x: list[float] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    matrix: list[list[float]] = field(default_factory=list)
    value_fmt: str = "f2"
    baseline: float = 0.0
    front: list[int] = field(default_factory=list)
    note: str = ""
    # diverging bars: is a value below the baseline the good side (e.g. a time ratio)?
    lower_is_better: bool = False
    # roofline: point sizes (e.g. ms), colour groups, and the roofs ("memory": GB/s, the slope;
    # any other name: a GFLOP/s ceiling)
    sizes: list[float] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    roofs: dict[str, float] = field(default_factory=dict)
    # bars, stacked: the first categories drawn apart from the others (0: none)
    apart: int = 0

    @property
    def n_marks(self) -> int:
        """How many data marks the chart draws (one per value): what the browser test counts."""
        if self.kind == "heatmap":
            return sum(len(r) for r in self.matrix)
        return sum(len(s.values) for s in self.series)


@dataclass
class Fact:
    label: str
    value: Any
    fmt: str = "text"

    def show(self) -> str:
        return FORMATTERS[self.fmt](self.value)


@dataclass
class Section:
    title: str
    facts: list[Fact] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    text: str = ""  # a paragraph of explanation


@dataclass
class Report:
    title: str
    subtitle: str = ""
    facts: list[Fact] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # the json renderer's output: the report's machine-readable content (raw values), an object
    # or a list (one object per answer: instr fit's quantizations, instr plan's settings)
    data: Any = field(default_factory=dict)
    # the table the csv renderer writes (csv holds one table)
    csv_table: str = ""
    # why this report has no table for csv: the csv format is then refused with this message
    no_csv: str = ""
    # json: ``data`` dumped as the report's builder made it (no NaN cleaning, no final newline:
    # quant-report's json, a raw data contract)
    json_as_given: bool = False

    def tables(self) -> list[Table]:
        return [t for s in self.sections for t in s.tables]

    def charts(self) -> list[Chart]:
        return [c for s in self.sections for c in s.charts]

    def table(self, name: str) -> Table:
        for t in self.tables():
            if t.name == name:
                return t
        raise KeyError(name)


def rows_of(records: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Plain Python rows (numpy and pandas scalars turned into int/float/str/None)."""
    out = []
    for r in records:
        row = {}
        for k in keys:
            v = r.get(k)
            if v is not None and hasattr(v, "item"):
                v = v.item()
            if isinstance(v, float) and math.isnan(v):
                v = None
            row[k] = v
        out.append(row)
    return out
