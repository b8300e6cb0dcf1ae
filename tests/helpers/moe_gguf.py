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
