"""`instr quant-eval`: perplexity and KL divergence checked against an independent computation.

The independent side gets its logits from llama-cpp-python's high-level ``Llama`` (logits_all=True,
one ``eval`` per chunk, flash attention on as llama-perplexity's default "auto" resolves on CPU)
and does its math with plain numpy, following the definitions of llama-perplexity written out here
(not through llamacpp_instr.running.quant.evaluate).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from llamacpp_instr.cli import main

CTX = 128
CHUNKS = 2
GENESIS = Path(__file__).resolve().parent.parent / "llamacpp_instr" / "data" / "kjv-genesis.txt"


def cli_json(*args: str) -> dict[str, Any]:
    r = CliRunner().invoke(main, ["quant-eval", *args, "--format", "json", "--threads", "2"])
    assert r.exit_code == 0, r.output
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def eval_default(base: Path, *quants: Path) -> dict[str, Any]:
    args = [str(base), *map(str, quants), "--chunk-size", str(CTX), "--chunks", str(CHUNKS)]
    return cli_json(*args)


class Reference:
    """Logits of the scored positions of each chunk, from ``llama_cpp.Llama(logits_all=True)``."""

    def __init__(
        self, model: Path, text: Path = GENESIS, bos: bool = True, kv: tuple[str, str] | None = None
    ) -> None:
        import llama_cpp

        types = {}
        if kv is not None:  # the KV cache's types, by ggml's type ids
            types = {f"type_{x}": getattr(llama_cpp, f"GGML_TYPE_{t.upper()}") for x, t in
                     zip("kv", kv, strict=True)}  # fmt: skip
        llm = llama_cpp.Llama(
            str(model),
            n_ctx=CTX,
            n_batch=CTX,
            logits_all=True,
            flash_attn=True,
            n_threads=2,
            verbose=False,
            **types,
        )
        raw = text.read_bytes()
        raw = raw[:-1] if raw.endswith(b"\n") else raw  # llama-perplexity's -f drops one
        tokens = llm.tokenize(raw, add_bos=True, special=False)
        add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llm._model.vocab))
        self.add_bos = add_bos
        first = CTX // 2
        logits, targets, every = [], [], []
        for c in range(CHUNKS):
            chunk = list(tokens[c * CTX : (c + 1) * CTX])
            fed = list(chunk)
            if add_bos and bos:
                fed[0] = llm.token_bos()
            llm.reset()
            llm.eval(fed)
            # position i predicts token i + 1; positions first .. CTX-2 are scored
            logits.append(np.array(llm.scores[first : CTX - 1], dtype=np.float64))
            targets.append(np.array(chunk[first + 1 :]))
            every.append(np.array(llm.scores[: CTX - 1], dtype=np.float64))
        self.logits = np.concatenate(logits)
        self.targets = np.concatenate(targets)
        self.every = np.stack(every)  # (chunk, position 0 .. CTX-2, vocabulary)
        llm.close()

    def logprobs(self) -> np.ndarray:
        x = self.logits
        m = x.max(axis=1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))

    def nll(self) -> np.ndarray:
        lp = self.logprobs()
        return -lp[np.arange(len(self.targets)), self.targets]

    def nll_stored(self) -> np.ndarray:
        """The nll as llama-perplexity's base file gives it back: log-probabilities floored at
        that of the logit max - 16."""
        x = self.logits
        m = x.max(axis=1)
        lse = np.log(np.exp(x - m[:, None]).sum(axis=1))
        floor = (m - 16) - m - lse
        lp = self.logprobs()[np.arange(len(self.targets)), self.targets]
        return -np.maximum(lp, floor)


def sem(x: np.ndarray) -> float:
    """llama.cpp's uncertainty of a mean: sqrt(population variance / (N - 1))."""
    return float(np.sqrt(np.var(x) / (len(x) - 1)))


