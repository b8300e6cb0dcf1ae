"""`instr follow --prometheus` (issue 37, Prometheus): a live log's figures at /metrics.

Against a real Prometheus (Debian's package): it scrapes the exporter that `instr exec --metrics`
starts beside a real llama-server under concurrent load, and PromQL through its HTTP API returns
the request count, the TTFT buckets and a TTFT quantile equal to those computed here from the
log's raw records (the quantile as Prometheus interpolates it). `instr serve --metrics` the same
way without Prometheus. Without a model: the figures of hand-made records, a rotated series of
10,000 requests followed with the exporter's state bounded (what it holds does not grow with the
requests), a log rotated under a running exporter, and bad input (a log that does not exist, a
port in use, a malformed HOST:PORT) as one line and exit 2.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tracemalloc
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.prometheus_server import Prometheus
from helpers.support import free_port, request_records, signal_server, wait_ready, wait_requests

from llamacpp_instr.cli import main
from llamacpp_instr.converters.formats.live_figures import RequestFigures, RequestTracker
from llamacpp_instr.converters.formats.prometheus import Metrics
from llamacpp_instr.converters.reading.tail import follow_log

SID = "00000000000000aa"
DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana-dashboard.json"
MS = 1_000_000


# --- hand-made llama-server records ------------------------------------------------------------


def _step(step: int, start: int, dur: int, seqs: list[list[int]], kind: str) -> list[dict]:
    n = sum(q[1] for q in seqs)
    begin: dict[str, Any] = {"type": "step_begin", "ts": start, "sid": SID, "step": step}
    begin |= {"ctx": 1, "n_tokens": n, "kind": kind, "level": "minimal"}
    begin["pos"] = [min(q[2] for q in seqs), max(q[3] for q in seqs)]
    if len(seqs) > 1 or seqs[0][0] != 0:
        begin["seqs"] = seqs
    end = {"type": "step_end", "ts": start + dur, "sid": SID, "step": step, "ctx": 1}
    end |= {"t_start": start, "dur": dur, "status": 0, "n_tokens": n, "n_outputs": len(seqs)}
    end |= {"n_computes": 1, "kv_used": seqs[0][3] + 1 if seqs[0][0] == 0 else 7}
    return [begin, end]


def session_start(ts: int, file_index: int = 0, records_before: int = 0) -> dict[str, Any]:
    rec: dict[str, Any] = {"type": "session_start", "ts": ts, "sid": SID, "schema_version": 1}
    rec |= {"level": "minimal", "metadata": {"program": "llama-server"}}
    rec["context"] = {"n_ctx": 512, "n_seq_max": 2}
    rec["memory"] = {"buffers": [{"buffer": "CPU", "weights": 100, "kv_cache": 20, "compute": 3}]}
    if file_index:
        rec["file"] = {"index": file_index, "t_session": 0, "records_before": records_before}
    return rec


def one_request(i: int, t: int, step0: int, gen: int = 3) -> tuple[list[dict], dict[str, Any]]:
    """Request ``i`` arriving at ``t`` on slot i % 2, its slot's cache holding 2 tokens from
    the second request of the slot on: a prompt step of 4 tokens (0.2 ms after 0.1 ms of queue),
    then ``gen`` generation steps of 0.05 ms, 0.02 ms apart. Its records, and what it should
    give (computed by hand from the same times)."""
    slot, cached = i % 2, (2 if i >= 2 else 0)
    wait, prompt_dur, gen_dur, gap = 100_000, 200_000, 50_000, 20_000
    recs = _step(step0, t + wait, prompt_dur, [[slot, 4, cached, cached + 3]], "prompt")
    first_token = t + wait + prompt_dur + 10_000  # sampled after the prompt step
    start, ends = first_token + gap, []
    for k in range(gen):
        p = cached + 4 + k
        recs += _step(step0 + 1 + k, start, gen_dur, [[slot, 1, p, p]], "gen")
        ends.append(start + gen_dur)
        start += gen_dur + gap
    model = ends[-1] + 5_000 - (t + wait)
    req = {"type": "request", "ts": t + wait + model + 10_000, "sid": SID, "id": f"task-{i}"}
    req |= {"endpoint": "/completion", "method": "POST", "status": 200, "outcome": "ok"}
    req |= {"stream": False, "t_arrive": t, "wait": wait, "ttft": first_token - t}
    req |= {"model": model, "dur": wait + model + 10_000, "prompt_tokens": 4, "gen_tokens": gen}
    req |= {"slot": slot}
    recs.append(req)
    itl = [ends[0] - first_token] + [b - a for a, b in zip(ends, ends[1:], strict=False)]
    return recs, {"itl_ns": itl, "cached": cached, "ttft_ns": first_token - t, "wait_ns": wait}


@pytest.mark.fast
def test_a_requests_figures_come_from_its_records_and_its_slots_steps() -> None:
    tracker = RequestTracker()
    tracker.add(session_start(0))
    got: list[RequestFigures] = []
    want = []
    step, t = 0, MS
    for i in range(4):
        recs, w = one_request(i, t, step)
        want.append(w)
        step, t = step + 4, t + MS
        for rec in recs:
            fig = tracker.add(rec)
            if isinstance(fig, RequestFigures):
                got.append(fig)
    assert len(got) == 4
    for fig, w in zip(got, want, strict=True):
        assert fig.outcome == "ok" and fig.gen_tokens == 3 and fig.prompt_tokens == 4
        assert fig.ttft_s == pytest.approx(w["ttft_ns"] * 1e-9)
        assert fig.queue_s == pytest.approx(w["wait_ns"] * 1e-9)
        assert fig.prefill_s == pytest.approx((w["ttft_ns"] - w["wait_ns"]) * 1e-9)
        assert fig.itl_s == pytest.approx([x * 1e-9 for x in w["itl_ns"]])
        assert len(fig.itl_s) == fig.gen_tokens  # one gap per generated token decoded
        assert fig.cached_tokens == w["cached"]
        assert fig.running == 0  # each request's record came after its last step
    assert tracker.state_size() == 0


@pytest.mark.fast
def test_prompt_cache_misses_are_counted_by_why() -> None:
    """llama-server's ``cache`` object says why a prompt reused less than a cache held: the
    counter has one series per reason, as instr requests names them."""
    tracker, metrics = RequestTracker(), Metrics()
    metrics.observe(tracker.add(session_start(0)))
    caches = [
        {"prompt": 50, "enabled": True, "held": 0, "common": 0, "reused": 0},  # new
        {"prompt": 50, "enabled": True, "held": 60, "common": 49, "reused": 49},  # all of it
        {"prompt": 50, "enabled": True, "held": 0, "common": 0, "reused": 0}
        | {"seen": {"tokens": 32, "request": "task-0"}},  # evicted
        {"prompt": 50, "enabled": True, "held": 0, "common": 0, "reused": 0}
        | {"seen": {"tokens": 32, "request": "task-0"}},  # evicted
    ]
    step, t = 0, MS
    for i, cache in enumerate(caches):
        recs, _ = one_request(i, t, step)
        recs[-1]["cache"] = cache
        step, t = step + 4, t + MS
        for rec in recs:
            metrics.observe(tracker.add(rec))
    counts = {
        s.labels["reason"]: s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "llamacpp_instr:prompt_cache_misses_total"
    }
    assert counts == {"new": 1.0, "evicted": 2.0}


def write_series(log: Path, n_requests: int, per_file: int) -> list[dict[str, Any]]:
    """A rotated series of ``n_requests`` hand-made requests (``log``, ``log.1``... oldest the
    highest), each file beginning with the session's session_start; returns the request
    records."""
    files: list[list[dict]] = []
    cur: list[dict] = [session_start(0)]
    written = 0
    requests = []
    step, t = 0, MS
    for i in range(n_requests):
        if i and i % per_file == 0:
            files.append(cur)
            written += len(cur)
            cur = [session_start(t - 1, len(files), written)]
        recs, _ = one_request(i, t, step)
        requests.append(recs[-1])
        cur += recs
        step, t = step + 4, t + MS
    files.append(cur)
    for k, recs in enumerate(files):
        name = log if k == len(files) - 1 else log.with_name(f"{log.name}.{len(files) - 1 - k}")
        name.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return requests


@pytest.mark.fast
def test_a_rotated_series_of_10000_requests_with_bounded_state(tmp_path: Path) -> None:
    """The whole series is read (every request counted once), and what the exporter holds does
    not grow with the requests: its tracker's steps stay those of the requests in flight, and
    the memory Python allocated is the same after 10,000 requests as after 2,000."""
    log = tmp_path / "server.log"
    requests = write_series(log, 10_000, per_file=2_500)
    assert len(list(tmp_path.glob("server.log*"))) == 4
    tracker, metrics = RequestTracker(), Metrics()
    most = 0
    seen = 0
    tracemalloc.start()
    try:
        for rec in follow_log(log, wait=0, stop=lambda: True):
            fig = tracker.add(rec)
            metrics.observe(fig)
            most = max(most, tracker.state_size())
            if isinstance(fig, RequestFigures):
                seen += 1
                if seen == 2_000:
                    at_2000 = tracemalloc.get_traced_memory()[0]
        at_10000 = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert seen == len(requests) == 10_000
    value = metrics.registry.get_sample_value
    assert value("llamacpp_instr:requests_total", {"outcome": "ok"}) == 10_000
    assert value("llamacpp_instr:time_to_first_token_seconds_count") == 10_000
    assert value("llamacpp_instr:inter_token_latency_seconds_count") == 30_000
    assert value("llamacpp_instr:prefix_cache_hits_total") == 2 * (10_000 - 2)
    # one request in flight at a time: its 4 steps, and a step begun
    assert most <= 5, most
    assert at_10000 - at_2000 < 64 * 1024, (at_2000, at_10000)


def dashboard_queries() -> list[str]:
    """Every PromQL query of docs/grafana-dashboard.json, its variables given values."""
    d = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    subst = {"$job": ".*", "$instance": ".*", "$__rate_interval": "1m"}
    return [re.sub(r"\$[a-z_]+", lambda m: subst[m.group(0)], e) for e in exprs]


@pytest.mark.fast
def test_the_dashboard_asks_for_metrics_the_exporter_serves() -> None:
    tracker, metrics = RequestTracker(), Metrics()
    recs, _ = one_request(0, MS, 0)
    for rec in [session_start(0), *recs]:
        metrics.observe(tracker.add(rec))
    served = {s.name for family in metrics.registry.collect() for s in family.samples}
    queries = dashboard_queries()
    assert len(queries) >= 15
    asked = {n for q in queries for n in re.findall(r"\b(?:llamacpp_instr:|process_)\w+", q)}
    assert "llamacpp_instr:time_to_first_token_seconds_bucket" in asked
    assert asked <= served, asked - served


# --- the exporter as a process ------------------------------------------------------------------


def scrape(port: int) -> dict[str, float]:
    """/metrics as {series: value} (``name{labels}`` as written)."""
    # as Prometheus asks (OpenMetrics first): the names keep their colons whatever is asked
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, v = line.rpartition(" ")
            out[series] = float(v)
    return out


def scrape_until(port: int, series: str, want: float, proc: subprocess.Popen[Any]) -> dict:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the exporter exited"
        try:
            got = scrape(port)
        except OSError:
            got = {}
        if got.get(series) == want:
            return got
        time.sleep(0.2)
    raise AssertionError(f"{series} never reached {want}: {got.get(series)}")


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[str]] = []

    def start(log: Path, *more: str) -> tuple[subprocess.Popen[str], int]:
        port = free_port()
        cmd = [sys.executable, "-m", "llamacpp_instr.cli", "follow", str(log)]
        proc = subprocess.Popen(
            [*cmd, "--prometheus", f"127.0.0.1:{port}", *more],
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc, port

    yield start
    for p in procs:
        if p.poll() is None:
            p.terminate()
            p.wait(timeout=30)


@pytest.mark.fast
def test_a_log_rotated_under_the_exporter_is_followed(tmp_path: Path, exporter: Any) -> None:
    log = tmp_path / "server.log"
    recs, _ = one_request(0, MS, 0)
    log.write_text("".join(json.dumps(r) + "\n" for r in [session_start(0), *recs]))
    proc, port = exporter(log)
    scrape_until(port, 'llamacpp_instr:requests_total{outcome="ok"}', 1, proc)
    # rotated as the native writer does: the file moves to .1, a new one begins
    log.rename(tmp_path / "server.log.1")
    more = [session_start(2 * MS, 1, len(recs) + 1)]
    ttfts = [recs[-1]["ttft"]]
    for i in range(1, 6):
        r, _ = one_request(i, (i + 1) * MS, 4 * i)
        more += r
        ttfts.append(r[-1]["ttft"])
    log.write_text("".join(json.dumps(r) + "\n" for r in more))
    got = scrape_until(port, 'llamacpp_instr:requests_total{outcome="ok"}', 6, proc)
    assert got["llamacpp_instr:time_to_first_token_seconds_sum"] == pytest.approx(sum(ttfts) * 1e-9)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


@pytest.mark.fast
def test_a_log_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        main, ["follow", str(tmp_path / "none.log"), "--prometheus", ":0", "--wait", "0"]
    )
    assert r.exit_code == 2
    assert r.output == f"error: log file not found: {tmp_path / 'none.log'}\n"


@pytest.mark.fast
def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(json.dumps(session_start(0)) + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        for args in (
            ["follow", str(log), "--prometheus", f"127.0.0.1:{port}"],
            # before the model loads, and before the server's own port is looked at
            ["serve", "--metrics", f"127.0.0.1:{port}", "-o", str(tmp_path / "s.log")],
        ):
            r = CliRunner().invoke(main, args)
            assert r.exit_code == 2, (args, r.output)
            want = f"error: port {port} on 127.0.0.1 is in use (choose another for metrics)\n"
            assert r.output == want
    assert not (tmp_path / "s.log").exists()


@pytest.mark.fast
@pytest.mark.parametrize("listen", ["9400", "host:port", "127.0.0.1:99999"])
def test_a_malformed_listen_address_is_one_line(tmp_path: Path, listen: str) -> None:
    log = tmp_path / "server.log"
    log.write_text(json.dumps(session_start(0)) + "\n")
    r = CliRunner().invoke(main, ["follow", str(log), "--prometheus", listen])
    assert r.exit_code == 2
    assert (
        r.output.startswith("error: --prometheus/--metrics wants HOST:PORT")
        and r.output.count("\n") == 1
    )


# --- a real Prometheus scraping the exporter beside a real llama-server -----------------------


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets, as
    promql/quantile.go computes it (classic buckets: linear within the bucket the rank falls
    in; the +Inf bucket answers the highest finite bound)."""
    buckets = sorted(buckets)
    assert buckets[-1][0] == math.inf and len(buckets) >= 2
    observations = buckets[-1][1]
    rank = q * observations
    b = next(i for i, (_, c) in enumerate(buckets[:-1] + [(0, math.inf)]) if c >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, end, count = 0.0, buckets[b][0], buckets[b][1]
    if b > 0:
        start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return start + (end - start) * (rank / count)


def test_exec_with_a_port_in_use_does_not_start_the_program(
    tools_bin: Path, smollm2_path: Path, tmp_path: Path
) -> None:
    log, port = tmp_path / "server.log", free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "llamacpp_instr.cli", "exec", "-o", str(log)]
            + ["--metrics", f"127.0.0.1:{busy}", "llama-server", "-m", str(smollm2_path)]
            + ["--host", "127.0.0.1", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert r.returncode == 2
    want = f"error: port {busy} on 127.0.0.1 is in use (choose another for metrics)"
    assert r.stderr == want + "\n"
    assert not log.exists()  # the server never started


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus not installed")
def test_prometheus_sees_every_request_of_llama_server_as_the_log_says(
    tools_bin: Path, smollm2_path: Path, tmp_path: Path
) -> None:
    import openai

    log, port, mport = tmp_path / "server.log", free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "llamacpp_instr.cli", "exec", "-o", str(log)]
        + ["--metrics", f"127.0.0.1:{mport}"]
        + ["llama-server", "-m", str(smollm2_path), "--host", "127.0.0.1", "--port", str(port)]
        + ["--parallel", "2", "-c", "2048", "-t", "2", "--no-webui"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    prom = None
    try:
        wait_ready(port, server, timeout=180, path="/health")
        prom = Prometheus(tmp_path, mport)
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=120, max_retries=0
        )

        def job(i: int) -> None:
            if i % 2:
                s = client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": f"Tell story number {i}."}],
                    max_tokens=6 + i,
                    temperature=0,
                    stream=True,
                )
                for _ in s:
                    pass
            else:
                client.completions.create(
                    model="m", prompt=f"Count from {i} to twenty:", max_tokens=6 + i, temperature=0
                )

        with ThreadPoolExecutor(3) as pool:
            list(pool.map(job, range(12)))
        with pytest.raises(openai.BadRequestError):  # more than a slot's context: an error
            client.completions.create(model="m", prompt="word " * 1500, max_tokens=4)
        # every request's record written (the record follows the response)
        reqs = wait_requests(log, 13)
        assert len(reqs) == 13
        by_outcome = {o: sum(1 for r in reqs if r["outcome"] == o) for o in ("ok", "error")}
        assert by_outcome == {"ok": 12, "error": 1}

        # Prometheus has scraped the exporter since the last record was read
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if prom.value("sum(llamacpp_instr:requests_total)") == len(reqs):
                break
            time.sleep(0.5)
        assert prom.value("sum(llamacpp_instr:requests_total)") == 13
        assert prom.value('llamacpp_instr:requests_total{outcome="error"}') == 1
        assert prom.value("llamacpp_instr:request_success_total") == 12

        # TTFT: the buckets as the records' ttft fall in them, and a quantile of them
        ttfts = [r["ttft"] / 1e9 for r in reqs if r["ttft"] is not None]
        assert len(ttfts) == 12
        rows = prom.query("llamacpp_instr:time_to_first_token_seconds_bucket")
        buckets = []
        for row in rows:
            le = float(row["metric"]["le"])
            assert float(row["value"][1]) == sum(1 for t in ttfts if t <= le), le
            buckets.append((le, float(sum(1 for t in ttfts if t <= le))))
        assert len(buckets) == 23
        for q in (0.5, 0.9):
            want = bucket_quantile(q, buckets)
            got = prom.value(
                f"histogram_quantile({q}, llamacpp_instr:time_to_first_token_seconds_bucket)"
            )
            assert got == pytest.approx(want, rel=1e-12), q
        assert prom.value("llamacpp_instr:time_to_first_token_seconds_sum") == pytest.approx(
            sum(ttfts), rel=1e-9
        )
        # a gap between tokens per generated token decoded, for each request that got a token
        gen = sum(r["gen_tokens"] for r in reqs if r["ttft"] is not None)
        assert gen > 0
        assert prom.value("llamacpp_instr:inter_token_latency_seconds_count") == gen
        assert prom.value("llamacpp_instr:prompt_tokens_total") == sum(
            r["prompt_tokens"] for r in reqs
        )
        for query in dashboard_queries():  # the dashboard's queries are PromQL Prometheus takes
            prom.query(query)
    finally:
        if prom is not None:
            prom.stop()
        signal_server(server)
        try:
            server.wait(timeout=60)
        finally:
            if server.poll() is None:
                server.kill()
    # the exporter ends once the server has and its log is read: nothing listens on its port
    # (SO_REUSEADDR: the connections Prometheus made may wait in TIME_WAIT, a listener may not)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", mport))
                break
            except OSError:
                time.sleep(0.2)
    else:
        raise AssertionError("the exporter did not end after the server")


