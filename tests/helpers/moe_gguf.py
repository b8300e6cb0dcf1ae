"""Mixture-of-experts test models, derived from a dense GGUF (the bundled SmolLM2) with gguf-py alone.

Each layer's dense FFN (``ffn_{gate,up,down}.weight``) becomes ``n_expert`` experts stacked on a new
outer axis (``ffn_{gate,up,down}_exps.weight``: the quantized bytes as they are, no requantizing),
and a router ``ffn_gate_inp.weight`` (F32, ``n_expert`` rows of ``n_embd``) is added, with the
``llama.expert_count`` and ``llama.expert_used_count`` keys. llama.cpp's llama graph then builds
its MoE FFN (``build_moe_ffn`` with the top-k weights normalized).

- ``distinct=False`` (identical experts): every expert is the layer's own FFN. Because the top-k
  weights are normalized to sum to 1, the layer computes the dense FFN whatever the router picks:
  the greedy text equals the dense model's for the first tokens (the MoE kernel and the weighted
  sum round differently, so a long text may drift).
- ``distinct=True``: expert ``e`` of layer ``l`` is the FFN of layer ``(l + e) mod n_layer``, and
  router row ``e`` is scaled by ``skew ** e``. A row with a larger norm gives logits of a larger
  spread, so it is in the top-k more often: routing is uneven by construction, and deterministic
  for a seed.
- ``n_layer``: keep only the first layers (a small model for fast tests).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

FFN_PARTS = ("ffn_gate", "ffn_up", "ffn_down")


def _copy_kv(reader: gguf.GGUFReader, writer: gguf.GGUFWriter, overrides: dict[str, int]) -> None:
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in overrides:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub)
    for key, value in overrides.items():
        writer.add_key_value(key, value, gguf.GGUFValueType.UINT32)


def _add(writer: gguf.GGUFWriter, name: str, t: Any) -> None:
    qtype = gguf.GGMLQuantizationType(t.tensor_type)
    if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        writer.add_tensor(name, np.asarray(t.data))
    else:
        writer.add_tensor(name, np.asarray(t.data), raw_dtype=qtype)


def write_moe_model(
    src: Path | str,
    dest: Path | str,
    *,
    n_expert: int = 8,
    n_used: int = 2,
    n_layer: int | None = None,
    distinct: bool = False,
    skew: float = 1.5,
    seed: int = 0,
) -> Path:
    """Write a llama-architecture MoE made from the dense llama model ``src``; returns ``dest``."""
    dest = Path(dest)
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    if arch != "llama":
        raise ValueError(f"{src}: architecture {arch!r}, not llama")
    n_src = int(reader.fields["llama.block_count"].contents())
    n_embd = int(reader.fields["llama.embedding_length"].contents())
    n_keep = n_src if n_layer is None else n_layer
    if not 1 <= n_keep <= n_src or not 1 <= n_used <= n_expert:
        raise ValueError(f"n_layer {n_layer}, n_expert {n_expert}, n_used {n_used}: out of range")
    tensors = {t.name: t for t in reader.tensors}
    writer = gguf.GGUFWriter(str(dest), arch)
    _copy_kv(
        reader,
        writer,
        {
            "llama.block_count": n_keep,
            "llama.expert_count": n_expert,
            "llama.expert_used_count": n_used,
        },
    )
    rng = np.random.default_rng(seed)
    for t in reader.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and int(parts[1]) >= n_keep:
            continue
        if parts[0] != "blk" or parts[2] not in FFN_PARTS:
            _add(writer, t.name, t)
            continue
        il, part = int(parts[1]), parts[2]
        sources = [(il + e) % n_keep if distinct else il for e in range(n_expert)]
        src_t = [tensors[f"blk.{s}.{part}.weight"] for s in sources]
        if len({(int(s.tensor_type), tuple(s.shape)) for s in src_t}) != 1:
            raise ValueError(f"blk.{il}.{part}: the source layers' types or shapes differ")
        stacked = np.stack([np.asarray(s.data) for s in src_t])
        qtype = gguf.GGMLQuantizationType(t.tensor_type)
        raw = None if qtype == gguf.GGMLQuantizationType.F32 else qtype
        writer.add_tensor(f"blk.{il}.{part}_exps.weight", stacked, raw_dtype=raw)
        if part == FFN_PARTS[-1]:
            router = rng.standard_normal((n_expert, n_embd)).astype(np.float32)
            router /= np.sqrt(n_embd)
            if distinct:
                router *= (skew ** np.arange(n_expert, dtype=np.float32))[:, None]
            writer.add_tensor(f"blk.{il}.ffn_gate_inp.weight", router)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


def write_tiny_gpt_oss(
    dest: Path | str,
    *,
    n_layer: int = 2,
    n_embd: int = 256,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_expert: int = 8,
    n_used: int = 2,
    n_ff_exp: int = 256,
    n_swa: int = 64,
    router_scale: float = 3.0,
    seed: int = 7,
) -> Path:
    """A tiny ``gpt-oss`` (llama.cpp's openai-moe) of random weights: attention sinks, biases,
    alternating sliding-window layers, and a MoE FFN whose routing weights are llama.cpp's softmax
    over each token's chosen router logits (its softmax-weight gating). The router's rows are
    scaled by ``router_scale`` and it has a bias, so that its logits spread well outside [0, 1]."""
    from helpers.tiny_gguf import N_VOCAB, add_vocab

    dest = Path(dest)
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    w = gguf.GGUFWriter(str(dest), "gpt-oss")
    w.add_name("tiny-gpt-oss-f32")
    w.add_context_length(1024)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff_exp)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_sliding_window(n_swa)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_vocab(w)

    def mat(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(n) * 0.01).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(N_VOCAB, n_embd))
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm(n_embd))
        w.add_tensor(p + "post_attention_norm.weight", norm(n_embd))
        w.add_tensor(p + "attn_q.weight", mat(n_head * head_dim, n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, n_head * head_dim))
        w.add_tensor(p + "attn_output.bias", mat(n_embd, std=0.01))
        w.add_tensor(p + "attn_sinks.weight", mat(n_head, std=0.1))
        w.add_tensor(p + "ffn_gate_inp.weight", mat(n_expert, n_embd, std=router_scale))
        w.add_tensor(p + "ffn_gate_inp.bias", mat(n_expert, std=router_scale))
        w.add_tensor(p + "ffn_gate_exps.weight", mat(n_expert, n_ff_exp, n_embd))
        w.add_tensor(p + "ffn_up_exps.weight", mat(n_expert, n_ff_exp, n_embd))
        w.add_tensor(p + "ffn_down_exps.weight", mat(n_expert, n_embd, n_ff_exp))
        w.add_tensor(p + "ffn_gate_exps.bias", mat(n_expert, n_ff_exp, std=0.01))
        w.add_tensor(p + "ffn_up_exps.bias", mat(n_expert, n_ff_exp, std=0.01))
        w.add_tensor(p + "ffn_down_exps.bias", mat(n_expert, n_embd, std=0.01))
    w.add_tensor("output_norm.weight", norm(n_embd))
    w.add_tensor("output.weight", mat(N_VOCAB, n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dest
