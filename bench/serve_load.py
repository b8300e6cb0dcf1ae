"""llama-server under sustained concurrent load, with the instrument off and on.

    python bench/serve_load.py [--model GGUF] [--requests 80] [--rounds 4] [--concurrency 8]
                               [--parallel 4] [--threads 2] [--rss-requests 1600] [--write-docs]
                               [--draft-layers K]

The patched llama-server of `instr build --tools` at `--parallel 4`, driven on loopback by the real
`openai` client at concurrency 8, in rounds, the configurations interleaved round by round (so
that drift of the shared machine hits each alike):

- off:      the server alone (LLAMA_INSTR_LOG unset);
- minimal:  `instr exec --level minimal`;
- sampled:  `instr exec --level detailed --sample 16 --max-bytes 64M --keep 8` (the always-on
            configuration of the issue);
- detailed: `instr exec --level detailed`.
- exported: sampled, plus `--metrics` (the Prometheus exporter beside the server) and a
            real Prometheus (Debian's `prometheus`) scraping it every second; its ratios to
            sampled, the same run without the exporter, are the exporter's cost (targets:
            requests/s >= 0.98x, p99 <= 1.05x), and Prometheus' own count of its scrapes says it
            scraped.

Each round is a fixed list of requests (the same in every configuration and round): mixed prompt
lengths (8 to 64 words), mixed max_tokens (4 to 16), a third of them streamed, one in ten of those dropped by the client
after its second token, and one in forty refused by the server (a prompt longer than a slot's
context: HTTP 400). Per configuration: requests/s (completed requests over the round's wall
time) and p50/p99 latency of the requests that completed, as ratios to off in the same round
(median over rounds, with the spread of off's own rounds as the run's noise); the server's CPU
time per request (user + system, from /proc: far less sensitive to other work on the machine
than wall time) as a ratio to off's; log bytes per request; the server's RSS growth over the
round; and the log checked: every line of every file
parses, each file begins with session_start, and each request the client made has exactly one
`request` record with the outcome the client saw (ok, error, cancelled), none missing.

Then one long run of off and one of the always-on configuration: the server's RSS after 100 and
after 1,000 requests, and on to `--rss-requests` (1,600: the always-on log rotates past 64 MiB),
the always-on log checked as the rounds' are.

With `--draft-layers K` every configuration speculates: a draft made of the model's
first K layers (`tests/helpers/draft_gguf.py`), `-md` with `--spec-type draft-simple`, so that the
instrument's cost includes the speculation records (a `spec` record per verify step, the
requests' `spec` objects); its section of docs/performance.md is `serve_load_draft`.

Bounded in count (the request lists) and time (every request has a timeout; a round that runs past
`--round-timeout` fails the run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "tests"))

from helpers.prometheus_server import Prometheus  # noqa: E402

from llamacpp_instr.native import models, tools  # noqa: E402

CONFIGS = {
    "off": None,
    "minimal": ["--level", "minimal"],
    "sampled": ["--level", "detailed", "--sample", "16", "--max-bytes", "64M", "--keep", "8"],
    "detailed": ["--level", "detailed"],
    "exported": ["--level", "detailed", "--sample", "16", "--max-bytes", "64M", "--keep", "8"],
}
EXPORTED_VS = "sampled"  # the exporter's cost: exported against the same configuration without it
TARGETS = {"minimal": 0.98, "sampled": 0.98}  # requests/s vs off; p99 latency <= 1.05x
P99_TARGET = 1.05

WORDS = (
    "the river ran past the old mill where the miller kept his accounts in a book bound in red "
    "leather and every evening he counted the sacks of flour that the carts had taken to town"
).split()


def echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Req:
    """One request of the fixed list."""

    i: int
    prompt: str
    max_tokens: int
    stream: bool
    drop: bool  # the client goes away after its second token
    refused: bool  # a prompt past the slot's context: the server answers 400

    @property
    def expect(self) -> str:
        return "error" if self.refused else "cancelled" if self.drop else "ok"


def request_list(n: int, ctx_per_slot: int) -> list[Req]:
    out = []
    for i in range(n):
        length = (8, 16, 32, 64)[i % 4]
        words = [WORDS[(i * 7 + j) % len(WORDS)] for j in range(length)]
        refused = i % 40 == 39
        if refused:
            words = words * (ctx_per_slot // len(words) + 2)  # more tokens than a slot holds
        stream = i % 3 == 1
        out.append(
            Req(
                i=i,
                prompt=" ".join(words),
                max_tokens=(4, 8, 12, 16)[(i // 4) % 4],
                stream=stream,
                drop=stream and i % 10 == 4,
                refused=refused,
            )
        )
    return out


@dataclass
class Outcome:
    req: Req
    seen: str  # ok, error, cancelled: what the client saw
    latency: float  # s, arrival to the end of the response (or the drop)
    status: int = 200


def send(client: Any, r: Req) -> Outcome:
    import openai

    t0 = time.monotonic()
    try:
        if r.stream:
            stream = client.completions.create(
                model="m",
                prompt=r.prompt,
                max_tokens=r.max_tokens,
                temperature=0,
                stream=True,
            )
            got = 0
            for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    got += 1
                    if r.drop and got == 2:
                        stream.close()  # the client goes away mid-stream
                        return Outcome(r, "cancelled", time.monotonic() - t0)
            return Outcome(r, "ok", time.monotonic() - t0)
        client.completions.create(
            model="m", prompt=r.prompt, max_tokens=r.max_tokens, temperature=0
        )
        return Outcome(r, "ok", time.monotonic() - t0)
    except openai.APIStatusError as exc:
        return Outcome(r, "error", time.monotonic() - t0, exc.status_code)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_s(pid: int) -> float:
    """CPU seconds the process has used (user + system, all its threads): what the server spent,
    much less sensitive than wall time to other work on a shared machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """llama-server, alone (off) or under `instr exec`, until stop()."""

    def __init__(
        self, config: str, model: Path, log: Path, args: argparse.Namespace, exe: Path
    ) -> None:
        self.port = free_port()
        self.log = log
        server_args = ["-m", str(model), "--host", "127.0.0.1", "--port", str(self.port)]
        server_args += ["--parallel", str(args.parallel), "-c", str(args.ctx), "-t"]
        server_args += [str(args.threads), "--no-webui", "--seed", "1"]
        if args.draft is not None:  # speculating: the draft, drafting for every slot
            server_args += ["-md", str(args.draft), "--spec-type", "draft-simple"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_INSTR_")}
        conf = CONFIGS[config]
        self.prometheus: Prometheus | None = None
        self.scrapes = 0  # exported: Prometheus' successful scrapes of the exporter
        self.exporter_pid = 0  # exported: the `instr metrics` process beside the server
        metrics_port = free_port() if config == "exported" else 0
        if conf is None:
            cmd = [str(exe), *server_args]
        else:
            cmd = [sys.executable, "-m", "llamacpp_instr.cli", "exec", "-o", str(log)]
            if metrics_port:
                cmd += ["--metrics", f"127.0.0.1:{metrics_port}"]
            cmd += [*conf, "llama-server", *server_args]
        self.err = open(log.with_name(log.name + ".stderr"), "w")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=self.err)
        self._wait_ready()
        if metrics_port:
            if shutil.which("prometheus") is None:
                raise SystemExit("exported: Debian's prometheus is not installed")
            self.prometheus = Prometheus(log.parent / f"prometheus-{log.stem}", metrics_port)
            # measured from its first scrape on: its start-up (TSDB, WAL) is not the exporter's
            # steady cost
            self.prometheus.wait_scraped()
        # llama-server's own pid, whose memory and CPU time are measured: instr exec runs it as
        # a child (beside the exporter, with --metrics)
        self.pid = self.proc.pid
        if conf is not None:
            children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
            servers = [
                int(c)
                for c in children
                if Path(f"/proc/{c}/comm").read_text().strip() == "llama-server"
            ]
            if len(servers) != 1:
                raise SystemExit(f"instr exec runs {len(servers)} llama-servers, not one")
            self.pid = servers[0]
            others = [int(c) for c in children if int(c) != self.pid]
            self.exporter_pid = others[0] if metrics_port and others else 0

    def helpers_cpu_s(self) -> tuple[float, float]:
        """CPU seconds so far of the exporter and of Prometheus (0 without them)."""
        exporter = cpu_s(self.exporter_pid) if self.exporter_pid else 0.0
        prom = self.prometheus.cpu_s() if self.prometheus is not None else 0.0
        return exporter, prom

    def _wait_ready(self, timeout: float = 180) -> None:
        import urllib.request

        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise SystemExit(
                    f"llama-server exited ({self.proc.returncode}); see {self.err.name}"
                )
            try:
                url = f"http://127.0.0.1:{self.port}/health"
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise SystemExit("llama-server did not become ready")

    def client(self) -> Any:
        import openai

        return openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.port}/v1",
            api_key="unused",
            timeout=300,
            max_retries=0,
        )

    def stop(self) -> None:
        if self.prometheus is not None:
            self.scrapes = self.prometheus.scrapes()
            self.prometheus.stop()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def run_requests(server: Server, reqs: list[Req], concurrency: int, limit: float) -> list[Outcome]:
    client = server.client()
    t_end = time.monotonic() + limit
    with ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(send, client, r) for r in reqs]
        out = [f.result(timeout=max(1.0, t_end - time.monotonic())) for f in futures]
    return out


