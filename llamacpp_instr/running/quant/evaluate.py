"""Perplexity and KL divergence of quantized models against a base model, computed the way the
pinned llama.cpp's ``llama-perplexity --kl-divergence`` computes them
(tools/perplexity/perplexity.cpp: ``perplexity()``, ``kl_divergence()``, ``log_softmax()``).

Tokens and chunks
    The text (``-f``: the file's bytes, one trailing newline dropped) is tokenized once with the
    BASE model's tokenizer, special tokens added (BOS when the vocabulary adds it) and not parsed.
    It needs at least ``2*ctx`` tokens. It is cut into ``n_chunk = min(--chunks, n_tokens // ctx)``
    chunks of ``ctx`` tokens; each chunk is evaluated from an empty KV cache, teacher-forced, with
    its first token replaced by BOS when the vocabulary adds BOS. Only the second half is scored:
    with ``first = ctx // 2``, the logits at positions ``first .. ctx-2`` predict the tokens at
    ``first+1 .. ctx-1``, i.e. ``n = ctx - 1 - first`` tokens per chunk and ``N = n_chunk * n``
    in all.

Per scored token ``t`` (logits ``z`` of the quant Q and ``zb`` of the base, over the vocabulary)
    - log-softmax: ``log q_i = z_i - max(z) - log sum_j exp(z_j - max(z))`` (``log p_i`` alike
      from ``zb``);
    - ``nll = -log q_tok`` and ``nll_base = -log p_tok`` for the correct next token ``tok``;
    - ``nll_base'`` = ``min(nll_base, 16 + lse_b)`` with ``lse_b = log sum_j exp(zb_j - max(zb))``:
      the base's nll as llama-perplexity's second pass reads it from its base file, where every
      log-probability is floored at that of a logit ``max(zb) - 16`` (a correct token the base
      finds very unlikely counts as at most ``16 + lse_b`` nats);
    - ``KLD_t = sum over i with log p_i > -16 of p_i * (log p_i - log q_i)`` (llama.cpp skips base
      probabilities below e^-16);
    - same top: ``argmax z == argmax zb`` (first index on ties);
    - ``dp_t = q_tok - p_tok`` (Q's probability of the correct token minus the base's).

Statistics over the ``N`` tokens (``mean_and_uncertainty`` and ``covariance`` of llama.cpp)
    - ``mu(x) = sum x / N`` and ``err(x) = sqrt((sum x^2 / N - mu^2) / (N - 1))``, 0 unless the
      variance is positive and ``N > 10``;
    - ``PPL = exp(mu(nll))``, ``PPL_err = PPL * err(nll)``; the base's the same over
      ``nll_base`` (what llama-perplexity's first pass prints as the final estimate);
    - ``ln(PPL(Q)/PPL(base)) = mu(nll) - mu(nll_base')`` (llama-perplexity's second pass),
      uncertainty ``sqrt(err(nll)^2 + err(nll_base')^2 - 2 cov)`` with
      ``cov = (sum nll*nll_base' / N - mu(nll) mu(nll_base')) / (N - 1)`` (0 when ``N < 10``);
      the JSON also has ``ln_ppl_ratio_exact`` (``mu(nll) - mu(nll_base)``, 0 for a model against
      itself, where llama.cpp's is slightly positive) with its uncertainty;
    - KLD: mean ``mu(KLD)`` with ``err(KLD)``; median of the sorted values (the mean of the two
      middle ones when ``N`` is even); percentile ``f`` (90, 95, 99, 99.9 %) by linear
      interpolation at ``p = f * (N - 1)`` (``p`` computed in float32 as llama.cpp does):
      ``(1 - frac(p)) v[floor p] + frac(p) v[floor p + 1]``; max;
    - ``dp`` mean ``mu(dp)`` with ``err(dp)``; ``RMS dp = sqrt(mu(dp^2))`` with uncertainty
      ``err(dp^2) / (2 RMS)``;
    - same top p = ``n_same_top / N`` with uncertainty ``sqrt(p (1 - p) / (N - 1))``.

Where this differs from llama-perplexity, on purpose
    llama-perplexity stores the base log-probabilities in its ``--kl-divergence-base`` file as
    16-bit integers with a per-token scale (``(max - max(min, max - 16)) / 65535``, so at most
    about 1.2e-4 nats of rounding per value) and computes the second pass from them. The floor at
    ``max - 16`` matters (it biases llama.cpp's PPL(base) and ln ratio, by 0.1 % of PPL on SmolLM2)
    and is reproduced in ``nll_base'``; the rounding (unbiased, and below the statistics'
    precision) is not: the base log-probabilities stay float64, so a model against itself gives a
    KLD and a dp of exactly 0. The floor does not touch the KLD (floored values are below the
    e^-16 cutoff) and dp uses the exact ``p_tok`` (the floor moves it by less than e^-16).
    llama-perplexity packs ``n_batch / ctx`` chunks into one batch as separate sequences (each
    attending only to itself); here every chunk is its own batch (``n_batch = ctx``,
    ``n_ubatch = min(ctx, 512)``), which is the same computation. Sums are float64.

The KV cache and attention (``-ctk/-ctv``, ``--flash-attn``)
    The base is always evaluated with an f16 KV cache: the reference. Each QUANT is evaluated with
    the KV cache types given (``type_k``, ``type_v``), so that its divergence is that of its
    weights and its cache together; given no QUANT, the base itself with the cache given is
    compared with the base (what the cache alone costs). Flash attention is the same for every
    model (on, off, or llama.cpp's auto, llama-perplexity's default); a quantized V cache needs it.

KL divergence by context position
    The per-token KLD by its position in the chunk (the logits at position ``p`` have seen
    ``p + 1`` tokens of context), averaged over the chunks in ``POSITION_BINS`` bins of equal
    width, each with its mean's uncertainty (``err`` above): over the scored positions
    ``first .. ctx-2``, or with ``all_positions`` over every position ``0 .. ctx-2`` (the logits of
    the whole chunk are then output: twice the output buffer). A quantized cache's error builds
    up with the tokens written to it; the headline statistics stay llama-perplexity's.

Memory stays bounded: all models are loaded, each with its own context; for each chunk the base
is decoded, then each quant, and the statistics are computed straight from the contexts' logits
buffers in blocks of rows. Only the per-token KLD and dp values (``N`` float64 each per quant) are
kept, never the logits of the whole text.

Needs ``llama_cpp`` (imported when a model is loaded); the statistics helpers need numpy only.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import models
from llamacpp_instr.running.offload import Offload
from llamacpp_instr.running.placement import Placement, prepare
from llamacpp_instr.running.quant.stats import (  # noqa: F401 (also named from here)
    LOG_PROB_CUTOFF,
    PERCENTILES,
    POSITION_BINS,
    STORED_LOGIT_RANGE,
    Accumulator,
    ByPosition,
    compare_block,
    covariance,
    log_softmax,
    mean_and_uncertainty,
    median,
    percentile,
)

# float64 elements per temporary array when turning a block of logits rows into log-probs
_BLOCK_ELEMENTS = 1 << 21

# progress(chunk index, n_chunks, model index (0 = base), n_models, model path)
Progress = Callable[[int, int, int, int, Path], None]


def default_text() -> Path:
    """The bundled public-domain text: the Book of Genesis, King James Version (the package's
    ``data/``, two folders above this module's)."""
    return Path(__file__).resolve().parents[2] / "data" / "kjv-genesis.txt"


def read_text(path: Path) -> bytes:
    """The text as llama-perplexity's ``-f`` reads it: the file's bytes, one trailing newline off."""
    if not path.exists():
        raise UserError(f"text file not found: {path}")
    if not path.is_file():
        raise UserError(f"text path is not a file: {path}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read text file {path}: {exc.strerror}") from None
    return data[:-1] if data.endswith(b"\n") else data


# --- models, through llama-cpp-python's low-level API ------------------------------------------


class _Model:
    """One model and its own context, sized for one chunk: ``n_ctx = n_batch = ctx``."""

    model: Any
    ctx: Any
    batch: Any
    _tok: np.ndarray
    _pos: np.ndarray
    _out: np.ndarray

    def __init__(self, llama_cpp: Any, path: Path, ctx: int, placement: Placement) -> None:
        self.lc = llama_cpp
        self.path = path
        self.model = None
        self.ctx = None
        self.batch = None
        params = llama_cpp.llama_model_default_params()
        placement.apply(params)
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise UserError(models.explain_load_failure(path))
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.add_eos = bool(llama_cpp.llama_vocab_get_add_eos(self.vocab))
        self.bos = int(llama_cpp.llama_vocab_bos(self.vocab))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self.model))
        self.n_ctx = ctx

    def open_context(
        self, threads: int, kv: tuple[str, str] = ("f16", "f16"), flash_attn: bool | None = None
    ) -> None:
        """A context of one chunk with the KV cache types ``kv`` (K, V) and flash attention on,
        off or llama.cpp's auto (None)."""
        from llamacpp_instr.running.context_defaults import flash_attn_type, kv_type_id

        lc = self.lc
        ctx = self.n_ctx
        p = lc.llama_context_default_params()
        p.n_ctx = ctx
        p.n_batch = ctx
        p.n_ubatch = min(ctx, 512)  # llama.cpp's default n_ubatch, as llama-perplexity uses it
        p.n_seq_max = 1
        p.n_threads = threads
        p.n_threads_batch = threads
        p.type_k, p.type_v = kv_type_id(kv[0]), kv_type_id(kv[1])
        p.flash_attn_type = flash_attn_type(flash_attn)
        self.kv = kv
        self.ctx = lc.llama_init_from_model(self.model, p)
        if not self.ctx:
            cache = "" if kv == ("f16", "f16") else f" with a {kv[0]}/{kv[1]} KV cache"
            raise UserError(
                f"llama.cpp could not create a context of {ctx} tokens{cache} for {self.path}"
            )
        self.batch = lc.llama_batch_init(ctx, 0, 1)
        b = self.batch
        for i in range(ctx):
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
        self._tok = np.ctypeslib.as_array(b.token, shape=(ctx,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(ctx,))
        self._out = np.ctypeslib.as_array(
            ctypes.cast(b.logits, ctypes.POINTER(ctypes.c_int8)), shape=(ctx,)
        )
        self._pos[:] = np.arange(ctx, dtype=np.int32)

    def tokenize(self, text: bytes) -> np.ndarray:
        """``common_tokenize(ctx, text, add_special=true, parse_special=false)``."""
        lc = self.lc
        n_max = len(text) + 16
        for _ in range(2):
            buf = (lc.llama_token * n_max)()
            n = lc.llama_tokenize(self.vocab, text, len(text), buf, n_max, True, False)
            if n >= 0:
                return np.array(buf[:n], dtype=np.int32)
            n_max = -n
        raise UserError("llama.cpp failed to tokenize the text")

    def decode(self, chunk: np.ndarray, first: int) -> np.ndarray:
        """Decode one chunk from an empty KV cache, logits for positions ``first..``: the rows
        ``first .. ctx-2`` as a (ctx-1-first, n_vocab) float32 view of the context's buffer (valid
        until this context decodes again)."""
        lc = self.lc
        ctx = self.n_ctx
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        self._tok[:] = chunk
        if self.add_bos:
            self._tok[0] = self.bos
        self._out[:] = 0
        self._out[first:] = 1
        self.batch.n_tokens = ctx
        rc = lc.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise UserError(f"llama_decode failed ({rc}) on {self.path}")
        n = ctx - 1 - first
        p0 = lc.llama_get_logits_ith(self.ctx, first)
        p1 = lc.llama_get_logits_ith(self.ctx, ctx - 2)
        a0 = ctypes.cast(p0, ctypes.c_void_p).value or 0
        a1 = ctypes.cast(p1, ctypes.c_void_p).value or 0
        row = self.n_vocab * 4
        if a0 and a1 - a0 == (n - 1) * row:  # the outputs are contiguous, in batch order
            return np.ctypeslib.as_array(p0, shape=(n, self.n_vocab))
        rows = np.empty((n, self.n_vocab), dtype=np.float32)  # reordered outputs: gather
        for i in range(n):
            p = lc.llama_get_logits_ith(self.ctx, first + i)
            rows[i] = np.ctypeslib.as_array(p, shape=(self.n_vocab,))
        return rows

    def close(self) -> None:
        lc = self.lc
        if self.batch is not None:
            lc.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            lc.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            lc.llama_model_free(self.model)
            self.model = None


@dataclass(frozen=True)
class KvCache:
    """The KV cache the quants are evaluated with (the base's is f16) and flash attention for
    every model (None: llama.cpp's auto)."""

    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool | None = None

    @property
    def types(self) -> tuple[str, str]:
        return (self.type_k, self.type_v)

    @property
    def quantized(self) -> bool:
        return self.types != ("f16", "f16")

    def check(self) -> None:
        from llamacpp_instr.running.context_choices import check_kv

        check_kv(self.type_k, self.type_v, self.flash_attn)


def _load(
    llama_cpp: Any,
    paths: Sequence[Path],
    ctx: int,
    threads: int,
    placement: Placement,
    kv: KvCache = KvCache(),
) -> list[_Model]:
    """The base and the quants loaded, each with its context: the base's KV cache f16, the
    quants' ``kv``'s."""
    loaded: list[_Model] = []
    try:
        for p in paths:
            loaded.append(_Model(llama_cpp, p, ctx, placement))
            base = loaded[0]
            m = loaded[-1]
            if m.n_vocab != base.n_vocab:
                raise UserError(
                    f"different vocabularies: {m.path} has {m.n_vocab} tokens, the base "
                    f"{base.path} has {base.n_vocab}"
                )
            if m.add_eos:
                raise UserError(f"{m.path} adds EOS to every text: llama-perplexity refuses it too")
        for k, m in enumerate(loaded):
            m.open_context(threads, kv.types if k else ("f16", "f16"), kv.flash_attn)
    except BaseException:
        for m in loaded:
            m.close()
        raise
    return loaded


def _score(
    loaded: list[_Model],
    tokens: np.ndarray,
    n_chunk: int,
    progress: Progress | None,
    all_positions: bool = False,
) -> tuple[list[Accumulator], list[ByPosition], float, float]:
    """Decode every chunk with every model and compare each quant's logits with the base's: the
    accumulators of the scored half, the KLD by position (of the scored half, or of every
    position), and the base's nll sum and sum of squares over the scored tokens."""
    ctx = loaded[0].n_ctx
    first = ctx // 2
    n_score = ctx - 1 - first
    start = 0 if all_positions else first
    accs = [Accumulator(n_chunk * n_score) for _ in loaded[1:]]
    positions = [ByPosition(ctx - 1 - start, start) for _ in loaded[1:]]
    base_sum = base_sum2 = 0.0
    block = max(1, _BLOCK_ELEMENTS // loaded[0].n_vocab)
    # the unscored first half (by position only, if asked), then the scored half, in blocks
    blocks = [(a, min(b, a + block)) for lo, b in ((start, first), (first, ctx - 1))
              for a in range(lo, b, block)]  # fmt: skip
    for c in range(n_chunk):
        chunk = tokens[c * ctx : (c + 1) * ctx]
        views = []
        for k, m in enumerate(loaded):
            if progress is not None:
                progress(c, n_chunk, k, len(loaded), m.path)
            views.append(m.decode(chunk, start))
        for r0, r1 in blocks:
            nll_base, per_quant = compare_block(
                views[0][r0 - start : r1 - start],
                [v[r0 - start : r1 - start] for v in views[1:]],
                chunk[r0 + 1 : r1 + 1],
            )
            for pos, values in zip(positions, per_quant, strict=True):
                pos.add(r0, values[3])
            if r0 < first:
                continue
            base_sum += float(np.sum(nll_base))
            base_sum2 += float(np.sum(nll_base * nll_base))
            for acc, values in zip(accs, per_quant, strict=True):
                acc.add(*values)
        for pos in positions:
            pos.chunks += 1
        del views
    return accs, positions, base_sum, base_sum2


def evaluate(
    base: Path,
    quants: Sequence[Path],
    text: Path | None = None,
    ctx: int = 512,
    chunks: int | None = None,
    threads: int | None = None,
    progress: Progress | None = None,
    offload: Offload | None = None,
    kv: KvCache = KvCache(),
    all_positions: bool = False,
) -> dict[str, Any]:
    """Evaluate ``quants`` against ``base`` on ``text``; the report data (see the module doc).
    ``ctx`` is the chunk size in tokens (llama-perplexity's -c, the CLI's --chunk-size);
    ``offload`` places every model's layers (default: all on the CPU); ``kv``: the quants' KV
    cache and every model's flash attention (no quants and a quantized cache: the base with that
    cache against itself with an f16 one); ``all_positions``: the KLD by position over every
    position, not only the scored half (the logits of the whole chunk)."""
    from llamacpp_instr.native import bindings, pin
    from llamacpp_instr.running.run_config import resolve_threads

    quants = _asked(base, quants, ctx, chunks, kv)
    text_path = text if text is not None else default_text()
    data = read_text(text_path)
    paths = [Path(base), *map(Path, quants)]
    for p in paths:
        models.check_gguf(p)
    threads = resolve_threads(threads)
    llama_cpp = bindings.import_llama_cpp()
    from llama_cpp import _logger

    _logger.set_verbose(False)  # llama.cpp's load-time chatter off; errors still shown
    llama_cpp.llama_backend_init()
    offload = offload or Offload()
    placement = prepare(offload)

    t0 = time.monotonic()
    loaded = _load(llama_cpp, paths, ctx, threads, placement, kv)
    try:
        scored = _scored(loaded, data, text_path, ctx, chunks, progress, all_positions)
    finally:
        for m in loaded:
            m.close()
    n_chunk = scored.pop("chunks")
    count = n_chunk * (ctx - 1 - ctx // 2)
    log_base, log_base_err = mean_and_uncertainty(
        scored.pop("base_sum"), scored.pop("base_sum2"), count
    )
    rows = [
        {"path": str(path), "type_k": kv.type_k, "type_v": kv.type_v, **acc.summary(),
         "kld_by_position": pos.bins()}
        for path, acc, pos in zip(paths[1:], scored.pop("accs"), scored.pop("positions"), strict=True)
    ]  # fmt: skip
    return {
        "text": str(text_path),
        # where the models ran, when not all on the CPU (the numerics of devices differ)
        **({"offload": offload.describe()} if offload != Offload() else {}),
        "ctx": ctx,
        "chunks": n_chunk,
        "chunks_max": scored["chunks_max"],
        "tokens": scored["tokens"],
        "tokens_scored": count,
        "n_vocab": scored["n_vocab"],
        "add_bos": scored["add_bos"],
        "n_ctx_train": scored["n_ctx_train"],
        "threads": threads,
        # the base's KV cache is f16; each model's is in its row (type_k, type_v)
        "flash_attn": "auto" if kv.flash_attn is None else kv.flash_attn,
        "seconds": time.monotonic() - t0,
        "warnings": scored["warnings"],
        "llama_cpp_commit": pin.LLAMA_CPP_COMMIT,
        "base": {
            "path": str(paths[0]),
            "ppl": math.exp(log_base),
            "ppl_err": math.exp(log_base) * log_base_err,
        },
        "models": rows,
    }


def _asked(
    base: Path, quants: Sequence[Path], ctx: int, chunks: int | None, kv: KvCache
) -> Sequence[Path]:
    """The quants to evaluate (the base itself where only a KV cache is asked), or a one-line
    UserError for a request that cannot be evaluated."""
    if ctx < 8:
        raise UserError(f"--chunk-size must be at least 8, got {ctx}")
    if chunks is not None and chunks < 1:
        raise UserError(f"--chunks must be at least 1, got {chunks}")
    kv.check()
    if not quants and kv.quantized:
        quants = [base]
    if not quants:
        raise UserError(
            "give at least one QUANT.gguf to compare with the base, or a KV cache type "
            "(-ctk/-ctv) to compare the base's own cache with"
        )
    return quants


def _scored(
    loaded: list[Any],
    data: bytes,
    text_path: Path,
    ctx: int,
    chunks: int | None,
    progress: Progress | None,
    all_positions: bool,
) -> dict[str, Any]:
    """The text tokenized by the base and scored chunk by chunk by every model (``_score``): the
    sums and accumulators, with the counts and the models' facts the report gives."""
    tokens = loaded[0].tokenize(data)
    if len(tokens) < 2 * ctx:
        raise UserError(
            f"{text_path} tokenizes to {len(tokens)} tokens: --chunk-size {ctx} needs at least "
            f"{2 * ctx} (two chunks)"
        )
    n_chunk_max = len(tokens) // ctx
    n_chunk = n_chunk_max if chunks is None else min(chunks, n_chunk_max)
    accs, positions, base_sum, base_sum2 = _score(loaded, tokens, n_chunk, progress, all_positions)
    if progress is not None:
        progress(n_chunk, n_chunk, len(loaded), len(loaded), loaded[-1].path)
    warnings = list(
        dict.fromkeys(
            f"--chunk-size {ctx} is more than the {m.n_ctx_train} tokens {m.path.name} was "
            "trained on"
            for m in loaded
            if ctx > m.n_ctx_train
        )
    )
    return {
        "tokens": len(tokens), "chunks": n_chunk, "chunks_max": n_chunk_max, "accs": accs,
        "positions": positions, "base_sum": base_sum, "base_sum2": base_sum2,
        "n_vocab": loaded[0].n_vocab, "add_bos": loaded[0].add_bos,
        "n_ctx_train": loaded[0].n_ctx_train, "warnings": warnings,
    }  # fmt: skip


def evaluate_quants(
    base: Path,
    quants: Sequence[Path],
    text: Path | None = None,
    ctx: int = 512,
    chunks: int | None = None,
    threads: int | None = None,
    progress: Progress | None = None,
    offload: Offload | None = None,
    kv: KvCache = KvCache(),
    all_positions: bool = False,
    layers: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """``instr quant-eval``: ``evaluate`` (its arguments), and with ``layers`` where the error
    enters, each layer's outputs against the base's on the same chunks (``layers.layer_errors``,
    under the data's ``layers``); ``say`` hears that second pass begin."""
    from llamacpp_instr.running.quant.layers import layer_errors

    if layers and kv.quantized:
        raise UserError(
            "--layers measures the weights' error with an f16 KV cache: give it "
            "without -ctk/-ctv"
        )
    if layers and prepare(offload or Offload()).offloading:
        # the native capture copies outputs the CPU backend computed: offloaded layers'
        # outputs never reach it
        raise UserError(
            "--layers captures layer outputs on the CPU: give it without --gpu-layers "
            "(or with --device none)"
        )
    data = evaluate(base, quants, text, ctx, chunks, threads, progress, offload, kv, all_positions)
    if layers:
        say("quant-eval: per-layer error ...")
        scored = scored_chunks(base, text, ctx, int(data["chunks"]))
        data["layers"] = layer_errors(
            base, list(quants), scored, ctx, int(data["threads"]), offload=offload
        )
    return data


def scored_chunks(base: Path, text: Path | None, ctx: int, n: int) -> list[list[int]]:
    """The first ``n`` chunks ``evaluate`` scores: the text tokenized with the base's tokenizer
    (special tokens added, as llama-perplexity does), cut into ``ctx`` tokens, the first of each
    made BOS when the vocabulary adds BOS."""
    from llamacpp_instr.native import bindings

    llama_cpp = bindings.import_llama_cpp()
    from llama_cpp import _logger

    _logger.set_verbose(False)
    vocab = llama_cpp.Llama(str(base), vocab_only=True, verbose=False)
    tokens = vocab.tokenize(read_text(text or default_text()), add_bos=True)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab._model.vocab))
    out = []
    for i in range(n):
        chunk = list(tokens[i * ctx : (i + 1) * ctx])
        if add_bos:
            chunk[0] = vocab.token_bos()
        out.append(chunk)
    vocab.close()
    return out
