"""The GPU checks of the CUDA op timer (driven by bench/gpu_check.sh on a machine with a GPU; see
the README's "CUDA" section). Sub-commands:

    gpu_check.py model OUT.gguf             a random-weight F16 model with Llama-3.2-1B's shapes
    gpu_check.py quantize IN OUT            IN quantized to Q4_K_M (llama_model_quantize)
    gpu_check.py moe-model OUT.gguf         a small random-weight MoE (8 experts, 2 used)
    gpu_check.py levels MODEL OUTDIR        in one process, alternated: generation with no session,
                                            at MINIMAL and at DETAILED (CUDA graphs on): decode
                                            tokens/s of each, greedy text and every step's logits
                                            compared with no session; the logs of the last round
    gpu_check.py headline LOG BENCH.json    the summary's prompt and generation tokens/s of LOG
                                            against llama-bench's (-o json) for the same setting
    gpu_check.py warm MODEL LOG             a prompt and greedy generation run twice in one
                                            process, the second in a session (every kernel it
                                            launches loaded by the first): CUPTI's check of
                                            warm computes
    gpu_check.py phases MODEL OUTDIR        where a session's cost lands in a decode token: the
                                            host's time in llama_decode, in llama_synchronize and
                                            reading the logits, per setting (no session, MINIMAL,
                                            MINIMAL without device timing or without the step's
                                            memory, DETAILED), alternated in one process

Everything it prints is also written as JSON (``--json``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

LLAMA_1B = dict(n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, n_ff=8192, n_vocab=128256)
LEVELS = ("off", "minimal", "detailed")
Q4_K_M = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M


def cmd_model(a: argparse.Namespace) -> dict[str, Any]:
    from helpers.tiny_gguf import write_tiny_model

    write_tiny_model(a.out, dtype="f16", n_ctx_train=8192, **LLAMA_1B)
    return {"model": str(a.out)}


def cmd_quantize(a: argparse.Namespace) -> dict[str, Any]:
    import llama_cpp

    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = Q4_K_M
    p.nthread = 16
    rc = llama_cpp.llama_model_quantize(str(a.src).encode(), str(a.out).encode(), ctypes.byref(p))
    if rc != 0:
        raise SystemExit(f"error: quantizing {a.src} failed ({rc})")
    return {"quantized": str(a.out)}


def cmd_moe_model(a: argparse.Namespace) -> dict[str, Any]:
    from helpers.moe_gguf import write_moe_model
    from helpers.tiny_gguf import write_tiny_model

    dense = Path(a.out).with_suffix(".dense.gguf")
    shapes = dict(n_layer=8, n_embd=512, n_head=8, n_head_kv=4, n_ff=1408, n_vocab=32000)
    write_tiny_model(dense, dtype="f16", n_ctx_train=4096, **shapes)
    write_moe_model(dense, a.out, n_expert=8, n_used=2, distinct=True)
    dense.unlink()
    return {"moe_model": str(a.out)}


def _logits(llm: Any) -> bytes:
    """The last token's logits as llama.cpp returned them (bytes: compared bit for bit)."""
    import llama_cpp

    n = llm.n_vocab()
    p = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return bytes(ctypes.string_at(p, 4 * n))


def _generate(llm: Any, prompt: list[int], n: int) -> tuple[list[int], list[bytes], float]:
    """Greedy generation of n tokens: the tokens, each step's logits, decode tokens/s."""
    import numpy as np

    llm.reset()
    llm.eval(prompt)
    tokens: list[int] = []
    logits: list[bytes] = []
    t0 = time.perf_counter()
    for _ in range(n):
        raw = _logits(llm)
        logits.append(raw)
        tok = int(np.argmax(np.frombuffer(raw, dtype=np.float32)))
        tokens.append(tok)
        llm.eval([tok])
    dt = time.perf_counter() - t0
    return tokens, logits, n / dt


def _opened(a: argparse.Namespace) -> tuple[Any, list[int]]:
    """The model of ``levels`` and ``phases``, every layer offloaded, and their prompt of
    ``a.prompt`` tokens (past the specials); ``a.outdir`` made."""
    import llama_cpp

    llm = llama_cpp.Llama(
        str(a.model), n_gpu_layers=-1, n_ctx=1024, n_batch=512, n_ubatch=512, verbose=False
    )
    n_vocab = llm.n_vocab()
    prompt = [(i * 7919) % max(1, n_vocab - 8) + 4 for i in range(a.prompt)]
    a.outdir.mkdir(parents=True, exist_ok=True)
    return llm, prompt


