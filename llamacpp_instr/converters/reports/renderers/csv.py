"""CSV: the report's main table (``Report.csv_table``), every row, raw values, keys as header."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from llamacpp_instr.contract.errors import UserError

from ..report import Report
from .base import Renderer


@dataclass
class Csv(Renderer):
    name = "csv"
    about = "csv (the main table)"

    def render(self, report: Report) -> str:
        if report.no_csv:  # a report with no one main table says why
            raise UserError(report.no_csv)
        t = report.table(report.csv_table) if report.csv_table else report.tables()[0]
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow([c.key for c in t.columns])
        for r in t.rows:
            w.writerow(["" if r.get(c.key) is None else r.get(c.key) for c in t.columns])
        return buf.getvalue()