@dataclass
class Round:
    config: str
    wall: float
    outcomes: list[Outcome]
    rss_before: int
    rss_after: int
    cpu: float = 0.0  # server CPU seconds over the round
    log_bytes: int = 0
    table_bytes: int = 0  # of graph records (node tables, or a same_as naming one)
    scrapes: int = 0  # exported: Prometheus' successful scrapes of the exporter over the round
    exporter_cpu: float = 0.0  # exported: CPU seconds of `instr metrics` over the round
    prometheus_cpu: float = 0.0  # exported: CPU seconds of Prometheus over the round
    files: int = 0
    lines: int = 0
    bad_lines: int = 0
    records: dict[str, int] = field(default_factory=dict)  # outcome -> request records
    missing: int = 0  # requests without exactly one record with the outcome seen

    @property
    def rps(self) -> float:
        return len(self.outcomes) / self.wall

    def latency(self, q: float) -> float:
        done = sorted(o.latency for o in self.outcomes if o.seen == "ok")
        return done[min(len(done) - 1, int(q * len(done)))]


def log_series(log: Path) -> list[Path]:
    rotated = sorted(
        (p for p in log.parent.glob(log.name + ".*") if p.name[len(log.name) + 1 :].isdigit()),
        key=lambda p: -int(p.name[len(log.name) + 1 :]),
    )
    return rotated + ([log] if log.exists() else [])