@pytest.fixture(scope="module")
def smollm2_q8(
    instr_api: Any, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The bundled SmolLM2 requantized to Q8_0 with the pinned quantizer."""
    import llama_cpp

    out = tmp_path_factory.mktemp("quant_eval") / "smollm2-q8_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(
        str(smollm2_path).encode(), str(out).encode(), llama_cpp.byref(params)
    )
    assert rc == 0
    return out


@pytest.fixture(scope="module")
def smollm2_vs_q8(smollm2_path: Path, smollm2_q8: Path) -> dict[str, Any]:
    return eval_default(smollm2_path, smollm2_q8)


# (a) perplexity of the base, independently -------------------------------------------------------


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_base_ppl_matches_independent_numpy(
    which: str, tiny_llama_f32: Path, smollm2_path: Path, instr_api: Any
) -> None:
    model = tiny_llama_f32 if which == "tiny" else smollm2_path
    data = eval_default(model, model)
    ref = Reference(model)
    nll = ref.nll()
    assert data["tokens_scored"] == len(nll) == CHUNKS * (CTX - 1 - CTX // 2)
    ppl = math.exp(nll.mean())
    assert data["base"]["ppl"] == pytest.approx(ppl, rel=1e-6)
    assert data["models"][0]["ppl"] == pytest.approx(ppl, rel=1e-6)
    assert data["base"]["ppl_err"] == pytest.approx(ppl * sem(nll), rel=1e-5)
    if which == "tiny":
        # the tiny vocabulary adds BOS: each chunk's first token is replaced by it, and that
        # changes the result (so the check above would catch a missing replacement)
        assert ref.add_bos
        no_bos = math.exp(Reference(model, bos=False).nll().mean())
        assert abs(no_bos / ppl - 1) > 1e-5
        assert data["base"]["ppl"] != pytest.approx(no_bos, rel=1e-6)


# (b) a model against itself ------------------------------------------------------------------------


def test_model_against_itself(smollm2_path: Path, instr_api: Any) -> None:
    data = eval_default(smollm2_path, smollm2_path)
    m = data["models"][0]
    assert m["kld"]["mean"] == 0.0
    assert all(m["kld"][k] == 0.0 for k in ("median", "p90", "p95", "p99", "p99_9", "max"))
    assert m["same_top_p"] == 100.0
    assert m["delta_p"]["mean"] == 0.0 and m["delta_p"]["rms"] == 0.0
    assert m["ln_ppl_ratio_exact"] == 0.0
    assert m["ppl"] == data["base"]["ppl"]
    assert [b["mean"] for b in m["kld_by_position"]] == [0.0] * 8
    # llama.cpp's ratio reads the base's nll back from its base file, floored: slightly positive
    # when a scored token is far below the top one, as the independent computation says
    ref = Reference(smollm2_path)
    floored = ref.nll().mean() - ref.nll_stored().mean()
    assert m["ln_ppl_ratio"] == pytest.approx(floored, rel=1e-5, abs=1e-12)
    assert m["ln_ppl_ratio"] >= 0.0


# (c) against a quantized model, independently ------------------------------------------------------


def independent_kld(base: Reference, quant: Reference) -> dict[str, Any]:
    lp, lq = base.logprobs(), quant.logprobs()
    p = np.exp(lp)
    keep = lp > -16  # llama.cpp skips base probabilities below e^-16
    kld = np.where(keep, p * (lp - lq), 0.0).sum(axis=1)
    rows = np.arange(len(base.targets))
    nll_b, nll_q = -lp[rows, base.targets], -lq[rows, base.targets]
    dp = np.exp(-nll_q) - np.exp(-nll_b)
    same = np.argmax(base.logits, axis=1) == np.argmax(quant.logits, axis=1)
    n = len(kld)
    stored = base.nll_stored()
    cov = (np.mean(nll_q * stored) - nll_q.mean() * stored.mean()) / (n - 1)
    return {
        "kld": kld,
        "ppl": math.exp(nll_q.mean()),
        "ln_ratio": nll_q.mean() - stored.mean(),
        "ln_ratio_err": math.sqrt(sem(nll_q) ** 2 + sem(stored) ** 2 - 2 * cov),
        "ln_ratio_exact": nll_q.mean() - nll_b.mean(),
        "dp_mean": dp.mean(),
        "dp_rms": math.sqrt(np.mean(dp * dp)),
        "same": 100.0 * same.mean(),
    }


def test_kld_against_quant_matches_independent_numpy(
    smollm2_path: Path, smollm2_q8: Path, smollm2_vs_q8: dict[str, Any]
) -> None:
    m = smollm2_vs_q8["models"][0]
    ref = independent_kld(Reference(smollm2_path), Reference(smollm2_q8))
    kld = ref["kld"]
    assert m["kld"]["mean"] > 1e-4  # a real difference, well above float noise
    assert m["kld"]["mean"] == pytest.approx(kld.mean(), rel=1e-5)
    assert m["kld"]["mean_err"] == pytest.approx(sem(kld), rel=1e-4)
    assert m["kld"]["median"] == pytest.approx(np.median(kld), rel=1e-5)
    assert m["kld"]["max"] == pytest.approx(kld.max(), rel=1e-5)
    # numpy's default percentile is the same linear interpolation (llama.cpp computes the
    # position in float32: a shift of ~1e-4 positions at most)
    for key, q in (("p90", 90), ("p95", 95), ("p99", 99), ("p99_9", 99.9)):
        assert m["kld"][key] == pytest.approx(np.percentile(kld, q), rel=1e-3), key
    assert m["ppl"] == pytest.approx(ref["ppl"], rel=1e-6)
    assert m["ln_ppl_ratio"] == pytest.approx(ref["ln_ratio"], rel=1e-5, abs=1e-9)
    assert m["ln_ppl_ratio_err"] == pytest.approx(ref["ln_ratio_err"], rel=1e-4)
    assert m["ln_ppl_ratio_exact"] == pytest.approx(ref["ln_ratio_exact"], rel=1e-5, abs=1e-9)
    assert m["delta_p"]["mean"] == pytest.approx(ref["dp_mean"], rel=1e-4, abs=1e-9)
    assert m["delta_p"]["rms"] == pytest.approx(ref["dp_rms"], rel=1e-5)
    assert m["same_top_p"] == pytest.approx(ref["same"], abs=1e-9)
    assert 50.0 < m["same_top_p"] < 100.0
    # by position, by default over the scored positions 64 .. 126: 8 bins of equal width
    by_pos = kld.reshape(CHUNKS, CTX - 1 - CTX // 2)
    edges = [64, 72, 80, 88, 96, 103, 111, 119, 127]  # 64 + round(linspace(0, 63, 9))
    bins = m["kld_by_position"]
    assert [(b["first"], b["last"] + 1) for b in bins] == list(
        zip(edges[:-1], edges[1:], strict=True)
    )
    for b in bins:
        part = by_pos[:, b["first"] - 64 : b["last"] - 63]
        assert (b["tokens"], b["mean"]) == (part.size, pytest.approx(part.mean(), rel=1e-5))


def test_tiny_quant_kld_positive(tiny_llama_f32: Path, tiny_llama_q8: Path) -> None:
    data = eval_default(tiny_llama_f32, tiny_llama_q8)
    m = data["models"][0]
    ref = independent_kld(Reference(tiny_llama_f32), Reference(tiny_llama_q8))
    assert m["kld"]["mean"] > 0
    assert m["kld"]["mean"] == pytest.approx(ref["kld"].mean(), rel=1e-3)
    assert m["ppl"] == pytest.approx(ref["ppl"], rel=1e-6)


def kld_rows(base: np.ndarray, quant: np.ndarray) -> np.ndarray:
    """KL(base || quant) of each row of logits, base probabilities below e^-16 skipped."""

    def logp(z: np.ndarray) -> np.ndarray:
        m = z.max(axis=-1, keepdims=True)
        return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))

    lp, lq = logp(base), logp(quant)
    return np.where(lp > -16, np.exp(lp) * (lp - lq), 0.0).sum(axis=-1)


@pytest.mark.parametrize("cache", ["q8_0", "q4_0"])
def test_a_kv_cache_against_the_base_by_position(
    cache: str, smollm2_path: Path, instr_api: Any
) -> None:
    """No QUANT and -ctk/-ctv: the base with that cache against the base with an f16 one, its
    KLD at every position of every chunk (--all-positions) computed here from llama_cpp.Llama's
    logits (made with that cache), averaged in 8 bins of equal width over positions 0 .. CTX-2;
    the headline over the scored half, as ever."""
    data = cli_json(
        str(smollm2_path), "-ctk", cache, "-ctv", cache, "--flash-attn", "--all-positions",
        "--chunk-size", str(CTX), "--chunks", str(CHUNKS),
    )  # fmt: skip
    (m,) = data["models"]
    assert m["path"] == str(smollm2_path)
    assert (m["type_k"], m["type_v"], data["flash_attn"]) == (cache, cache, True)
    base = Reference(smollm2_path)
    quant = Reference(smollm2_path, kv=(cache, cache))
    kld = kld_rows(base.every, quant.every)  # (chunk, position)
    assert m["kld"]["mean"] > 1e-5  # the cache changes the logits
    assert m["kld"]["mean"] == pytest.approx(kld[:, CTX // 2 :].mean(), rel=1e-5)
    edges = [0, 16, 32, 48, 64, 79, 95, 111, 127]  # round(linspace(0, 127, 9))
    bins = m["kld_by_position"]
    assert [(b["first"], b["last"] + 1) for b in bins] == list(
        zip(edges[:-1], edges[1:], strict=True)
    )
    for b in bins:
        part = kld[:, b["first"] : b["last"] + 1]
        assert b["tokens"] == part.size
        assert b["mean"] == pytest.approx(part.mean(), rel=1e-5)
        assert b["err"] == pytest.approx(sem(part.ravel()), rel=1e-4)


def test_weights_and_kv_cache_together(
    smollm2_path: Path, smollm2_q8: Path, smollm2_vs_q8: dict[str, Any]
) -> None:
    """A QUANT with -ctk/-ctv: its weights and its cache against the base's f16 cache, the
    quant's logits made with that cache (the same figures computed here)."""
    data = cli_json(
        str(smollm2_path), str(smollm2_q8), "-ctk", "q8_0", "-ctv", "q8_0",
        "--chunk-size", str(CTX), "--chunks", str(CHUNKS),
    )  # fmt: skip
    (m,) = data["models"]
    assert m["path"] == str(smollm2_q8) and m["type_k"] == "q8_0"
    assert data["flash_attn"] == "auto"
    ref = independent_kld(Reference(smollm2_path), Reference(smollm2_q8, kv=("q8_0", "q8_0")))
    assert m["kld"]["mean"] == pytest.approx(ref["kld"].mean(), rel=1e-5)
    assert m["kld"]["mean"] != smollm2_vs_q8["models"][0]["kld"]["mean"]


@pytest.mark.fast
def test_per_token_values_on_synthetic_logits() -> None:
    """compare_block on logits spread wide enough that llama.cpp's floors matter: base
    log-probabilities floored at the logit max - 16, the KLD cutoff at e^-16."""
    from llamacpp_instr.running.quant.evaluate import compare_block

    rng = np.random.default_rng(7)
    rows, vocab = 40, 1000
    zb = (rng.standard_normal((rows, vocab)) * 6).astype(np.float32)
    zq = (zb + rng.standard_normal((rows, vocab)) * 0.3).astype(np.float32)
    targets = rng.integers(0, vocab, rows)
    targets[:5] = np.argmin(zb[:5], axis=1)  # certainly below max - 16: floored
    nll_base, (out,) = compare_block(zb, [zq], targets)
    nll, nll_b, stored, kld, same, dp = out

    def logp(z: np.ndarray) -> np.ndarray:
        z = z.astype(np.float64)
        m = z.max(axis=1, keepdims=True)
        return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))

    lp, lq = logp(zb), logp(zq)
    r = np.arange(rows)
    assert np.allclose(nll_b, -lp[r, targets], rtol=1e-12)
    assert np.allclose(nll, -lq[r, targets], rtol=1e-12)
    z64 = zb.astype(np.float64)
    lse = np.log(np.exp(z64 - z64.max(axis=1, keepdims=True)).sum(axis=1))
    expect_stored = np.minimum(-lp[r, targets], 16 + lse)
    assert np.allclose(stored, expect_stored, rtol=1e-9)
    assert (stored[:5] < nll_b[:5] - 1).all()  # the floor took effect where it should
    expect_kld = np.zeros(rows)
    for i in range(rows):
        keep = lp[i] > -16
        expect_kld[i] = np.sum(np.exp(lp[i][keep]) * (lp[i][keep] - lq[i][keep]))
    assert np.allclose(kld, expect_kld, rtol=1e-9)
    assert (same == (zb.argmax(axis=1) == zq.argmax(axis=1))).all()
    assert np.allclose(dp, np.exp(lq[r, targets]) - np.exp(lp[r, targets]), atol=1e-15)


