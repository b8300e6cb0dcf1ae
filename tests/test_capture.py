"""llama_instr_capture: node outputs copied natively while the graph runs (no eval callback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import llamacpp_instr
from llamacpp_instr.native import bindings

pytestmark = pytest.mark.native


def _llama(model: Path) -> Any:
    import llama_cpp

    return llama_cpp.Llama(
        str(model), n_ctx=128, n_batch=64, n_threads=2, verbose=False, logits_all=True
    )


TOKENS = [1, 40, 41, 42, 43, 44]


def test_captured_outputs_are_exact_and_change_nothing(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    llm = _llama(tiny_llama_f32)
    try:
        llm.eval(TOKENS)
        plain = np.array(llm.scores[: len(TOKENS)], dtype=np.float32)
        llm.reset()
        with llamacpp_instr.session(llm, tmp_path / "c.log", level="minimal"):
            instr_api.capture(llm.ctx, ["l_out-*", "attn_out-*", "ffn_out-*", "result_output"])
            llm.eval(TOKENS)
            cap = instr_api.captured(llm.ctx)
            logits = np.array(llm.scores[: len(TOKENS)], dtype=np.float32)
            instr_api.capture(llm.ctx, [])
        n_layer = int(llm.metadata["llama.block_count"])
        n_embd = int(llm.metadata["llama.embedding_length"])
    finally:
        llm.close()
    # capturing reads outputs: the logits are bit-identical to a run without it
    assert np.array_equal(logits, plain)
    # and the captured output projection is those logits, exactly
    assert np.array_equal(cap["result_output"], logits)
    for kind in ("l_out", "attn_out", "ffn_out"):
        for i in range(n_layer):
            assert cap[f"{kind}-{i}"].shape == (len(TOKENS), n_embd)
    # the residual stream: layer i's output is its input plus attention and FFN contributions,
    # so l_out-(i) - l_out-(i-1) == attn_out-i + ffn_out-i (float rounding aside)
    for i in range(1, n_layer):
        delta = cap[f"l_out-{i}"] - cap[f"l_out-{i - 1}"]
        np.testing.assert_allclose(
            delta, cap[f"attn_out-{i}"] + cap[f"ffn_out-{i}"], rtol=1e-4, atol=1e-4
        )
    assert len(cap) == 3 * n_layer + 1


def test_capture_needs_a_session(instr_api: Any, tiny_llama_f32: Path) -> None:
    llm = _llama(tiny_llama_f32)
    try:
        with pytest.raises(bindings.SessionError) as e:
            instr_api.capture(llm.ctx, ["l_out-*"])
        assert e.value.code == bindings.ERR_NO_SESSION
    finally:
        llm.close()