def test_instr_serve_metrics_counts_its_requests(
    instr_api: Any, smollm2_path: Path, tmp_path: Path
) -> None:
    import openai

    log, port, mport = tmp_path / "serve.log", free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llamacpp_instr.cli", "serve", str(smollm2_path)]
        + ["--port", str(port), "-o", str(log), "-t", "2", "--metrics", f"127.0.0.1:{mport}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(port, proc)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        for i in range(3):
            client.completions.create(
                model="m", prompt=f"Count from {i} to ten:", max_tokens=5, temperature=0
            )

        # instr serve records every HTTP request (wait_ready's /v1/models too)
        def done() -> list[dict[str, Any]]:
            return [r for r in request_records(log) if r["endpoint"] == "/v1/completions"]

        deadline = time.monotonic() + 60
        while len(done()) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(done()) == 3
        reqs = [r for r in request_records(log) if r["ttft"] is not None]
        assert len(reqs) == 3  # the completions: the other requests have no first token
        got = scrape_until(
            port=mport,
            series='llamacpp_instr:requests_total{outcome="ok"}',
            want=len(request_records(log)),
            proc=proc,
        )
        assert got["llamacpp_instr:time_to_first_token_seconds_sum"] == pytest.approx(
            sum(r["ttft"] for r in reqs) / 1e9, rel=1e-9
        )
        assert got["llamacpp_instr:generation_tokens_total"] == sum(r["gen_tokens"] for r in reqs)
        assert got["llamacpp_instr:inter_token_latency_seconds_count"] == sum(
            r["gen_tokens"] for r in reqs
        )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()


@pytest.mark.fast
def test_a_new_runs_request_takes_no_layer_spans_of_an_earlier_run() -> None:
    """Two runs in one stream (two sessions, each numbering its steps from 0): a request of the
    second run gets its own steps' layer spans, never the first run's steps of the same numbers."""
    tracker = RequestTracker(layers=True)
    got: list[RequestFigures] = []
    for run, sid in enumerate(("run-a", "run-b")):
        start = session_start(run * 100 * MS)
        start["sid"] = sid
        tracker.add(start)
        recs, _ = one_request(0, (run * 100 + 1) * MS, 0)
        for rec in recs:
            rec["sid"] = sid
            if rec["type"] == "step_end":
                # the step's compute, its one layer numbered by the run
                compute = {"type": "compute", "ts": rec["ts"], "sid": sid, "ctx": 1}
                compute |= {"step": rec["step"], "t_start": rec["t_start"], "dur": rec["dur"]}
                compute["layers"] = [[run, 0, rec["dur"]]]
                tracker.add(compute)
            fig = tracker.add(rec)
            if isinstance(fig, RequestFigures):
                got.append(fig)
    assert len(got) == 2
    first, second = ({layer for spans in f.layers.values() for layer, _, _ in spans} for f in got)
    assert first == {0} and second == {1}, (first, second)
