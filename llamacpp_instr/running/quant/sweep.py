"""``instr quant-sweep``: one base model, several quantization types, size, speed and quality
measured together.

For each type: quantize BASE with the pinned llama.cpp quantizer (cached under
``cache_dir()/quant/<sha256 of BASE>/<type>.gguf``, so a second sweep reuses the files), then

- file size and bits per weight (gguf-py's type table, as quant-report);
- run-time memory: weights, KV cache and compute buffers, from a session's session_start;
- prompt and generation tokens/s, measured during execution (the steps of a minimal-level
  session), in repetitions interleaved across all models (so machine noise hits them alike) and
  given as the median ratio to BASE;
- perplexity and KL divergence against BASE on the same tokens (``evaluate.evaluate``, as
  llama-perplexity computes them).
"""

from __future__ import annotations

import hashlib
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import models
from llamacpp_instr.native.paths import cache_dir
from llamacpp_instr.running.offload import Offload
from llamacpp_instr.running.placement import prepare

SPEED_PROMPT = (
    "In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep."
)
Echo = Callable[[str], None]


def _file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def quantized(base: Path, qtype: str, threads: int, echo: Echo) -> Path:
    """BASE quantized to ``qtype``, from the cache when it was made before."""
    from llamacpp_instr.running.quant.quantize import TYPES, quantize_file

    if qtype not in TYPES:
        raise UserError(f"unknown type {qtype!r}: choose from {', '.join(TYPES)}")
    out = cache_dir() / "quant" / _file_hash(base) / f"{qtype}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    echo(f"quantizing {base.name} to {qtype} ...")
    tmp = out.with_suffix(".partial.gguf")
    from llama_cpp import _logger

    _logger.set_verbose(False)  # llama.cpp's line per tensor: the echo above says enough
    quantize_file(base, tmp, qtype, threads)
    tmp.replace(out)
    return out


def _speed_run(
    path: Path, n_predict: int, threads: int, log: Path, offload: Offload
) -> dict[str, Any]:
    """One short greedy run at the minimal level; tok/s from its measured steps."""
    from llamacpp_instr.running import runner

    log.unlink(missing_ok=True)
    cfg = runner.RunConfig(
        model=path,
        prompt=SPEED_PROMPT,
        n_predict=n_predict,
        threads=threads,
        n_ctx=512,
        level="minimal",
        out=log,
        ignore_eos=True,
        offload=offload,
    )
    runner.run(cfg)
    from llamacpp_instr.converters import load_session
    from llamacpp_instr.converters.reports.summary import overview

    frames = load_session(log)
    ov = overview(frames)
    memory = frames.info.memory
    return {
        "prompt_tok_s": ov["prompt_tok_s"],
        "gen_tok_s": ov["gen_tok_s"],
        "memory": {k: int(memory.get(k, 0)) for k in ("weights", "kv_cache", "compute")},
    }


def sweep(
    base: Path,
    types: Sequence[str],
    *,
    text: Path | None = None,
    ctx: int = 512,
    chunks: int | None = 8,
    reps: int = 3,
    n_predict: int = 32,
    threads: int | None = None,
    echo: Echo = lambda _: None,
    offload: Offload | None = None,
) -> dict[str, Any]:
    """The sweep's data: one entry per model (BASE first), see the module doc; ``offload``
    places every model's layers, in the speed runs and the quality evaluation alike."""
    from llamacpp_instr.converters.reports.quant.inventory import from_gguf
    from llamacpp_instr.running.quant import evaluate as quant_eval
    from llamacpp_instr.running.runner import resolve_threads

    models.check_gguf(base)
    if not types:
        raise UserError("give at least one type with --types")
    if reps < 1:
        raise UserError("--reps must be at least 1")
    threads = resolve_threads(threads)
    offload = offload or Offload()
    prepare(offload)  # RPC servers and devices checked before the first quantization
    paths = [base] + [quantized(base, t, threads, echo) for t in types]
    names = ["base"] + list(types)

    speeds: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="instr-sweep-") as tmp:
        for rep in range(reps):
            for name, path in zip(names, paths, strict=True):
                log = Path(tmp) / f"{name}.log"
                speeds[name].append(_speed_run(path, n_predict, threads, log, offload))
            echo(f"speed: repetition {rep + 1}/{reps} done")

    echo("perplexity and KL divergence ...")
    quality = quant_eval.evaluate(
        base, paths[1:], text=text, ctx=ctx, chunks=chunks, threads=threads, offload=offload
    )

    base_pp = statistics.median(s["prompt_tok_s"] for s in speeds["base"])
    base_tg = statistics.median(s["gen_tok_s"] for s in speeds["base"])
    rows = []
    for i, (name, path) in enumerate(zip(names, paths, strict=True)):
        inv = from_gguf(path)
        pp = statistics.median(s["prompt_tok_s"] for s in speeds[name])
        tg = statistics.median(s["gen_tok_s"] for s in speeds[name])
        q = quality["models"][i - 1] if i > 0 else None
        rows.append(
            {
                "type": name if i else f"base ({inv.file_type})",
                "path": str(path),
                "bytes": int(inv.bytes),
                "bpw": float(inv.bpw),
                "memory": speeds[name][-1]["memory"],
                "prompt_tok_s": pp,
                "gen_tok_s": tg,
                "prompt_speed_ratio": pp / base_pp if base_pp else None,
                "gen_speed_ratio": tg / base_tg if base_tg else None,
                "ppl": q["ppl"] if q else quality["base"]["ppl"],
                "kld_mean": q["kld"]["mean"] if q else 0.0,
                "kld_p99": q["kld"]["p99"] if q else 0.0,
                "same_top_p": q["same_top_p"] if q else 100.0,
            }
        )
    return {
        "base": str(base),
        **({"offload": offload.describe()} if offload != Offload() else {}),
        "types": list(types),
        "reps": reps,
        "n_predict": n_predict,
        "threads": threads,
        "ctx": quality.get("ctx", ctx),
        "chunks": quality.get("chunks"),
        "tokens_scored": quality.get("tokens_scored"),
        "models": rows,
    }
