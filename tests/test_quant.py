"""Quantization reports, `instr quantize` and `instr compare`, checked against gguf-py and hand math."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from gguf import GGUFReader
from helpers.support import RunLog, hand_bytes, make_run

from llamacpp_instr.cli import main
from llamacpp_instr.converters.reports.quant.inventory import from_gguf, from_session, report_data

pytestmark = pytest.mark.native


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def quantized(
    tiny_llama_f32: Path, tmp_path_factory: pytest.TempPathFactory, instr_api: Any
) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("quant")
    out = {}
    for t in ("q4_k_m", "q8_0"):
        out[t] = d / f"tiny-{t}.gguf"
        r = _cli("quantize", str(tiny_llama_f32), "--type", t, "-o", str(out[t]))
        assert r.exit_code == 0, r.output
    return out


def test_totals_equal_independent_byte_counts(
    quantized: dict[str, Path], tiny_llama_f32: Path
) -> None:
    for path in [tiny_llama_f32, *quantized.values()]:
        inv = from_gguf(path)
        assert inv.bytes == hand_bytes(path)
        assert len(inv.tensors) == len(GGUFReader(path).tensors)


def test_bits_per_weight_and_ratios(quantized: dict[str, Path]) -> None:
    q8 = from_gguf(quantized["q8_0"])
    q4 = from_gguf(quantized["q4_k_m"])
    for t in q8.tensors:
        if t.type == "q8_0":
            assert t.bpw == 8.5  # 34 bytes per 32 weights
    types = {t.type for t in q4.tensors}
    assert {"q4_k", "q6_k", "f32"} <= types  # Q4_K_M mixes in Q6_K; norms stay F32
    for t in q4.tensors:
        if t.type == "q4_k":
            assert t.bpw == 4.5  # 144 bytes per 256 weights
        if t.type == "q6_k":
            assert t.bpw == 6.5625
        if t.role.endswith("norm"):
            assert t.type == "f32"
    data = report_data([q8])
    rows = {r["name"]: r for r in data["models"][0]["tensors"]}
    w = rows["blk.0.ffn_up.weight"]
    assert w["vs_f32"] == pytest.approx(32 / 8.5) and w["vs_16bit"] == pytest.approx(16 / 8.5)
    # F16 and BF16 are both 16 bits per weight: one ratio, no separate (always equal) columns
    t = data["models"][0]["totals"]
    for row in (w, t):
        assert "vs_f16" not in row and "vs_bf16" not in row
    assert t["vs_16bit"] == pytest.approx(q8.n_elements * 16 / (8 * hand_bytes(quantized["q8_0"])))
    by_type = {r["type"]: r for r in data["models"][0]["per_type"]}
    assert sum(r["byte_share"] for r in by_type.values()) == pytest.approx(1.0)


def test_side_by_side(quantized: dict[str, Path]) -> None:
    q8, q4 = from_gguf(quantized["q8_0"]), from_gguf(quantized["q4_k_m"])
    cmp_ = report_data([q8, q4])["comparison"]["others"][0]
    assert cmp_["saved"] == q8.bytes - q4.bytes > 0
    changed = {r["name"] for r in cmp_["type_changes"]}
    a = {t.name: t.type for t in q8.tensors}
    b = {t.name: t.type for t in q4.tensors}
    assert changed == {n for n in a if a[n] != b[n]}
    assert sum(r["saved"] for r in cmp_["per_layer"]) == pytest.approx(cmp_["saved"])


@pytest.mark.parametrize("fmt", ["text", "markdown", "csv", "json", "html"])
def test_every_format(fmt: str, quantized: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / f"report.{fmt}"
    r = _cli(
        "quant-report",
        str(quantized["q8_0"]),
        str(quantized["q4_k_m"]),
        "--format",
        fmt,
        "-o",
        str(out),
    )
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "bf16" not in text.replace("F16/BF16", "").lower()  # only in the 16-bit label
    assert "vs_bf16" not in text and "vs_f16" not in text
    if fmt == "json":
        data = json.loads(text)
        assert data["models"][1]["totals"]["bytes"] == hand_bytes(quantized["q4_k_m"])
        for m in data["models"]:
            for r in [m["totals"], *m["tensors"]]:
                assert r["vs_16bit"] == pytest.approx(r["elements"] * 2 / r["bytes"])
    elif fmt == "html":
        # self-contained: charts inline, nothing loaded from elsewhere
        assert text.count("<svg") >= 3 and text.count('<table class="sortable"') >= 6
        assert "src=" not in text and "href=" not in text and "@import" not in text
        # one 16-bit figure per model, a column per model's tensor table and the full listing
        assert text.count("<dt>smaller than 16-bit (F16/BF16)</dt>") == 2
        assert text.count("vs 16-bit (F16/BF16)") == 3
    elif fmt == "csv":
        assert text.splitlines()[0].startswith("model,name,role")
        assert len(text.splitlines()) == 1 + 2 * len(GGUFReader(quantized["q8_0"]).tensors)
        rows = list(csv.DictReader(io.StringIO(text)))
        assert "vs_16bit" in rows[0] and "vs_f16" not in rows[0] and "vs_bf16" not in rows[0]
        for r in rows:
            assert float(r["vs_16bit"]) == pytest.approx(int(r["elements"]) * 2 / int(r["bytes"]))
    else:
        assert "q6_k" in text and "bits per weight" in text
        # once per model in the headline, once per model as the tensor table's column
        assert text.count("smaller than 16-bit (F16/BF16)") == 2
        assert text.count("vs 16-bit (F16/BF16)") == 2
        assert "smaller than F16" not in text


def _table_lengths(text: str, fmt: str, first_header: str) -> list[int]:
    """The number of data rows of each table (text or markdown) whose header starts with
    ``first_header``."""
    lengths = []
    for block in text.split("\n\n"):
        lines = block.strip("\n").splitlines()
        for i, line in enumerate(lines):
            cells = [c for c in re.split(r"\s*\|\s*|\s{2,}", line.strip()) if c]
            if cells[:1] == [first_header] and (fmt == "text") != line.startswith("|"):
                rows = lines[i + 1 :]
                if fmt == "markdown":
                    rows = [r for r in rows[1:] if r.startswith("|")]
                else:  # up to the "(N more rows...)" line or a note
                    rows = [r for r in rows if r.strip()]
                    rows = rows[: next((k for k, r in enumerate(rows) if r[:1] in "(G"), len(rows))]
                lengths.append(len(rows))
                break
    return lengths


@pytest.mark.parametrize("fmt", ["text", "markdown"])
@pytest.mark.parametrize("top", [None, 1, 3])
def test_top_limits_rows_in_text_and_markdown(
    fmt: str, top: int | None, quantized: dict[str, Path]
) -> None:
    a, b = quantized["q8_0"], quantized["q4_k_m"]
    args = ["quant-report", str(a), str(b), "--format", fmt]
    r = _cli(*args, *(["--top", str(top)] if top is not None else []))
    assert r.exit_code == 0, r.output
    n = top if top is not None else 12  # the default
    # counted here from gguf-py's tensor names: roles are the names without blk.N.
    names = [t.name for t in GGUFReader(b).tensors]
    roles = {re.sub(r"^blk\.\d+\.", "", name) for name in names}
    assert len(names) > 12 and len(roles) > 3  # so that --top cuts the tables
    types_a = {t.name: t.tensor_type for t in GGUFReader(a).tensors}
    changed = sum(types_a[t.name] != t.tensor_type for t in GGUFReader(b).tensors)
    assert changed > 0
    # the largest tensors of each model, then the tensors that changed type
    assert _table_lengths(r.output, fmt, "tensor") == [min(n, len(names))] * 2 + [min(n, changed)]
    # per role: one table per model, and the side-by-side one
    assert _table_lengths(r.output, fmt, "role") == [min(n, len(roles))] * 3


def test_error_vs_reference(
    quantized: dict[str, Path], tiny_llama_f32: Path, tmp_path: Path
) -> None:
    from llamacpp_instr.converters.reports.quant.inventory import dequant_error

    e8 = {r["name"]: r for r in dequant_error(quantized["q8_0"], tiny_llama_f32)}
    e4 = {r["name"]: r for r in dequant_error(quantized["q4_k_m"], tiny_llama_f32)}
    w = "blk.0.ffn_up.weight"
    assert 0 < e8[w]["rmse"] < e4[w]["rmse"]  # more bits, less error
    assert e8[w]["snr_db"] > e4[w]["snr_db"] > 10
    assert e8["blk.0.attn_norm.weight"]["rmse"] == 0.0  # f32 stays f32
    r = _cli("quant-report", str(quantized["q4_k_m"]), "--error-vs", str(tiny_llama_f32))
    assert r.exit_code == 0 and "SNR (dB)" in r.output


def test_session_inventory_and_memory(smollm2_detailed: RunLog, smollm2_path: Path) -> None:
    inv = from_session(smollm2_detailed.path)
    assert inv.bytes == hand_bytes(smollm2_path)
    assert inv.memory and inv.memory["kv_cache"] > 0
    r = _cli("quant-report", "--log", str(smollm2_detailed.path))
    assert r.exit_code == 0 and "KV cache" in r.output


def test_compare_sessions(tiny_llama_f32: Path, quantized: dict[str, Path], tmp_path: Path) -> None:
    a = RunLog(make_run(tiny_llama_f32, tmp_path / "a.log", "verbose", n_predict=6))
    a2 = RunLog(make_run(tiny_llama_f32, tmp_path / "a2.log", "verbose", n_predict=6))
    r = _cli("compare", str(a.path), str(a2.path), "--format", "json")
    assert r.exit_code == 0, r.output
    c = json.loads(r.output)
    assert c["tokens"]["agreement"] == 1.0 and c["tokens"]["compared"] == 5
    assert c["logits"]["top1_agreement"] == 1.0 and c["logits"]["kl_max"] == pytest.approx(
        0.0, abs=1e-9
    )
    b = RunLog(make_run(quantized["q4_k_m"], tmp_path / "b.log", "verbose", n_predict=6))
    c = json.loads(_cli("compare", str(a.path), str(b.path), "--format", "json").output)
    gen_a = [s["tokens"][0] for s in a.of("step_begin") if s["kind"] == "gen"]
    gen_b = [s["tokens"][0] for s in b.of("step_begin") if s["kind"] == "gen"]
    assert c["tokens"]["agree"] == sum(x == y for x, y in zip(gen_a, gen_b, strict=True))
    # B's weight inventory is the quantized file's bytes as gguf-py counts them; the buffers hold
    # at least that (CPU_REPACK may add a repacked copy); F32 A needs more than quantized B
    assert sum(w["bytes"] for w in b.start["weights"]) == hand_bytes(quantized["q4_k_m"])
    mem_a, mem_b = c["a"]["memory"], c["b"]["memory"]
    assert mem_a == a.start["memory"] and mem_b == b.start["memory"]
    for mem, model in ((mem_a, tiny_llama_f32), (mem_b, quantized["q4_k_m"])):
        assert mem["weights"] == sum(buf["weights"] for buf in mem["buffers"])
        assert mem["weights"] >= hand_bytes(model)
    assert mem_a["weights"] > mem_b["weights"]
    text_out = _cli("compare", str(a.path), str(b.path)).output
    assert "Time per op type" in text_out and "Free-running agreement" in text_out
    for fmt in ("markdown", "csv", "html"):
        out = tmp_path / f"cmp.{fmt}"
        r = _cli("compare", str(a.path), str(b.path), "--format", fmt, "-o", str(out))
        assert r.exit_code == 0, r.output
        text = out.read_text()
        assert "MUL_MAT" in text
        if fmt == "html":  # self-contained: nothing fetched from anywhere
            assert "<svg" in text and "<table" in text
            assert "src=" not in text and "href=" not in text and "@import" not in text


# ---------------------------------------------------------------------------- bad input


def _err(r: Any, needle: str) -> None:
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines()[-1].startswith("error: ") and needle in r.output


def test_bad_input(tmp_path: Path, tiny_llama_f32: Path, quantized: dict[str, Path]) -> None:
    notgguf = tmp_path / "x.gguf"
    notgguf.write_text("hello")
    _err(_cli("quant-report", str(notgguf)), "not a GGUF")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_llama_f32.read_bytes()[:-1000])
    _err(_cli("quant-report", str(cut)), "truncated")
    nolog = tmp_path / "s.log"
    nolog.write_text(
        '{"type":"session_start","ts":1,"sid":"0123456789abcdef","schema_version":1}\n'
    )
    _err(_cli("quant-report", "--log", str(nolog)), "no weight inventory")
    _err(
        _cli("quantize", str(tiny_llama_f32), "--type", "q7_z", "-o", str(tmp_path / "o.gguf")),
        "unknown --type",
    )
    _err(_cli("quant-report"), "at least one")


def test_different_models_warn_and_compare(tiny_llama_f32: Path, tiny_second_arch: Path) -> None:
    r = _cli("quant-report", str(tiny_llama_f32), str(tiny_second_arch))
    assert r.exit_code == 0
    assert "warning: " in r.output and "different models?" in r.output


def test_requantize_warns(quantized: dict[str, Path], tmp_path: Path) -> None:
    r = _cli("quantize", str(quantized["q8_0"]), "--type", "q4_0", "-o", str(tmp_path / "re.gguf"))
    assert r.exit_code == 0 and "already quantized" in r.output


def test_unknown_tensor_type_is_reported_not_fatal(tiny_llama_f32: Path, tmp_path: Path) -> None:
    """A type id the installed gguf-py does not know (e.g. 42) becomes `unknown(42)`, with the
    bytes the file holds for it; the other tensors are reported as usual."""
    import struct

    data = bytearray(tiny_llama_f32.read_bytes())
    name = b"output_norm.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    type_at = at + 4 + 8 * n_dims
    assert struct.unpack_from("<I", data, type_at)[0] == 0  # F32
    struct.pack_into("<I", data, type_at, 42)
    odd = tmp_path / "type42.gguf"
    odd.write_bytes(bytes(data))
    with pytest.raises(ValueError):
        GGUFReader(odd)  # gguf-py alone refuses the whole file
    inv = from_gguf(odd)
    ref = {t.name: t for t in from_gguf(tiny_llama_f32).tensors}
    for t in inv.tensors:
        if t.name == "output_norm.weight":
            assert t.type == "unknown(42)" and t.type_id == 42 and t.bytes >= ref[t.name].bytes
        else:
            assert (t.type, t.bytes, t.shape) == (
                ref[t.name].type,
                ref[t.name].bytes,
                ref[t.name].shape,
            )
    r = _cli("quant-report", str(odd), "--format", "csv")
    assert r.exit_code == 0 and "unknown(42)" in r.output
