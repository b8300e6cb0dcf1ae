"""Instrumentation overhead: SmolLM2-135M decode, stock build vs our build at every level.

Runs every configuration in its own process, interleaved (A B C ... A B C ...) so that machine noise
hits all of them alike, and reports ratios against the stock llama-cpp-python 0.3.36 build measured
in the same run:

    python bench/overhead.py [--reps 5] [--tokens 64] [--threads 2] [--write-docs]
    python bench/overhead.py --levels-only        # the one-process table of the levels alone

Configurations: stock (the unpatched pin, built once and cached), off, minimal, detailed, verbose,
and `cb_eval` — the upstream-style peer: our build with no session but an eval callback that asks to
observe every node (the scheduler then splits the graph and synchronizes at each node). The peer's
callback is in the testing build of our libraries (`instr build --testing`), built once and cached.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = ["stock", "off", "minimal", "detailed", "verbose", "cb_eval"]
# long enough (about 50 tokens) that prompt processing is measured on a real batch, not 8 tokens
PROMPT = (
    "The history of the printing press begins in East Asia, where woodblock printing spread in "
    "the Tang dynasty, and continues in fifteenth-century Mainz, where Johannes Gutenberg combined "
    "movable metal type, oil-based ink and a screw press into a system that could print books"
)


def child(config: str, tokens: int, threads: int, log: str) -> None:
    """One measurement, in a fresh process; prints a JSON line."""
    import llama_cpp
    import numpy as np

    from llamacpp_instr.native import bindings, models

    low = llama_cpp.llama_cpp  # the module llama.py calls into
    if config == "cb_eval":
        peer = bindings.load().bench_cb_eval
        default_params = low.llama_context_default_params

        def with_peer():  # type: ignore[no-untyped-def]
            p = default_params()
            p.cb_eval = low.ggml_backend_sched_eval_callback(peer)
            return p

        low.llama_context_default_params = with_peer

    llm = llama_cpp.Llama(
        str(models.default_model()), n_ctx=1024, n_threads=threads, n_threads_batch=threads,
        seed=0, verbose=False,
    )  # fmt: skip
    api = bindings.load() if config not in ("stock", "cb_eval") else None
    if api and config != "off":
        api.session_begin(llm.ctx, log, config, {"bench": "overhead"})
    prompt = llm.tokenize(PROMPT.encode(), add_bos=True)
    # the prompt five times: the first builds its graph (and, instrumented, writes its node table);
    # the others reuse it. Noise only slows a run, so the median of the four is the steady cost.
    prompt_s = []
    for _ in range(5):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        prompt_s.append(time.perf_counter() - t0)
    t1 = time.perf_counter()
    n = tokens
    tok = 0
    n_vocab = llm.n_vocab()
    per_token = []
    for _ in range(tokens):
        logits = np.ctypeslib.as_array(low.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
        tok = int(logits.argmax())  # greedy, so every config must produce the same tokens
        ta = time.perf_counter()
        llm.eval([tok])
        per_token.append(time.perf_counter() - ta)
    t2 = time.perf_counter()
    if api and config != "off":
        api.session_end("ok")
    print(json.dumps({
        "config": config, "prompt_tokens": len(prompt), "prompt_s": statistics.median(prompt_s[1:]),
        "prompt_first_s": prompt_s[0],
        "gen_tokens": n, "gen_s": t2 - t1, "last_token": tok,
        "token_s_median": statistics.median(per_token),
    }))  # fmt: skip


def _one_process(threads: int) -> tuple[Any, Any, list[int]]:
    """The instrumentation API, SmolLM2 loaded as the one-process measurements use it, and the
    bench's prompt tokenized."""
    import llama_cpp

    from llamacpp_instr.native import bindings, models

    api = bindings.load()
    llm = llama_cpp.Llama(
        str(models.default_model()), n_ctx=1024, n_threads=threads, n_threads_batch=threads,
        verbose=False,
    )  # fmt: skip
    return api, llm, llm.tokenize(PROMPT.encode(), add_bos=True)


