"""Each choice a context is made with has one mapping: flash attention's three ways to llama.cpp's
enum and a KV cache type to ggml's id (``running/context_defaults``); flash attention's name and
instr run's options, and the settings llama.cpp refuses (``running/context_choices``). Checked
against llama.h's values and gguf-py's type ids, and no other module of the package spells the
enum or the type ids itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.running import context_choices as cc
from llamacpp_instr.running import context_defaults as cd

ROOT = Path(__file__).resolve().parents[1] / "llamacpp_instr"


@pytest.mark.native
def test_flash_attention_maps_to_llama_hs_enum() -> None:
    """Through llama-cpp-python's bindings of the build (so in the whole suite, not the fast
    tier): llama.h's LLAMA_FLASH_ATTN_TYPE_AUTO = -1, _DISABLED = 0, _ENABLED = 1."""
    assert [cd.flash_attn_type(c) for c in (None, False, True)] == [-1, 0, 1]


@pytest.mark.fast
def test_flash_attention_maps_to_names_and_options() -> None:
    assert [cc.flash_attn_name(c) for c in (None, False, True)] == ["auto", "off", "on"]
    assert [cc.flash_attn_args(c) for c in (None, False, True)] == [
        [],
        ["--no-flash-attn"],
        ["--flash-attn"],
    ]


@pytest.mark.fast
def test_kv_types_map_to_ggmls_ids() -> None:
    """ggml.h's ``enum ggml_type`` of the pin (bf16 too, which llama-cpp-python's bindings lack)."""
    ggml_h = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8}
    ggml_h |= {"iq4_nl": 20, "bf16": 30}
    assert {name: cd.kv_type_id(name) for name in cc.KV_TYPES} == ggml_h
    with pytest.raises(UserError, match="unknown KV cache type 'q3_k'"):
        cd.kv_type_id("q3_k")


@pytest.mark.fast
def test_a_setting_llama_cpp_refuses_is_one_line() -> None:
    cc.check_kv("q8_0", "q8_0", None)  # auto turns flash attention on for a quantized V cache
    cc.check_kv("q8_0", "f16", False)  # a quantized K cache alone needs no flash attention
    with pytest.raises(UserError, match=r"-ctv q8_0\) needs flash attention") as e:
        cc.check_kv("f16", "q8_0", False)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="-ctk/--cache-type-k must be one of"):
        cc.check_kv("q2_k", "f16", True)


@pytest.mark.fast
def test_no_other_module_spells_the_mappings() -> None:
    """llama.cpp's flash-attention enum and ggml's KV type ids are named in context_defaults
    alone: a second spelling is a second mapping."""
    found = []
    checked = 0
    for p in sorted(ROOT.rglob("*.py")):
        if p.name == "context_defaults.py":
            continue
        checked += 1
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            named = (
                node.attr
                if isinstance(node, ast.Attribute)
                else node.value if isinstance(node, ast.Constant) else None
            )
            if isinstance(named, str) and named.startswith(("LLAMA_FLASH_ATTN_TYPE", "GGML_TYPE_")):
                found.append(f"{p.relative_to(ROOT)}:{node.lineno}: {named}")
            if isinstance(node, ast.Dict) and {
                k.value for k in node.keys if isinstance(k, ast.Constant)
            } >= {None, True, False}:
                found.append(f"{p.relative_to(ROOT)}:{node.lineno}: a tri-state table")
    assert checked > 150
    assert not found, "\n".join(found)
