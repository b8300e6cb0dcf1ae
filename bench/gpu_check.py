"""The GPU checks of the CUDA op timer (driven by bench/gpu_check.sh on a machine with a GPU; see
docs/cuda.md and docs/performance.md, "CUDA"). Every context opens as llama.cpp's own programs
open theirs (flash attention ``auto``: on where the backend has its kernels) unless
``--flash-attn`` says otherwise. Sub-commands:

    gpu_check.py model OUT.gguf             a random-weight F16 model with Llama-3.2-1B's shapes
    gpu_check.py tiny-model OUT.gguf        a tiny one of the same layout (the dry run's stand-in)
    gpu_check.py quantize IN OUT            IN quantized to Q4_K_M (llama_model_quantize)
    gpu_check.py moe-model OUT.gguf         a small random-weight MoE (8 experts, 2 used)
    gpu_check.py cost MODEL OUTDIR          in one process, the settings alternated round by round
                                            (CUDA graphs on): decode tokens/s with no session, at
                                            MINIMAL and at DETAILED, through llama.cpp's C API
                                            (where the cost lands: llama_decode, llama_synchronize,
                                            the logits) and through llama-cpp-python's Llama.eval;
                                            greedy text and every step's logits against no session
    gpu_check.py levels MODEL OUTDIR        the Llama.eval loop alone
    gpu_check.py phases MODEL OUTDIR        the C API loop alone (with MINIMAL also without device
                                            timing, and without the step's memory figures)
    gpu_check.py headline LOG BENCH.json    the summary's prompt and generation tokens/s of LOG
                                            against llama-bench's (-o json) for the same setting
    gpu_check.py warm MODEL LOG             a prompt and greedy generation run twice in one
                                            process, the second in a session (every kernel it
                                            launches loaded by the first): CUPTI's check of
                                            warm computes
    gpu_check.py sampling MODEL LOG         sampling at temperature 0.8 (penalties, top-k, top-p,
                                            min-p) in a DETAILED session: the `host` and `chain`
                                            records against llama.cpp's own counter of the chain
                                            (llama_perf_sampler), within 2 % or 0.1 ms
    gpu_check.py regions LOG                GGML_CUDA_GRAPH_OPT=1's concurrent regions in a DETAILED
                                            log: ops whose intervals overlap, and any op whose
                                            interval covers all the others of its region (timed
                                            through it: the target is none)
    gpu_check.py crash                      dies of a segmentation fault in native code (the crash
                                            tracer's check, and a fault injected into a step)

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


# the dry run's stand-in for the 1B: the same layout, small enough for two shared CPU cores
TINY = dict(n_layer=4, n_embd=256, n_head=8, n_head_kv=4, n_ff=512, n_vocab=32000)


def cmd_tiny_model(a: argparse.Namespace) -> dict[str, Any]:
    from helpers.tiny_gguf import write_tiny_model

    write_tiny_model(a.out, dtype="f16", n_ctx_train=4096, **TINY)
    return {"model": str(a.out)}


def _flash(a: argparse.Namespace) -> Any:
    """The context defaults of ``a.flash_attn`` (auto: llama.cpp's own, on where it can be)."""
    from llamacpp_instr.running.api import llama_defaults

    return llama_defaults({"auto": None, "on": True, "off": False}[a.flash_attn])


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

    with _flash(a):
        llm = llama_cpp.Llama(
            str(a.model), n_gpu_layers=-1, n_ctx=1024, n_batch=512, n_ubatch=512, verbose=False
        )
    n_vocab = llm.n_vocab()
    prompt = [(i * 7919) % max(1, n_vocab - 8) + 4 for i in range(a.prompt)]
    a.outdir.mkdir(parents=True, exist_ok=True)
    return llm, prompt


def cmd_levels(a: argparse.Namespace) -> dict[str, Any]:
    llm, prompt = _opened(a)
    return _levels(a, llm, prompt, a.rounds)


def _levels(
    a: argparse.Namespace,
    llm: Any,
    prompt: list[int],
    rounds: int,
    warm: bool = True,
    turn: int = 0,
) -> dict[str, Any]:
    """``rounds`` rounds of the Llama.eval loop at each level, each level first in turn from the
    ``turn``-th (after a warm-up of each, with ``warm``)."""
    import llamacpp_instr

    def one(level: str, log: Path) -> tuple[list[int], list[bytes], float]:
        if level == "off":
            return _generate(llm, prompt, a.n)
        with llamacpp_instr.session(llm, str(log), level=level):
            return _generate(llm, prompt, a.n)

    # warm-up: each level's CUDA graphs captured (the first computes of a graph run uncaptured)
    for level in LEVELS if warm else ():
        one(level, a.outdir / f"warmup-{level}.log")
    tps: dict[str, list[float]] = {lv: [] for lv in LEVELS}
    ref: tuple[list[int], list[bytes]] | None = None
    same_text = {lv: True for lv in LEVELS}
    same_logits = {lv: True for lv in LEVELS}
    for r in range(turn, turn + rounds):
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
    llm, prompt = _opened(a)
    return _phases(a, llm, prompt, a.rounds, PHASE_SETTINGS)


def _phases(
    a: argparse.Namespace,
    llm: Any,
    prompt: list[int],
    rounds: int,
    settings: tuple[tuple[str, str | None, dict[str, str]], ...],
    warm: bool = True,
    turn: int = 0,
) -> dict[str, Any]:
    """``rounds`` rounds of the C API loop in each of ``settings``, each first in turn from the
    ``turn``-th (after a warm-up of each, with ``warm``)."""
    import os

    import llamacpp_instr

    def one(name: str, level: str | None, env: dict[str, str]) -> list[tuple[float, float, float]]:
        for k in PHASE_ENV:
            os.environ.pop(k, None)
        os.environ.update(env)
        if level is None:
            return _phase_tokens(llm, prompt, a.n)
        with llamacpp_instr.session(llm, str(a.outdir / f"phases-{name}.log"), level=level):
            return _phase_tokens(llm, prompt, a.n)

    for name, level, env in settings if warm else ():  # each selection's CUDA graphs captured
        one(name, level, env)
    rows: dict[str, list[list[tuple[float, float, float]]]] = {s[0]: [] for s in settings}
    for r in range(turn, turn + rounds):
        first = r % len(settings)
        for name, level, env in settings[first:] + settings[:first]:
            rows[name].append(one(name, level, env))
    for var in PHASE_ENV:
        os.environ.pop(var, None)
    out: dict[str, Any] = {}
    for name, per_round in rows.items():
        # per round: the median of each phase (us) and tokens/s; then the median over rounds
        per = [
            [statistics.median(t[i] for t in toks) * 1e6 for i in range(3)]
            + [len(toks) / sum(sum(t) for t in toks)]
            for toks in per_round
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


# what `cost` compares: the C API loop's settings (no session, MINIMAL, DETAILED)
COST_SETTINGS = tuple(s for s in PHASE_SETTINGS if s[0] in LEVELS)


def cmd_cost(a: argparse.Namespace) -> dict[str, Any]:
    """Both loops on one model in one process, a round of each in turn: the C API loop's ratios
    (the targets: MINIMAL >= 0.99x, DETAILED >= 0.95x) and llama-cpp-python's (within 0.02 of
    them)."""
    llm, prompt = _opened(a)
    c_rounds: list[dict[str, Any]] = []
    py_rounds: list[dict[str, Any]] = []
    for r in range(a.rounds):
        c_rounds.append(_phases(a, llm, prompt, 1, COST_SETTINGS, warm=r == 0, turn=r))
        py_rounds.append(_levels(a, llm, prompt, 1, warm=r == 0, turn=r))
    c = {lv: statistics.median(r[lv]["ratio"] for r in c_rounds) for lv in LEVELS[1:]}
    py = {lv: statistics.median(r[f"{lv}_ratio"] for r in py_rounds) for lv in LEVELS[1:]}
    return {
        "c_api": {lv: c[lv] for lv in c},
        "c_api_off_tok_s": statistics.median(r["off"]["tok_s"] for r in c_rounds),
        "c_api_rounds": c_rounds,
        "llama_cpp_python": py,
        "llama_cpp_python_off_tok_s": statistics.median(
            r["decode_tok_s"]["off"] for r in py_rounds
        ),
        "llama_cpp_python_rounds": py_rounds,
        "py_minus_c": {lv: py[lv] - c[lv] for lv in c},
        "text_identical": all(all(r["text_identical"].values()) for r in py_rounds),
        "logits_bit_identical": all(all(r["logits_bit_identical"].values()) for r in py_rounds),
    }


def cmd_warm(a: argparse.Namespace) -> dict[str, Any]:
    import llama_cpp

    import llamacpp_instr

    with _flash(a):
        llm = llama_cpp.Llama(
            str(a.model),
            n_gpu_layers=-1,
            n_ctx=2048,
            n_batch=512,
            n_ubatch=512,
            verbose=False,
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


def cmd_sampling(a: argparse.Namespace) -> dict[str, Any]:
    """The sampling of ``a.n`` tokens at temperature 0.8 through a chain of penalties, top-k,
    top-p and min-p, every layer offloaded, in a DETAILED session: the `host` records' time in the
    chain against llama.cpp's own counter of it (llama_perf_sampler), read as the session ends."""
    import llama_cpp

    import llamacpp_instr

    with _flash(a):
        llm = llama_cpp.Llama(str(a.model), n_gpu_layers=-1, n_ctx=1024, seed=11, verbose=False)
    kw = {"temp": 0.8, "top_k": 64, "top_p": 0.9, "min_p": 0.01, "repeat_penalty": 1.1}
    tokens: list[int] = []
    with llamacpp_instr.session(llm, str(a.log), level="detailed"):
        for tok in llm.generate(llm.tokenize(b"The quick brown fox"), **kw):  # type: ignore[arg-type]
            tokens.append(int(tok))
            if len(tokens) == a.n:
                break
        assert llm._sampler is not None  # made by generate
        perf = llama_cpp.llama_perf_sampler(llm._sampler.sampler)
    llm.close()
    recs = _records(a.log)
    hosts = [r for r in recs if r.get("type") == "host"]
    chains = [r for r in recs if r.get("type") == "chain"]
    chain_ns = sum(int(h.get("chain_ns", 0)) for h in hosts)
    llama_us = perf.t_sample_ms * 1000
    return {
        "tokens": len(tokens),
        "llama_perf_sampler_us": llama_us,
        "llama_perf_sampler_n": int(perf.n_sample),
        "host_records": len(hosts),
        "host_sampled": sum(int(h.get("sampled", 0)) for h in hosts),
        "chain_records": len(chains),
        "chain_t_sample_us": [c.get("t_sample_us") for c in chains],
        "host_chain_us": chain_ns / 1000,
        "host_over_llama": chain_ns / 1000 / llama_us if llama_us else None,
        # the tolerance of tests/test_host_work.py: 2 %, or 0.1 ms
        "within": abs(chain_ns / 1000 - llama_us) <= max(0.02 * llama_us, 100),
    }


def _records(path: Path) -> list[dict[str, Any]]:
    import gzip

    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def concurrent_regions(ops: list[tuple[int, int, int]]) -> tuple[int, list[int]]:
    """``ops``: one compute's (node, start, end). The groups of ops whose intervals overlap one
    another (a concurrent region: ops on several streams at once), and the nodes of the ops whose
    interval covers every other op of their group (timed through the region)."""
    regions, spanning = 0, []
    group: list[tuple[int, int, int]] = []
    for op in sorted(ops, key=lambda o: (o[1], -o[2])) + [(-1, 1 << 62, 1 << 62)]:
        if group and op[1] < max(e for _, _, e in group):
            group.append(op)
            continue
        if len(group) > 1:
            regions += 1
            lo, hi = min(s for _, s, _ in group), max(e for _, _, e in group)
            spanning += [n for n, s, e in group if s <= lo and e >= hi]
        group = [op]
    return regions, spanning


def cmd_regions(a: argparse.Namespace) -> dict[str, Any]:
    from llamacpp_instr.converters import load_session

    f = load_session(str(a.log))
    ops = f.ops
    if "device" in ops.columns:  # (a log of one device has no device column)
        ops = ops[ops["device"].astype(str) == a.device]
    n_regions, spanning, computes = 0, [], 0
    for (_, _), g in ops.groupby(["step", "ubatch"], sort=False):
        computes += 1
        r, s = concurrent_regions(
            [
                (int(n), int(t), int(t) + int(d))
                for n, t, d in zip(g["node"], g["t_start"], g["dur_ns"], strict=True)
            ]
        )
        n_regions += r
        spanning += [str(g.loc[g["node"] == n, "op"].iloc[0]) + f"#{n}" for n in s]
    return {
        "computes": computes,
        "regions": n_regions,
        "spanning_ops": len(spanning),
        "spanning_examples": spanning[:10],
    }


def cmd_crash(a: argparse.Namespace) -> dict[str, Any]:
    """A read of an address no page holds, in native code (libc's strlen, through ctypes): the
    process dies of SIGSEGV, as a fault in llama.cpp would kill it."""
    ctypes.CDLL(None).strlen(ctypes.c_void_p(8))
    return {}


def cmd_headline(a: argparse.Namespace) -> dict[str, Any]:
    from llamacpp_instr.converters import load_session
    from llamacpp_instr.converters.reports.summary import overview

    ov = overview(load_session(str(a.log)))
    rows = json.loads(a.bench.read_text())
    # the prompt from an empty cache; the generation after the deepest context tested (the run's
    # own generation follows its prompt)
    pp = min(
        (int(r.get("n_depth", 0)), float(r["avg_ts"]))
        for r in rows
        if int(r.get("n_prompt", 0)) > 0
    )[1]
    tg = max(
        (int(r.get("n_depth", 0)), float(r["avg_ts"])) for r in rows if int(r.get("n_gen", 0)) > 0
    )[1]
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
    for name, fn in (("model", cmd_model), ("tiny-model", cmd_tiny_model)):
        p = sub.add_parser(name)
        p.add_argument("out", type=Path)
        p.set_defaults(fn=fn)
    p = sub.add_parser("quantize")
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.set_defaults(fn=cmd_quantize)
    p = sub.add_parser("moe-model")
    p.add_argument("out", type=Path)
    p.set_defaults(fn=cmd_moe_model)
    flash = argparse.ArgumentParser(add_help=False)
    flash.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")
    for name, fn, rounds in (
        ("levels", cmd_levels, 3),
        ("phases", cmd_phases, 5),
        ("cost", cmd_cost, 5),
    ):
        p = sub.add_parser(name, parents=[flash])
        p.add_argument("model", type=Path)
        p.add_argument("outdir", type=Path)
        p.add_argument("--prompt", type=int, default=128, help="prompt tokens")
        p.add_argument("-n", type=int, default=64, help="generated tokens")
        p.add_argument("--rounds", type=int, default=rounds)
        p.set_defaults(fn=fn)
    p = sub.add_parser("warm", parents=[flash])
    p.add_argument("model", type=Path)
    p.add_argument("log", type=Path)
    p.add_argument("--prompt-file", type=Path, required=True)
    p.add_argument("-n", type=int, default=32)
    p.add_argument("--level", default="detailed")
    p.set_defaults(fn=cmd_warm)
    p = sub.add_parser("sampling", parents=[flash])
    p.add_argument("model", type=Path)
    p.add_argument("log", type=Path)
    p.add_argument("-n", type=int, default=64)
    p.set_defaults(fn=cmd_sampling)
    p = sub.add_parser("regions")
    p.add_argument("log", type=Path)
    p.add_argument("--device", default="CUDA0")
    p.set_defaults(fn=cmd_regions)
    p = sub.add_parser("crash")
    p.set_defaults(fn=cmd_crash)
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
