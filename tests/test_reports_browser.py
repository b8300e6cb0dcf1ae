"""Every HTML report, rendered in a real browser (headless Debian Chromium, driven by Playwright):
no script errors, tables with the rows the data has, charts with one mark per data point, and
headers that sort. Expected counts come from the raw NDJSON and from gguf-py, not from the report.

Skipped, saying why, where Chromium (Debian package `chromium`) or Playwright is missing; CI
installs both.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from gguf import GGUFReader
from helpers.support import FIXTURES, Page, RunLog, make_run, read_log

from llamacpp_instr.cli import main

pytestmark = pytest.mark.native


def _html(args: list[str], out: Path) -> Path:
    r = CliRunner().invoke(main, [*args, "--format", "html", "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out


def _raw(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.open()]


def test_summary_page(browser: Any, smollm2_detailed: RunLog, tmp_path: Path) -> None:
    recs = _raw(smollm2_detailed.path)
    page = Page(browser, _html(["summary", str(smollm2_detailed.path)], tmp_path / "s.html"))
    try:
        # op types timed in the log: each op's node label from its graph table
        graphs = {g["graph"]: g["nodes"] for g in recs if g["type"] == "graph"}

        def label(node: dict[str, Any]) -> str:
            return f"{node['op']}:{node['sub']}" if node["sub"] else node["op"]

        timed = {
            label(graphs[c["graph"]][op[0]])
            for c in recs
            if c["type"] == "compute"
            for op in c["ops"]
        }
        assert page.rows("by_op") == len(timed)
        gen = [b["step"] for b in recs if b["type"] == "step_begin" and b["kind"] == "gen"]
        n_layer = recs[0]["model"]["n_layer"]
        assert (
            page.marks("tokens_per_second") == len(gen) == page.declared_marks("tokens_per_second")
        )
        assert page.marks("step_time_histogram") == page.declared_marks("step_time_histogram")
        # one bar per step in the histogram's bins, all steps counted
        heights = page.page.locator('figure[data-chart="step_time_histogram"] .mark').evaluate_all(
            "els => els.map(e => parseFloat(e.dataset.value))"
        )
        assert sum(heights) == len(gen)
        # stacked bars: one segment per (layer or outside, op type), the layers all present
        stacked = page.declared_marks("typical_step_by_layer")
        assert page.marks("typical_step_by_layer") == stacked and stacked % (n_layer + 1) == 0
        heat = page.marks("layer_op_heatmap")
        assert heat == page.declared_marks("layer_op_heatmap") and heat % n_layer == 0
        # sorting by total time (column 2), then again descending
        page.sort_by("by_op", 2)
        values = [float(v) for v in page.column("by_op", 2)]
        assert values == sorted(values)
        page.sort_by("by_op", 2)
        values = [float(v) for v in page.column("by_op", 2)]
        assert values == sorted(values, reverse=True)
        page.sort_by("by_op", 0)
        names = page.column("by_op", 0)
        assert names == sorted(names, key=lambda s: s.lower()) or names == sorted(names)
    finally:
        page.close()


def test_compare_page(
    browser: Any, tiny_llama_f32: Path, tiny_llama_q8: Path, tmp_path: Path
) -> None:
    a = make_run(tiny_llama_f32, tmp_path / "a.log", "detailed", n_predict=5)
    b = make_run(tiny_llama_q8, tmp_path / "b.log", "detailed", n_predict=5)
    page = Page(browser, _html(["compare", str(a.log_path), str(b.log_path)], tmp_path / "c.html"))
    try:
        ra, rb = _raw(a.log_path), _raw(b.log_path)

        def op_types(recs: list[dict[str, Any]]) -> set[str]:
            graphs = {g["graph"]: g["nodes"] for g in recs if g["type"] == "graph"}
            return {
                graphs[c["graph"]][op[0]]["op"]
                + (
                    ":" + graphs[c["graph"]][op[0]]["sub"]
                    if graphs[c["graph"]][op[0]]["sub"]
                    else ""
                )
                for c in recs
                if c["type"] == "compute"
                for op in c["ops"]
            }

        both = op_types(ra) | op_types(rb)
        assert page.rows("per_op") == len(both)
        assert page.rows("memory") == 3 and page.marks("memory") == 6
        # layers of the timed ops in A's log (null: outside the layers); B has the same
        graphs_a = {g["graph"]: g["nodes"] for g in ra if g["type"] == "graph"}
        layers = {
            graphs_a[c["graph"]][op[0]]["layer"]
            for c in ra
            if c["type"] == "compute"
            for op in c["ops"]
        }
        assert page.rows("per_layer") == len(layers)
        assert page.marks("per_layer") == 2 * len(layers - {None})  # the chart: layers only
        ratio_bars = page.marks("op_time_ratio")
        assert ratio_bars == page.declared_marks("op_time_ratio") == min(15, len(both))
    finally:
        page.close()


def test_quant_report_page(
    browser: Any, tiny_llama_f32: Path, tiny_llama_q8: Path, tmp_path: Path
) -> None:
    page = Page(
        browser,
        _html(["quant-report", str(tiny_llama_f32), str(tiny_llama_q8)], tmp_path / "q.html"),
    )
    try:
        names = [t.name for t in GGUFReader(tiny_llama_q8).tensors]
        layers = {int(m.group(1)) for n in names if (m := re.match(r"blk\.(\d+)\.", n))}
        roles = {re.sub(r"^blk\.\d+\.", "", n).removesuffix(".weight") for n in names}
        outside = [n for n in names if not n.startswith("blk.")]
        # every tensor of both models in the full, sortable listing
        assert page.rows("tensors") == 2 * len(names)
        assert page.page.locator('table[data-table="per_role"]').count() == 2
        assert page.rows("comparison_per_role") == len(roles)
        # per-layer bars: transformer blocks only; the embedding and output apart
        types_f32 = {str(t.tensor_type) for t in GGUFReader(tiny_llama_f32).tensors}
        assert page.page.locator('figure[data-chart="bytes_outside_layers"]').count() == 2
        assert page.page.locator('figure[data-chart="bytes_outside_layers"]').first.locator(
            ".mark"
        ).count() == len(outside)
        first_layers = page.page.locator('figure[data-chart="bytes_per_layer"]').first
        assert first_layers.locator(".mark").count() == len(layers) * len(types_f32)
        assert page.marks("saved_per_layer") == len(layers)
        # bits per weight: norms left out of the scale, one bar per model per other role
        norms = {r for r in roles if r.endswith("norm")}
        assert norms and page.marks("bpw_by_role") == 2 * (len(roles) - len(norms))
        page.sort_by("tensors", 7)  # bytes
        values = [float(v) for v in page.column("tensors", 7)]
        assert values == sorted(values)
    finally:
        page.close()


IMAGES = FIXTURES / "tiny-llama-gemma3-images-detailed.log.gz"
# what each part of an image's way is, from its records: load, preprocessing, the encode's ops
# by part of the encoder and the rest of it, the prefill of its tokens
WAY = ("load", "preprocess", "embedding", "blocks", "projector", "rest", "prefill")


def _ways(recs: list[dict[str, Any]]) -> dict[int, list[float]]:
    """Each image's way (ms), from the records alone."""
    begins = {r["step"]: r for r in recs if r["type"] == "step_begin"}
    ends = {r["step"]: r for r in recs if r["type"] == "step_end"}
    graphs = {r["graph"]: r["nodes"] for r in recs if r["type"] == "graph"}
    n_layer = next(r for r in recs if r["type"] == "context")["model"]["n_layer"]
    out = {}
    for m in (r for r in recs if r["type"] == "media"):
        ns = dict.fromkeys(WAY, 0) | {"load": m["load"][1], "preprocess": m["preprocess"][1]}
        for s, b in begins.items():
            if b["kind"] == "encode" and [m["id"], 0] in b["media"]:
                ns["rest"] += ends[s]["dur"]
                for c in (c for c in recs if c["type"] == "compute" and c["step"] == s):
                    for node, _, dur in (o[:3] for o in c["ops"]):
                        layer = graphs[c["graph"]][node]["layer"]
                        part = "embedding" if layer is None else "blocks"
                        part = "projector" if layer == n_layer else part
                        ns[part] += dur
                        ns["rest"] -= dur
            elif b["kind"] != "encode" and b.get("media") == [m["id"], 0]:
                ns["prefill"] += ends[s]["dur"]
        out[m["id"]] = [ns[k] / 1e6 for k in WAY]
    return out