def cmd_levels(a: argparse.Namespace) -> dict[str, Any]:
    import llamacpp_instr

    llm, prompt = _opened(a)

    def one(level: str, log: Path) -> tuple[list[int], list[bytes], float]:
        if level == "off":
            return _generate(llm, prompt, a.n)
        with llamacpp_instr.session(llm, str(log), level=level):
            return _generate(llm, prompt, a.n)

    # warm-up: each level's CUDA graphs captured (the first computes of a graph run uncaptured)
    for level in LEVELS:
        one(level, a.outdir / f"warmup-{level}.log")
    tps: dict[str, list[float]] = {lv: [] for lv in LEVELS}
    ref: tuple[list[int], list[bytes]] | None = None
    same_text = {lv: True for lv in LEVELS}
    same_logits = {lv: True for lv in LEVELS}
    for r in range(a.rounds):
        order = LEVELS[r % 3 :] + LEVELS[: r % 3]  # each level first in turn
        for level in order:
            toks, lg, t = one(level, a.outdir / f"full-{level}.log")
            tps[level].append(t)
            if level == "off" and ref is None:
                ref = (toks, lg)
            if ref is not None:
                same_text[level] &= toks == ref[0]
                same_logits[level] &= lg == ref[1]
    for level in LEVELS:
        (a.outdir / f"warmup-{level}.log").unlink(missing_ok=True)
    med = {lv: statistics.median(v) for lv, v in tps.items()}
    return {
        "decode_tok_s": med,
        "decode_tok_s_rounds": tps,
        "minimal_ratio": med["minimal"] / med["off"],
        "detailed_ratio": med["detailed"] / med["off"],
        "text_identical": same_text,
        "logits_bit_identical": same_logits,
        "logs": [str(a.outdir / f"full-{lv}.log") for lv in LEVELS if lv != "off"],
    }


# the settings `phases` compares: (name, level, environment the library reads per session)
PHASE_SETTINGS: tuple[tuple[str, str | None, dict[str, str]], ...] = (
    ("off", None, {}),
    ("minimal", "minimal", {}),
    ("minimal-no-device-timing", "minimal", {"LLAMA_INSTR_DEVICE_TIMING": "0"}),
    ("minimal-no-step-memory", "minimal", {"LLAMA_INSTR_STEP_MEMORY": "0"}),
    ("detailed", "detailed", {}),
)
PHASE_ENV = ("LLAMA_INSTR_DEVICE_TIMING", "LLAMA_INSTR_STEP_MEMORY")


def _phase_tokens(llm: Any, prompt: list[int], n: int) -> list[tuple[float, float, float]]:
    """Greedy decode of n tokens through llama.cpp's C API, each token's host time (s) in
    llama_decode, in llama_synchronize, and reading the logits and choosing the next token."""
    import llama_cpp
    import numpy as np

    ctx = llm._ctx.ctx
    llm.reset()
    llm.eval(prompt)
    n_vocab = llm.n_vocab()
    tok = int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), (n_vocab,))))
    arr = (llama_cpp.llama_token * 1)()
    out = []
    clock = time.perf_counter
    for _ in range(n):
        arr[0] = tok
        t0 = clock()
        if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, 1)) != 0:
            raise SystemExit("error: llama_decode failed")
        t1 = clock()
        llama_cpp.llama_synchronize(ctx)
        t2 = clock()
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), (n_vocab,))
        tok = int(np.argmax(logits))
        t3 = clock()
        out.append((t1 - t0, t2 - t1, t3 - t2))
    return out