@pytest.mark.fast
def test_statistics_helpers_follow_llama_cpp() -> None:
    from llamacpp_instr.running.quant.evaluate import mean_and_uncertainty, median, percentile

    v = np.array([0.0, 1.0, 2.0, 10.0])
    assert median(v) == 1.5
    assert percentile(v, 0.5) == pytest.approx(1.5)
    assert percentile(v, 0.9) == pytest.approx(0.3 * 2.0 + 0.7 * 10.0, rel=1e-6)
    assert percentile(v, 1.0) == 10.0 and percentile(v, 0.0) == 0.0
    x = np.arange(20, dtype=float)
    mu, err = mean_and_uncertainty(x.sum(), (x * x).sum(), len(x))
    assert mu == 9.5 and err == pytest.approx(np.std(x) / math.sqrt(19))
    # llama.cpp reports no uncertainty for 10 values or fewer
    assert mean_and_uncertainty(x[:10].sum(), (x[:10] ** 2).sum(), 10)[1] == 0.0


# (d) one-line errors ------------------------------------------------------------------------------


def one_line_error(*args: str) -> str:
    r = CliRunner().invoke(main, ["quant-eval", *args])
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: ") and r.output.count("\n") == 1, r.output
    return r.output


def test_text_shorter_than_two_chunks(tiny_llama_f32: Path, tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text("In the beginning God created the heaven and the earth.\n")
    out = one_line_error(str(tiny_llama_f32), str(tiny_llama_f32), "--text", str(short))
    assert "two chunks" in out and "1024" in out


def test_vocab_mismatch(tiny_llama_f32: Path, tmp_path: Path) -> None:
    from helpers.tiny_gguf import write_tiny_model

    other = write_tiny_model(tmp_path / "tiny-640.gguf", seed=1, n_vocab=640)
    out = one_line_error(str(tiny_llama_f32), str(other), "--chunk-size", "64", "--chunks", "2")
    assert "vocabular" in out and "640" in out and "512" in out


def test_kv_options_bad_input(tiny_llama_f32: Path) -> None:
    out = one_line_error(str(tiny_llama_f32))
    assert "QUANT" in out and "-ctk" in out
    out = one_line_error(str(tiny_llama_f32), "-ctv", "q8_0", "--no-flash-attn")
    assert "flash attention" in out and "q8_0" in out
    out = one_line_error(str(tiny_llama_f32), "-ctk", "q8_0", "--layers")
    assert "--layers" in out and "-ctk" in out
    r = CliRunner().invoke(main, ["quant-eval", str(tiny_llama_f32), "-ctk", "q9_9"])
    assert r.exit_code == 2 and "q9_9" in r.output


def test_missing_files(tiny_llama_f32: Path, tmp_path: Path) -> None:
    out = one_line_error(str(tiny_llama_f32), str(tmp_path / "nope.gguf"))
    assert "not found" in out and "nope.gguf" in out
    out = one_line_error(
        str(tiny_llama_f32), str(tiny_llama_f32), "--text", str(tmp_path / "nope.txt")
    )
    assert "not found" in out and "nope.txt" in out


# (e) every format --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["text", "markdown", "csv", "json", "html"])
def test_every_format_renders(fmt: str, smollm2_vs_q8: dict[str, Any], smollm2_q8: Path) -> None:
    from llamacpp_instr.converters.reports.quant.eval_report import build
    from llamacpp_instr.converters.reports.renderers import render

    data = smollm2_vs_q8
    out = render(build(data), fmt)
    m = data["models"][0]
    if fmt == "json":
        got = json.loads(out)
        for key in ("text", "ctx", "chunks", "tokens_scored", "base", "models"):
            assert key in got
        assert got["ctx"] == CTX and got["chunks"] == CHUNKS
        assert set(got["base"]) >= {"path", "ppl"}
        gm = got["models"][0]
        for key in ("path", "ppl", "ppl_err", "ln_ppl_ratio", "ln_ppl_ratio_err", "same_top_p"):
            assert key in gm
        assert set(gm["kld"]) >= {"mean", "mean_err", "median", "p90", "p95", "p99", "p99_9", "max"}
        assert set(gm["delta_p"]) >= {"mean", "rms"}
    elif fmt == "csv":
        lines = out.strip().splitlines()
        assert lines[0].startswith("model,ppl,ppl_err,ln_ppl_ratio")
        assert len(lines) == 3  # header, base, one quant
        assert lines[2].startswith(smollm2_q8.name + ",")
        assert float(lines[2].split(",")[1]) == m["ppl"]
    elif fmt == "html":
        assert out.startswith("<!doctype html>")
        assert 'data-chart="kld_percentiles"' in out and 'data-marks="5"' in out
        assert 'data-table="models"' in out and 'data-rows="2"' in out
    else:
        assert smollm2_q8.name in out
        assert f"{m['kld']['mean']:.6f}" in out
        assert f"{m['kld']['p99_9']:.6f}" in out


def test_cli_writes_output_file(tiny_llama_f32: Path, tiny_llama_q8: Path, tmp_path: Path) -> None:
    out = tmp_path / "qe.md"
    r = CliRunner().invoke(
        main,
        ["quant-eval", str(tiny_llama_f32), str(tiny_llama_q8), "--chunk-size", "64"]
        + ["--chunks", "2"]
        + ["--format", "markdown", "-o", str(out)],
    )
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "| model |" in text and tiny_llama_q8.name in text
