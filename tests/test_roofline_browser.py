"""The summary's roofline section of a real run, rendered in headless Chromium (as
test_reports_browser.py does): one point per drawn op, the roofs drawn, one step-efficiency
point per step, the per-op-type table with every timed op type. Expected counts come from the raw
NDJSON, not from the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import QUICK, Page, RunLog

from llamacpp_instr.cli import main
from llamacpp_instr.converters.session import machine_peaks
from llamacpp_instr.running import peak_probe as measure

pytestmark = pytest.mark.native


def test_summary_roofline_page(
    browser: Any,
    instr_api: Any,
    smollm2_detailed: RunLog,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLAMACPP_INSTR_CACHE", str(tmp_path))
    p = measure.measure(QUICK, instr_api)
    machine_peaks.save(p, tmp_path)
    out = tmp_path / "s.html"
    r = CliRunner().invoke(
        main, ["summary", str(smollm2_detailed.path), "--format", "html", "-o", str(out)]
    )
    assert r.exit_code == 0, r.output
    recs = [json.loads(line) for line in smollm2_detailed.path.open()]
    graphs = {g["graph"]: g["nodes"] for g in recs if g["type"] == "graph"}
    steps = [s for s in recs if s["type"] == "step_end"]
    # the timed op types (labels), and the graph nodes with FLOPs (any op but data movement)
    timed = [graphs[c["graph"]][op[0]] for c in recs if c["type"] == "compute" for op in c["ops"]]
    labels = {f"{n['op']}:{n['sub']}" if n["sub"] else n["op"] for n in timed}
    no_flops = {"GET_ROWS", "SET_ROWS", "CPY", "CONT", "VIEW", "PERMUTE", "RESHAPE"}
    assert timed and labels - no_flops
    page = Page(browser, out)
    try:
        marks = page.marks("roofline")
        assert 0 < marks == page.declared_marks("roofline")
        # at least one point per op type with FLOPs (each op type is some graph node's)
        colours = page.page.locator('figure[data-chart="roofline"] .mark').evaluate_all(
            "els => new Set(els.map(e => e.getAttribute('fill'))).size"
        )
        assert colours == min(len(labels - no_flops), 10)
        # the bandwidth slope and one ceiling per measured matmul type
        roofs = page.page.locator('figure[data-chart="roofline"] line.roof').count()
        assert roofs == 1 + len(QUICK.types)
        assert page.marks("step_efficiency") == len(steps) == page.declared_marks("step_efficiency")
        assert page.rows("roof_by_op") == len(labels)
        assert "decode runs at" in page.page.content()
    finally:
        page.close()
