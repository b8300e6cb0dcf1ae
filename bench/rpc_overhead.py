"""What recording a distributed run costs: tokens/s over ggml's RPC backend, with and without it.

    python bench/rpc_overhead.py [--model GGUF] [-n 32] [--rounds 9] [--threads 1] [--write-docs]

ggml-rpc-server on loopback (no proxy, no shaping; `instr build --tools`' build, patched or the
stock pin's) serves this machine's CPU; a client process (the installed patched build) offloads
every layer of the model to it and generates -n tokens greedily. Configurations, run
interleaved round by round (a new client process each run, the order shuffled every round) so
that drift of the shared machine hits every one alike:

- off:        the patched client and server, no session (nothing recorded);
- transfers:  a session at the detailed level, the server the stock pin's (it times nothing: the
              client records its commands and the splits' host times only);
- remote:     a session at the detailed level, the patched server timing every op of every graph
              and sending the times to the client;
- remote-min: the same at the minimal level.

tokens/s is the client's own: generated tokens after the first, over the time from the first to the
last (the prompt and the load excluded). Prints per configuration the median tokens/s and two
ratios to `off`: of the medians, and the median of the per-round ratios with a bootstrap 95 %
interval; `--write-docs` puts the table in docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from helpers import netsim  # noqa: E402
from tools_overhead import interval  # noqa: E402

from llamacpp_instr.native import models, tools  # noqa: E402

CONFIGS = ("off", "transfers", "remote", "remote-min")
PROMPT = "The capital of France is"


def echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("-n", type=int, default=32, help="generated tokens per run")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1, help="threads of the server and the client")
    ap.add_argument("--write-docs", action="store_true", help="update docs/performance.md")
    args = ap.parse_args()
    model = args.model or models.default_model()

    servers = [
        (None, 0.0, netsim.binary_server_command(exe / "ggml-rpc-server", args.threads))
        for exe in (
            tools.build_tools(echo, programs=("ggml-rpc-server",)),
            tools.build_tools(echo, programs=("ggml-rpc-server",), stock=True),
        )
    ]
    samples: dict[str, list[float]] = {c: [] for c in CONFIGS}
    rng = random.Random(0)
    with (
        tempfile.TemporaryDirectory(prefix="rpc-overhead-") as tmp,
        netsim.Network(servers, loopback=True) as net,
    ):
        patched, stock = net.endpoints
        for k in range(args.rounds):
            order = list(CONFIGS)
            rng.shuffle(order)
            for c in order:
                log = Path(tmp) / f"{c}-{k}.log" if c != "off" else None
                level = "minimal" if c == "remote-min" else "detailed"
                endpoint = stock if c == "transfers" else patched
                code = netsim.client_script(
                    model, [endpoint], args.n, PROMPT, log=log, level=level, threads=args.threads
                )
                out = netsim.run_python(code)
                tok_s = (len(out["tokens"]) - 1) / out["decode_s"]
                samples[c].append(tok_s)
                echo(f"  {c}: {tok_s:.1f} tokens/s")
                if log is not None:
                    log.unlink()
            echo(f"round {k + 1}/{args.rounds} done")

    lines = [
        f"{model.name}, every layer on one RPC server on loopback, {args.rounds} interleaved "
        f"rounds of {args.n} tokens, {args.threads} thread(s) each side; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "",
        "| configuration | tokens/s (median) | vs off (of the medians) "
        "| vs off (median of per-round ratios, 95 % interval) |",
        "|---|---|---|---|",
    ]
    base = statistics.median(samples["off"])
    for c in CONFIGS:
        med = statistics.median(samples[c])
        ratios = [x / o for x, o in zip(samples[c], samples["off"], strict=True)]
        lo, hi = interval(ratios)
        lines.append(
            f"| {c} | {med:.1f} | {med / base:.3f}x | "
            f"{statistics.median(ratios):.3f}x ({lo:.3f}-{hi:.3f}) |"
        )
    report = "\n".join(lines)
    print(report)
    if args.write_docs:
        from overhead import write_section

        write_section("rpc", report, script="bench/rpc_overhead.py")


if __name__ == "__main__":
    main()
