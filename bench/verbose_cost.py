"""What each level costs a generated token, in instructions: SmolLM2-135M, one thread, callgrind.

Instruction counts do not move with other work on the machine, so they show where a level's time
goes, and what a change saves, where wall-clock ratios (bench/overhead.py) cannot be trusted: a
shared machine. For each level a fresh process loads the model, decodes the prompt and a few tokens
at that level, then callgrind's instrumentation is switched on (callgrind_control) for TOKENS
generated tokens only. It prints the instructions per token of each level, their ratio to
MINIMAL's, and at VERBOSE the instrumentation's own functions that cost the most (inclusive).

    python bench/verbose_cost.py [--tokens 8] [--top 12] [--write-docs]
    python bench/verbose_cost.py --cpu-time 40 [--write-docs]   # VERBOSE vs MINIMAL, CPU time

``--cpu-time ROUNDS`` needs no valgrind: one thread (ggml computes on the calling thread), MINIMAL
and VERBOSE alternated in a shuffled order over ROUNDS rounds of 16 generated tokens in one session,
each timed in the thread's CPU time (what it consumed, not its wait for a core: steadier than wall
time on a shared machine, though other work still moves it through the caches); prints the median
CPU ns per token of each and the median of each round's MINIMAL / VERBOSE.

Needs valgrind. Valgrind runs no AVX-512: on a CPU that has it, run it on libraries built for
AVX2, e.g. ``python patches/devtree.py build DIR --cmake-arg=-DGGML_NATIVE=OFF
--cmake-arg=-DGGML_AVX2=ON --cmake-arg=-DGGML_FMA=ON --cmake-arg=-DGGML_F16C=ON`` and
``LLAMA_CPP_LIB_PATH=DIR/build/bin``. One thread: callgrind runs threads one at a time, so a
worker's wait for another is counted as the instructions it spins, not as time.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LEVELS = ["minimal", "detailed", "verbose"]
PROMPT = b"The capital of France is"


def child(level: str, tokens: int, log: str) -> None:
    """The measured process: ready, then (instrumented) ``tokens`` generated tokens, then done;
    each step waits for a line on stdin."""
    import llama_cpp

    from llamacpp_instr.native import bindings, models

    llm = llama_cpp.Llama(
        str(models.default_model()), n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False
    )
    api = bindings.load()
    api.session_begin(llm.ctx, log, "minimal", {"bench": "verbose_cost"})
    api.set_level(level)
    base = llm.tokenize(PROMPT, add_bos=True)
    llm.eval(base)
    for _ in range(3):  # the one-token graph built and its table written
        llm.eval([base[2]])
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(tokens):
        llm.eval([base[2]])
    print("done", flush=True)
    sys.stdin.readline()
    api.session_end("ok")


def cpu_time(rounds: int, log: str) -> str:
    """``--cpu-time``: MINIMAL and VERBOSE alternated, each round's 16 tokens in thread CPU time;
    the line that says what it measured."""
    import random
    import statistics
    import time

    import llama_cpp

    from llamacpp_instr.native import bindings, models

    llm = llama_cpp.Llama(
        str(models.default_model()), n_ctx=1024, n_threads=1, n_threads_batch=1, verbose=False
    )
    api = bindings.load()
    api.session_begin(llm.ctx, log, "minimal", {"bench": "verbose_cost --cpu-time"})
    base = llm.tokenize(PROMPT, add_bos=True)
    ns: dict[str, list[float]] = {"minimal": [], "verbose": []}
    shuffler = random.Random(3)
    for _ in range(rounds):
        order = list(ns)
        shuffler.shuffle(order)
        for level in order:
            api.set_level(level)
            llm.reset()
            llm.eval(base)
            llm.eval([base[2]])  # (the one-token graph)
            t0 = time.thread_time_ns()
            for _ in range(16):
                llm.eval([base[2]])
            ns[level].append((time.thread_time_ns() - t0) / 16)
    api.session_end("ok")
    paired = statistics.median(m / v for m, v in zip(ns["minimal"], ns["verbose"], strict=True))
    return (
        f"Thread CPU time per generated token, one thread, {rounds} rounds of 16 tokens, MINIMAL "
        f"and VERBOSE alternated in one session: MINIMAL {statistics.median(ns['minimal']):,.0f} "
        f"ns, VERBOSE {statistics.median(ns['verbose']):,.0f} ns; MINIMAL / VERBOSE, the median "
        f"of each round's: {paired:.3f}."
    )


def measure(level: str, tokens: int, work: Path) -> Path:
    """callgrind's output for ``tokens`` generated tokens at ``level``."""
    out = work / f"{level}.callgrind"
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    cmd += [sys.executable, __file__, "--child", level, "--tokens", str(tokens)]
    cmd += ["--log", str(work / f"{level}.log")]
    p = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert p.stdin is not None and p.stdout is not None
    for state in ("on", "off"):
        line = p.stdout.readline()
        if not line:
            sys.exit(
                f"the {level} run ended early (exit {p.wait()}): does valgrind run this build?"
            )
        ctl = ["callgrind_control", "-i", state, str(p.pid)]
        subprocess.run(ctl, check=True, capture_output=True)
        p.stdin.write("go\n")
        p.stdin.flush()
    p.wait()
    return out


def total(out: Path) -> int:
    m = re.search(r"^totals: (\d+)", out.read_text(), re.M)
    assert m, out
    return int(m.group(1))


def top(out: Path, n: int, tokens: int) -> list[str]:
    """The instrumentation's functions (llama-instr sources, to_chars) by inclusive count."""
    r = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--auto=no", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in r.stdout.splitlines():
        m = re.match(r"\s*([\d,]+) \(.*?\)\s+(\S+?):(.*?)(?: \[.*)?$", line)
        if m and ("llama-instr" in m.group(2) or "to_chars" in m.group(3)):
            per = int(m.group(1).replace(",", "")) / tokens
            rows.append(f"{per:>12,.0f}  {m.group(3)[:100]}")
    return rows[:n]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--cpu-time", type=int, metavar="ROUNDS", help="thread CPU time, no valgrind")
    ap.add_argument(
        "--write-docs", action="store_true", help="update docs/performance.md's section"
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--log", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.tokens, args.log)
        return
    lib = os.environ.get("LLAMA_CPP_LIB_PATH")
    lines = [f"Libraries: {'the installed wheel' if lib is None else 'a build of this tree'}."]
    with tempfile.TemporaryDirectory() as tmp:
        if args.cpu_time:
            lines += ["", cpu_time(args.cpu_time, str(Path(tmp) / "cpu.log"))]
        else:
            outs = {lv: measure(lv, args.tokens, Path(tmp)) for lv in LEVELS}
            per = {lv: total(out) / args.tokens for lv, out in outs.items()}
            lines += [
                "",
                f"Instructions per generated token (callgrind, one thread, {args.tokens} tokens):",
                "",
                "| level | instructions | MINIMAL / level |",
                "|---|---|---|",
            ]
            lines += [
                f"| {lv} | {per[lv]:,.0f} | {per['minimal'] / per[lv]:.3f} |" for lv in LEVELS
            ]
            lines += ["", "VERBOSE's own functions, per token (inclusive):", "", "```"]
            lines += top(outs["verbose"], args.top, args.tokens)
            lines += ["```"]
    report = "\n".join(lines)
    print(report)
    if args.write_docs:
        from overhead import write_section

        name = "verbose_cpu_time" if args.cpu_time else "verbose_cost"
        write_section(name, report, script="bench/verbose_cost.py")


if __name__ == "__main__":
    main()
