"""`instr run` and the native session core, on the real patched build with real models."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFReader
from helpers.support import PROMPT, RunLog, by_type, make_run, read_log

from llamacpp_instr.cli import main

pytestmark = pytest.mark.native


def gguf_inventory(path: Path) -> dict[str, tuple[str, list[int], int]]:
    """name -> (type, shape, bytes) as gguf-py reads the file."""
    out = {}
    for t in GGUFReader(path).tensors:
        shape = [int(d) for d in t.shape]
        while len(shape) > 1 and shape[-1] == 1:
            shape.pop()
        out[t.name] = (t.tensor_type.name.lower(), shape, int(t.n_bytes))
    return out


def log_inventory(start: dict[str, Any]) -> dict[str, tuple[str, list[int], int]]:
    return {w["name"]: (w["type"], w["shape"], w["bytes"]) for w in start["weights"]}


def test_every_line_validates(
    smollm2_detailed: RunLog, smollm2_verbose: RunLog, schema_validator: Any
) -> None:
    for log in (smollm2_detailed, smollm2_verbose):
        for rec in log.records:
            schema_validator.validate(rec)
        assert log.records[0]["type"] == "session_start"
        assert log.records[-1]["type"] == "session_end"
        assert log.records[-1]["totals"]["records"] == len(log.records)
        assert len({r["sid"] for r in log.records}) == 1


def test_weight_inventory_matches_gguf_py_smollm2(
    smollm2_detailed: RunLog, smollm2_path: Path
) -> None:
    assert log_inventory(smollm2_detailed.start) == gguf_inventory(smollm2_path)


@pytest.mark.parametrize("fixture", ["tiny_llama_f32", "tiny_llama_f16", "tiny_llama_q8"])
def test_weight_inventory_matches_gguf_py_tiny(
    fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    model: Path = request.getfixturevalue(fixture)
    log = RunLog(make_run(model, tmp_path / "s.log", "minimal", n_predict=2))
    inv = log_inventory(log.start)
    assert inv == gguf_inventory(model)
    types = {t for t, _, _ in inv.values()}
    expected = {"tiny_llama_f32": "f32", "tiny_llama_f16": "f16", "tiny_llama_q8": "q8_0"}[fixture]
    assert expected in types
    model_info = log.start["model"]
    assert model_info["architecture"] == "llama"
    assert sum(w["bytes"] for w in log.start["weights"]) == sum(b for _, _, b in inv.values())


def test_model_and_context_metadata(smollm2_detailed: RunLog, smollm2_path: Path) -> None:
    reader = GGUFReader(smollm2_path)

    def kv(key: str) -> Any:
        f = reader.fields[key]
        return f.parts[f.data[0]].tolist()[0]

    m = smollm2_detailed.start["model"]
    assert m["n_layer"] == kv("llama.block_count") == 30
    assert m["n_embd"] == kv("llama.embedding_length")
    assert m["n_head"] == kv("llama.attention.head_count")
    assert m["n_head_kv"] == kv("llama.attention.head_count_kv")
    assert m["n_ff"] == kv("llama.feed_forward_length")
    assert m["n_ctx_train"] == kv("llama.context_length")
    assert m["n_vocab"] == len(reader.fields["tokenizer.ggml.tokens"].data)
    c = smollm2_detailed.start["context"]
    assert c["n_ctx"] == 512 and c["n_threads"] == 2 and c["flash_attn"] is False
    mem = smollm2_detailed.start["memory"]
    weights = smollm2_detailed.start["weights"]
    assert {w["name"] for w in weights} == {t.name for t in reader.tensors}
    assert mem["weights"] == sum(b["weights"] for b in mem["buffers"])
    by_buffer: dict[str, list[str]] = {}
    for w in weights:
        by_buffer.setdefault(w["buffer"], []).append(w["name"])
    held = {b["buffer"]: b["weights"] for b in mem["buffers"] if b["weights"]}
    assert set(held) == set(by_buffer)
    spans = {t.name: (int(t.data_offset), int(t.n_bytes)) for t in reader.tensors}
    for buffer, names in by_buffer.items():
        if buffer == "CPU_Mapped":
            # the file mapped from the first to the last byte of the tensors read from it
            first = min(spans[n][0] for n in names)
            assert held[buffer] == max(spans[n][0] + spans[n][1] for n in names) - first
        else:  # an extra buffer type (AMX, CPU_REPACK) holds its copies at least whole
            assert held[buffer] >= sum(spans[n][1] for n in names), buffer
    # f16 K and V caches: 2 * n_layer * n_ctx * n_embd_kv * 2 bytes
    n_embd_kv = m["n_embd"] // m["n_head"] * m["n_head_kv"]
    assert mem["kv_cache"] == 2 * m["n_layer"] * c["n_ctx"] * n_embd_kv * 2
    assert smollm2_detailed.start["metadata"]["prompt"] == PROMPT


def test_steps_and_tokens_match_the_run(smollm2_detailed: RunLog, smollm2_path: Path) -> None:
    import llama_cpp

    res = smollm2_detailed.result
    vocab_only = llama_cpp.Llama(str(smollm2_path), vocab_only=True, verbose=False)
    prompt_ids = vocab_only.tokenize(PROMPT.encode(), add_bos=True)
    begins = smollm2_detailed.of("step_begin")
    ends = smollm2_detailed.of("step_end")
    assert len(begins) == len(ends) == res.n_steps
    # one prompt step, then every generated token but the last is fed back
    assert begins[0]["kind"] == "prompt" and begins[0]["tokens"] == prompt_ids
    assert begins[0]["n_tokens"] == len(prompt_ids) == res.n_prompt_tokens
    gen = [b for b in begins if b["kind"] == "gen"]
    assert len(gen) == res.n_generated - 1 == 15
    assert [b["tokens"][0] for b in gen] == res.token_ids[:-1]
    assert [b["pos"][0] for b in gen] == list(range(len(prompt_ids), len(prompt_ids) + len(gen)))
    assert "".join(p for b in gen for p in b["pieces"]) == vocab_only.detokenize(
        res.token_ids[:-1]
    ).decode(errors="replace")
    for e in ends:
        assert e["status"] == 0 and e["n_outputs"] == 1
        assert e["logits"]["shape"] == [49152, 1]
    assert [e["kv_used"] for e in ends] == [len(prompt_ids) + i for i in range(len(ends))]
    totals = smollm2_detailed.records[-1]["totals"]
    assert totals["steps"] == len(ends)
    assert totals["prompt_tokens"] == len(prompt_ids) and totals["gen_tokens"] == len(gen)
    assert smollm2_detailed.records[-1]["status"] == "ok"


def test_levels_decide_what_is_written(tiny_llama_f32: Path, tmp_path: Path) -> None:
    minimal = RunLog(make_run(tiny_llama_f32, tmp_path / "m.log", "minimal", n_predict=3))
    assert not minimal.of("graph") and "tokens" not in minimal.of("step_begin")[0]
    assert all("ops" not in c and c["layers"] for c in minimal.of("compute"))
    detailed = RunLog(make_run(tiny_llama_f32, tmp_path / "d.log", "detailed", n_predict=3))
    assert detailed.of("graph") and all(
        "ops" in c and "threads" not in c for c in detailed.of("compute")
    )
    assert not detailed.of("topk") and not detailed.of("tensor_stats")
    verbose = RunLog(make_run(tiny_llama_f32, tmp_path / "v.log", "verbose", n_predict=3))
    assert verbose.of("topk") and not verbose.of("tensor_stats")  # value statistics: asked for
    assert all(len(c["threads"]) == len(c["ops"]) for c in verbose.of("compute"))
    kw = {"n_predict": 3, "value_stats": True}
    values = RunLog(make_run(tiny_llama_f32, tmp_path / "s.log", "verbose", **kw))
    assert values.of("topk") and len(values.of("tensor_stats")) == len(values.of("compute"))


def _logits(model: Path, instr_api: Any, level: str | None, tmp_path: Path) -> np.ndarray:
    """Logits of the prompt and 6 greedy tokens, fed one by one, with or without a session."""
    import llama_cpp

    llm = llama_cpp.Llama(
        str(model), n_ctx=256, n_threads=2, logits_all=True, verbose=False, seed=0
    )
    if level:
        instr_api.session_begin(llm.ctx, str(tmp_path / f"{level}.log"), level, {})
    try:
        tokens = llm.tokenize(PROMPT.encode(), add_bos=True)
        llm.eval(tokens)
        for _ in range(6):
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            llm.eval([nxt])
        return llm.scores[: llm.n_tokens].copy()
    finally:
        if level:
            instr_api.session_end("ok")
        llm.close()


@pytest.mark.parametrize("level", ["detailed", "verbose"])
def test_logits_bit_identical_off_vs_instrumented(
    level: str, smollm2_path: Path, instr_api: Any, tmp_path: Path
) -> None:
    off = _logits(smollm2_path, instr_api, None, tmp_path)
    on = _logits(smollm2_path, instr_api, level, tmp_path)
    assert off.shape == on.shape
    assert off.tobytes() == on.tobytes()
    assert len(by_type(read_log(tmp_path / f"{level}.log"), "step_end")) == 7


# ---------------------------------------------------------------- the CLI, good and bad input


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def test_cli_run_default_model(instr_api: Any, tmp_path: Path) -> None:
    out = tmp_path / "cli.log"
    r = _cli(
        "run", "--prompt", PROMPT, "-n", "4", "--threads", "2", "--ctx", "256", "--output", str(out)
    )
    assert r.exit_code == 0, r.output
    assert "session log: " in r.output and "4 generated" in r.output
    recs = read_log(out)
    # its figures add up: the tokens decoded are the prompt's and the generated ones fed back
    m = re.search(r"(\d+) steps, (\d+) tokens decoded: (\d+) prompt \+ (\d+)", r.output)
    assert m is not None, r.output
    steps, decoded, prompt, fed = (int(x) for x in m.groups())
    begins = [x for x in recs if x["type"] == "step_begin"]
    assert steps == len(begins) and decoded == prompt + fed == sum(x["n_tokens"] for x in begins)
    assert recs[0]["model"]["name"].startswith("Smollm2")
    assert recs[-1]["status"] == "ok"


def _one_line_error(r: Any, needle: str) -> None:
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: ") and needle in lines[-1], r.output
    assert "Traceback" not in r.output


def test_missing_model(tmp_path: Path) -> None:
    _one_line_error(
        _cli("run", str(tmp_path / "nope.gguf"), "--prompt", "x"), "model file not found"
    )


def test_not_a_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a model\n" * 10)
    _one_line_error(_cli("run", str(bad), "--prompt", "x"), "not a GGUF file")


def test_truncated_gguf(tiny_llama_f32: Path, tmp_path: Path, instr_api: Any) -> None:
    cut = tmp_path / "cut.gguf"
    data = tiny_llama_f32.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    _one_line_error(
        _cli("run", str(cut), "--prompt", "x", "-o", str(tmp_path / "c.log")), "truncated"
    )


def test_model_llama_cpp_cannot_load(tmp_path: Path, instr_api: Any) -> None:
    import gguf

    path = tmp_path / "alien.gguf"
    w = gguf.GGUFWriter(str(path), "no_such_architecture")
    w.add_tensor("alien.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _one_line_error(
        _cli("run", str(path), "--prompt", "x", "-o", str(tmp_path / "a.log")), "cannot load"
    )


def test_unwritable_log_path(tiny_llama_f32: Path, tmp_path: Path) -> None:
    r = _cli(
        "run", str(tiny_llama_f32), "--prompt", "x", "-o", str(tmp_path / "no" / "dir" / "s.log")
    )
    _one_line_error(r, "cannot write log")


def test_stock_llama_cpp_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import llama_cpp

    from llamacpp_instr.native import bindings

    class StockLib:  # what the stock build's libllama looks like: no llama_instr_* symbols
        pass

    monkeypatch.setattr(llama_cpp.llama_cpp, "_lib", StockLib())
    monkeypatch.setattr(bindings, "_cached", None)
    _one_line_error(_cli("run", "--prompt", "x"), "stock build")
    _one_line_error(_cli("doctor"), "stock build")


def test_doctor_reports_patched_build(instr_api: Any) -> None:
    r = _cli("doctor")
    assert r.exit_code == 0, r.output
    from llamacpp_instr.native import build

    assert "+instr." in r.output and "ok: the patched build matches the patches" in r.output
    assert f"patch hash {build.source_patch_hash()}" in r.output
    assert instr_api.build_info()["patch_hash"] == build.source_patch_hash()


def test_ctrl_c_leaves_a_valid_interrupted_log(
    smollm2_path: Path, tmp_path: Path, instr_api: Any
) -> None:
    out = tmp_path / "int.log"
    cmd = [sys.executable, "-m", "llamacpp_instr.cli", "run", "--prompt", PROMPT, "-n", "2000",
           "--ctx", "4096", "--threads", "2", "--ignore-eos", "-o", str(out)]  # fmt: skip
    # Ctrl-C as a terminal delivers it: a test run in the background (nohup, CI runners) ignores
    # SIGINT, and a Python child inherits that and never raises KeyboardInterrupt
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if out.exists() and out.read_bytes().count(b'"step_end"') >= 5:
            break
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    recs = read_log(out)  # every line parses
    assert recs[-1]["type"] == "session_end" and recs[-1]["status"] == "interrupted"
    assert recs[-1]["totals"]["steps"] == len(by_type(recs, "step_end")) >= 5
    assert "Traceback" not in err.decode()


def test_two_contexts_in_two_threads_never_interleave(
    smollm2_path: Path, instr_api: Any, tmp_path: Path, schema_validator: Any
) -> None:
    import threading

    import llama_cpp

    out = tmp_path / "two.log"
    llms = [
        llama_cpp.Llama(str(smollm2_path), n_ctx=256, n_threads=1, verbose=False) for _ in range(2)
    ]
    instr_api.session_begin(llms[0].ctx, str(out), "detailed", {})
    errors: list[BaseException] = []

    def work(llm: Any) -> None:
        try:
            tokens = llm.tokenize(PROMPT.encode(), add_bos=True)
            llm.eval(tokens)
            for _ in range(8):
                llm.eval([int(tokens[-1])])
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(llm,)) for llm in llms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    instr_api.session_end("ok")
    for llm in llms:
        llm.close()
    assert not errors
    recs = read_log(out)  # every line is one complete JSON object
    for r in recs:
        schema_validator.validate(r)
    ends = by_type(recs, "step_end")
    assert sorted({e["ctx"] for e in ends}) == [1, 2]
    assert len(ends) == 18 and len({e["step"] for e in ends}) == 18
    for ctx in (1, 2):  # each context's computes reference its own graphs
        graphs = {g["graph"] for g in by_type(recs, "graph") if g["ctx"] == ctx}
        assert {c["graph"] for c in by_type(recs, "compute") if c["ctx"] == ctx} <= graphs


def test_demo_runs_converts_and_checks(instr_api: Any, tmp_path: Path) -> None:
    r = _cli("doctor", "--demo", "-o", str(tmp_path), "-n", "4")
    assert r.exit_code == 0, r.output
    assert "log ok: " in r.output and "trace ok: " in r.output
    assert (tmp_path / "demo.pftrace").stat().st_size > 0


def test_a_run_warms_up_as_llama_cpp_s_programs_do(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """instr run decodes the BOS and EOS tokens once before its session, as common's
    initialisation does for llama.cpp's programs, then forgets them: the session's first step
    holds the prompt alone in the KV cache, llama.cpp's own counters (the perf record) count the
    prompt alone, and the text is what a run without the warm-up (--no-warmup) writes."""
    import llama_cpp

    from llamacpp_instr.running import runner

    seen: list[list[int]] = []
    decode = llama_cpp.llama_decode

    def counting(ctx: Any, batch: Any) -> int:
        seen.append([batch.token[i] for i in range(batch.n_tokens)])
        return int(decode(ctx, batch))

    texts = {}
    for warm in (True, False):
        seen.clear()
        log = tmp_path / f"warm-{warm}.log"
        cfg = runner.RunConfig(
            model=tiny_llama_f32, prompt=PROMPT, n_predict=6, threads=2, n_ctx=256,
            level="minimal", out=log, ignore_eos=True, warmup=warm,
        )  # fmt: skip
        llama_cpp.llama_decode = counting  # (llama-cpp-python's own decodes are not seen)
        try:
            result = runner.run(cfg)
        finally:
            llama_cpp.llama_decode = decode
        texts[warm] = result.text
        recs = read_log(log)
        first = by_type(recs, "step_end")[0]
        assert first["kv_used"] == result.n_prompt_tokens
        (perf,) = by_type(recs, "perf")
        assert perf["n_p_eval"] == result.n_prompt_tokens
        # the warm-up's decode: BOS then EOS, before any of the run's own
        reader = GGUFReader(tiny_llama_f32)
        ids = [
            int(reader.fields[f"tokenizer.ggml.{k}_token_id"].parts[-1][0]) for k in ("bos", "eos")
        ]
        assert seen == ([ids] if warm else [])
    assert texts[True] == texts[False]
