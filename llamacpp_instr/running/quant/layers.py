"""Where a quantization's error enters: BASE and each QUANT run on the same tokens, and the
residual stream after every layer (``l_out-N``), the attention output (``attn_out-N``) and the
FFN output (``ffn_out-N``) compared tensor by tensor.

The outputs are copied natively while the graph runs (``llama_instr_capture``): no eval callback,
no graph split. Per layer and tensor, over every token of every chunk:

    relative RMS error = ||Q - B|| / ||B||          cosine similarity = <Q, B> / (||Q|| ||B||)

(sums in float64 across chunks). The layer where the error grows most is the one whose residual
stream's relative error rises most over the previous layer's (layer 0: over zero). attn_out and
ffn_out say which half of a block the error comes out of; both include what earlier layers passed
in, so they attribute growth within a layer, not absolutely.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import bindings
from llamacpp_instr.running.offload import Offload
from llamacpp_instr.running.placement import Placement, prepare

PATTERNS = ["l_out-*", "attn_out-*", "ffn_out-*"]
KINDS = ("l_out", "attn_out", "ffn_out")


class _Acc:
    """Running sums of one tensor's comparison over chunks."""

    __slots__ = ("err2", "base2", "dot", "q2")

    def __init__(self) -> None:
        self.err2 = self.base2 = self.dot = self.q2 = 0.0

    def add(self, b: np.ndarray, q: np.ndarray) -> None:
        b64 = b.astype(np.float64, copy=False)
        q64 = q.astype(np.float64, copy=False)
        d = q64 - b64
        self.err2 += float(np.dot(d.ravel(), d.ravel()))
        self.base2 += float(np.dot(b64.ravel(), b64.ravel()))
        self.dot += float(np.dot(q64.ravel(), b64.ravel()))
        self.q2 += float(np.dot(q64.ravel(), q64.ravel()))

    def rel_rms(self) -> float:
        return float(np.sqrt(self.err2 / self.base2)) if self.base2 > 0 else 0.0

    def cosine(self) -> float:
        den = np.sqrt(self.base2 * self.q2)
        return float(self.dot / den) if den > 0 else 1.0


def _load(path: Path, n_ctx: int, threads: int, placement: Placement) -> Any:
    return placement.llama(
        str(path),
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_ubatch=n_ctx,  # one ubatch per chunk: capture keeps the last ubatch's outputs
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )


def _chunk_outputs(api: bindings.InstrLib, llm: Any, tokens: Sequence[int]) -> dict[str, Any]:
    llm.reset()
    llm.eval(list(tokens))
    return api.captured(llm.ctx)


def layer_errors(
    base: Path,
    quants: Sequence[Path],
    chunks: Sequence[Sequence[int]],
    n_ctx: int,
    threads: int,
    progress: Callable[[int, int], None] | None = None,
    offload: Offload | None = None,
) -> dict[str, Any]:
    """Per quant model, per layer: relative RMS error and cosine similarity of l_out, attn_out and
    ffn_out against ``base``, over the token ``chunks`` (each at most ``n_ctx`` tokens)."""
    api = bindings.load()
    placement = prepare(offload or Offload())
    acc: list[dict[str, _Acc]] = [{} for _ in quants]
    with tempfile.TemporaryDirectory(prefix="instr-layers-") as tmp:
        models = [_load(p, n_ctx, threads, placement) for p in [base, *quants]]
        try:
            # a session (the hooks run only then), at the cheapest level, to a throw-away log
            api.session_begin(None, str(Path(tmp) / "capture.log"), "minimal", {"capture": True})
            try:
                for llm in models:
                    api.capture(llm.ctx, PATTERNS)
                for c, toks in enumerate(chunks):
                    ref = _chunk_outputs(api, models[0], toks)
                    if not ref:
                        raise UserError(
                            "the model's graph names no l_out-N/attn_out-N/ffn_out-N tensors: "
                            "its architecture is not supported for per-layer error"
                        )
                    for m, llm in enumerate(models[1:]):
                        got = _chunk_outputs(api, llm, toks)
                        for name, b in ref.items():
                            q = got.get(name)
                            if q is None or q.shape != b.shape:
                                raise UserError(f"{quants[m]} has no {name} like the base model's")
                            acc[m].setdefault(name, _Acc()).add(b, q)
                    if progress:
                        progress(c + 1, len(chunks))
            finally:
                api.session_end("ok")
        finally:
            for llm in models:
                llm.close()
    return {
        "tokens": int(sum(len(t) for t in chunks)),
        "models": [_summarize(str(q), a) for q, a in zip(quants, acc, strict=True)],
    }


def _summarize(path: str, acc: dict[str, _Acc]) -> dict[str, Any]:
    by_layer: dict[int, dict[str, Any]] = {}
    for name, a in acc.items():
        m = re.fullmatch(r"(l_out|attn_out|ffn_out)-(\d+)", name)
        if not m:
            continue
        row = by_layer.setdefault(int(m.group(2)), {"layer": int(m.group(2))})
        row[f"{m.group(1)}_rel_rms"] = a.rel_rms()
        row[f"{m.group(1)}_cosine"] = a.cosine()
    layers = [by_layer[k] for k in sorted(by_layer)]
    prev = 0.0
    for row in layers:
        cur = row.get("l_out_rel_rms", 0.0)
        row["growth"] = cur - prev
        prev = cur
    worst = max(layers, key=lambda r: r["growth"]) if layers else None
    return {
        "path": path,
        "layers": layers,
        "worst_layer": worst["layer"] if worst else None,
        "worst_growth": worst["growth"] if worst else None,
        "final_rel_rms": layers[-1].get("l_out_rel_rms") if layers else None,
    }
