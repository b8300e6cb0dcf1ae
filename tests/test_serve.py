"""`instr serve`, driven by the real `openai` client: concurrent requests, streaming and not, then
SIGINT; the log records every request and tags its steps, and converts."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import assert_same_trace, free_port, wait_ready

from llamacpp_instr.cli import main


@pytest.fixture(scope="module")
def served(instr_api: Any, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A server on the bundled model, four concurrent requests from the openai client, SIGINT."""
    import openai

    log = tmp_path_factory.mktemp("serve") / "serve.log"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llamacpp_instr.cli", "serve", str(smollm2_path)]
        + ["--port", str(port), "-o", str(log), "-t", "2"],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(port, proc)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")

        def completion(i: int) -> dict[str, Any]:
            r = client.completions.create(
                model="smollm2", prompt=f"Count from {i} to ten:", max_tokens=8, temperature=0
            )
            return {"kind": "completion", "text": r.choices[0].text}

        def chat_stream(i: int) -> dict[str, Any]:
            stream = client.chat.completions.create(
                model="smollm2",
                messages=[{"role": "user", "content": f"Name {i} colors."}],
                max_tokens=8,
                temperature=0,
                stream=True,
            )
            text = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
            return {"kind": "chat-stream", "text": text}

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda f_i: f_i[0](f_i[1]), [
                (completion, 1), (chat_stream, 2), (completion, 3), (chat_stream, 4)
            ]))  # fmt: skip
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    recs = [json.loads(line) for line in log.open(encoding="utf-8")]
    return {"results": results, "records": recs, "log": log, "rc": proc.returncode, "err": err}


def test_requests_are_answered_and_the_session_ends_interrupted(
    served: Any, schema_validator: Any
) -> None:
    assert all(r["text"] for r in served["results"]), served["results"]
    for rec in served["records"]:
        schema_validator.validate(rec)
    assert served["rc"] == 0, served["err"]
    assert "status interrupted" in served["err"] and "Traceback" not in served["err"]
    recs = served["records"]
    assert recs[0]["type"] == "session_start" and recs[0]["metadata"]["command"] == "instr serve"
    assert recs[-1]["type"] == "session_end" and recs[-1]["status"] == "interrupted"


def test_the_server_opens_its_context_as_llama_server_does(served: Any) -> None:
    """llama-server's own defaults (common.h's n_batch and n_ubatch, flash attention auto: on, on
    the CPU), as the model's context says them in the log, not llama-cpp-python's 512 and off."""
    ctx = served["records"][0]["context"]
    assert (ctx["n_batch"], ctx["n_ubatch"], ctx["flash_attn"]) == (2048, 512, True), ctx


def test_every_request_is_recorded_with_its_timings(served: Any) -> None:
    recs = served["records"]
    posts = [r for r in recs if r["type"] == "request" and r["method"] == "POST"]
    assert sorted(r["endpoint"] for r in posts) == sorted(
        ["/v1/completions"] * 2 + ["/v1/chat/completions"] * 2
    )
    assert sorted(r["stream"] for r in posts) == [False, False, True, True]
    steps = [r for r in recs if r["type"] == "step_begin"]
    for r in posts:
        assert r["status"] == 200
        assert 0 <= r["wait"] <= r["ttft"] <= r["wait"] + r["model"] <= r["dur"]
        mine = [s for s in steps if s.get("request") == r["id"]]
        # the request's steps decoded exactly the tokens it counted: its prompt, then one step
        # per fed-back generated token
        assert sum(s["n_tokens"] for s in mine) == r["prompt_tokens"] + r["gen_tokens"]
        assert len(mine) == 1 + r["gen_tokens"] and r["gen_tokens"] > 0
        # and they ran while the request was in flight
        assert all(r["t_arrive"] <= s["ts"] <= r["t_arrive"] + r["dur"] for s in mine)
    # requests took the model one at a time: their model-time intervals do not overlap
    spans = sorted(
        (r["t_arrive"] + r["wait"], r["t_arrive"] + r["wait"] + r["model"]) for r in posts
    )
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
    # every step of the session belongs to a request
    assert all("request" in s for s in steps)


