"""What recording the host's work between steps costs llama-server: DETAILED (every sampler, the
grammar and the server's own work timed) against MINIMAL (one total per step).

    python bench/host_overhead.py [--rounds 12] [--requests 16] [--n-predict 32] [--parallel 8]
                                  [--threads 1] [--server PATH] [--write-docs]

The patched llama-server of `instr build --tools` (or `--server`), with `--parallel 8` slots, on a
model of a 131072-token vocabulary (tests/tiny_gguf.py: sampling costs what it costs on a real
vocabulary while its steps stay cheap, the hardest case for the recording). Every request asks for
a JSON schema (a grammar) and repetition penalties at temperature 0.8, 8 at a time.

llama-server's level is set once, when LLAMA_INSTR_LOG opens its session, so the two levels are two
servers started side by side and kept for the whole run, each idle while the other serves. A round
sends the same requests to one, then the other, the order alternating round by round, so that the
shared machine's drift hits both alike. Tokens/s is the tokens the server predicted (its own
`tokens_predicted`) over the round's wall time; the server's CPU time per token (user + system,
from /proc) is the steadier view on a shared machine. Reported: each level's median, the ratio of
the medians and the median of the rounds' ratios (paired); the target is DETAILED at least 0.99x
MINIMAL in tokens/s. Both logs are checked to hold `host` records (DETAILED's with its samplers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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

from llamacpp_instr.native import tools  # noqa: E402

LEVELS = ("minimal", "detailed")
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def start(
    exe: Path, model: Path, level: str, log: Path, args: argparse.Namespace
) -> tuple[Any, int]:
    port = free_port()
    env = dict(os.environ, LLAMA_INSTR_LOG=str(log), LLAMA_INSTR_LEVEL=level)
    # the server's own log to a file: a pipe nobody reads fills up and stops the server
    err = log.with_suffix(".stderr").open("w")
    proc = subprocess.Popen(
        [str(exe), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
        + ["--parallel", str(args.parallel), "-c", str(args.parallel * 256)]
        + ["-t", str(args.threads), "--seed", "3"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=err,
        text=True,
    )
    wait_ready(port, proc, timeout=180, path="/health")
    return proc, port


def complete(port: int, i: int, n_predict: int, **more: Any) -> dict[str, Any]:
    """Request ``i`` of the bench (a JSON schema, repeat penalties, temperature 0.8; ``more``
    adds sampling parameters) to the server at ``port``: its response."""
    body = {
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


def check_log(log: Path, level: str) -> int:
    hosts = [json.loads(x) for x in log.read_text().splitlines() if '"type":"host"' in x]
    if not hosts:
        raise SystemExit(f"{log}: no host records at {level}")
    if level == "detailed" and not any("parts" in h for h in hosts):
        raise SystemExit(f"{log}: no samplers at detailed")
    return len(hosts)


def _ratios(v: dict[str, list[float]]) -> tuple[dict[str, float], float]:
    """Each level's median, and the median of the rounds' detailed / minimal."""
    paired = statistics.median(d / m for d, m in zip(v["detailed"], v["minimal"], strict=True))
    return {lv: statistics.median(x) for lv, x in v.items()}, paired


def report(
    tps: dict[str, list[float]],
    cpu: dict[str, list[float]],
    args: argparse.Namespace,
    records: dict[str, int],
) -> str:
    med, paired = _ratios(tps)
    cpu_med, cpu_paired = _ratios(cpu)
    spread = (max(tps["minimal"]) - min(tps["minimal"])) / med["minimal"]
    host = f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end"
    lines = [
        f"llama-server, `--parallel {args.parallel}`, `-t {args.threads}`, on a tiny llama of a "
        f"131072-token vocabulary; {args.requests} requests a round ({args.parallel} at a time), "
        f"each a JSON schema, repeat penalty 1.1, temperature 0.8, {args.n_predict} tokens at "
        f"most; {args.rounds} rounds, the levels alternated; {host}",
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
    ap.add_argument("--server", type=Path, default=None, help="a llama-server to run instead")
    ap.add_argument("--write-docs", action="store_true", help="update docs/performance.md")
    args = ap.parse_args()
    exe = args.server or tools.build_tools(echo, programs=("llama-server",)) / "llama-server"
    tps: dict[str, list[float]] = {lv: [] for lv in LEVELS}
    cpu: dict[str, list[float]] = {lv: [] for lv in LEVELS}
    with tempfile.TemporaryDirectory(prefix="host-overhead-") as tmp:
        model = write_big_vocab_model(Path(tmp) / "big-vocab.gguf")
        servers = {lv: start(exe, model, lv, Path(tmp) / f"{lv}.log", args) for lv in LEVELS}
        try:
            for lv in LEVELS:
                one_round(servers[lv], args)  # warm-up, not counted
            for k in range(args.rounds):
                for lv in LEVELS if k % 2 == 0 else LEVELS[::-1]:
                    t, c = one_round(servers[lv], args)
                    tps[lv].append(t)
                    cpu[lv].append(c)
                echo(
                    f"  round {k + 1}: "
                    + ", ".join(
                        f"{lv} {tps[lv][-1]:.1f} tok/s {cpu[lv][-1]:.2f} ms" for lv in LEVELS
                    )
                )
        finally:
            for proc, _ in servers.values():
                proc.send_signal(2)
                proc.communicate(timeout=120)
        records = {lv: check_log(Path(tmp) / f"{lv}.log", lv) for lv in LEVELS}
    text = report(tps, cpu, args, records)
    print(text)
    if args.write_docs:
        sys.path.insert(0, str(ROOT / "bench"))
        from overhead import write_section

        write_section("host_overhead", text, script="bench/host_overhead.py")


if __name__ == "__main__":
    main()