# every box of the image section, and the page itself: none wider than what holds it
OVERFLOW = """() => {
  const wide = [];
  const root = document.scrollingElement;
  if (root.scrollWidth > root.clientWidth) wide.push(["page", root.scrollWidth, root.clientWidth]);
  const section = document.querySelector('figure[data-chart="media_way"]').closest("section");
  for (const el of section.querySelectorAll("*")) {
    const box = el.getBoundingClientRect(), outer = section.getBoundingClientRect();
    if (box.width === 0 && box.height === 0) continue;  // (a tooltip's title: no box)
    const out = box.right > outer.right + 0.5 || box.left < outer.left - 0.5;
    if (out || (el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1))
      wide.push([el.tagName, el.dataset.table || el.className.baseVal || el.className, box.width]);
  }
  return wide;
}"""


def test_each_images_way_drawn_and_nothing_wider_than_the_page(
    browser: Any, tmp_path: Path
) -> None:
    """The summary of two images: their ways as stacked bars (a mark per part, each as long as
    its records say, the first image apart, above the other), and no table, chart or page wider
    than the page's column (980 px, in a window of 1024)."""
    recs = read_log(IMAGES)
    ways = _ways(recs)
    page = Page(browser, _html(["summary", str(IMAGES)], tmp_path / "m.html"))
    try:
        page.page.set_viewport_size({"width": 1024, "height": 900})
        assert page.marks("media_way") == page.declared_marks("media_way") == len(WAY) * len(ways)
        bars = page.page.locator('figure[data-chart="media_way"] .mark').evaluate_all(
            "els => els.map(e => [parseFloat(e.dataset.value), e.getBBox().y])"
        )
        # by image, each its parts in order: image 1 (the first) on top
        got = [[v for v, _ in bars[i * len(WAY) : (i + 1) * len(WAY)]] for i in range(len(ways))]
        for want, have in zip((ways[1], ways[2]), got, strict=True):
            assert have == pytest.approx(want, abs=1e-9)
        rule = page.page.locator('figure[data-chart="media_way"] line.apart')
        assert rule.count() == 1
        y = float(rule.get_attribute("y1") or 0)
        assert bars[0][1] < y < bars[len(WAY)][1]
        assert page.page.evaluate(OVERFLOW) == []
    finally:
        page.close()
