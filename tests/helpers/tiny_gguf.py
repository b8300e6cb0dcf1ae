"""Tiny, real, loadable GGUF models written with gguf-py, deterministic from a seed.

They have everything llama.cpp needs to load and generate: hyper-parameters, a small
SentencePiece-style vocabulary (control tokens, the 256 byte tokens, printable ASCII) and weights
drawn from a seeded RNG with a small std so activations stay finite. Dimensions are multiples of
256 so k-quants do not fall back to other types.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

# A non-llama architecture with its own graph builder in llama.cpp (q/k/v biases, NeoX rope).
SECOND_ARCH = "qwen2"
N_VOCAB = 512


def _vocab(
    raw_pieces: list[bytes] | None = None, n_vocab: int = N_VOCAB
) -> tuple[list[Any], list[float], list[int]]:
    T = gguf.TokenType
    tokens: list[Any] = ["<unk>", "<s>", "</s>"]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [T.BYTE] * 256
    chars = ["\u2581" if c == " " else c for c in map(chr, range(32, 127))]
    tokens += chars
    types += [T.NORMAL] * len(chars)
    # normal tokens whose text is arbitrary bytes (not necessarily UTF-8): what a byte-level BPE
    # vocabulary's pieces can be; token ids FIRST_RAW_PIECE.. in order
    raw = list(raw_pieces or [])
    tokens += raw
    types += [T.NORMAL] * len(raw)
    n_unused = n_vocab - len(tokens)
    if n_unused < 0:
        raise ValueError(f"n_vocab {n_vocab} is smaller than the {len(tokens)} tokens it must hold")
    tokens += [f"<unused{i}>" for i in range(n_unused)]
    types += [T.UNUSED] * n_unused
    scores = (
        [0.0] * 259 + [-float(i) for i in range(len(chars))] + [-1e3] * len(raw) + [-1e4] * n_unused
    )
    return tokens, scores, [int(t) for t in types]


FIRST_RAW_PIECE = 3 + 256 + 95


def write_tiny_model(
    path: Path | str,
    *,
    arch: str = "llama",
    n_layer: int = 2,
    n_embd: int = 256,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 512,
    n_ctx_train: int = 1024,
    dtype: str = "f32",
    seed: int = 0,
    raw_pieces: list[bytes] | None = None,
    n_vocab: int = N_VOCAB,
) -> Path:
    """Write a tiny ``arch`` model (``llama`` or ``qwen2``) to ``path`` and return the path."""
    if arch not in ("llama", SECOND_ARCH):
        raise ValueError(f"unsupported tiny architecture {arch!r}")
    if dtype not in ("f32", "f16"):
        raise ValueError(f"dtype must be f32 or f16, not {dtype!r}")
    path = Path(path)
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    n_embd_kv = head_dim * n_head_kv
    wtype = np.float16 if dtype == "f16" else np.float32

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}-{dtype}")
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)

    tokens, scores, types = _vocab(raw_pieces, n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.02).astype(wtype)

    def norm(n: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(n) * 0.01).astype(np.float32)

    def bias(n: int) -> np.ndarray:
        return (rng.standard_normal(n) * 0.01).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd))
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm(n_embd))
        w.add_tensor(p + "attn_q.weight", mat(n_embd, n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_embd_kv, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_embd_kv, n_embd))
        if arch == SECOND_ARCH:
            w.add_tensor(p + "attn_q.bias", bias(n_embd))
            w.add_tensor(p + "attn_k.bias", bias(n_embd_kv))
            w.add_tensor(p + "attn_v.bias", bias(n_embd_kv))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, n_embd))
        w.add_tensor(p + "ffn_norm.weight", norm(n_embd))
        w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff))
    w.add_tensor("output_norm.weight", norm(n_embd))
    w.add_tensor("output.weight", mat(n_vocab, n_embd))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_tiny_iswa_model(
    path: Path | str, *, n_layer: int = 4, n_embd: int = 256, n_head: int = 4, n_head_kv: int = 2,
    n_ff: int = 512, n_swa: int = 64, seed: int = 5,
) -> Path:  # fmt: skip
    """A tiny gemma2: interleaved sliding-window attention, so llama.cpp gives it two KV caches
    (llama_kv_cache_iswa: one for the full layers, one for the sliding-window ones)."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    n_embd_kv = head_dim * n_head_kv
    w = gguf.GGUFWriter(str(path), "gemma2")
    w.add_name("tiny-gemma2-f32")
    w.add_context_length(1024)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(n_swa)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens, scores, types = _vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (rng.standard_normal(n) * 0.01).astype(np.float32)  # gemma's norms add 1

    w.add_tensor("token_embd.weight", mat(N_VOCAB, n_embd))
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm(n_embd))
        w.add_tensor(p + "attn_q.weight", mat(n_embd, n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_embd_kv, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_embd_kv, n_embd))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, n_embd))
        w.add_tensor(p + "post_attention_norm.weight", norm(n_embd))
        w.add_tensor(p + "ffn_norm.weight", norm(n_embd))
        w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff))
        w.add_tensor(p + "post_ffw_norm.weight", norm(n_embd))
    w.add_tensor("output_norm.weight", norm(n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