def cmd_phases(a: argparse.Namespace) -> dict[str, Any]:
    import os

    import llamacpp_instr

    llm, prompt = _opened(a)

    def one(name: str, level: str | None, env: dict[str, str]) -> list[tuple[float, float, float]]:
        for k in PHASE_ENV:
            os.environ.pop(k, None)
        os.environ.update(env)
        if level is None:
            return _phase_tokens(llm, prompt, a.n)
        with llamacpp_instr.session(llm, str(a.outdir / f"phases-{name}.log"), level=level):
            return _phase_tokens(llm, prompt, a.n)

    for name, level, env in PHASE_SETTINGS:  # warm-up: each selection's CUDA graphs captured
        one(name, level, env)
    rows: dict[str, list[list[tuple[float, float, float]]]] = {s[0]: [] for s in PHASE_SETTINGS}
    for r in range(a.rounds):
        first = r % len(PHASE_SETTINGS)
        for name, level, env in PHASE_SETTINGS[first:] + PHASE_SETTINGS[:first]:
            rows[name].append(one(name, level, env))
    for var in PHASE_ENV:
        os.environ.pop(var, None)
    out: dict[str, Any] = {}
    for name, rounds in rows.items():
        # per round: the median of each phase (us) and tokens/s; then the median over rounds
        per = [
            [statistics.median(t[i] for t in toks) * 1e6 for i in range(3)]
            + [len(toks) / sum(sum(t) for t in toks)]
            for toks in rounds
        ]
        med = [statistics.median(p[i] for p in per) for i in range(4)]
        out[name] = {
            "decode_us": round(med[0], 1),
            "synchronize_us": round(med[1], 1),
            "logits_us": round(med[2], 1),
            "tok_s": round(med[3], 1),
            "tok_s_rounds": [round(p[3], 1) for p in per],
        }
    base = out["off"]["tok_s"]
    for name in out:
        out[name]["ratio"] = round(out[name]["tok_s"] / base, 4)
    return out


def cmd_warm(a: argparse.Namespace) -> dict[str, Any]:
    import llama_cpp

    import llamacpp_instr

    llm = llama_cpp.Llama(
        str(a.model), n_gpu_layers=-1, n_ctx=2048, n_batch=512, n_ubatch=512, verbose=False
    )
    prompt = llm.tokenize(a.prompt_file.read_text().encode(), add_bos=True)

    def generate() -> list[int]:
        llm.reset()  # (else llama-cpp-python keeps the prompt's cache and decodes its last token only)
        out: list[int] = []
        for tok in llm.generate(prompt, temp=0.0, reset=True):
            out.append(int(tok))
            if len(out) >= a.n:
                break
        return out

    first = generate()
    with llamacpp_instr.session(llm, str(a.log), level=a.level):
        second = generate()
    return {"log": str(a.log), "prompt_tokens": len(prompt), "same_text": first == second}


def cmd_headline(a: argparse.Namespace) -> dict[str, Any]:
    from llamacpp_instr.converters import load_session
    from llamacpp_instr.converters.reports.summary import overview

    ov = overview(load_session(str(a.log)))
    rows = json.loads(a.bench.read_text())
    pp = next(float(r["avg_ts"]) for r in rows if int(r.get("n_prompt", 0)) > 0)
    tg = next(float(r["avg_ts"]) for r in rows if int(r.get("n_gen", 0)) > 0)
    return {
        "summary_prompt_tok_s": float(ov["prompt_tok_s"]),
        "bench_prompt_tok_s": pp,
        "prompt_ratio": float(ov["prompt_tok_s"]) / pp,
        "summary_gen_tok_s": float(ov["gen_tok_s"]),
        "bench_gen_tok_s": tg,
        "gen_ratio": float(ov["gen_tok_s"]) / tg,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("model")
    p.add_argument("out", type=Path)
    p.set_defaults(fn=cmd_model)
    p = sub.add_parser("quantize")
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.set_defaults(fn=cmd_quantize)
    p = sub.add_parser("moe-model")
    p.add_argument("out", type=Path)
    p.set_defaults(fn=cmd_moe_model)
    for name, fn, rounds in (("levels", cmd_levels, 3), ("phases", cmd_phases, 5)):
        p = sub.add_parser(name)
        p.add_argument("model", type=Path)
        p.add_argument("outdir", type=Path)
        p.add_argument("--prompt", type=int, default=128, help="prompt tokens")
        p.add_argument("-n", type=int, default=64, help="generated tokens")
        p.add_argument("--rounds", type=int, default=rounds)
        p.set_defaults(fn=fn)
    p = sub.add_parser("warm")
    p.add_argument("model", type=Path)
    p.add_argument("log", type=Path)
    p.add_argument("--prompt-file", type=Path, required=True)
    p.add_argument("-n", type=int, default=32)
    p.add_argument("--level", default="detailed")
    p.set_defaults(fn=cmd_warm)
    p = sub.add_parser("headline")
    p.add_argument("log", type=Path)
    p.add_argument("bench", type=Path)
    p.set_defaults(fn=cmd_headline)
    a = ap.parse_args()
    out = a.fn(a)
    text = json.dumps(out, indent=1, default=str)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
