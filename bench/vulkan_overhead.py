"""Device timing's cost on Vulkan: tokens/s at MINIMAL and DETAILED relative to OFF, on Mesa's
lavapipe where there is no GPU.

One process, a session per level and round, the model fully offloaded (``--ngl``): every round runs each level
(`set_level`) in a shuffled order, a prompt then ``--tokens`` generated tokens, so all levels share
the process, the loaded model and Mesa's compiled shaders, and machine noise hits them alike.
Reported: median tok/s per level, and the median over rounds of each round's ratio to OFF; and the
timestamps' own cost: each level against the same level with the device's ops untimed
(LLAMA_INSTR_DEVICE_TIMING=0). An instrumented compute ends with the backends synchronized (patch
0002), which changes how ggml-vulkan returns the logits (a copy from an idle device is a memcpy):
that, not the timing, is what the ratios to OFF also hold.

    python bench/vulkan_overhead.py [--rounds 12] [--tokens 4] [--model PATH | --moe] [--write-docs]

The Vulkan build's libraries come from `instr build --vulkan --no-install` (built if missing) and
run under the installed package. lavapipe is a CPU: these are not GPU figures. A timestamp costs a
GPU next to nothing, but it waits for the commands before it, which on a GPU can serialize work
that would otherwise overlap; measure on the GPU you care about.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# a level, or a level with the device's ops untimed (LLAMA_INSTR_DEVICE_TIMING=0): the session's
# host side alone, which tells the timestamps' own cost from the session's
LEVELS = ["off", "minimal", "detailed", "minimal-untimed", "detailed-untimed"]
PROMPT = "The history of the printing press begins in East Asia, where woodblock printing spread"


def child(model: str, ngl: int, rounds: int, tokens: int, threads: int, log: str) -> None:
    """Every level in one process, alternated round by round; prints a JSON line."""
    import llama_cpp
    import numpy as np

    from llamacpp_instr.native import bindings

    api = bindings.load()
    llm = llama_cpp.Llama(
        model, n_ctx=512, n_threads=threads, n_threads_batch=threads, n_gpu_layers=ngl,
        verbose=False,
    )  # fmt: skip
    n_vocab = llm.n_vocab()

    def last_logits() -> np.ndarray:
        # llama_get_logits_ith waits for the device: a decode returns before an asynchronous
        # backend is done (uninstrumented; instrumented, each compute ends synchronized)
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,))

    prompt = llm.tokenize(PROMPT.encode(), add_bos=True)
    # warm-up: Mesa compiles each shader at its first use (minutes with a cold cache)
    llm.eval(prompt)
    llm.eval([int(last_logits().argmax())])
    pp: dict[str, list[float]] = {lv: [] for lv in LEVELS}
    tg: dict[str, list[float]] = {lv: [] for lv in LEVELS}
    out: dict[str, list[int]] = {lv: [] for lv in LEVELS}
    order = list(LEVELS)
    shuffler = random.Random(1)
    for k in range(rounds):
        shuffler.shuffle(order)
        for lv in order:
            # read by the Vulkan timer once per session: a session per level and round, each
            # with its own file, begun (and its graph announced by a warm-up) outside the timing
            os.environ["LLAMA_INSTR_DEVICE_TIMING"] = "0" if lv.endswith("-untimed") else "1"
            api.session_begin(llm.ctx, f"{log}.{k}.{lv}", "detailed", {"bench": "vulkan_overhead"})
            api.set_level(lv.split("-")[0])
            llm.reset()
            llm.eval(prompt)
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(prompt)
            tok = int(last_logits().argmax())
            t1 = time.perf_counter()
            toks = [tok]
            for _ in range(tokens):
                llm.eval([tok])
                tok = int(last_logits().argmax())
                toks.append(tok)
            t2 = time.perf_counter()
            pp[lv].append(len(prompt) / (t1 - t0))
            tg[lv].append(tokens / (t2 - t1))
            out[lv] = toks
            api.session_end("ok")
    llm.close()
    print(json.dumps({"pp": pp, "tg": tg, "same_output": len({tuple(t) for t in out.values()}) == 1,
                      "prompt_tokens": len(prompt)}))  # fmt: skip


def coverage(log: Path) -> dict[str, float]:
    """From the DETAILED steps of the logs (``log.<round>.<level>``): the share of the device's
    busy time its timed ops cover, and the share of a generated token's llama_decode time the
    device was busy."""
    # each record with its file's index, so that steps of two sessions never pair
    recs = [
        dict(json.loads(line), file=i)
        for i, f in enumerate(sorted(log.parent.glob(log.name + ".*")))
        for line in f.open()
    ]
    cov, busy_share, mark_gap, marks_share = [], [], [], []
    ends = {(r["file"], r["sid"], r["step"]): r for r in recs if r["type"] == "step_end"}
    for r in recs:
        if r["type"] != "compute" or "ops" not in r or not r.get("busy"):
            continue
        dev = r["busy"][0][0]
        busy = sum(b[2] for b in r["busy"] if b[0] == dev)
        ops = sum(
            o[2] for o in r["ops"] if any(s[0] == dev and s[1] <= o[0] < s[2] for s in r["splits"])
        )
        cov.append(ops / busy)
        # what a mark costs: a buffer's begin mark and the mark before its first op have nothing
        # recorded between them (copies aside), so the first op starts one mark's time later
        starts = sorted(o[1] for o in r["ops"])
        gaps = []
        for b in r["busy"]:
            first = next((t for t in starts if b[1] <= t < b[1] + b[2]), None)
            if first is not None:
                gaps.append(first - b[1])
        mark_gap += gaps
        step = ends.get((r["file"], r["sid"], r["step"]))
        if step and step["n_tokens"] == 1:
            busy_share.append(busy / step["dur"])
            # DETAILED's marks: one per op, three per command buffer (begin, before the first op, end)
            n_marks = len(r["ops"]) + 3 * len(r["busy"])
            marks_share.append(n_marks * statistics.median(gaps or [0]) / step["dur"])
    return {
        "coverage_median": statistics.median(cov),
        "coverage_min": min(cov),
        "busy_share_median": statistics.median(busy_share) if busy_share else float("nan"),
        "mark_ns_median": statistics.median(mark_gap),
        "marks_share_median": statistics.median(marks_share) if marks_share else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ngl", type=int, default=99)
    ap.add_argument("--model", help="GGUF file (default: SmolLM2-135M, the default model)")
    ap.add_argument(
        "--moe",
        action="store_true",
        help="a mixture of experts instead: the default model's first 4 layers, 8 experts, top-2 "
        "(tests/moe_gguf.py), whose routing DETAILED reads back from the device",
    )
    ap.add_argument("--lib", help="the Vulkan build's libraries (default: instr build --vulkan's)")
    ap.add_argument("--write-docs", action="store_true", help="update docs/performance.md")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--log", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.model, args.ngl, args.rounds, args.tokens, args.threads, args.log)
        return

    from llamacpp_instr.native import build, models
    from llamacpp_instr.running.vulkan_env import lavapipe_env

    def echo(m: str) -> None:
        print(m, file=sys.stderr)

    model = args.model or str(models.default_model())
    lib = Path(args.lib) if args.lib else build.vulkan_lib_dir(echo)
    with tempfile.TemporaryDirectory() as tmp:
        if args.moe:
            sys.path.insert(0, str(ROOT / "tests"))
            from helpers.moe_gguf import write_moe_model

            model = str(
                write_moe_model(model, Path(tmp) / "moe-small.gguf", n_layer=4, distinct=True)
            )
        log = Path(tmp) / "vk.log"
        cmd = [sys.executable, __file__, "--child", "--model", model, "--ngl", str(args.ngl),
               "--rounds", str(args.rounds), "--tokens", str(args.tokens),
               "--threads", str(args.threads), "--log", str(log)]  # fmt: skip
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, env=lavapipe_env(lib, args.threads))
        if r.returncode != 0:
            sys.exit(f"the child failed: {r.stderr[-2000:]}")
        res = json.loads(r.stdout.strip().splitlines()[-1])
        cov = coverage(log)
    wall = time.monotonic() - t0

    def ratios(kind: str, lv: str) -> list[float]:
        return [a / b for a, b in zip(res[kind][lv], res[kind]["off"], strict=True)]

    lines = [
        f"`{Path(model).name}` fully offloaded (`n_gpu_layers={args.ngl}`) to Vulkan0 = Mesa's "
        f"lavapipe (`llvmpipe`, a CPU: **not GPU figures**), {args.threads} threads, "
        f"a {res['prompt_tokens']}-token prompt and {args.tokens} generated tokens per level per "
        f"round, {args.rounds} rounds, the levels in a shuffled order each round, one process and "
        f"one session (`set_level`); {wall:.0f} s in all. Same greedy output at every level: "
        f"{res['same_output']}.",
        "",
        "| level | generation tok/s (median) | vs off (median of per-round ratios) "
        "| prompt tok/s (median) | vs off (median of per-round ratios) |",
        "|---|---|---|---|---|",
    ]
    for lv in LEVELS[:3]:
        lines.append(
            f"| {lv} | {statistics.median(res['tg'][lv]):.2f} "
            f"| {statistics.median(ratios('tg', lv)):.3f}x "
            f"| {statistics.median(res['pp'][lv]):.2f} "
            f"| {statistics.median(ratios('pp', lv)):.3f}x |"
        )
    dm_gen = statistics.median(
        a / b for a, b in zip(res["tg"]["detailed"], res["tg"]["minimal"], strict=True)
    )
    dm_pro = statistics.median(
        a / b for a, b in zip(res["pp"]["detailed"], res["pp"]["minimal"], strict=True)
    )
    lines += [
        "",
        f"DETAILED against MINIMAL (medians of per-round ratios; on a mixture of experts DETAILED "
        f"also reads each router's ranking back): generation {dm_gen:.3f}x, prompt {dm_pro:.3f}x.",
    ]
    lines += [
        "",
        "The timestamps' own cost: each level against the same level with the device's ops "
        "untimed (`LLAMA_INSTR_DEVICE_TIMING=0`; the session and its per-compute synchronization "
        "alike), medians of per-round ratios:",
        "",
        "| level | generation | prompt |",
        "|---|---|---|",
    ]
    for lv in LEVELS[1:3]:
        gen = [a / b for a, b in zip(res["tg"][lv], res["tg"][lv + "-untimed"], strict=True)]
        pro = [a / b for a, b in zip(res["pp"][lv], res["pp"][lv + "-untimed"], strict=True)]
        lines.append(
            f"| {lv} timed / untimed | {statistics.median(gen):.3f}x "
            f"| {statistics.median(pro):.3f}x |"
        )
    lines += [
        "",
        f"DETAILED computes: the timed ops cover {cov['coverage_median']:.1%} of the device's busy "
        f"time (median; min {cov['coverage_min']:.1%}); the device was busy "
        f"{cov['busy_share_median']:.1%} of a generated token's llama_decode time (median).",
        "",
        f"What a mark costs, measured in the same log: a command buffer's first op starts "
        f"{cov['mark_ns_median'] / 1000:.1f} µs (median) after the buffer's begin mark, with one "
        f"mark and nothing else between them. DETAILED writes a mark per op and three per command "
        f"buffer: at that price, {cov['marks_share_median']:.2%} of a generated token's time "
        f"(median); MINIMAL writes one per layer and three per buffer.",
    ]
    report = "\n".join(lines)
    print(report)
    if args.write_docs:
        from overhead import write_section

        name = "vulkan_overhead_moe" if args.moe else "vulkan_overhead"
        script = "bench/vulkan_overhead.py" + (" --moe" if args.moe else "")
        write_section(name, report, script=script)


if __name__ == "__main__":
    main()
