"""Where a quantization's error enters: per-layer comparison of captured outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import llamacpp_instr
from llamacpp_instr.converters.reports.quant.layers_report import layers_report
from llamacpp_instr.converters.reports.renderers import render
from llamacpp_instr.running.quant.layers import layer_errors

pytestmark = pytest.mark.native

CHUNKS = [[1] + list(range(40, 71)), [1] + list(range(100, 131))]


def test_a_model_against_itself_has_no_error(instr_api: Any, tiny_llama_f32: Path) -> None:
    res = layer_errors(tiny_llama_f32, [tiny_llama_f32], CHUNKS, 64, 2)
    (m,) = res["models"]
    assert res["tokens"] == 64 and len(m["layers"]) == 2
    for row in m["layers"]:
        for kind in ("l_out", "attn_out", "ffn_out"):
            assert row[f"{kind}_rel_rms"] == 0.0
            assert row[f"{kind}_cosine"] == pytest.approx(1.0, abs=1e-12)


def test_q8_0_error_per_layer(instr_api: Any, tiny_llama_f32: Path, tiny_llama_q8: Path) -> None:
    res = layer_errors(tiny_llama_f32, [tiny_llama_q8], CHUNKS, 64, 2)
    (m,) = res["models"]
    for row in m["layers"]:
        assert 0 < row["l_out_rel_rms"] < 0.1 and 0.99 < row["l_out_cosine"] < 1
    # the growths add up to the last layer's error, and the worst layer is the largest growth
    assert sum(r["growth"] for r in m["layers"]) == pytest.approx(m["final_rel_rms"])
    assert m["worst_growth"] == max(r["growth"] for r in m["layers"])
    # layer 0's figure, from the two models' captured outputs with numpy
    import llama_cpp

    outs = []
    for path in (tiny_llama_f32, tiny_llama_q8):
        llm = llama_cpp.Llama(str(path), n_ctx=64, n_batch=64, n_ubatch=64, verbose=False)
        try:
            with llamacpp_instr.session(llm, path.parent / f"{path.stem}-cap.log", level="minimal"):
                instr_api.capture(llm.ctx, ["l_out-0"])
                got = []
                for toks in CHUNKS:
                    llm.reset()
                    llm.eval(toks)
                    got.append(instr_api.captured(llm.ctx)["l_out-0"].astype(np.float64))
                outs.append(np.concatenate(got))
        finally:
            llm.close()
    b, q = outs
    assert m["layers"][0]["l_out_rel_rms"] == pytest.approx(
        np.linalg.norm(q - b) / np.linalg.norm(b), rel=1e-9
    )
    # and the report: a chart point per layer, a table row per layer
    rep = layers_report(res, tiny_llama_f32.name)
    html = render(rep, "html")
    assert html.count('class="mark"') >= 2 + 2 * 2
    assert "error grows most at layer" in render(rep, "text")


def test_quant_eval_layers_option(
    instr_api: Any, tiny_llama_f32: Path, tiny_llama_q8: Path
) -> None:
    import json

    from click.testing import CliRunner

    from llamacpp_instr.cli import main

    args = ["quant-eval", str(tiny_llama_f32), str(tiny_llama_q8), "--chunk-size", "32"]
    args += ["--chunks", "2"]
    r = CliRunner().invoke(main, [*args, "--layers", "--format", "json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    (m,) = data["layers"]["models"]
    assert [row["layer"] for row in m["layers"]] == [0, 1] and data["layers"]["tokens"] == 64
    assert m["worst_layer"] in (0, 1) and m["final_rel_rms"] > 0
    html = CliRunner().invoke(main, [*args, "--layers", "--format", "html"]).stdout
    assert 'data-chart="layer_error"' in html and "error grows most at layer" in html


@pytest.fixture(scope="module")
def smollm2_q8(
    instr_api: Any, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    from llamacpp_instr.running.quant.quantize import quantize_file

    out = tmp_path_factory.mktemp("smol") / "smollm2-q8_0.gguf"
    quantize_file(smollm2_path, out, "q8_0")
    return out


def test_layers_and_sweep_on_the_bundled_model(
    smollm2_path: Path, smollm2_q8: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real model: an error figure for each of its 30 layers, and a one-type sweep."""
    import json

    from click.testing import CliRunner

    from llamacpp_instr.cli import main

    res = layer_errors(smollm2_path, [smollm2_q8], [[1] + list(range(300, 363))], 64, 2)
    (m,) = res["models"]
    assert [r["layer"] for r in m["layers"]] == list(range(30))
    assert all(0 < r["l_out_rel_rms"] < 1 for r in m["layers"])
    monkeypatch.setenv("LLAMACPP_INSTR_CACHE", str(tmp_path / "cache"))
    r = CliRunner().invoke(
        main,
        ["quant-sweep", str(smollm2_path), "--types", "q8_0", "--chunk-size", "64", "--chunks", "2"]
        + ["--reps", "1", "-n", "4", "--format", "json"],
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    base, q8 = data["models"]
    from helpers.support import hand_bytes

    # sizes as gguf-py counts them (the bundled base is Q4_1: its Q8_0 is larger)
    assert base["bytes"] == hand_bytes(smollm2_path)
    assert q8["type"] == "q8_0" and q8["bytes"] == hand_bytes(Path(q8["path"]))
    assert q8["kld_mean"] > 0 and q8["same_top_p"] > 50
