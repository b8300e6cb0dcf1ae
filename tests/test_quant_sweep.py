"""`instr quant-sweep`: cached quantization, sizes and quality per type, and the Pareto front."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llamacpp_instr.cli import main
from llamacpp_instr.converters.reports.quant.sweep_report import pareto_front


@pytest.mark.fast
def test_pareto_front_by_hand() -> None:
    # (size, kld): b is beaten by a (smaller and closer); d by c
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    ys = [0.5, 0.6, 0.2, 0.3, 0.1]
    assert pareto_front(xs, ys) == [0, 2, 4]


@pytest.fixture(scope="module")
def swept(instr_api: Any, tiny_llama_f32: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache = tmp_path_factory.mktemp("cache")
    out = tmp_path_factory.mktemp("sweep")
    mp = pytest.MonkeyPatch()
    mp.setenv("LLAMACPP_INSTR_CACHE", str(cache))
    args = ["quant-sweep", str(tiny_llama_f32), "--types", "q8_0,q4_0"]
    args += ["--chunks", "2", "--reps", "2", "-n", "4"]
    try:
        first = CliRunner().invoke(
            main, [*args, "--chunk-size", "64", "--format", "json", "-o", str(out / "s.json")]
        )
        # the old spelling of --chunk-size, kept for one release
        second = CliRunner().invoke(
            main, [*args, "--ctx", "64", "--format", "html", "-o", str(out / "s.html")]
        )
    finally:
        mp.undo()
    return {"first": first, "second": second, "out": out, "cache": cache}


def test_sweep_measures_every_type(swept: Any, tiny_llama_f32: Path) -> None:
    from helpers.support import hand_bytes

    assert swept["first"].exit_code == 0, swept["first"].output
    data = json.loads((swept["out"] / "s.json").read_text())
    assert [m["type"] for m in data["models"]] == ["base (F32)", "q8_0", "q4_0"]
    base, q8, q4 = data["models"]
    # sizes are the files' tensor bytes as gguf-py's type table counts them
    for m in data["models"]:
        assert m["bytes"] == hand_bytes(Path(m["path"]))
        assert m["memory"]["weights"] >= m["bytes"] and m["gen_tok_s"] > 0
    assert base["bytes"] > q8["bytes"] > q4["bytes"]
    assert base["kld_mean"] == 0.0 and base["same_top_p"] == 100.0
    assert 0 <= q8["kld_mean"] <= q4["kld_mean"] and q4["kld_mean"] > 0
    assert base["gen_speed_ratio"] == 1.0 and data["reps"] == 2


def test_sweep_reuses_its_quantized_files(swept: Any, tiny_llama_f32: Path) -> None:
    assert swept["second"].exit_code == 0, swept["second"].output
    assert "quantizing" in swept["first"].output and "quantizing" not in swept["second"].output
    assert "--ctx is deprecated" not in swept["first"].output
    assert "warning: --ctx is deprecated" in swept["second"].output
    assert "use --chunk-size" in swept["second"].output
    assert sorted(p.name for p in swept["cache"].glob("quant/*/*.gguf")) == [
        "q4_0.gguf",
        "q8_0.gguf",
    ]


def test_sweep_html_marks_the_front(swept: Any) -> None:
    html = (swept["out"] / "s.html").read_text()
    for chart in ("size_vs_kld", "speed_vs_kld"):
        assert f'data-chart="{chart}" data-kind="scatter" data-marks="2"' in html
    assert html.count('class="front"') == 2 and 'class="mark on-front"' in html


def test_unknown_type_is_a_one_line_error(tiny_llama_f32: Path) -> None:
    r = CliRunner().invoke(main, ["quant-sweep", str(tiny_llama_f32), "--types", "q9_z"])
    assert r.exit_code == 2 and r.output.startswith("error: unknown type(s) q9_z")
