"""What recording the host's work between steps costs llama-server, in instructions: the same
server and requests as bench/host_overhead.py, run under callgrind, which other work on the
machine does not move.

    python bench/host_instructions.py [--requests 8] [--n-predict 32] [--parallel 8]
                                      [--server PATH] [--write-docs]

One llama-server under `valgrind --tool=callgrind`, opened at DETAILED, one warm-up round, then one
round at each level in the order minimal, detailed, detailed, minimal (SIGUSR1 switches it, as in
host_overhead.py); callgrind's counters are zeroed before a round and dumped after it. For each
round: the server's instructions per generated token, and those of the instrumentation's own code
(exclusive: the functions of libllama named llama_instr..., and its anonymous-namespace helpers,
which also count llama.cpp's own few: a bound from above). A round's total moves from one round
to the next by up to about 1 %, either way at either level (the server's threads poll while they
wait, and slots are reused by prompt similarity); the instrumentation's own count does not. The
system calls that write the log are not instructions of the process and are not counted here
(bench/host_overhead.py's CPU time carries them). Slow: about 3 minutes a round on 2 cores.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from helpers.tiny_gguf import write_big_vocab_model  # noqa: E402
from host_overhead import echo, one, start, switch  # noqa: E402

from llamacpp_instr.native import tools  # noqa: E402

ORDER = ("minimal", "detailed", "detailed", "minimal")
_LINE = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$")


def counts(dump: Path) -> tuple[int, int]:
    """A dump's instructions in all, and those of the instrumentation's own code (module doc)."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", str(dump)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    total = ours = 0
    for line in out.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        n, name = int(m.group(1).replace(",", "")), m.group(2)
        if "PROGRAM TOTALS" in name:
            total = n
        elif "libllama.so" in name and (
            "llama_instr" in name or name.startswith("???:(anonymous namespace)::")
        ):
            ours += n
    if total <= 0:
        raise SystemExit(f"{dump}: no program totals")
    return total, ours


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--server", type=Path, default=None, help="a llama-server to run instead")
    ap.add_argument("--write-docs", action="store_true", help="update docs/performance.md")
    args = ap.parse_args()
    exe = args.server or tools.build_tools(echo, programs=("llama-server",)) / "llama-server"
    rows = []
    with tempfile.TemporaryDirectory(prefix="host-instructions-") as name:
        tmp = Path(name)
        model = write_big_vocab_model(tmp / "big-vocab.gguf")
        log = tmp / "server.log"
        ns = argparse.Namespace(parallel=args.parallel, threads=1)
        callgrind = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/callgrind.out.%p")
        proc, port = start(exe, model, log, ns, wrap=callgrind, timeout=900)
        level = "detailed"

        def one_round() -> int:
            with ThreadPoolExecutor(args.parallel) as pool:
                jobs = [(port, i, args.n_predict) for i in range(args.requests)]
                return sum(pool.map(lambda job: one(*job), jobs))

        try:
            echo("  warm-up round (not counted)")
            one_round()
            for k, lv in enumerate(ORDER):
                if lv != level:
                    switch(proc, log, lv, timeout=120)
                    level = lv
                subprocess.run(
                    ["callgrind_control", "-z", str(proc.pid)],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                tokens = one_round()
                subprocess.run(
                    ["callgrind_control", "-d", f"round{k}", str(proc.pid)],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                echo(f"  round {k + 1}: {lv}, {tokens} tokens")
                rows.append((lv, tokens))
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=600)
        dumps = sorted(tmp.glob("callgrind.out.*.*"), key=lambda p: int(p.suffix[1:]))
        if len(dumps) != len(ORDER):
            raise SystemExit(f"{len(dumps)} callgrind dumps, expected {len(ORDER)}")
        measured = [(lv, tok, *counts(d)) for (lv, tok), d in zip(rows, dumps, strict=True)]
    lines = [
        f"llama-server under callgrind, `--parallel {args.parallel}`, `-t 1`, the tiny llama of a "
        f"131072-token vocabulary; a round is {args.requests} requests at once (a JSON schema, "
        f"repeat penalty 1.1, temperature 0.8, {args.n_predict} tokens at most), the level "
        "switched by SIGUSR1 in one server",
        "",
        "| round | level | tokens | instructions a token | the instrumentation's a token | share |",
        "|---|---|---|---|---|---|",
    ]
    for k, (lv, tok, total, ours) in enumerate(measured):
        lines.append(
            f"| {k + 1} | {lv} | {tok} | {total / tok:,.0f} | {ours / tok:,.0f} | "
            f"{ours / total:.3%} |"
        )

    def per_token(lv: str, own: bool) -> float:
        """The level's rounds' mean instructions a token (the instrumentation's with ``own``)."""
        vals = [(ours if own else total) / tok for m, tok, total, ours in measured if m == lv]
        return sum(vals) / len(vals)

    extra = per_token("detailed", True) - per_token("minimal", True)
    lines += [
        "",
        f"DETAILED's own work beyond MINIMAL's: {extra:,.0f} instructions a token, "
        f"{extra / per_token('minimal', False):.3%} of MINIMAL's instructions a token.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write_docs:
        from overhead import write_section

        write_section("host_instructions", text, script="bench/host_instructions.py")


if __name__ == "__main__":
    main()
