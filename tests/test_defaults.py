"""Every context opens with llama.cpp's own defaults: flash attention ``auto`` (on, on the CPU),
said in the log and by instr summary; ``--no-flash-attn`` shows attention as separate ops. The
greedy text of ``instr run`` at its defaults is the text of llama.cpp's own greedy loop at
``llama_context_default_params`` (the C API, no session), on the bundled model and a MoE made
from it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.support import PROMPT, RunLog, make_run

N_GEN = 24


def _llama_cpp_greedy(model: Path, n_gen: int) -> list[int]:
    """llama.cpp's greedy loop at its defaults: llama_model_default_params,
    llama_context_default_params (only n_ctx raised to hold the text), the prompt tokenized
    with BOS, then the argmax of each decode's last logits, fed back one token at a time."""
    import llama_cpp

    mp = llama_cpp.llama_model_load_from_file(
        str(model).encode(), llama_cpp.llama_model_default_params()
    )
    assert mp
    cp = llama_cpp.llama_context_default_params()
    assert cp.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO  # llama.cpp's default
    cp.n_ctx = 512
    ctx = llama_cpp.llama_init_from_model(mp, cp)
    assert ctx
    try:
        vocab = llama_cpp.llama_model_get_vocab(mp)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        toks = (llama_cpp.llama_token * 64)()
        text = PROMPT.encode()
        n = llama_cpp.llama_tokenize(vocab, text, len(text), toks, 64, True, False)
        assert n > 1
        feed, out = list(toks[:n]), []
        for _ in range(n_gen):
            arr = (llama_cpp.llama_token * len(feed))(*feed)
            assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(arr))) == 0
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
            feed = [int(np.argmax(row))]
            out.append(feed[0])
        return out
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(mp)


@pytest.mark.parametrize("which", ["smollm2", "moe"])
def test_greedy_text_is_llama_cpps_at_its_defaults(
    which: str,
    instr_api: Any,
    smollm2_path: Path,
    moe_distinct: Path,
    tmp_path: Path,
) -> None:
    model = smollm2_path if which == "smollm2" else moe_distinct
    res = make_run(model, tmp_path / "run.log", "detailed", n_predict=N_GEN)
    ours = list(res.token_ids)
    theirs = _llama_cpp_greedy(model, N_GEN)
    assert len(ours) == N_GEN
    assert ours == theirs, (ours, theirs)
    start = RunLog(res).start
    assert start["context"]["flash_attn"] is True  # auto, on the CPU
    assert start["metadata"]["flash_attn_type"] == "auto"


def _summary(log: Path, *args: str) -> str:
    """instr summary's stdout (``args``: its options)."""
    r = subprocess.run(
        [sys.executable, "-m", "llamacpp_instr.cli", "summary", str(log), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("flash", [None, True, False])
def test_the_log_and_the_summary_say_what_flash_attention_was(
    flash: bool | None, instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    log = make_run(tiny_llama_f32, tmp_path / "fa.log", "detailed", n_predict=3, flash_attn=flash)
    start = RunLog(log).start
    used = flash is not False  # auto turns it on on the CPU
    assert start["context"]["flash_attn"] is used
    asked = {None: "auto", True: "on", False: "off"}[flash]
    assert start["metadata"]["flash_attn_type"] == asked
    doc = json.loads(_summary(log.log_path, "--format", "json"))
    assert doc["overview"]["flash_attn"] == {"used": used, "asked": asked}
    line = next(x for x in _summary(log.log_path).splitlines() if "flash attention" in x)
    if flash is None:
        assert "on (decided by auto, llama.cpp's default" in line
    elif flash:
        assert "on (asked)" in line
    else:
        assert "off (asked: attention as separate KQ, soft_max and KQV ops)" in line


@pytest.mark.fast
def test_what_a_llama_cpp_command_line_asked() -> None:
    """A session opened by LLAMA_INSTR_LOG says its program's command line: -fa as given, auto
    without one; an API session says nothing of what was asked."""
    from llamacpp_instr.converters.session.attention import asked

    assert asked({"argv": ["llama-server", "-m", "m.gguf"]}) == "auto"
    assert asked({"argv": ["llama-cli", "-fa", "off"]}) == "off"
    assert asked({"argv": ["llama-cli", "--flash-attn", "on"]}) == "on"
    assert asked({"argv": ["llama-cli", "--flash-attn=0"]}) == "off"
    assert asked({"flash_attn_type": "auto", "argv": ["x", "-fa", "on"]}) == "auto"
    assert asked({"api": "llamacpp_instr.session"}) is None
    assert asked({"argv": [1, None, "-fa"]}) == "auto"  # foreign bytes: nothing to read
    assert asked("not a dict") is None


def test_the_api_opens_llama_cpps_defaults(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """llama-cpp-python's Llama opens flash attention off; inside ``llama_defaults`` as llama.cpp's
    programs do (auto: on, on the CPU), and forced off with ``flash_attn=False``."""
    import llama_cpp

    import llamacpp_instr

    for given, used in ((None, True), (False, False)):
        log = tmp_path / f"api-{given}.log"
        with llamacpp_instr.llama_defaults(given):
            llm = llama_cpp.Llama(str(tiny_llama_f32), n_ctx=256, n_threads=2, verbose=False)
        with llamacpp_instr.session(llm, log, level="minimal"):
            llm.create_completion("Hello", max_tokens=2, temperature=0)
        llm.close()
        first = json.loads(log.read_text().splitlines()[0])
        assert first["context"]["flash_attn"] is used
    plain = llama_cpp.Llama(str(tiny_llama_f32), n_ctx=256, n_threads=2, verbose=False)
    log = tmp_path / "plain.log"
    with llamacpp_instr.session(plain, log, level="minimal"):
        pass
    plain.close()
    assert json.loads(log.read_text().splitlines()[0])["context"]["flash_attn"] is False
