"""Multimodal projectors (mmproj GGUF files, llama.cpp's ``clip`` architecture) for mtmd, written
with gguf-py, deterministic from a seed: random weights, real keys and tensor names.

A projector is an encoder (a vision transformer, or a whisper audio encoder) and the projection that
maps its output into the text model's embeddings: ``n_embd_text`` is that width (576 feeds the
bundled SmolLM2-135M). Every key and tensor name is one that tools/mtmd/clip.cpp's loader
(``clip_model_loader``) reads, under the names of clip-impl.h (``KEY_*``, ``TN_*``).

Vision (``write_vision_mmproj``), a ViT on ``image_size`` squares cut into ``patch_size`` patches:

- ``idefics3`` (SmolVLM's family): a SigLIP encoder, then a pixel shuffle that folds each
  ``scale_factor`` x ``scale_factor`` block of patches into one token and a linear projection
  (``mm.model.fc``). mtmd cuts an image into ``image_size`` tiles (one here: the preprocessor's
  longest edge is ``image_size``) plus an overview, and encodes each: two encodes per image.
  Each gives ``(image_size / patch_size / scale_factor) ** 2`` tokens.
- ``gemma3``: the same encoder, average-pooled by ``scale_factor``, RMS-normed and projected
  (``mm.input_projection``); one encode per image.
- ``mlp`` (LLaVA-1.5): a CLIP encoder (class embedding, pre-norm) read at its second-to-last
  layer, then a two-layer MLP (``mm.0``, ``mm.2``); one encode, ``(image_size / patch_size) ** 2``
  tokens.
- ``mlp_norm`` (Yi-VL's LLaVA): the same encoder, then a matrix, a layer norm, a GELU, a matrix
  and a layer norm (``mm.0``, ``mm.1``, ``mm.3``, ``mm.4``). The file says ``mlp``: clip.cpp takes
  an ``mlp`` projector with ``mm.3`` for this one (it has no name of its own there).
- ``ldp`` (MobileVLM): the same encoder, then an MLP (``mm.model.mlp.1``, ``.3``) and two
  MobileNet blocks (``mm.model.mb_block.1``, ``.2``: a depthwise convolution, a layer norm, a
  hard swish, a squeeze-and-excite, a pointwise matrix and a layer norm), the second of stride 2.
- ``ldpv2`` (MobileVLM V2): the same encoder, then an MLP (``mm.model.mlp.0``, ``.2``), an
  average pool of 2 and a depthwise convolution added back (``mm.model.peg.0``).
  clip.cpp builds both MobileVLM projectors for 24 x 24 patches (CLIP ViT-L/14 at 336 px), so
  their defaults are 96 px images of 4 px patches: ``(24 / 2) ** 2`` tokens.
- ``adapter`` (GLM-Edge-V): a SigLIP encoder read at its last layer, then a stride-2
  convolution over the patches (``adapter.conv``), a matrix, a layer norm, a GELU, a SwiGLU MLP
  (``adapter.linear.*``) and begin and end embeddings of its own (``adapter.boi``, ``.eoi``):
  ``(image_size / patch_size / 2) ** 2 + 2`` tokens.

clip.cpp builds the projectors of ``mlp``, ``mlp_norm``, ``ldp``, ``ldpv2``, ``adapter`` and
``gemma3`` with no graph callback (``idefics3``'s names one node, with no layer): ggml names their
nodes ``node_N``.

Audio (``write_audio_mmproj``), whisper's encoder (two 1-D convolutions over ``n_mel`` mel bins,
the second of stride 2, then a transformer over at most ``n_audio_ctx`` positions): mtmd pads or
cuts the audio into 30 s chunks of 3000 mel frames, 1500 positions after the convolutions, so
``n_audio_ctx`` must be at least 1500.

- ``qwen2a`` (Qwen2-Audio): an average pool of 2 and a linear projection (``mm.a.fc``): 750
  tokens per chunk.
- ``ultravox``: frames stacked by ``stack_factor``, RMS norm, a SwiGLU MLP (``mm.a.mlp.1``,
  ``mm.a.mlp.2``) with a norm between.
- ``voxtral``: the pool, frames stacked by ``stack_factor``, a GELU MLP without biases. Its
  default stack factor is 2: at 4 (the pin's converter writes 4) the pooled 750 frames stack into
  188 tokens where mtmd counts 187, and clip_encode aborts ("Invalid number of output tokens").

Matrices are ``dtype`` (f16 as llama.cpp's converter writes them, or f32); the convolution kernels
f16 (ggml's im2col wants them so); norms, biases and the position and class embeddings f32.
Weights have a small spread, so that activations stay finite through any number of layers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

VISION_PROJECTORS = ("idefics3", "gemma3", "mlp", "mlp_norm", "ldp", "ldpv2", "adapter")
# LLaVA's projectors: a CLIP encoder read at its second-to-last layer, then the projection
LLAVA_PROJECTORS = ("mlp", "mlp_norm", "ldp", "ldpv2")
# the patches a side clip.cpp builds MobileVLM's projectors for (its n_patch)
MOBILEVLM_SIDE = 24
AUDIO_PROJECTORS = ("qwen2a", "ultravox", "voxtral")

# SmolLM2-135M's width: its embeddings are what the projection feeds
SMOLLM2_N_EMBD = 576

# whisper's 30 s chunk is 3000 mel frames; the stride-2 convolution halves them
WHISPER_N_POS = 1500

_SIGLIP_MEAN_STD = ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])
_CLIP_MEAN_STD = ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711])

Tensors = dict[str, np.ndarray]


class _Weights:
    """Seeded random tensors, numpy shapes (ggml's ``ne`` reversed)."""

    def __init__(self, seed: int, dtype: str) -> None:
        if dtype not in ("f32", "f16"):
            raise ValueError(f"dtype must be f32 or f16, not {dtype!r}")
        self.rng = np.random.default_rng(seed)
        self.wtype = np.float16 if dtype == "f16" else np.float32

    def mat(self, *shape: int, std: float = 0.02) -> np.ndarray:
        return (self.rng.standard_normal(shape) * std).astype(self.wtype)

    def kernel(self, *shape: int) -> np.ndarray:
        return (self.rng.standard_normal(shape) * 0.02).astype(np.float16)

    def norm(self, n: int) -> np.ndarray:
        return (1.0 + self.rng.standard_normal(n) * 0.01).astype(np.float32)

    def bias(self, *shape: int) -> np.ndarray:
        return (self.rng.standard_normal(shape) * 0.01).astype(np.float32)

    def embd(self, *shape: int) -> np.ndarray:
        """Position and class embeddings: f32, added to (or joined with) f32 activations."""
        return (self.rng.standard_normal(shape) * 0.02).astype(np.float32)


def _encoder_layers(
    w: _Weights, prefix: str, n_layer: int, n_embd: int, n_ff: int, k_bias: bool = True
) -> Tensors:
    """Pre-norm transformer blocks as clip.cpp names them (``TN_ATTN_*``, ``TN_LN_*``,
    ``TN_FFN_*``); whisper's have no K bias. ``n_ff`` must differ from ``n_embd``: clip.cpp takes
    an FFN down matrix whose input is ``n_embd`` wide for up and down swapped (old converters')."""
    if n_ff == n_embd:
        raise ValueError("n_ff must differ from n_embd (clip.cpp would swap ffn_up and ffn_down)")
    out: Tensors = {}
    for il in range(n_layer):
        p = f"{prefix}.blk.{il}."
        out[p + "ln1.weight"], out[p + "ln1.bias"] = w.norm(n_embd), w.bias(n_embd)
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out[p + name + ".weight"] = w.mat(n_embd, n_embd)
            if name != "attn_k" or k_bias:
                out[p + name + ".bias"] = w.bias(n_embd)
        out[p + "ln2.weight"], out[p + "ln2.bias"] = w.norm(n_embd), w.bias(n_embd)
        out[p + "ffn_up.weight"], out[p + "ffn_up.bias"] = w.mat(n_ff, n_embd), w.bias(n_ff)
        out[p + "ffn_down.weight"] = w.mat(n_embd, n_ff)
        out[p + "ffn_down.bias"] = w.bias(n_embd)
    return out


def _write(path: Path, name: str, keys: dict[str, object], tensors: Tensors) -> Path:
    """The file at ``path``, written beside it first and renamed (never half-written)."""
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), "clip")
    writer.add_name(name)
    for key, value in keys.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, list(value))  # type: ignore[call-overload]
    for tname, data in tensors.items():
        writer.add_tensor(tname, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(path)
    return path


def _common_keys(
    modality: str, n_embd: int, n_head: int, n_ff: int, n_layer: int, n_embd_text: int
) -> dict[str, object]:
    return {
        f"clip.{modality}.embedding_length": n_embd,
        f"clip.{modality}.attention.head_count": n_head,
        f"clip.{modality}.feed_forward_length": n_ff,
        f"clip.{modality}.block_count": n_layer,
        f"clip.{modality}.projection_dim": n_embd_text,
        f"clip.{modality}.attention.layer_norm_epsilon": 1e-6,
    }


def _vision_projection(
    w: _Weights, projector: str, n_embd: int, n_embd_text: int, scale_factor: int
) -> Tensors:
    if projector == "idefics3":
        return {"mm.model.fc.weight": w.mat(n_embd_text, n_embd * scale_factor**2)}
    if projector == "gemma3":
        return {
            "mm.soft_emb_norm.weight": w.norm(n_embd),
            "mm.input_projection.weight": w.mat(n_embd, n_embd_text),
        }
    if projector in ("ldp", "ldpv2"):
        return _mobilevlm_projection(w, projector, n_embd, n_embd_text)
    if projector == "adapter":
        return _glm_edge_projection(w, n_embd, n_embd_text)
    hidden = 2 * n_embd_text
    out = {"mm.0.weight": w.mat(hidden, n_embd), "mm.0.bias": w.bias(hidden)}
    if projector == "mlp":
        out["mm.2.weight"], out["mm.2.bias"] = w.mat(n_embd_text, hidden), w.bias(n_embd_text)
        return out
    out["mm.1.weight"], out["mm.1.bias"] = w.norm(hidden), w.bias(hidden)
    out["mm.3.weight"], out["mm.3.bias"] = w.mat(n_embd_text, hidden), w.bias(n_embd_text)
    out["mm.4.weight"], out["mm.4.bias"] = w.norm(n_embd_text), w.bias(n_embd_text)
    return out


def _mobilevlm_projection(w: _Weights, projector: str, n_embd: int, n_embd_text: int) -> Tensors:
    """MobileVLM's MLP into the text model's width, then (ldp) two MobileNet blocks of
    ``mm.model.mb_block.N.block.{0,1,2}`` or (ldpv2) a depthwise convolution ``mm.model.peg.0``:
    depthwise kernels 3 x 3, one channel each; the squeeze-and-excite reduces by 4."""
    first, second = (1, 3) if projector == "ldp" else (0, 2)
    c = n_embd_text
    out: Tensors = {
        f"mm.model.mlp.{first}.weight": w.mat(c, n_embd),
        f"mm.model.mlp.{first}.bias": w.bias(c),
        f"mm.model.mlp.{second}.weight": w.mat(c, c),
        f"mm.model.mlp.{second}.bias": w.bias(c),
    }
    if projector == "ldpv2":
        out["mm.model.peg.0.weight"], out["mm.model.peg.0.bias"] = w.kernel(c, 1, 3, 3), w.bias(c)
        return out
    for b in (1, 2):
        p = f"mm.model.mb_block.{b}.block."
        out[p + "0.0.weight"] = w.kernel(c, 1, 3, 3)
        out[p + "0.1.weight"], out[p + "0.1.bias"] = w.norm(c), w.bias(c)
        out[p + "1.fc1.weight"], out[p + "1.fc1.bias"] = w.mat(c // 4, c), w.bias(c // 4)
        out[p + "1.fc2.weight"], out[p + "1.fc2.bias"] = w.mat(c, c // 4), w.bias(c)
        out[p + "2.0.weight"] = w.mat(c, c)
        out[p + "2.1.weight"], out[p + "2.1.bias"] = w.norm(c), w.bias(c)
    return out


def _glm_edge_projection(w: _Weights, n_embd: int, n_embd_text: int) -> Tensors:
    """GLM-Edge-V's adapter: a 2 x 2 convolution of stride 2 into the text model's width, a
    matrix, a layer norm, and a SwiGLU MLP twice as wide; its begin and end embeddings."""
    c, ff = n_embd_text, 2 * n_embd_text
    return {
        "adapter.conv.weight": w.kernel(c, n_embd, 2, 2),
        "adapter.conv.bias": w.bias(c),
        "adapter.linear.linear.weight": w.mat(c, c),
        "adapter.linear.norm1.weight": w.norm(c),
        "adapter.linear.norm1.bias": w.bias(c),
        "adapter.linear.dense_h_to_4h.weight": w.mat(ff, c),
        "adapter.linear.gate.weight": w.mat(ff, c),
        "adapter.linear.dense_4h_to_h.weight": w.mat(c, ff),
        "adapter.boi": w.embd(1, c),
        "adapter.eoi": w.embd(1, c),
    }


def _check_vision(
    projector: str, n_layer: int, image_size: int, patch_size: int, scale_factor: int
) -> None:
    if projector not in VISION_PROJECTORS:
        raise ValueError(f"vision projector {projector!r}: choose one of {VISION_PROJECTORS}")
    side = image_size // patch_size
    if image_size % patch_size:
        raise ValueError(f"image_size {image_size} must be a multiple of patch_size {patch_size}")
    if projector in ("idefics3", "gemma3") and side % scale_factor:
        raise ValueError(f"{side} patches a side must be a multiple of scale_factor {scale_factor}")
    if projector in ("ldp", "ldpv2") and side != MOBILEVLM_SIDE:
        raise ValueError(f"{projector} is built for {MOBILEVLM_SIDE} patches a side, not {side}")
    if projector == "adapter" and side % 2:
        raise ValueError(f"adapter's stride-2 convolution wants an even side, not {side} patches")
    if projector in LLAVA_PROJECTORS and n_layer < 2:
        raise ValueError(f"{projector} reads the second-to-last layer: n_layer >= 2")


def write_vision_mmproj(
    path: Path | str,
    *,
    projector: str = "idefics3",
    n_embd_text: int = SMOLLM2_N_EMBD,
    n_embd: int = 64,
    n_head: int = 4,
    n_ff: int = 256,
    n_layer: int = 2,
    image_size: int | None = None,
    patch_size: int | None = None,
    scale_factor: int = 4,
    dtype: str = "f16",
    seed: int = 0,
) -> Path:
    """Write a vision projector to ``path`` and return the path (see the module's docstring);
    ``image_size`` and ``patch_size``: 96 and 4 for MobileVLM's (24 patches a side), 256 and 16
    for the others by default."""
    mobilevlm = projector in ("ldp", "ldpv2")
    image_size = image_size or (96 if mobilevlm else 256)
    patch_size = patch_size or (4 if mobilevlm else 16)
    _check_vision(projector, n_layer, image_size, patch_size, scale_factor)
    llava = projector in LLAVA_PROJECTORS
    w = _Weights(seed, dtype)
    n_pos = (image_size // patch_size) ** 2 + (1 if llava else 0)
    tensors: Tensors = {
        "v.patch_embd.weight": w.kernel(n_embd, 3, patch_size, patch_size),
        "v.position_embd.weight": w.embd(n_pos, n_embd),
    }
    if llava:
        tensors["v.class_embd"] = w.embd(n_embd)
        tensors["v.pre_ln.weight"], tensors["v.pre_ln.bias"] = w.norm(n_embd), w.bias(n_embd)
    else:
        tensors["v.patch_embd.bias"] = w.bias(n_embd)
    tensors.update(_encoder_layers(w, "v", n_layer, n_embd, n_ff))
    if not llava:
        tensors["v.post_ln.weight"], tensors["v.post_ln.bias"] = w.norm(n_embd), w.bias(n_embd)
    tensors.update(_vision_projection(w, projector, n_embd, n_embd_text, scale_factor))

    mean, std = _CLIP_MEAN_STD if llava else _SIGLIP_MEAN_STD
    keys: dict[str, object] = {
        "clip.projector_type": "mlp" if projector == "mlp_norm" else projector,
        "clip.has_vision_encoder": True,
        "clip.has_audio_encoder": False,
        "clip.use_gelu": not llava,  # SigLIP's GELU; CLIP's quick GELU
        **_common_keys("vision", n_embd, n_head, n_ff, n_layer, n_embd_text),
        "clip.vision.image_size": image_size,
        "clip.vision.patch_size": patch_size,
        "clip.vision.image_mean": mean,
        "clip.vision.image_std": std,
    }
    if projector in ("idefics3", "gemma3"):
        keys["clip.vision.projector.scale_factor"] = scale_factor
    if projector == "idefics3":
        keys["clip.vision.preproc_image_size"] = image_size
    name = f"tiny-{projector}-{n_embd}x{n_layer}-{image_size}px"
    return _write(Path(path), name, keys, tensors)


def _audio_projection(
    w: _Weights, projector: str, n_embd: int, n_embd_text: int, stack_factor: int
) -> Tensors:
    if projector == "qwen2a":
        return {"mm.a.fc.weight": w.mat(n_embd_text, n_embd), "mm.a.fc.bias": w.bias(n_embd_text)}
    n_in = n_embd * stack_factor
    if projector == "ultravox":
        hidden = 2 * n_embd_text  # SwiGLU: half of it gates the other half
        return {
            "mm.a.norm_pre.weight": w.norm(n_in),
            "mm.a.mlp.1.weight": w.mat(hidden, n_in),
            "mm.a.norm_mid.weight": w.norm(hidden // 2),
            "mm.a.mlp.2.weight": w.mat(n_embd_text, hidden // 2),
        }
    return {
        "mm.a.mlp.1.weight": w.mat(n_embd_text, n_in),
        "mm.a.mlp.2.weight": w.mat(n_embd_text, n_embd_text),
    }


def write_audio_mmproj(
    path: Path | str,
    *,
    projector: str = "qwen2a",
    n_embd_text: int = SMOLLM2_N_EMBD,
    n_embd: int = 64,
    n_head: int = 4,
    n_ff: int = 256,
    n_layer: int = 2,
    n_mel: int = 128,
    n_audio_ctx: int = WHISPER_N_POS,
    stack_factor: int | None = None,
    dtype: str = "f16",
    seed: int = 0,
) -> Path:
    """Write an audio projector to ``path`` and return the path (see the module's docstring);
    ``stack_factor`` (ultravox, voxtral): 4 for ultravox, 2 for voxtral by default."""
    if projector not in AUDIO_PROJECTORS:
        raise ValueError(f"audio projector {projector!r}: choose one of {AUDIO_PROJECTORS}")
    if n_audio_ctx < WHISPER_N_POS:
        raise ValueError(f"n_audio_ctx {n_audio_ctx}: a 30 s chunk takes {WHISPER_N_POS}")
    if stack_factor is None:
        stack_factor = 2 if projector == "voxtral" else 4
    w = _Weights(seed, dtype)
    # conv biases broadcast over time: ggml shape [1, n_embd]
    tensors: Tensors = {
        "a.conv1d.1.weight": w.kernel(n_embd, n_mel, 3),
        "a.conv1d.1.bias": w.bias(n_embd, 1),
        "a.conv1d.2.weight": w.kernel(n_embd, n_embd, 3),
        "a.conv1d.2.bias": w.bias(n_embd, 1),
        "a.position_embd.weight": w.embd(n_audio_ctx, n_embd),
    }
    tensors.update(_encoder_layers(w, "a", n_layer, n_embd, n_ff, k_bias=False))
    tensors["a.post_ln.weight"], tensors["a.post_ln.bias"] = w.norm(n_embd), w.bias(n_embd)
    tensors.update(_audio_projection(w, projector, n_embd, n_embd_text, stack_factor))
    keys: dict[str, object] = {
        "clip.projector_type": projector,
        "clip.has_vision_encoder": False,
        "clip.has_audio_encoder": True,
        **_common_keys("audio", n_embd, n_head, n_ff, n_layer, n_embd_text),
        "clip.audio.num_mel_bins": n_mel,
    }
    if projector != "qwen2a":
        keys["clip.audio.projector.stack_factor"] = stack_factor
    name = f"tiny-{projector}-{n_embd}x{n_layer}"
    return _write(Path(path), name, keys, tensors)


# mtmd wraps an idefics3 image in SmolVLM's own control tokens, which SmolLM2's vocabulary lacks:
# it looks them up by their text, and a token it does not find goes into the prompt as -1, which
# llama_decode refuses. A copy of SmolLM2 with two of its unused control tokens renamed has them.
SMOLVLM_TOKENS = {"<jupyter_script>": "<fake_token_around_image>", "<empty_output>": "<global-img>"}


def write_vlm_text_model(
    src: Path | str, dest: Path | str, renames: dict[str, str] | None = None
) -> Path:
    """``src`` (a GGUF text model, the bundled SmolLM2) copied to ``dest`` with tokens renamed
    (``SMOLVLM_TOKENS`` by default): the same weights, ids and types; returns ``dest``."""
    renames = SMOLVLM_TOKENS if renames is None else renames
    dest = Path(dest)
    reader = gguf.GGUFReader(str(src))
    tokens = list(reader.fields["tokenizer.ggml.tokens"].contents())
    missing = sorted(set(renames) - set(tokens))
    if missing:
        raise ValueError(f"{src}: no token {', '.join(missing)} to rename")
    tokens = [renames.get(tok, tok) for tok in tokens]
    partial = dest.with_name(dest.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = tokens if key == "tokenizer.ggml.tokens" else field.contents()
        writer.add_key_value(key, value, vtype, sub)
    for tensor in reader.tensors:
        qtype = gguf.GGMLQuantizationType(tensor.tensor_type)
        raw = (
            None
            if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
            else qtype
        )
        writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(dest)
    return dest


Writer = Callable[..., Path]


def cached_mmproj(folder: Path | str, name: str, writer: Writer, **params: object) -> Path:
    """``writer(folder / name, **params)``, written on first use and reused after."""
    dest = Path(folder) / name
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        writer(dest, **params)
    return dest