def test_the_log_converts(served: Any, tmp_path: Path) -> None:
    out = tmp_path / "serve.pftrace"
    r = CliRunner().invoke(main, ["to-perfetto", str(served["log"]), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.stat().st_size > 0


@pytest.mark.fast
def test_port_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        log = tmp_path / "never.log"
        r = CliRunner().invoke(main, ["serve", "--port", str(port), "-o", str(log)])
    assert r.exit_code == 2
    assert r.output.strip() == f"error: port {port} on 127.0.0.1 is in use (choose another --port)"
    assert not log.exists()


def test_summary_gives_request_latency_percentiles(served: Any) -> None:
    import numpy as np

    r = CliRunner().invoke(main, ["summary", str(served["log"]), "--format", "json"])
    assert r.exit_code == 0, r.output
    lat = json.loads(r.output)["requests"]
    reqs = [x for x in served["records"] if x["type"] == "request"]
    assert lat["requests"] == len(reqs)
    for key, field in (("wait", "wait"), ("ttft", "ttft"), ("total", "dur")):
        ms = np.array([x[field] for x in reqs if x[field] is not None]) / 1e6
        for q in (50, 90, 99):
            assert lat[key][f"p{q}"] == pytest.approx(np.percentile(ms, q))
    # and the frames have the requests and each step's request id
    from llamacpp_instr import load_session

    f = load_session(served["log"])
    assert sorted(f.requests["id"].astype(str)) == sorted(x["id"] for x in reqs)
    assert f.steps["request"].notna().all()


def test_the_trace_has_a_requests_track(served: Any, tmp_path: Path) -> None:
    """Perfetto: requests on lanes above the steps (one slice per request, time to first token
    nested), the steps carrying their request id; the fast encoder equals the reference."""
    from llamacpp_instr import to_perfetto

    out = to_perfetto(served["log"], tmp_path / "t.pftrace")
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    trace = pb.Trace()
    trace.ParseFromString(out.read_bytes())
    tracks = {
        p.track_descriptor.uuid: p.track_descriptor.name
        for p in trace.packet
        if p.HasField("track_descriptor")
    }
    lanes = {u for u, n in tracks.items() if n.startswith("requests")}
    assert lanes and "requests" in tracks.values()
    names: dict[int, str] = {}
    for p in trace.packet:
        for e in p.interned_data.event_names:
            names[e.iid] = e.name
    begins = [
        p.track_event
        for p in trace.packet
        if p.HasField("track_event")
        and p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN
        and p.track_event.track_uuid in lanes
    ]
    titles = [names.get(e.name_iid, e.name) for e in begins]
    reqs = [x for x in served["records"] if x["type"] == "request"]
    assert sum(t.startswith(("POST ", "GET ")) for t in titles) == len(reqs)
    assert titles.count("time to first token") == sum(x["ttft"] is not None for x in reqs)
    assert_same_trace(served["log"])


# --out: the old spelling of -o/--output, kept for one release
@pytest.mark.parametrize("out_option", ["-o", "--out"])
def test_sigterm_ends_the_session_as_interrupted(
    out_option: str, instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    log = tmp_path / "term.log"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llamacpp_instr.cli", "serve", str(tiny_llama_f32)]
        + ["--port", str(port), out_option, str(log), "-t", "1", "--ctx", "256"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(port, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert ("warning: --out is deprecated" in err) == (out_option == "--out")
    recs = [json.loads(line) for line in log.open()]
    assert recs[-1]["type"] == "session_end" and recs[-1]["status"] == "interrupted"


def test_sigusr1_switches_the_level_from_the_next_step(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """instr serve at --level minimal, SIGUSR1 between two requests: the first's steps are
    minimal, the second's detailed (as the library's switch in llama-server), said on stderr."""
    import time
    import urllib.request

    log = tmp_path / "usr1.log"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llamacpp_instr.cli", "serve", str(tiny_llama_f32)]
        + ["--port", str(port), "-o", str(log), "-t", "1", "--ctx", "256", "--level", "minimal"],
        stderr=subprocess.PIPE,
        text=True,
    )

    def complete() -> None:
        body = json.dumps({"prompt": "a b c", "max_tokens": 3, "temperature": 0}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(req, timeout=120).read()

    try:
        wait_ready(port, proc)
        complete()
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)  # Python runs the handler between two bytecodes of the main thread
        complete()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "SIGUSR1: recording at detailed from the next step" in err
    recs = [json.loads(line) for line in log.open()]
    requests = sorted(
        (r for r in recs if r["type"] == "request" and r["endpoint"] == "/v1/completions"),
        key=lambda r: r["t_arrive"],
    )
    assert len(requests) == 2
    seen = []
    for r in requests:
        t0, t1 = r["t_arrive"], r["t_arrive"] + r["dur"]
        seen.append({x["level"] for x in recs if x["type"] == "step_begin" and t0 <= x["ts"] <= t1})
    assert seen == [{"minimal"}, {"detailed"}], seen
