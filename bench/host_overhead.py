"""What recording the host's work between steps costs llama-server: DETAILED (every sampler, the
grammar and the server's own work timed) against MINIMAL (one total per step).

    python bench/host_overhead.py [--rounds 12] [--requests 16] [--n-predict 32] [--parallel 8]
                                  [--threads 1] [--blocks-s 60] [--block-ms 250]
                                  [--body-kb 0] [--server PATH] [--write-docs]

The patched llama-server of `instr build --tools` (or `--server`), with `--parallel 8` slots, on a
model of a 131072-token vocabulary (tests/tiny_gguf.py: sampling costs what it costs on a real
vocabulary while its steps stay cheap, the hardest case for the recording). Every request asks for
a JSON schema (a grammar) and repetition penalties at temperature 0.8, 8 at a time. With
`--body-kb K`, each body also carries K KiB of text in a field llama-server ignores: what DETAILED
records of a request's body for a replay (parsed and written again) is then of that size, and
nothing else of the server's work changes.

One server runs the whole bench, opened at DETAILED; SIGUSR1 switches its level between MINIMAL
and DETAILED from the next step (the bench waits for the server's line saying so). A round sends
the same requests at one level, then at the other, the order alternating round by round, so that
the shared machine's drift hits both alike and both levels share one process, one heap and one
address layout. Tokens/s is the tokens the server predicted (its own `tokens_predicted`) over the
round's wall time; the server's CPU time per token (user + system, from /proc) is the steadier
view on a shared machine. Reported: each level's median, the ratio of the medians and the median
of the rounds' ratios (paired); the target is DETAILED at least 0.99x MINIMAL in tokens/s. The
log is checked: every step a round began is at that round's level, and
the host records of each level are counted (DETAILED's with its samplers).

A round's paired ratio moves by 8-10 % on a shared 2-core VM (its speed drifts over seconds), so
rounds cannot resolve 1 %. Then, in the same server, blocks: requests back to back on every slot
for --blocks-s while the level switches every --block-ms or so, and each level's tokens/s read
from the log's own step clock (a generation step's time runs from its start to the next step's:
its decode and the host's work after it), neighbouring blocks paired: the drift is nearly the same
a quarter second apart, and a minute holds hundreds of pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from helpers.support import free_port, wait_ready  # noqa: E402
from helpers.tiny_gguf import write_big_vocab_model  # noqa: E402
from tools_overhead import interval  # noqa: E402

from llamacpp_instr.native import tools  # noqa: E402

LEVELS = ("minimal", "detailed")
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def start(
    exe: Path,
    model: Path,
    log: Path,
    args: argparse.Namespace,
    wrap: tuple[str, ...] = (),
    timeout: float = 180,
) -> tuple[Any, int]:
    """llama-server (under ``wrap``, a command such as valgrind's, if given) at DETAILED, logging
    to ``log``, once it answers /health within ``timeout`` s: the process and its port."""
    port = free_port()
    env = dict(os.environ, LLAMA_INSTR_LOG=str(log), LLAMA_INSTR_LEVEL="detailed")
    # the server's own log to a file: a pipe nobody reads fills up and stops the server
    err = log.with_suffix(".stderr").open("w")
    proc = subprocess.Popen(
        [*wrap, str(exe), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
        + ["--no-webui"]
        + ["--parallel", str(args.parallel), "-c", str(args.parallel * 256)]
        + ["-t", str(args.threads), "--seed", "3"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=err,
        text=True,
    )
    wait_ready(port, proc, timeout=timeout, path="/health")
    return proc, port


def switch(proc: Any, log: Path, level: str, timeout: float = 30) -> None:
    """SIGUSR1 to the server, then wait for its line saying it records at ``level``."""
    said = log.with_suffix(".stderr")
    n = said.read_text(errors="replace").count("SIGUSR1: recording at")
    proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [
            x for x in said.read_text(errors="replace").splitlines() if "SIGUSR1: recording at" in x
        ]
        if len(lines) > n:
            if f"recording at {level} " not in lines[-1]:
                raise SystemExit(f"the server switched to something else: {lines[-1]}")
            return
        time.sleep(0.01)
    raise SystemExit(f"the server did not say it switched its level within {timeout:.0f} s")


# --body-kb's text, set by main: a body's field the server ignores and DETAILED records
BODY_PAD: dict[str, str] = {}


def complete(port: int, i: int, n_predict: int, **more: Any) -> dict[str, Any]:
    """Request ``i`` of the bench (a JSON schema, repeat penalties, temperature 0.8; ``more``
    adds sampling parameters) to the server at ``port``: its response."""
    body = {
        **BODY_PAD,
        "prompt": f"Request {i}: write a short note.",
        "n_predict": n_predict,
        "temperature": 0.8,
        "repeat_penalty": 1.1,
        "json_schema": SCHEMA,
        "cache_prompt": False,
        "seed": i,
        **more,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return dict(json.loads(r.read()))


def one(port: int, i: int, n_predict: int) -> int:
    return int(complete(port, i, n_predict)["tokens_predicted"])


def cpu_s(pid: int) -> float:
    """CPU seconds the process has used (user + system): what the server spent, much less
    sensitive than wall time to other work on a shared machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(server: tuple[Any, int], args: argparse.Namespace) -> tuple[float, float]:
    """Tokens/s, and the server's CPU ms per token, over one round."""
    proc, port = server
    c0, t0 = cpu_s(proc.pid), time.perf_counter()
    with ThreadPoolExecutor(args.parallel) as pool:
        tokens = sum(pool.map(lambda i: one(port, i, args.n_predict), range(args.requests)))
    return tokens / (time.perf_counter() - t0), (cpu_s(proc.pid) - c0) * 1000 / tokens


def check_log(log: Path, windows: list[tuple[str, int, int]]) -> dict[str, int]:
    """Every step begun inside a round's window is at that round's level; each level's host
    records, counted (DETAILED's must name samplers)."""
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    for level, t0, t1 in windows:
        seen = {r["level"] for r in recs if r["type"] == "step_begin" and t0 <= r["ts"] <= t1}
        if seen != {level}:
            raise SystemExit(f"{log}: a round at {level} has steps at {sorted(seen)}")
    hosts = [r for r in recs if r["type"] == "host"]
    counts = {lv: sum(1 for h in hosts if h["level"] == lv) for lv in LEVELS}
    if not all(counts.values()):
        raise SystemExit(f"{log}: host records by level {counts}")
    if not any("parts" in h for h in hosts if h["level"] == "detailed"):
        raise SystemExit(f"{log}: no samplers at detailed")
    return counts


def blocks_phase(server: tuple[Any, int], log: Path, args: argparse.Namespace, level: str) -> str:
    """Requests back to back on every slot for ``args.blocks_s`` s while the level switches
    every ``args.block_ms`` ms or so (0.5 to 1.5 times it, at random: nothing periodic in the
    server lines up with it); the level in force at the end."""
    import random
    import threading

    proc, port = server
    stop = threading.Event()
    rng = random.Random(7)

    def worker(w: int) -> None:
        for i in range(w, 1 << 30, args.parallel):
            if stop.is_set():
                return
            one(port, 10_000 + i, args.n_predict)

    with ThreadPoolExecutor(args.parallel) as pool:
        running = [pool.submit(worker, w) for w in range(args.parallel)]
        end = time.monotonic() + args.blocks_s
        try:
            while time.monotonic() < end:
                time.sleep(args.block_ms / 1000 * rng.uniform(0.5, 1.5))
                level = LEVELS[1 - LEVELS.index(level)]
                switch(proc, log, level)
        finally:
            stop.set()
        for f in running:
            f.result()
    return level


def block_ratios(log: Path, t0: int) -> tuple[dict[str, float], list[float]]:
    """From the log's steps begun after ``t0``: each level's tokens/s over its generation steps
    (every sequence of the batch one token: a prompt's steps left out), a step's time running
    from its start to the next step's start (its decode and all the host's work after it),
    leaving out each step followed by one at the other level (a switch fell in its time); and,
    for each two neighbouring blocks of steps at the two levels, DETAILED's tokens/s over
    MINIMAL's."""
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    steps = [r for r in recs if r["type"] == "step_begin" and r["ts"] >= t0]
    outputs = {r["step"]: r["n_outputs"] for r in recs if r["type"] == "step_end"}
    blocks: list[list[Any]] = []  # [level, ns, tokens]
    for s, nxt in zip(steps, steps[1:], strict=False):
        if s["level"] != nxt["level"]:
            blocks.append(["switch", 0, 0])
            continue
        gen = all(q[1] == 1 for q in s.get("seqs", [[0, s["n_tokens"]]]))
        if not gen or s["step"] not in outputs:
            continue
        if blocks and blocks[-1][0] == s["level"]:
            blocks[-1][1] += nxt["ts"] - s["ts"]
            blocks[-1][2] += outputs[s["step"]]
        else:
            blocks.append([s["level"], nxt["ts"] - s["ts"], outputs[s["step"]]])
    kept = [b for b in blocks if b[0] in LEVELS and b[2] > 0]
    rate = {
        lv: 1e9 * sum(b[2] for b in kept if b[0] == lv) / sum(b[1] for b in kept if b[0] == lv)
        for lv in LEVELS
    }
    pairs = []
    for a, b in zip(kept, kept[1:], strict=False):
        if a[0] != b[0]:
            d, m = (a, b) if a[0] == "detailed" else (b, a)
            pairs.append((d[2] / d[1]) / (m[2] / m[1]))
    return rate, pairs


def _ratios(v: dict[str, list[float]]) -> tuple[dict[str, float], float]:
    """Each level's median, and the median of the rounds' detailed / minimal."""
    paired = statistics.median(d / m for d, m in zip(v["detailed"], v["minimal"], strict=True))
    return {lv: statistics.median(x) for lv, x in v.items()}, paired


def report(
    tps: dict[str, list[float]],
    cpu: dict[str, list[float]],
    args: argparse.Namespace,
    records: dict[str, int],
    blocks: tuple[dict[str, float], list[float]] | None = None,
) -> str:
    med, paired = _ratios(tps)
    cpu_med, cpu_paired = _ratios(cpu)
    spread = (max(tps["minimal"]) - min(tps["minimal"])) / med["minimal"]
    host = f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end"
    lines = [
        f"llama-server, `--parallel {args.parallel}`, `-t {args.threads}`, on a tiny llama of a "
        f"131072-token vocabulary; {args.requests} requests a round ({args.parallel} at a time), "
        f"each a JSON schema, repeat penalty 1.1, temperature 0.8, {args.n_predict} tokens at "
        f"most{f', a body of {args.body_kb} KiB more (recorded at detailed)' if args.body_kb else ''}"
        f"; {args.rounds} rounds, the levels alternated in one server (SIGUSR1); {host}",
        "",
        "| level | tokens/s (median of rounds) | vs minimal | paired | server CPU ms per token "
        "| vs minimal | paired | host records |",
        "|---|---|---|---|---|---|---|---|",
        f"| minimal | {med['minimal']:.1f} | 1.000x | 1.000x | {cpu_med['minimal']:.2f} | 1.000x "
        f"| 1.000x | {records['minimal']} |",
        f"| detailed | {med['detailed']:.1f} | {med['detailed'] / med['minimal']:.3f}x | "
        f"{paired:.3f}x | {cpu_med['detailed']:.2f} | "
        f"{cpu_med['detailed'] / cpu_med['minimal']:.3f}x | {cpu_paired:.3f}x | "
        f"{records['detailed']} |",
        "",
        f"Noise: minimal's own rounds spread {spread:.0%} in tokens/s (max - min over median).",
    ]
    if blocks is not None:
        rate, pairs = blocks
        lo, hi = interval(pairs, share=0.90)
        lines += [
            "",
            f"Levels switched every {args.block_ms / 2:.0f}-{1.5 * args.block_ms:.0f} ms under a "
            f"steady load ({args.blocks_s:.0f} s, requests back to back on every slot), each "
            "generation step timed from its start to the next one's by the log's clock (a step "
            f"with a switch in its time left out): minimal {rate['minimal']:.1f} tok/s, detailed "
            f"{rate['detailed']:.1f}, **{rate['detailed'] / rate['minimal']:.3f}x**; the median "
            f"of {len(pairs)} neighbouring blocks' ratios {statistics.median(pairs):.3f}x "
            f"(bootstrap 90 %: {lo:.3f}-{hi:.3f}x), their standard deviation "
            f"{statistics.pstdev(pairs):.1%}.",
        ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument(
        "--threads", type=int, default=1, help="llama-server -t (1: no spinning barrier)"
    )
    ap.add_argument(
        "--blocks-s",
        type=float,
        default=60,
        help="then the levels switched every --block-ms "
        "under a steady load for this long (0: not)",
    )
    ap.add_argument("--block-ms", type=float, default=250)
    ap.add_argument("--body-kb", type=int, default=0, help="KiB of text a body carries besides")
    ap.add_argument("--server", type=Path, default=None, help="a llama-server to run instead")
    ap.add_argument("--write-docs", action="store_true", help="update docs/performance.md")
    args = ap.parse_args()
    if args.body_kb > 0:
        words = "the quick brown fox jumps over the lazy dog near the river bank "
        BODY_PAD["note"] = (words * (args.body_kb * 1024 // len(words) + 1))[: args.body_kb * 1024]
    exe = args.server or tools.build_tools(echo, programs=("llama-server",)) / "llama-server"
    tps: dict[str, list[float]] = {lv: [] for lv in LEVELS}
    cpu: dict[str, list[float]] = {lv: [] for lv in LEVELS}
    windows: list[tuple[str, int, int]] = []
    with tempfile.TemporaryDirectory(prefix="host-overhead-") as tmp:
        model = write_big_vocab_model(Path(tmp) / "big-vocab.gguf")
        log = Path(tmp) / "server.log"
        server = start(exe, model, log, args)
        level = "detailed"
        try:
            one_round(server, args)  # warm-up, not counted
            for k in range(args.rounds):
                for lv in LEVELS if k % 2 == 0 else LEVELS[::-1]:
                    if lv != level:
                        switch(server[0], log, lv)
                        level = lv
                    t0 = time.monotonic_ns()  # the log's clock (CLOCK_MONOTONIC)
                    t, c = one_round(server, args)
                    windows.append((lv, t0, time.monotonic_ns()))
                    tps[lv].append(t)
                    cpu[lv].append(c)
                echo(
                    f"  round {k + 1}: "
                    + ", ".join(
                        f"{lv} {tps[lv][-1]:.1f} tok/s {cpu[lv][-1]:.2f} ms" for lv in LEVELS
                    )
                )
            t_blocks = time.monotonic_ns()
            if args.blocks_s > 0:
                echo(f"  {args.blocks_s:.0f} s of blocks ...")
                level = blocks_phase(server, log, args, level)
        finally:
            server[0].send_signal(signal.SIGINT)
            server[0].communicate(timeout=120)
        records = check_log(log, windows)
        blocks = block_ratios(log, t_blocks) if args.blocks_s > 0 else None
    text = report(tps, cpu, args, records, blocks)
    print(text)
    if args.write_docs:
        sys.path.insert(0, str(ROOT / "bench"))
        from overhead import write_section

        write_section("host_overhead", text, script="bench/host_overhead.py")


if __name__ == "__main__":
    main()
