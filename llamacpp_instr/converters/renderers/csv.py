"""CSV: the report's main table (``Report.csv_table``), every row, raw values, keys as header."""

from __future__ import annotations

import csv
import io

from ..report import Report


def render(report: Report) -> str:
    t = report.table(report.csv_table) if report.csv_table else report.tables()[0]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c.key for c in t.columns])
    for r in t.rows:
        w.writerow(["" if r.get(c.key) is None else r.get(c.key) for c in t.columns])
    return buf.getvalue()