def check_log(rnd: Round, log: Path) -> None:
    """Every line of every file parses, each file begins with session_start, and each request the
    client made has exactly one record with the outcome it saw."""
    records: list[dict[str, Any]] = []
    for f in log_series(log):
        rnd.files += 1
        rnd.log_bytes += f.stat().st_size
        data = f.read_bytes()
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        else:
            rnd.bad_lines += 1  # the file does not end on a whole line
        for k, line in enumerate(lines):
            rnd.lines += 1
            try:
                rec = json.loads(line)
            except ValueError:
                rnd.bad_lines += 1
                continue
            if k == 0 and rec.get("type") != "session_start":
                rnd.bad_lines += 1
            if rec.get("type") == "graph":
                rnd.table_bytes += len(line) + 1
            records.append(rec)
    for r in records:
        if r.get("type") == "request":
            kind = r.get("outcome", "ok")
            rnd.records[kind] = rnd.records.get(kind, 0) + 1


def count_missing(rnd: Round, extra_ok: int) -> int:
    """Requests without exactly one record with the outcome the client saw, counted per outcome
    (the server's ids are its own): |requests seen - records| over ok, error and cancelled, and
    any record of another kind. ``extra_ok``: requests made outside the measured list (warm-up)."""
    seen = {"ok": extra_ok, "error": 0, "cancelled": 0}
    for o in rnd.outcomes:
        seen[o.seen] += 1
    kinds = set(seen) | set(rnd.records)
    return sum(abs(seen.get(k, 0) - rnd.records.get(k, 0)) for k in kinds)


