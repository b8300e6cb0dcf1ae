"""What recording a mixture of experts' routing costs: generation tokens/s at
DETAILED (routing recorded) over MINIMAL, on the distinct-experts MoE made from the bundled
SmolLM2 (tests/helpers/moe_gguf.py: 30 layers, 8 experts, top-2), in one process and one session,
alternating the level round by round in a shuffled order (set_level), so that drift in the
machine's speed cancels; each round's DETAILED rate is taken over MINIMAL's in the same round.

    python bench/moe_routing.py [--rounds 20] [--tokens 16] [--threads 2] [--write-docs]

Target: DETAILED at least 0.98x of MINIMAL (the median paired ratio).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from overhead import write_section  # noqa: E402

LEVELS = ("minimal", "detailed")


def model_path(cache: Path) -> Path:
    """The distinct-experts MoE, written once into ``cache``."""
    from helpers.moe_gguf import write_moe_model

    from llamacpp_instr.native import models

    dest = cache / "moe-distinct.gguf"
    if not dest.exists():
        write_moe_model(models.default_model(), dest, distinct=True)
    return dest


def measure(
    model: Path, rounds: int, tokens: int, threads: int, log: str
) -> dict[str, list[float]]:
    import llama_cpp

    from llamacpp_instr.native import bindings

    api = bindings.load()
    llm = llama_cpp.Llama(
        str(model), n_ctx=1024, n_threads=threads, n_threads_batch=threads, verbose=False
    )
    prompt = llm.tokenize(b"The capital of France is", add_bos=True)
    tg: dict[str, list[float]] = {lv: [] for lv in LEVELS}
    api.session_begin(llm.ctx, log, "detailed", {"bench": "moe_routing"})
    order = list(LEVELS)
    shuffler = random.Random(1)
    try:
        for _ in range(rounds):
            shuffler.shuffle(order)
            for lv in order:
                api.set_level(lv)
                llm.reset()
                llm.eval(prompt)
                t0 = time.perf_counter()
                for _ in range(tokens):
                    llm.eval([prompt[-1]])
                tg[lv].append(tokens / (time.perf_counter() - t0))
    finally:
        api.session_end("ok")
        llm.close()
    return tg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "moe_routing")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    model = model_path(args.cache)
    tg = measure(model, args.rounds, args.tokens, args.threads, str(args.cache / "bench.log"))
    ratios = [d / m for d, m in zip(tg["detailed"], tg["minimal"], strict=True)]
    ratio = statistics.median(ratios)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratio, ratio, ratio]
    report = "\n".join(
        [
            f"MoE of the bundled SmolLM2 (30 layers, 8 experts, top-2), {args.threads} threads, "
            f"{args.rounds} rounds of {args.tokens} generated tokens per level, one process.",
            "",
            "| level | generation tok/s (median) | over MINIMAL (paired median) | quartiles |",
            "|---|---|---|---|",
            f"| minimal | {statistics.median(tg['minimal']):.2f} | 1.000 | |",
            f"| detailed (routing recorded) | {statistics.median(tg['detailed']):.2f} | "
            f"{ratio:.3f} | {q[0]:.3f} to {q[2]:.3f} |",
            "",
            f"Target: at least 0.98x. {'Met' if ratio >= 0.98 else 'Not met'}.",
        ]
    )
    print(report)
    if args.write_docs:
        write_section("moe_routing", report)


if __name__ == "__main__":
    main()