def levels_in_process(tokens: int, threads: int, log: str, rounds: int = 30) -> None:
    """Every level in one process and one session, alternating round by round (set_level), so that
    process-to-process noise (page faults, placement) cancels: prompt tok/s with the graph rebuilt
    on every prompt (its length changes), and generation tok/s. Prints a JSON line."""
    api, llm, base = _one_process(threads)
    levels = ["off", "minimal", "detailed", "verbose"]
    pp: dict[str, list[float]] = {lv: [] for lv in levels}
    tg: dict[str, list[float]] = {lv: [] for lv in levels}
    api.session_begin(llm.ctx, log, "detailed", {"bench": "levels in one process"})
    order = list(levels)
    shuffler = random.Random(1)
    for i in range(rounds):
        shuffler.shuffle(order)
        for lv in order:
            api.set_level(lv)
            toks = base + base[1 : 1 + i % 7]  # a new length most rounds: the graph is rebuilt
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(toks)
            pp[lv].append(len(toks) / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            for _ in range(tokens // 8):
                llm.eval([base[2]])
            tg[lv].append((tokens // 8) / (time.perf_counter() - t0))
    api.session_end("ok")

    def paired(rates: dict[str, list[float]], lv: str, base: str = "off") -> float:
        # each round's rate over the base level's in the same round: drift in the machine's speed
        # over the run (other tenants, clocks) cancels round by round
        return statistics.median(a / b for a, b in zip(rates[lv], rates[base], strict=True))

    print(
        json.dumps(
            {
                lv: {
                    "pp": statistics.median(pp[lv]),
                    "tg": statistics.median(tg[lv]),
                    "pp_paired": paired(pp, lv),
                    "tg_paired": paired(tg, lv),
                    "tg_vs_minimal": paired(tg, lv, "minimal"),
                }
                for lv in levels
            }
        )
    )


def step_memory_in_process(tokens: int, threads: int, log: str, rounds: int = 40) -> None:
    """What step_end's memory figures cost (under 1 % of a generation step at MINIMAL):
    one process, a MINIMAL session per round, alternately with and without the figures
    (LLAMA_INSTR_STEP_MEMORY, read once per session), in a shuffled order. Prints a JSON line:
    generation tok/s, median over rounds, each way, and the median of the paired ratios."""
    api, llm, base = _one_process(threads)
    tg: dict[str, list[float]] = {"on": [], "off": []}
    shuffler = random.Random(2)
    for _ in range(rounds):
        order = ["on", "off"]
        shuffler.shuffle(order)
        for way in order:
            os.environ["LLAMA_INSTR_STEP_MEMORY"] = "1" if way == "on" else "0"
            api.session_begin(llm.ctx, log, "minimal", {"bench": "step memory"})
            llm.reset()
            llm.eval(base)
            t0 = time.perf_counter()
            for _ in range(tokens // 4):
                llm.eval([base[2]])
            tg[way].append((tokens // 4) / (time.perf_counter() - t0))
            api.session_end("ok")
    ratios = [a / b for a, b in zip(tg["on"], tg["off"], strict=True)]
    print(
        json.dumps(
            {
                "on": statistics.median(tg["on"]),
                "off": statistics.median(tg["off"]),
                "ratio": statistics.median(ratios),
                "rounds": rounds,
            }
        )
    )


def in_process(mode: str, args: argparse.Namespace, value_stats: bool = False) -> dict:
    """Run one of the one-process measurements (``--child levels`` or ``step-memory``) in a
    fresh process and return the JSON line it prints; ``value_stats``: its sessions record
    VERBOSE's value statistics (LLAMA_INSTR_VALUE_STATS=1, `--value-stats`)."""
    env = dict(os.environ, LLAMA_INSTR_VALUE_STATS="1" if value_stats else "0")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, __file__, "--child", mode, "--tokens", str(args.tokens),
               "--threads", str(args.threads), "--log", str(Path(tmp) / f"{mode}.log")]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        return json.loads(r.stdout.strip().splitlines()[-1])


def run_one(config: str, args: argparse.Namespace, libs: dict[str, Path], logdir: Path) -> dict:
    """One child process; ``libs`` maps a configuration to the libraries it runs instead of the
    installed ones."""
    env = dict(os.environ)
    if config in libs:
        env["LLAMA_CPP_LIB_PATH"] = str(libs[config])
    log = logdir / f"{config}.log"
    log.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--child", config, "--tokens", str(args.tokens),
           "--threads", str(args.threads), "--log", str(log)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def log_facts(path: Path) -> dict:
    """Bytes per generated token and op-time coverage of a DETAILED log."""
    recs = [json.loads(line) for line in path.open()]
    sizes = [len(line.encode()) + 1 for line in path.read_text().splitlines()]
    kind = {r["step"]: r["kind"] for r in recs if r["type"] == "step_begin"}
    gen_steps = {s for s, k in kind.items() if k == "gen"}
    per_step_bytes = sum(
        sz for r, sz in zip(recs, sizes, strict=True)
        if r.get("step") in gen_steps and r["type"] in ("step_begin", "step_end", "compute")
    )  # fmt: skip
    ends = {r["step"]: r for r in recs if r["type"] == "step_end"}
    op_ns: dict[int, int] = {}
    for r in recs:
        if r["type"] == "compute":
            op_ns[r["step"]] = op_ns.get(r["step"], 0) + sum(o[2] for o in r.get("ops", []))
    cov = [op_ns.get(s, 0) / ends[s]["dur"] for s in gen_steps]
    return {
        "bytes_total": path.stat().st_size,
        "bytes_per_gen_token_total": path.stat().st_size / max(1, len(gen_steps)),
        "bytes_per_gen_step": per_step_bytes / max(1, len(gen_steps)),
        "coverage_mean": statistics.mean(cov),
        "coverage_min": min(cov),
        "coverage_median": statistics.median(cov),
    }


def in_process_lines(args: argparse.Namespace) -> list[str]:
    """The tables of the runs in one process: every level alternated (``levels_in_process``), and
    step_end's memory figures at MINIMAL (``step_memory_in_process``)."""
    # every level in one process (see levels_in_process): the steadiest view of the levels' cost
    lv = in_process("levels", args)
    lines = [
        "",
        "Every level in one process and one session, alternated in a shuffled order over 30 rounds "
        "(`set_level`), the prompt's length changing so its graph is rebuilt each time, then "
        f"{args.tokens // 8} generated tokens (the first rebuilds the graph for one token); medians, "
        "relative to OFF in the same process, as a ratio of the medians and as the median of "
        "each round's ratio (paired):",
        "",
        "| level | prompt tok/s (graph rebuilt) | vs off | paired | generation tok/s | vs off | "
        "paired |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, v in lv.items():
        lines.append(
            f"| {name} | {v['pp']:.1f} | {v['pp'] / lv['off']['pp']:.3f}x | "
            f"{v['pp_paired']:.3f}x | {v['tg']:.1f} | {v['tg'] / lv['off']['tg']:.3f}x | "
            f"{v['tg_paired']:.3f}x |"
        )
    # VERBOSE with its value statistics, which read every CPU op's output again: their own
    # option, measured alike in a second process
    vs = in_process("levels", args, value_stats=True)["verbose"]
    lines += [
        "",
        f"VERBOSE generation vs MINIMAL, each round's ratio (paired): "
        f"{lv['verbose']['tg_vs_minimal']:.3f}x (target: at least 0.95x); DETAILED "
        f"{lv['detailed']['tg_vs_minimal']:.3f}x. VERBOSE with its value statistics "
        f"(`--value-stats`), the same measurement in a second process: generation "
        f"{vs['tg_vs_minimal']:.3f}x of MINIMAL, prompt {vs['pp_paired']:.3f}x of OFF (paired).",
    ]
    # what step_end's memory figures cost at MINIMAL, in one process
    sm = in_process("step-memory", args)
    lines += [
        "",
        f"step_end's memory figures at MINIMAL, in one process (a session per round, with and "
        f"without them, {sm['rounds']} rounds in a shuffled order): generation {sm['on']:.1f} "
        f"tok/s with, {sm['off']:.1f} without; paired ratio {sm['ratio']:.3f}x (target: at "
        "least 0.99x).",
    ]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help="comma-separated subset of " + ", ".join(CONFIGS) + " (stock is always included)",
    )
    ap.add_argument("--write-docs", action="store_true", help="update docs/performance.md")
    ap.add_argument(
        "--levels-only",
        action="store_true",
        help="only every level in one process (no stock build, no separate processes)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--log", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "levels":
        levels_in_process(args.tokens, args.threads, args.log)
        return
    if args.child == "step-memory":
        step_memory_in_process(args.tokens, args.threads, args.log)
        return
    if args.child:
        child(args.child, args.tokens, args.threads, args.log)
        return

    if args.levels_only:
        print("\n".join(in_process_lines(args)))
        return

    from llamacpp_instr.native import build

    def echo(m: str) -> None:
        print(m, file=sys.stderr)

    configs = ["stock"] + [c for c in args.configs.split(",") if c in CONFIGS and c != "stock"]
    libs = {"stock": build.stock_lib_dir(echo)}
    if "cb_eval" in configs:
        libs["cb_eval"] = build.testing_lib_dir(echo)
    results: dict[str, list[dict]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        logdir = Path(tmp)
        order = list(configs)
        shuffler = random.Random(0)
        for rep in range(args.reps):
            # a fresh order each repetition: no configuration always runs right after another
            shuffler.shuffle(order)
            for c in order:
                results[c].append(run_one(c, args, libs, logdir))
            print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
        facts = log_facts(logdir / "detailed.log") if "detailed" in configs else None

    def rates(c: str, kind: str) -> list[float]:
        return [r[f"{kind}_tokens"] / r[f"{kind}_s"] for r in results[c]]

    # median, and best-of: noise on a shared machine only ever slows a run down, so the fastest
    # repetition is the least disturbed view of each configuration
    gen = {c: statistics.median(rates(c, "gen")) for c in configs}
    gen_best = {c: max(rates(c, "gen")) for c in configs}
    # per-token: 1 / the median llama_decode time of a generated token, medianed over repetitions;
    # a burst of noise moves a few tokens, not the median token
    tok = {c: statistics.median(1 / r["token_s_median"] for r in results[c]) for c in configs}
    pp = {c: statistics.median(rates(c, "prompt")) for c in configs}
    pp_first = {
        c: statistics.median(r["prompt_tokens"] / r["prompt_first_s"] for r in results[c])
        for c in configs
    }
    same_tokens = len({rs[-1]["last_token"] for rs in results.values()}) == 1
    lines = [
        f"SmolLM2-135M-Instruct Q4_1, {args.threads} threads, a "
        f"{results['stock'][0]['prompt_tokens']}-token prompt, {args.tokens} generated tokens, "
        f"{args.reps} repetitions, each running every config in a shuffled order; same greedy "
        f"output in every config: {same_tokens}",
        "",
        "| config | per-token tok/s | vs stock | gen tok/s (median run) | vs stock "
        "| gen tok/s (best run) | vs stock | prompt tok/s (graph reused) | vs stock "
        "| prompt tok/s (first, graph built) | vs stock |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in configs:
        lines.append(
            f"| {c} | {tok[c]:.1f} | {tok[c] / tok['stock']:.3f}x "
            f"| {gen[c]:.1f} | {gen[c] / gen['stock']:.3f}x | {gen_best[c]:.1f} | "
            f"{gen_best[c] / gen_best['stock']:.3f}x | {pp[c]:.1f} | {pp[c] / pp['stock']:.3f}x "
            f"| {pp_first[c]:.1f} | {pp_first[c] / pp_first['stock']:.3f}x |"
        )
    if facts:
        lines += [
            "",
            f"DETAILED log: {facts['bytes_per_gen_step'] / 1024:.1f} KiB per generated token in steady state "
            f"(step_begin + step_end + compute records), {facts['bytes_per_gen_token_total'] / 1024:.1f} KiB "
            f"per generated token including session_start and graph tables ({facts['bytes_total'] / 1024:.0f} KiB "
            f"for {args.tokens} tokens).",
            f"Op-time coverage of generation steps (sum of op durations / llama_decode wall time): "
            f"mean {facts['coverage_mean']:.1%}, median {facts['coverage_median']:.1%}, min {facts['coverage_min']:.1%}.",
        ]
    lines += in_process_lines(args)
    report = "\n".join(lines)
    print(report)
    if args.write_docs:
        write_section("overhead", report)


DOC_PAGES = ("performance.md", "accuracy.md")  # the pages whose tables the benches write


def write_section(name: str, body: str, doc: Path | None = None, script: str | None = None) -> None:
    """Replace the <!-- bench:NAME --> section of ``doc`` (by default the page of ``DOC_PAGES``
    that holds the section, else docs/performance.md)."""
    if doc is None:
        pages = [ROOT / "docs" / p for p in DOC_PAGES]
        held = [p for p in pages if f"<!-- bench:{name} -->" in p.read_text()]
        doc = held[0] if held else pages[0]
    text = doc.read_text() if doc.exists() else "# Performance\n"
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    stamp = time.strftime("%Y-%m-%d")
    block = f"{begin}\n_Measured {stamp} by `{script or f'bench/{name}.py'}`._\n\n{body}\n{end}"
    if begin in text:
        pre, rest = text.split(begin, 1)
        text = pre + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text)


if __name__ == "__main__":
    main()