def one_round(
    config: str,
    model: Path,
    reqs: list[Req],
    args: argparse.Namespace,
    exe: Path,
    tmp: Path,
    k: int,
) -> Round:
    log = tmp / f"{config}-{k}.log"
    server = Server(config, model, log, args, exe)
    try:
        # a warm-up request, so that every round starts with the model paged in
        run_requests(server, reqs[:2], 2, args.round_timeout)
        before = rss_kib(server.pid)
        cpu0 = cpu_s(server.pid)
        helpers0 = server.helpers_cpu_s()
        t0 = time.monotonic()
        outcomes = run_requests(server, reqs, args.concurrency, args.round_timeout)
        wall = time.monotonic() - t0
        cpu = cpu_s(server.pid) - cpu0
        helpers1 = server.helpers_cpu_s()
        after = rss_kib(server.pid)
    finally:
        server.stop()
    rnd = Round(config, wall, outcomes, before, after, cpu)
    rnd.exporter_cpu = helpers1[0] - helpers0[0]
    rnd.prometheus_cpu = helpers1[1] - helpers0[1]
    rnd.scrapes = server.scrapes
    if CONFIGS[config] is not None:
        check_log(rnd, log)
        rnd.missing = count_missing(rnd, extra_ok=2)  # the warm-up's two have records too
    for f in log_series(log):
        f.unlink()
    return rnd


def rss_run(
    config: str, model: Path, reqs: list[Req], args: argparse.Namespace, exe: Path, tmp: Path
) -> dict[str, Any]:
    """A long run of one server: its RSS every 100 requests up to --rss-requests, and for an
    instrumented one its log checked as the rounds' are (the always-on configuration's series
    rotates past 64 MiB in a long enough run)."""
    log = tmp / f"rss-{config}.log"
    server = Server(config, model, log, args, exe)
    marks: dict[int, int] = {}
    outcomes: list[Outcome] = []
    try:
        run_requests(server, reqs[:2], 2, args.round_timeout)
        marks[0] = rss_kib(server.pid)
        done = 0
        while done < args.rss_requests:
            batch = [
                reqs[(done + j) % len(reqs)] for j in range(min(100, args.rss_requests - done))
            ]
            outcomes += run_requests(server, batch, args.concurrency, args.round_timeout)
            done += len(batch)
            marks[done] = rss_kib(server.pid)
            echo(f"  {config}: rss after {done} requests: {marks[done] / 1024:.1f} MiB")
    finally:
        server.stop()
    rnd = Round(config, 1.0, outcomes, 0, 0)
    out: dict[str, Any] = {"marks": marks, "requests": done + 2}
    if CONFIGS[config] is not None:
        check_log(rnd, log)
        out.update(
            files=rnd.files,
            bytes=rnd.log_bytes,
            bad_lines=rnd.bad_lines,
            records=sum(rnd.records.values()),
            missing=count_missing(rnd, extra_ok=2),
        )
    for f in log_series(log):
        f.unlink()
    return out


