"""The replay client's own cost: `instr replay --url` over a 10,000-request log against a stand-in
that answers at once, so that what is measured is the client, not a model.

    python bench/replay_client.py [--requests 10000] [--rate 250] [--write-docs]

The log is a llama-server log as `instr exec` records it at detailed: a request record per request
with its body (a prompt of 20 to 80 words, `n_predict` 4; a third of them streamed, a tenth chat
completions) and its tokens, arriving at `--rate` a second, evenly. The stand-in (this script with
`--stand-in`, in its own process: its CPU is not the client's) answers each as llama-server does,
whole or streamed (one chunk per token, then `timings`), without waiting.

Measured, in one run:
- the client's CPU time per request: `instr replay` as a user runs it (reading the log, the plan,
  sending, the responses file, the figures, the report), from the kernel's account of the child
  (user + system), minus the same command on the log's first request only (start-up: Python, the
  imports, the log's reading), over the requests. Target: under 1 ms a request on 2 cores;
- how late each request went out against its recorded time (the replay's own `sent` against the
  plan, in process through the same client): median, p99, max;
- the requests that failed (none should).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORDS = "the river runs past the mill and the market where farmers sell apples and pears".split()
TIMINGS = {"cache_n": 0, "prompt_n": 30, "prompt_ms": 2.0, "predicted_n": 4, "predicted_ms": 3.0}


def write_log(path: Path, n: int, rate: float) -> None:
    """A server's log of ``n`` requests at ``rate`` a second, each with its body and tokens."""
    sid = "bench-replay"
    lines = [{"type": "session_start", "ts": 0, "sid": sid, "level": "detailed", "version": 1}]
    for i in range(n):
        t = int(1e9 + i * 1e9 / rate)
        prompt = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(20 + i % 61))
        body: dict[str, object] = {"n_predict": 4, "temperature": 0, "seed": i}
        endpoint = "/completion"
        if i % 10 == 9:
            endpoint = "/v1/chat/completions"
            body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 4}
        else:
            body["prompt"] = prompt
        body["stream"] = i % 3 == 0
        lines.append(
            {"type": "request", "ts": t + 5_000_000, "sid": sid, "id": f"task-{i}",
             "endpoint": endpoint, "method": "POST", "status": 200, "outcome": "ok",
             "stream": body["stream"], "t_arrive": t, "wait": 10_000, "ttft": 2_000_000,
             "model": 4_000_000, "dur": 5_000_000, "prompt_tokens": 30, "gen_tokens": 3,
             "slot": i % 4, "body": body, "body_bytes": len(json.dumps(body)),
             "gen_ids": [1, 2, 3, 4]}
        )  # fmt: skip
    lines.append({"type": "session_end", "ts": int(2e9 + n * 1e9 / rate), "sid": sid})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """HTTP/1.1 with keep-alive: each request answered at once, whole or as server-sent events."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            size = 0
            for h in lines[1:]:
                if h.lower().startswith("content-length:"):
                    size = int(h.split(":", 1)[1])
            body = json.loads(await reader.readexactly(size)) if size else {}
            chat = path.endswith("chat/completions")
            if not body.get("stream"):
                if chat:
                    obj = {"choices": [{"message": {"content": "a b c d"}}], "timings": TIMINGS}
                else:
                    obj = {"content": "a b c d", "tokens_predicted": 4, "timings": TIMINGS}
                data = json.dumps(obj).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(data)).encode()
                    + b"\r\n\r\n"
                    + data
                )
            else:
                events = [{"content": f" t{k}"} for k in range(4)]
                events.append({"content": "", "stop": True, "timings": TIMINGS})
                data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: "
                    + str(len(data)).encode()
                    + b"\r\n\r\n"
                    + data
                )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def stand_in(port: int) -> None:
    async def serve() -> None:
        server = await asyncio.start_server(_answer, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_of(cmd: list[str]) -> tuple[float, str]:
    """The CPU seconds (user + system) of a child running ``cmd``, and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])}...: exit {r.returncode}: {r.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, r.stdout


def lateness(log: Path, url: str) -> tuple[list[float], int]:
    """How late each request went out against its plan (ms), through the replay's own client, and
    how many failed."""
    from llamacpp_instr.converters.session.replay_log import Selection, read_served
    from llamacpp_instr.running.replay.client import send_all
    from llamacpp_instr.running.replay.media import MediaFolder
    from llamacpp_instr.running.replay.plan import make_plan

    served = read_served(log, Selection())
    plan = make_plan(str(log), served.requests, 1.0, MediaFolder(None))
    sent = send_all(url, plan, MediaFolder(None), lambda r, t: None, lambda: None)
    late = [(r.sent_ns - s.at_ns) / 1e6 for r, s in zip(sent, plan.sends, strict=True)]
    return late, sum(1 for r in sent if not r.ok)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=250.0, help="requests a second")
    ap.add_argument("--stand-in", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    if args.stand_in is not None:
        stand_in(args.stand_in)
        return
    port = _free_port()
    server = subprocess.Popen([sys.executable, __file__, "--stand-in", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        time.sleep(1.0)
        with tempfile.TemporaryDirectory(prefix="replay-client-") as tmp:
            log = Path(tmp) / "server.log"
            write_log(log, args.requests, args.rate)
            cli = [sys.executable, "-m", "llamacpp_instr.cli", "replay", str(log), "--url", url]
            cli += ["-o", str(Path(tmp) / "new.log"), "--format", "json"]
            base, _ = _cpu_of([*cli, "--first", "1"])
            full, out = _cpu_of(cli)
            rows = json.loads(out)["requests"]
            failed = sum(1 for r in rows if not r["ok"])
            late, failed_late = lateness(log, url)
    finally:
        server.terminate()
        server.wait(30)
    n = args.requests
    per = (full - base) / (n - 1) * 1e3
    late.sort()
    report = "\n".join(
        [
            f"`instr replay --url` over a log of {n:,} requests at {args.rate:g} a second (a third "
            "streamed, a tenth chat), against a stand-in answering at once in its own process; "
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "",
            "| figure | value |",
            "|---|---|",
            f"| the client's CPU, the whole command | {full:.2f} s |",
            f"| start-up (the same command on the first request only) | {base:.2f} s |",
            f"| **CPU per request** (target < 1 ms) | **{per:.3f} ms** |",
            f"| sent late against the recorded time: median, p99, max | "
            f"{statistics.median(late):.3f}, {late[int(0.99 * (len(late) - 1))]:.3f}, "
            f"{late[-1]:.3f} ms |",
            f"| requests failed | {failed} of {len(rows)}; {failed_late} of {len(late)} |",
        ]
    )
    print(report)
    if args.write_docs:
        sys.path.insert(0, str(ROOT / "bench"))
        from overhead import write_section

        write_section("replay_client", report, script="bench/replay_client.py")


if __name__ == "__main__":
    main()
