"""`instr export --otlp` (issue 37, OpenTelemetry): a log's requests as OTLP/HTTP traces, received here by
an HTTP server that decodes them with `opentelemetry-proto`.

Every request is one span with a child per decode step its slot took part in (the parent links
hold, the children lie within their request), an incoming `traceparent` is kept, a collector that
fails is retried and one that is down loses spans with a count, bad input is one line and exit 2;
and a real llama-server under concurrent load, followed live, has every request received.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import free_port, wait_ready, wait_requests
from test_metrics import MS, one_request, session_start

from llamacpp_instr.cli import main
from llamacpp_instr.converters.session.request_causes import cache_reason

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
WALL = "2026-11-22T15:55:00.123456Z"  # session_start's wall clock: unix 1795362900.123456


class Receiver:
    """An OTLP/HTTP traces endpoint: decodes each post, keeps its spans; answers 503 to the
    first ``fail`` posts."""

    def __init__(self, fail: int = 0) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans: list[Any] = []
        self.posts = 0
        self.fail = fail
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with outer.lock:
                    outer.posts += 1
                    failing = outer.posts <= outer.fail
                    if not failing:
                        req = ExportTraceServiceRequest.FromString(body)
                        assert self.path == "/v1/traces"
                        assert self.headers["Content-Type"] == "application/x-protobuf"
                        for rs in req.resource_spans:
                            for ss in rs.scope_spans:
                                outer.spans.extend(ss.spans)
                self.send_response(503 if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def requests(self) -> list[Any]:
        with self.lock:
            return [s for s in self.spans if s.kind == 2]  # SERVER: a request's

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def receiver() -> Iterator[Any]:
    made: list[Receiver] = []

    def make(fail: int = 0) -> Receiver:
        made.append(Receiver(fail))
        return made[-1]

    yield make
    for r in made:
        r.close()


def hand_log(path: Path, n: int) -> list[dict[str, Any]]:
    """``n`` hand-made requests (test_metrics.one_request: 4 steps each), request 3 with an
    incoming traceparent and request 5 an error; returns the request records."""
    start = session_start(0) | {"wall_time": WALL, "model": {"name": "smol"}}
    recs: list[dict[str, Any]] = [start]
    out = []
    for i in range(n):
        r, _ = one_request(i, (i + 1) * MS, 4 * i)
        if i == 3:
            r[-1]["traceparent"] = TRACEPARENT
        if i == 5:
            r[-1] |= {"status": 500, "outcome": "error", "error": "boom"}
        recs += r
        out.append(r[-1])
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return out


def attrs(span: Any) -> dict[str, Any]:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


@pytest.mark.fast
def test_every_request_is_one_span_with_a_child_per_step(tmp_path: Path, receiver: Any) -> None:
    log = tmp_path / "server.log"
    reqs = hand_log(log, 8)
    rx = receiver()
    r = CliRunner().invoke(main, ["export", str(log), "--otlp", rx.url])
    assert r.exit_code == 0, r.output
    assert r.output.endswith(f"8 requests, 40 spans sent to {rx.url}/v1/traces, 0 lost\n")
    by_id = {s.span_id: s for s in rx.spans}
    assert len(by_id) == len(rx.spans) == 8 * 5  # unique ids
    top = [s for s in rx.spans if s.kind == 2]  # SERVER
    assert len(top) == 8
    offset = 1795362900123456000  # WALL in unix ns; session_start's ts is 0
    for span, rec in zip(sorted(top, key=lambda s: s.start_time_unix_nano), reqs, strict=True):
        a = attrs(span)
        assert a["llamacpp_instr.request.id"] == rec["id"]
        assert span.start_time_unix_nano == offset + rec["t_arrive"]
        assert span.end_time_unix_nano == offset + rec["t_arrive"] + rec["dur"]
        assert a["gen_ai.operation.name"] == "text_completion"
        assert a["gen_ai.request.model"] == "smol" and span.name == "text_completion smol"
        assert a["gen_ai.usage.output_tokens"] == rec["gen_tokens"]
        cached = 2 if rec["id"] not in ("task-0", "task-1") else 0
        assert a["gen_ai.usage.input_tokens"] == rec["prompt_tokens"] + cached
        kids = [s for s in rx.spans if s.parent_span_id == span.span_id]
        assert len(kids) == 4  # its prompt step and 3 generation steps
        for k in kids:
            assert k.trace_id == span.trace_id and k.name == "llama_decode"
            assert span.start_time_unix_nano <= k.start_time_unix_nano
            assert k.end_time_unix_nano <= span.end_time_unix_nano
        if rec["id"] == "task-3":  # joins the incoming trace, under its parent
            assert span.trace_id.hex() == TRACEPARENT.split("-")[1]
            assert span.parent_span_id.hex() == TRACEPARENT.split("-")[2]
        else:
            assert not span.parent_span_id
        if rec["id"] == "task-5":
            assert span.status.code == 2 and span.status.message == "boom"  # ERROR
            assert a["error.type"] == "500"
        else:
            assert span.status.code == 0
    # the same log again: the same ids (a request's ids are its session's and its own)
    rx2 = receiver()
    assert CliRunner().invoke(main, ["export", str(log), "--otlp", rx2.url]).exit_code == 0
    assert {s.span_id for s in rx2.spans} == set(by_id)


@pytest.mark.fast
def test_layers_are_children_of_their_steps_when_asked(tmp_path: Path, receiver: Any) -> None:
    """With --layers, each step span has a child per layer span of its step's compute records
    (two computes for a prompt of two ubatches), at the times the records say."""
    log = tmp_path / "server.log"
    start = session_start(0) | {"wall_time": WALL, "model": {"name": "smol"}}
    recs, _ = one_request(0, MS, 0)
    out: list[dict[str, Any]] = [start]
    want: dict[int, list[tuple[int, int, int]]] = {}
    for rec in recs:
        if rec["type"] == "step_end":  # its computes come before it, inside the step
            t, step = rec["t_start"], rec["step"]
            ubatches = 2 if step == 0 else 1
            for u in range(ubatches):
                t0 = t + 1000 + u * 5000
                layers = [[0, 100, 1500, 7], [1, 1700, 2000, 7], [-1, 3800, 100, 2]]
                out.append(
                    {"type": "compute", "ts": t0 + 4000, "sid": start["sid"], "ctx": 1}
                    | {"step": step, "ubatch": u, "graph": 1, "t_start": t0, "dur": 4000}
                    | {"n_tokens": 2, "status": 0, "layers": layers}
                )
                want.setdefault(step, []).extend(
                    (lay, t0 + off, t0 + off + dur) for lay, off, dur, _ in layers
                )
        out.append(rec)
    log.write_text("".join(json.dumps(r) + "\n" for r in out))
    rx = receiver()
    r = CliRunner().invoke(main, ["export", str(log), "--otlp", rx.url, "--layers"])
    assert r.exit_code == 0, r.output
    steps = [s for s in rx.spans if s.name == "llama_decode"]
    assert len(steps) == 4 and sum(len(v) for v in want.values()) == 15
    offset = 1795362900123456000  # WALL in unix ns
    for st in steps:
        step = attrs(st)["llamacpp_instr.step"]
        kids = sorted(
            (s for s in rx.spans if s.parent_span_id == st.span_id),
            key=lambda s: (s.start_time_unix_nano, attrs(s)["llamacpp_instr.layer"]),
        )
        got = [
            (
                attrs(k)["llamacpp_instr.layer"],
                k.start_time_unix_nano - offset,
                k.end_time_unix_nano - offset,
            )
            for k in kids
        ]
        assert got == sorted(want[step], key=lambda x: (x[1], x[0]))
        assert all(k.trace_id == st.trace_id for k in kids)
    # without --layers: no layer spans
    rx2 = receiver()
    assert CliRunner().invoke(main, ["export", str(log), "--otlp", rx2.url]).exit_code == 0
    assert not [s for s in rx2.spans if s.name.startswith("layer")]


@pytest.mark.fast
def test_a_failing_collector_is_retried(tmp_path: Path, receiver: Any) -> None:
    log = tmp_path / "server.log"
    hand_log(log, 3)
    rx = receiver(fail=2)
    r = CliRunner().invoke(main, ["export", str(log), "--otlp", rx.url + "/v1/traces"])
    assert r.exit_code == 0, r.output
    assert rx.posts == 3 and len(rx.spans) == 15


@pytest.mark.fast
def test_a_collector_down_loses_spans_with_a_count(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    hand_log(log, 3)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    r = CliRunner().invoke(main, ["export", str(log), "--otlp", url])
    assert r.exit_code == 1
    line = r.output.strip()
    assert "\n" not in line and "3 requests, 0 spans sent" in line and "15 lost" in line, line


@pytest.mark.fast
@pytest.mark.parametrize("endpoint", ["127.0.0.1:4318", "ftp://x/v1/traces", "http://h:99999"])
def test_a_bad_endpoint_is_one_line(tmp_path: Path, endpoint: str) -> None:
    log = tmp_path / "server.log"
    hand_log(log, 1)
    r = CliRunner().invoke(main, ["export", str(log), "--otlp", endpoint])
    assert r.exit_code == 2
    assert r.output.startswith("error: --otlp/--endpoint ") and r.output.count("\n") == 1


@pytest.mark.fast
def test_a_log_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        main, ["export", str(tmp_path / "none.log"), "--otlp", "http://127.0.0.1:1"]
    )
    assert r.exit_code == 2
    assert r.output == f"error: log file not found: {tmp_path / 'none.log'}\n"


LIVE_PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_live_llama_server_has_every_request_received(
    tools_bin: Path, smollm2_path: Path, tmp_path: Path, receiver: Any
) -> None:
    import openai

    log, port = tmp_path / "server.log", free_port()
    rx = receiver()
    server = subprocess.Popen(
        [sys.executable, "-m", "llamacpp_instr.cli", "exec", "-o", str(log)]
        + ["llama-server", "-m", str(smollm2_path), "--host", "127.0.0.1", "--port", str(port)]
        + ["--parallel", "2", "-c", "2048", "-t", "2", "--no-webui"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    follower = None
    try:
        wait_ready(port, server, timeout=180, path="/health")
        follower = subprocess.Popen(
            [sys.executable, "-m", "llamacpp_instr.cli", "export", str(log)]
            + ["--otlp", rx.url, "--follow"],
            stderr=subprocess.PIPE,
            text=True,
        )
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=120, max_retries=0
        )

        # request 2 carries a client's trace context; request 3 a malformed one, which the
        # server's record must leave out (a header is the client's bytes)
        headers = {2: {"traceparent": LIVE_PARENT}, 3: {"traceparent": LIVE_PARENT.upper()}}

        def job(i: int) -> None:
            client.completions.create(
                model="m",
                prompt=f"Count from {i} to twenty:",
                max_tokens=4 + i,
                temperature=0,
                extra_headers=headers.get(i),
            )

        with ThreadPoolExecutor(3) as pool:
            list(pool.map(job, range(8)))
        reqs = wait_requests(log, 8)
        assert len(reqs) == 8
        deadline = time.monotonic() + 60
        while len(rx.requests()) < 8 and time.monotonic() < deadline:
            time.sleep(0.2)
        top = rx.requests()
        assert sorted(attrs(s)["llamacpp_instr.request.id"] for s in top) == sorted(
            r["id"] for r in reqs
        )
        joined = [r for r in reqs if "traceparent" in r]
        assert [r["traceparent"] for r in joined] == [LIVE_PARENT]  # the malformed one left out
        for span in top:
            rec = next(r for r in reqs if r["id"] == attrs(span)["llamacpp_instr.request.id"])
            # why its prompt cache reused less, as instr requests says it (computed there)
            assert attrs(span).get("llamacpp_instr.prompt_cache_miss") == (
                cache_reason(rec["cache"])[1]
            )
            if rec in joined:  # the client's trace, under the client's span
                _, trace, parent, _ = LIVE_PARENT.split("-")
                assert span.trace_id.hex() == trace and span.parent_span_id.hex() == parent
            else:
                assert span.parent_span_id == b""
            kids = [s for s in rx.spans if s.parent_span_id == span.span_id]
            # its steps: the prompt's (at least one) and one per generated token decoded
            assert len(kids) >= rec["gen_tokens"] + 1, rec
            assert all(k.trace_id == span.trace_id for k in kids)
        follower.send_signal(signal.SIGTERM)
        _, err = follower.communicate(timeout=60)
        assert follower.returncode == 0, err
        assert err.strip().splitlines()[-1].endswith(" 0 lost")
    finally:
        for p in (follower, server):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