def spread(values: list[float]) -> float:
    """The run's noise: (max - min) / median of a configuration's own rounds."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def report(
    rounds: dict[str, list[Round]],
    rss: dict[str, dict[str, Any]],
    args: argparse.Namespace,
    model: Path,
) -> str:
    off = rounds["off"]
    draft = f", drafting with its first {args.draft_layers} layers" if args.draft else ""
    lines = [
        f"llama-server on {model.name}{draft}, --parallel {args.parallel} -c {args.ctx} -t "
        f"{args.threads}; the `openai` client at concurrency {args.concurrency}, "
        f"{args.requests} requests per round ({sum(r.stream for r in REQS)} streamed, "
        f"{sum(r.drop for r in REQS)} dropped mid-stream, {sum(r.refused for r in REQS)} refused), "
        f"{args.rounds} interleaved rounds; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores",
        "",
        "| configuration | requests/s (median) | vs off | p50 latency vs off | p99 latency vs off "
        "| server CPU per request vs off | log bytes/request | node tables/request | files "
        "| RSS growth (MiB) | lines unparseable | requests without exactly one record |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    noise = (
        f"off's own rounds: requests/s spread {spread([r.rps for r in off]):.1%}, "
        f"p99 spread {spread([r.latency(0.99) for r in off]):.1%}, "
        f"server CPU per request spread {spread([r.cpu for r in off]):.1%}"
    )
    for c, rs in rounds.items():
        ratio = statistics.median(r.rps / o.rps for r, o in zip(rs, off, strict=True))
        p50 = statistics.median(
            r.latency(0.5) / o.latency(0.5) for r, o in zip(rs, off, strict=True)
        )
        p99 = statistics.median(
            r.latency(0.99) / o.latency(0.99) for r, o in zip(rs, off, strict=True)
        )
        cpu = statistics.median(r.cpu / o.cpu for r, o in zip(rs, off, strict=True))
        target = f" (target >= {TARGETS[c]}x)" if c in TARGETS else ""
        p99_target = f" (target <= {P99_TARGET}x)" if c in TARGETS else ""
        instrumented = CONFIGS[c] is not None
        lines.append(
            f"| {c} | {statistics.median(r.rps for r in rs):.2f} | {ratio:.3f}x{target} | "
            f"{p50:.3f}x | {p99:.3f}x{p99_target} | {cpu:.3f}x | "
            + (
                f"{statistics.median(r.log_bytes / len(r.outcomes) for r in rs):,.0f} | "
                f"{statistics.median(r.table_bytes / len(r.outcomes) for r in rs):,.0f} | "
                f"{max(r.files for r in rs)} | "
                if instrumented
                else "- | - | - | "
            )
            + f"{statistics.median((r.rss_after - r.rss_before) / 1024 for r in rs):+.1f} | "
            + (
                f"{sum(r.bad_lines for r in rs)} of {sum(r.lines for r in rs):,} | "
                f"{sum(r.missing for r in rs)} of {sum(len(r.outcomes) for r in rs)} |"
                if instrumented
                else "- | - |"
            )
        )
    if "exported" in rounds and EXPORTED_VS in rounds:
        ex, base = rounds["exported"], rounds[EXPORTED_VS]
        pairs = list(zip(ex, base, strict=True))
        lines += [
            "",
            f"The exporter's cost, exported against {EXPORTED_VS} round by round (Prometheus "
            f"scraping every second: {', '.join(str(r.scrapes) for r in ex)} scrapes in rounds of "
            f"{', '.join(f'{r.wall:.0f}' for r in ex)} s; CPU over a round: the exporter "
            f"{statistics.median(r.exporter_cpu for r in ex):.2f} s, Prometheus "
            f"{statistics.median(r.prometheus_cpu for r in ex):.2f} s, medians): requests/s "
            f"{statistics.median(r.rps / b.rps for r, b in pairs):.3f}x (target >= 0.98x), p99 "
            f"latency {statistics.median(r.latency(0.99) / b.latency(0.99) for r, b in pairs):.3f}x "
            f"(target <= {P99_TARGET}x), server CPU per request "
            f"{statistics.median(r.cpu / b.cpu for r, b in pairs):.3f}x.",
        ]
    lines += ["", f"Noise: {noise}."]
    for c, run in rss.items():
        marks = run["marks"]
        last = max(marks)
        at = ", ".join(
            f"{marks[k] / 1024:.1f} MiB after {k:,}"
            for k in sorted({100, 1000, last})
            if k in marks
        )
        conf = CONFIGS[c]
        what = "off" if conf is None else f"`{' '.join(conf)}`"
        line = (
            f"RSS of a long run, {what}: {marks[0] / 1024:.1f} MiB after the warm-up, {at} "
            f"requests ({(marks[last] - marks.get(100, marks[0])) / 1024:+.1f} MiB from 100 to "
            f"{last:,})"
        )
        if "files" in run:
            line += (
                f"; its log: {run['bytes']:,} bytes in {run['files']} files, {run['records']:,} "
                f"request records for {run['requests']:,} requests ({run['missing']} without "
                f"exactly one), {run['bad_lines']} unparseable lines"
            )
        lines += ["", line + "."]
    return "\n".join(lines)


REQS: list[Req] = []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--requests", type=int, default=80, help="requests per round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=4096, help="llama-server -c (shared by the slots)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--rss-requests",
        type=int,
        default=1600,
        help="requests of the long runs (off, sampled; RSS every 100; 0: none)",
    )
    ap.add_argument("--round-timeout", type=float, default=900.0)
    ap.add_argument(
        "--configs",
        default="off,minimal,sampled,detailed",
        help=f"off first, then any of {', '.join(CONFIGS)} (exported needs sampled)",
    )
    ap.add_argument(
        "--draft-layers",
        type=int,
        default=0,
        help="speculate with a draft of the model's first K layers (0: no speculation)",
    )
    ap.add_argument("--write-docs", action="store_true", help="update docs/performance.md")
    args = ap.parse_args()
    # SIGTERM unwinds like Ctrl-C: each round's server is stopped on the way out
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    model = args.model or models.default_model()
    configs = args.configs.split(",")
    if configs[0] != "off" or not set(configs) <= set(CONFIGS):
        raise SystemExit(f"--configs: off first, then any of {', '.join(CONFIGS)}")
    exe = tools.build_tools(echo, programs=("llama-server",)) / "llama-server"
    args.draft = None
    if args.draft_layers:
        from helpers.draft_gguf import cached_draft

        args.draft = cached_draft(model, tempfile.gettempdir(), args.draft_layers)
    REQS[:] = request_list(args.requests, args.ctx // args.parallel)
    rounds: dict[str, list[Round]] = {c: [] for c in configs}
    rss: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        for k in range(args.rounds):
            order = configs[k % len(configs) :] + configs[: k % len(configs)]
            for c in order:
                rnd = one_round(c, model, REQS, args, exe, Path(tmp), k)
                rounds[c].append(rnd)
                echo(
                    f"  round {k + 1} {c}: {rnd.rps:.2f} req/s, p50 {rnd.latency(0.5):.2f} s, "
                    f"p99 {rnd.latency(0.99):.2f} s, cpu {rnd.cpu:.1f} s, "
                    f"log {rnd.log_bytes:,} B in {rnd.files} "
                    f"files, missing {rnd.missing}, unparseable {rnd.bad_lines}"
                )
        if args.rss_requests > 0:
            for c in ("off", "sampled"):
                rss[c] = rss_run(c, model, REQS, args, exe, Path(tmp))
    text = report(rounds, rss, args, model)
    print(text)
    if args.write_docs:
        sys.path.insert(0, str(ROOT / "bench"))
        from overhead import write_section

        name = "serve_load_draft" if args.draft is not None else "serve_load"
        write_section(name, text, script="bench/serve_load.py")


if __name__ == "__main__":
    main()
