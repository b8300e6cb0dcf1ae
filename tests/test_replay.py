"""``instr replay`` without the build: the media hash against vectors computed apart from it (the
native ``hash_bytes`` compiled by hand once, and numpy's uint64 arithmetic), the request decoder's
new fields, a body's media put back from a folder, the figures against hand-computed values, the
verdict, the plan's refusals, and the whole command against a stand-in server (``--url``) that
answers as llama-server does: streams of chunks, ``timings``, an error status, 401 without its API
key; the stalls named as ``instr requests`` names them; ``instr compare`` of a recording and its
replay against the replay's own figures, and the matching of their requests.

The replay against a real llama-server (its log's records, its ``timings``) is
test_replay_server.py."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from helpers.support import write_log

from llamacpp_instr.cli import main
from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.contract.media_hash import media_hash
from llamacpp_instr.converters.reading.decode.sessions import request_record
from llamacpp_instr.converters.session import replay_figures as fig
from llamacpp_instr.converters.session import replay_log
from llamacpp_instr.deciding.replay_verdict import best_setting
from llamacpp_instr.running.replay import client, plan
from llamacpp_instr.running.replay.media import MediaFolder, inflate, markers
from llamacpp_instr.running.replay.server import ServerGone, address

pytestmark = pytest.mark.fast

SID = "5e55104500000001"
SCHEMA = Path(__file__).resolve().parents[1] / "llamacpp_instr" / "contract" / "schema_v4.json"

# hash_bytes of patches/overlay/src/llama-instr-media.cpp, compiled apart and run on these inputs
NATIVE_HASHES = {
    b"": "2ad0938b4c26d017",
    b"a": "f8ec39b68a68c9ed",
    b"abcdefg": "def825fbf106b979",
    b"abcdefgh": "6ee442de3b937366",
    b"abcdefghi": "8aa977dff305bee7",
    b"The capital of France is": "249f98dcac23cd6e",
    b"0123456789abcdef": "bfa974de01c5f02d",
    bytes(i * 7 % 256 for i in range(1000)): "a5b94ef2b9c8c5ac",
}


def _numpy_hash(data: bytes) -> str:
    """The same hash in numpy's uint64 arithmetic (which wraps modulo 2**64)."""
    u = np.uint64
    with np.errstate(over="ignore"):
        h = u(0x9E3779B97F4A7C15) ^ u(len(data))
        whole = len(data) // 8 * 8
        for w in np.frombuffer(data[:whole], dtype="<u8"):
            h = (h ^ w) * u(0xBF58476D1CE4E5B9)
            h ^= h >> u(31)
        tail = np.frombuffer(data[whole:] + bytes(8 - (len(data) - whole)), dtype="<u8")[0]
        h = (h ^ tail) * u(0x94D049BB133111EB)
        return f"{int(h ^ (h >> u(29))):016x}"


def test_the_media_hash_is_the_native_ones() -> None:
    for data, want in NATIVE_HASHES.items():
        assert media_hash(data) == want, data[:20]
        assert _numpy_hash(data) == want
    rng = np.random.default_rng(7)
    for n in (1, 7, 8, 9, 15, 16, 17, 4097):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert media_hash(data) == _numpy_hash(data)


# --- the request record's new fields ----------------------------------------------------------


def _record(i: int, t_arrive: int, body: Any = None, **more: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"type": "request", "ts": t_arrive + 10**9, "sid": SID, "id": f"task-{i}"}
    rec |= {"endpoint": "/completion", "method": "POST", "status": 200, "outcome": "ok"}
    rec |= {"stream": bool((body or {}).get("stream")), "t_arrive": t_arrive, "wait": 1_000_000}
    rec |= {"ttft": 20_000_000, "model": 50_000_000, "dur": 60_000_000}
    rec |= {"prompt_tokens": 5, "gen_tokens": 4, "slot": 0, "gen_ids": [11, 12, 13, 14]}
    if body is not None:
        rec["body"] = body
    return rec | more


def test_the_decoder_keeps_the_body_and_the_generated_ids() -> None:
    body = {"prompt": "hi", "n_predict": 4, "stream": True}
    r = request_record(_record(0, 5, body))
    assert orjson.loads(r["body"]) == body and list(r["gen_ids"]) == [11, 12, 13, 14]
    assert r["gen_ids_left_out"] == 0
    # a record of a log from before the fields: none of them
    old = _record(0, 5)
    del old["gen_ids"]
    assert not {"body", "body_left_out", "body_bytes", "gen_ids"} & set(request_record(old))
    left = request_record(_record(0, 5, body_left_out="size", body_bytes=2 << 20))
    assert left["body_left_out"] == "size" and left["body_bytes"] == 2 << 20 and "body" not in left


def test_the_decoder_drops_a_body_over_1_mib_and_refuses_odd_fields() -> None:
    big = request_record(_record(0, 5, {"prompt": "x" * (1 << 20)}))
    assert "body" not in big and big["body_left_out"] == "size" and big["body_bytes"] > 1 << 20
    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(300):  # deeper than JSON is written back: dropped, the record kept
        inner["a"] = inner = {}
    assert request_record(_record(0, 5, deep))["body_left_out"] == "not_json"
    for odd, exc in (
        ({"body": "a string"}, TypeError),
        ({"body": {"p": 1}, "body_left_out": 3}, TypeError),
        ({"gen_ids": [1, -2]}, ValueError),
        ({"gen_ids": [1, True]}, TypeError),
        ({"gen_ids": list(range(16385))}, ValueError),
        ({"gen_ids": [1], "gen_ids_left_out": "many"}, TypeError),
    ):
        with pytest.raises(exc):
            request_record(_record(0, 5) | odd)


def test_the_new_fields_validate_against_the_schema() -> None:
    doc = json.loads(SCHEMA.read_text())
    v = jsonschema.Draft202012Validator(doc)
    marker = {"instr_media": {"hash": "0123456789abcdef", "bytes": 3, "prefix": ""}}
    good = _record(0, 5, {"prompt": {"prompt_string": "x", "multimodal_data": [marker]}})
    assert not list(v.iter_errors(good))
    assert not list(v.iter_errors(_record(1, 5, body_left_out="not_json", body_bytes=9)))
    assert list(v.iter_errors(_record(1, 5, body_left_out="why not")))
    assert list(v.iter_errors(_record(1, 5, gen_ids=[-1])))


# --- media ------------------------------------------------------------------------------------


def _marker(data: bytes, prefix: str = "data:image/png;base64,") -> dict[str, Any]:
    return {"instr_media": {"hash": media_hash(data), "bytes": len(data), "prefix": prefix}}


def test_a_bodys_media_are_found_by_hash_and_put_back(tmp_path: Path) -> None:
    image, sound = b"\x89PNG fake image bytes", b"RIFF fake wav"
    (tmp_path / "a.png").write_bytes(image)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.wav").write_bytes(sound)
    (tmp_path / "same-size.png").write_bytes(b"x" * len(image))  # its size, not its hash
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": _marker(image)}},
                    {
                        "type": "input_audio",
                        "input_audio": {"data": _marker(sound, ""), "format": "wav"},
                    },
                    {"type": "text", "text": "what is this?"},
                ],
            }
        ]
    }
    assert len(list(markers(body))) == 2
    found = MediaFolder(tmp_path).resolve(body)
    assert found is not None
    sent = inflate(body, found)
    parts = sent["messages"][0]["content"]
    assert (
        parts[0]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(image).decode()
    )
    assert parts[1]["input_audio"]["data"] == base64.b64encode(sound).decode()
    assert parts[2] == {"type": "text", "text": "what is this?"}
    # a medium whose bytes are not there: not found, never another file of its size
    other = {"prompt": {"multimodal_data": [_marker(b"y" * len(image), "")]}}
    assert MediaFolder(tmp_path).resolve(other) is None
    assert MediaFolder(None).resolve(body) is None


# --- figures ----------------------------------------------------------------------------------


def _row(ttft: float | None, tpot: float | None, e2e: float, n_out: int, ok: bool = True) -> dict:
    return {"ok": ok, "ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e, "n_out": n_out}


def test_percentiles_goodput_and_throughput_by_hand() -> None:
    # four requests: e2e 100, 200, 300, 400 ms -> p50 250, p90 370, p99 397 (linear between ranks)
    rows = [
        _row(10, 5, 100, 11),
        _row(20, 10, 200, 11),
        _row(30, 20, 300, 11),
        _row(40, 40, 400, 11),
        _row(None, None, 0, 0, ok=False),
    ]
    s = fig.summary(fig.Setting("x", rows, span_ns=2 * 10**9), fig.Slo(ttft_ms=25, tpot_ms=10))
    assert s["e2e_ms"] == pytest.approx({"p50": 250.0, "p90": 370.0, "p99": 397.0})
    assert s["ttft_ms"]["p50"] == pytest.approx(25.0)
    assert s["requests"] == 5 and s["failed"] == 1
    # goodput: of the five sent, the first two meet TTFT <= 25 and TPOT <= 10
    assert s["goodput"] == pytest.approx(2 / 5)
    assert s["throughput"] == pytest.approx(44 / 2.0)  # 4 x 11 tokens over 2 s
    assert fig.percentiles([]) == {"p50": None, "p90": None, "p99": None}
    # TPOT: (e2e - ttft) / (n_out - 1)
    assert fig.tpot_ns(1_000, 100, 10) == pytest.approx(100.0)
    assert fig.tpot_ns(1_000, 100, 1) is None
    # a request of one token meets any TPOT (vLLM's 0), and the ITL percentiles pool every gap
    assert fig.Slo(tpot_ms=1).met(_row(5, None, 50, 1))
    from array import array

    gaps = [array("q", [10_000_000, 30_000_000]), array("q", [20_000_000])]
    itl = fig.summary(fig.Setting("y", rows[:1], gaps), None)["itl_ms"]
    assert itl == pytest.approx({"p50": 20.0, "p90": 28.0, "p99": 29.8})
    assert fig.cdf([1.0, 2.0, 2.0, None, 4.0], [0.0, 2.0, 3.0, 4.0]) == [0.0, 0.75, 0.75, 1.0]


def test_a_replayed_row_against_its_recording() -> None:
    rec = request_record(_record(0, 5, {"prompt": "x", "stream": True}))
    sent = fig.Replayed(0, "tp", status=200, e2e_ns=90_000_000, ttft_ns=30_000_000, n_out=4)
    served = rec | {"ttft": 25_000_000, "dur": 88_000_000}
    row = fig.replayed_row("s", rec, sent, served)
    assert row["ttft_ms"] == 30.0 and row["server_ttft_ms"] == 25.0 and row["e2e_ms"] == 90.0
    assert row["tpot_ms"] == pytest.approx(20.0) and row["identical"] is True
    assert row["recorded_ttft_ms"] == 20.0 and row["recorded_e2e_ms"] == 60.0
    other = served | {"gen_ids": request_record(_record(0, 5, gen_ids=[11, 12]))["gen_ids"]}
    assert fig.replayed_row("s", rec, sent, other)["identical"] is False
    assert fig.replayed_row("s", rec, sent, None)["identical"] is None
    # the tokens a record's request generated: its ids, else those decoded and the last sampled
    assert fig.output_tokens(rec) == 4 and fig.recorded_row(rec)["n_out"] == 4
    no_ids = {k: v for k, v in rec.items() if not k.startswith("gen_ids")}
    assert fig.output_tokens(no_ids) == 5 and fig.output_tokens(no_ids | {"ttft": None}) == 4
    # not a stream: the server's own TTFT
    whole = request_record(_record(1, 5, {"prompt": "x"}))
    assert fig.replayed_row("s", whole, sent, served)["ttft_ms"] == 25.0


def test_the_verdict_is_the_most_goodput_then_the_lowest_p90() -> None:
    def s(name: str, goodput: float | None, p90: float | None, failed: int = 0) -> dict:
        return {
            "setting": name,
            "goodput": goodput,
            "e2e_ms": {"p90": p90},
            "requests": 4,
        }.copy() | {"failed": failed}

    slo = fig.Slo(ttft_ms=100)
    rows = [s(fig.RECORDED, 1.0, 1.0), s("a", 0.5, 100), s("b", 0.75, 300), s("c", 0.75, 200)]
    v = best_setting(rows, slo)
    assert v is not None and v.setting == "c" and "goodput 75.0%" in v.line()
    assert best_setting([s("a", None, 300), s("b", None, None), s("c", None, 250)], None).setting == "c"  # type: ignore[union-attr]
    assert best_setting([s(fig.RECORDED, 1, 1)], slo) is None
    assert best_setting([s("a", 0, None, failed=4)], slo) is None


def test_the_slo_and_the_window_are_parsed_or_refused() -> None:
    assert fig.parse_slo("ttft=500,tpot=50") == fig.Slo(500.0, 50.0)
    assert fig.parse_slo("tpot=7.5") == fig.Slo(None, 7.5)
    for bad in ("", "ttft", "ttft=-1", "e2e=5", "ttft=1,ttft=2"):
        with pytest.raises(UserError):
            fig.parse_slo(bad)
    assert replay_log.parse_window("10:20") == (10.0, 20.0)
    assert replay_log.parse_window("5:") == (5.0, float("inf"))
    for bad in ("10", "20:10", "a:b", "-1:3"):
        with pytest.raises(UserError):
            replay_log.parse_window(bad)


# --- reading and planning ---------------------------------------------------------------------


def _session(ts: int = 0) -> dict[str, Any]:
    rec: dict[str, Any] = {"type": "session_start", "ts": ts, "sid": SID, "schema_version": 4}
    rec |= {"level": "detailed", "metadata": {"program": "llama-server"}}
    return rec | {"context": {"n_ctx": 512, "n_seq_max": 2}, "memory": {}}


def _alloc(i: int, ts: int, n: int, purpose: str = "kv_cache") -> dict[str, Any]:
    return {
        "type": "memory_alloc", "ts": ts, "sid": SID, "id": i, "device": 0,
        "buffer_type": "CPU", "bytes": n, "purpose": purpose,
    }  # fmt: skip


def test_the_first_n_and_a_window_are_read_within_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # written in another order than they arrived (a record is written when its request ends)
    arrivals = [5, 1, 4, 2, 3, 9, 0]
    recs = [_session(), _alloc(1, 1, 100), _alloc(2, 2, 50, "compute")]
    recs += [_record(i, t * 10**9, {"prompt": f"p{i}"}) for i, t in enumerate(arrivals)]
    log = write_log(tmp_path / "s.log", recs)
    served = replay_log.read_served(log, replay_log.Selection(first=3))
    assert [r["t_arrive"] // 10**9 for r in served.requests] == [0, 1, 2]
    assert served.total == 7 and served.peaks == {"device 0": 150}
    window = replay_log.read_served(log, replay_log.Selection(window=(2, 4.5), first=2))
    assert [r["t_arrive"] // 10**9 for r in window.requests] == [2, 3]
    monkeypatch.setattr(replay_log, "REQUESTS_MAX", 5)
    with pytest.raises(UserError, match="holds over 5 requests to replay: replay part of it"):
        replay_log.read_served(log)
    assert len(replay_log.read_served(log, replay_log.Selection(first=5)).requests) == 5
    # a window holds no more than its own requests (and those before the first is known)
    short = replay_log.read_served(log, replay_log.Selection(window=(1, 2.5)))
    assert [r["t_arrive"] // 10**9 for r in short.requests] == [1, 2]
    with pytest.raises(UserError, match="or a shorter --window"):
        replay_log.read_served(log, replay_log.Selection(window=(0, 8)))
    monkeypatch.setattr(replay_log, "BODIES_MAX", 40)
    with pytest.raises(UserError, match="holds over 1 GiB of bodies"):
        replay_log.read_served(log, replay_log.Selection(first=4))


def test_the_plan_sends_known_endpoints_and_refuses_a_forged_span(tmp_path: Path) -> None:
    recs = [
        request_record(_record(0, 0, {"prompt": "a"})),
        request_record(_record(1, 10**9, {"input": "b"}, endpoint="/tokenize")),
        request_record(_record(2, 2 * 10**9, {"prompt": "c", "stream": True})),
        request_record(_record(3, 3 * 10**9, body_left_out="size", body_bytes=3 << 20)),
        request_record(_record(4, 4 * 10**9, {"prompt": {"multimodal_data": [_marker(b"img")]}})),
    ]
    p = plan.make_plan("s.log", recs, 2.0, MediaFolder(None))
    assert [(s.endpoint, s.at_ns, s.stream) for s in p.sends] == [
        ("/completion", 0, False),
        ("/completion", 10**9, True),  # 2 s after the first, at twice the speed
    ]
    assert [r["id"] for r in p.recorded] == ["task-0", "task-2"]
    assert p.skipped == {
        "endpoint /tokenize": 1,
        "no body (size)": 1,
        "media not at hand (--media DIR)": 1,
    }
    years = [
        request_record(_record(0, 0, {"prompt": "a"})),
        request_record(_record(1, 3 * 10**17, {"prompt": "b"})),
    ]
    with pytest.raises(UserError, match="span 3,472 days at speed 1: replay part of it"):
        plan.make_plan("s.log", years, 1.0, MediaFolder(None))
    assert len(plan.make_plan("s.log", years, 1e6, MediaFolder(None)).sends) == 2


def test_a_server_address_is_read_from_its_arguments() -> None:
    assert address(["-m", "m.gguf"]) == ("127.0.0.1", None)
    assert address(["--port", "8081", "--host", "0.0.0.0"]) == ("127.0.0.1", 8081)
    assert address(["--port=9", "--host=::1"]) == ("[::1]", 9)
    with pytest.raises(UserError):
        address(["--host", "/tmp/s.sock"])


# --- the command, against a stand-in server ---------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    """llama-server's answers, in small: /completion and /v1/chat/completions, whole or streamed
    (one chunk per token, 10 ms apart, the last with `timings`), and 400 for more than 64 tokens."""

    seen: list[tuple[str, dict[str, Any], str]] = []
    key: str | None = None  # the API key it wants (Authorization: Bearer KEY), as llama-server

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.path, body, self.headers.get("traceparent", "")))
        if self.key is not None and self.headers.get("Authorization") != f"Bearer {self.key}":
            return self._send(401, {"error": {"code": 401, "message": "Invalid API Key"}})
        n = int(body.get("n_predict", body.get("max_tokens", 3)))
        chat = self.path.endswith("chat/completions")
        if n > 64:
            return self._send(400, {"error": {"code": 400, "message": "the context is too small"}})
        timings = {
            "cache_n": 0,
            "prompt_n": 5,
            "prompt_ms": 4.0,
            "predicted_n": n,
            "predicted_ms": 9.0,
        }
        if not body.get("stream"):
            time.sleep(0.02)
            if chat:
                msg = {"choices": [{"message": {"content": "ab" * n}}], "timings": timings}
                return self._send(200, msg)
            return self._send(200, {"content": "ab" * n, "tokens_predicted": n, "timings": timings})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for k in range(n):
            time.sleep(0.01)
            part = {"choices": [{"delta": {"content": f"t{k}"}}]} if chat else {"content": f"t{k}"}
            self.wfile.write(b"data: " + json.dumps(part).encode() + b"\n\n")
            self.wfile.flush()
        last = (
            {"choices": [{"delta": {}}], "timings": timings}
            if chat
            else {"content": "", "stop": True, "timings": timings}
        )
        self.wfile.write(b"data: " + json.dumps(last).encode() + b"\n\n")
        if chat:
            self.wfile.write(b"data: [DONE]\n\n")

    def _send(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def stand_in() -> Iterator[str]:
    _Handler.seen = []
    _Handler.key = None
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def _traffic(tmp_path: Path, media: Path) -> Path:
    image = b"\xff\xd8\xff fake jpeg"
    (media / "cat.jpg").write_bytes(image)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    with_image = {
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": _marker(image, "data:image/jpeg;base64,")}},
        ]}],
        "max_tokens": 2,
    }  # fmt: skip
    recs = [_session()]
    recs.append(_record(0, 10**9, {"prompt": "a", "n_predict": 5, "stream": True}))
    recs.append(_record(1, 10**9 + 50_000_000, {"prompt": "b", "n_predict": 3}))
    recs.append(_record(2, 10**9 + 80_000_000, chat, endpoint="/v1/chat/completions"))
    recs.append(_record(3, 10**9 + 90_000_000, {"prompt": "c", "n_predict": 100}))  # refused
    recs.append(_record(4, 10**9 + 100_000_000, with_image, endpoint="/v1/chat/completions"))
    return write_log(tmp_path / "recorded.log", recs)


def test_the_command_replays_against_a_running_server(tmp_path: Path, stand_in: str) -> None:
    media = tmp_path / "media"
    media.mkdir()
    log = _traffic(tmp_path, media)
    out = tmp_path / "new.log"
    t0 = time.monotonic()
    r = _cli("replay", str(log), "--url", stand_in, "-o", str(out), "--media", str(media),
             "--slo", "ttft=1000,tpot=1000", "--format", "json")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert time.monotonic() - t0 >= 0.1  # the last one is sent 100 ms after the first
    data = json.loads(r.stdout)
    rows = {row["id"]: row for row in data["requests"]}
    assert set(rows) == {f"task-{i}" for i in range(5)}
    streamed = rows["task-0"]
    assert streamed["ok"] and streamed["n_out"] == 5 and streamed["ttft_ms"] >= 10
    assert streamed["tpot_ms"] == pytest.approx((streamed["e2e_ms"] - streamed["ttft_ms"]) / 4)
    assert streamed["itl_max_ms"] >= 9 and streamed["prompt_ms"] == 4.0
    assert rows["task-2"]["n_out"] == 4 and rows["task-2"]["ttft_ms"] is not None
    assert rows["task-1"]["ttft_ms"] is None and rows["task-1"]["e2e_ms"] >= 20  # (no log: no TTFT)
    refused = rows["task-3"]
    assert not refused["ok"] and refused["status"] == 400
    assert rows["task-4"]["ok"] and rows["task-4"]["identical"] is None
    settings = {s["setting"]: s for s in data["settings"]}
    assert settings[stand_in]["requests"] == 5 and settings[stand_in]["failed"] == 1
    assert settings[stand_in]["goodput"] == pytest.approx(4 / 5)
    assert settings["recorded"]["requests"] == 5 and data["best"] == stand_in
    # the image went out as the client sent it, each request with its own traceparent
    sent = {tp: (path, body) for path, body, tp in _Handler.seen}
    assert len(sent) == 5
    urls = [b["messages"][0]["content"][0]["image_url"]["url"] for p, b in sent.values()
            if p == "/v1/chat/completions" and isinstance(b["messages"][0]["content"], list)]  # fmt: skip
    assert urls == [
        "data:image/jpeg;base64," + base64.b64encode(b"\xff\xd8\xff fake jpeg").decode()
    ]
    lines = [json.loads(x) for x in (tmp_path / "new.log.responses.jsonl").read_text().splitlines()]
    assert sorted(x["id"] for x in lines) == sorted(rows)
    by_id = {x["id"]: x for x in lines}
    assert by_id["task-0"]["text"] == "t0t1t2t3t4" and by_id["task-3"]["status"] == 400
    assert by_id["task-0"]["timings"]["predicted_n"] == 5 and len(by_id["task-0"]["itl_ms"]) == 4
    for fmt in ("text", "csv", "html", "markdown"):
        again = _cli("replay", str(log), "--url", stand_in, "-o", str(out), "--first", "2",
                     "--format", fmt)  # fmt: skip
        assert again.exit_code == 0, again.output
    assert (
        "e2e_cdf" in again.stdout
        or "<svg"
        in _cli("replay", str(log), "--url", stand_in, "-o", str(out), "--format", "html").stdout
    )


def test_a_media_not_at_hand_is_skipped_and_counted(tmp_path: Path, stand_in: str) -> None:
    media = tmp_path / "media"
    media.mkdir()
    log = _traffic(tmp_path, media)
    (media / "cat.jpg").write_bytes(b"another image of the same size!"[:16])
    r = _cli(
        "replay", str(log), "--url", stand_in, "-o", str(tmp_path / "n.log"), "--format", "json"
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["skipped"] == {"media not at hand (--media DIR)": 1}
    assert len(data["requests"]) == 4 and len(_Handler.seen) == 4


def _one_line(r: Any, words: str, code: int = 2) -> None:
    assert r.exit_code == code, r.output
    assert words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_bad_input_ends_in_one_line(tmp_path: Path) -> None:
    bare = [_record(i, i * 10**6) for i in range(3)]
    log = write_log(tmp_path / "old.log", [_session(), *bare])
    url = ("--url", "http://127.0.0.1:9")
    _one_line(_cli("replay", str(log), *url), "its 3 request records were recorded without bodies")
    _one_line(_cli("replay", str(log), *url), "record at detailed")
    none = write_log(tmp_path / "none.log", [_session()])
    _one_line(_cli("replay", str(none), *url), "no request records")
    _one_line(_cli("replay", str(tmp_path / "missing.log"), *url), "missing.log")
    _one_line(_cli("replay", str(log), "--slo", "ttft=fast", *url), "--slo 'ttft=fast'")
    _one_line(_cli("replay", str(log), "--window", "9:1", *url), "--window '9:1'")
    _one_line(
        _cli("replay", str(log), "--", "llama-cli", "-m", "m"), "starts llama-server, not llama-cli"
    )
    _one_line(_cli("replay", str(log)), "give llama-server's arguments after --, or --url")
    _one_line(_cli("replay", str(log), "--set", "-b 8", *url), "--set starts a server per setting")
    assert not list(tmp_path.glob("*.responses.jsonl"))


def test_a_server_gone_mid_replay_ends_the_replay_at_once(tmp_path: Path, stand_in: str) -> None:
    recs = [
        request_record(_record(i, i * 10**9, {"prompt": "x", "n_predict": 2})) for i in range(30)
    ]
    p = plan.make_plan("s.log", recs, 1.0, MediaFolder(None))
    t0 = time.monotonic()
    gone_at = t0 + 0.3
    done: list[fig.Replayed] = []
    with pytest.raises(ServerGone, match="llama-server ended") as exc:
        client.send_all(
            stand_in,
            p,
            MediaFolder(None),
            lambda x, text: done.append(x),
            lambda: "llama-server ended (exit status -9)" if time.monotonic() > gone_at else None,
        )
    assert exc.value.exit_status == 1
    assert time.monotonic() - t0 < 5  # not the 30 s the requests span
    assert 1 <= len(done) <= 2


# --- the server a replay starts, stood in for by a script -------------------------------------

# llama-server in small, as `instr exec` would run it: it serves /health and /completion on
# --port, writes a session log where LLAMA_INSTR_LOG says (a buffer of -c KiB, and a request record
# per request with its traceparent), ends its session on SIGINT, and with --die-after N kills
# itself at its Nth request
FAKE_SERVER = r"""
import json, os, signal, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
def opt(name, default):
    return args[len(args) - 1 - args[::-1].index(name) + 1] if name in args else default
port, ctx, die_after = int(opt("--port", 0)), int(opt("-c", 64)), int(opt("--die-after", 0))
# its API keys as llama-server takes them: --api-key (else LLAMA_API_KEY), --api-key-file
given = [args[k + 1] for k, a in enumerate(args[:-1]) if a == "--api-key"]
keys = [k for v in given or [os.environ.get("LLAMA_API_KEY", "")] for k in v.split(",") if k]
if "--api-key-file" in args:
    keys += [x for x in open(opt("--api-key-file", "")).read().splitlines() if x and x[0] != "#"]
if "--no-log" in args:
    print("llama-instr: LLAMA_INSTR_TOPK=0 is not a number: running uninstrumented", file=sys.stderr)
out = open(os.devnull if "--no-log" in args else os.environ["LLAMA_INSTR_LOG"], "a", buffering=1)
SID = "fa4e5e4e00000001"
def write(rec):
    out.write(json.dumps({"ts": time.monotonic_ns(), "sid": SID} | rec) + "\n")
write({"type": "session_start", "schema_version": 4, "level": os.environ["LLAMA_INSTR_LEVEL"],
       "metadata": {"program": "llama-server", "argv": sys.argv}, "context": {}, "memory": {}})
write({"type": "memory_alloc", "id": 1, "device": 0, "buffer_type": "CPU", "bytes": ctx * 1024,
       "purpose": "kv_cache"})
served = 0

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def do_POST(self):
        global served
        t = time.monotonic_ns()
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if keys and self.headers.get("Authorization", "").removeprefix("Bearer ") not in keys:
            data = b'{"error":{"code":401,"message":"Invalid API Key"}}'
            self.send_response(401)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return self.wfile.write(data)
        served += 1
        if served == die_after:
            os.kill(os.getpid(), signal.SIGKILL)
        n = int(body.get("n_predict", 2))
        time.sleep(0.01)
        ttft = time.monotonic_ns() - t
        time.sleep(0.01 * n)
        data = json.dumps({"content": "x" * n, "timings": {"predicted_n": n}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        write({"type": "request", "id": f"task-{served}", "endpoint": self.path, "method": "POST",
               "status": 200, "stream": False, "t_arrive": t, "wait": 0, "ttft": ttft,
               "model": 0, "dur": time.monotonic_ns() - t, "prompt_tokens": 2, "gen_tokens": n,
               "traceparent": self.headers["traceparent"], "gen_ids": list(range(n)),
               "body": body})

srv = ThreadingHTTPServer(("127.0.0.1", port), H)
def end(*_):
    write({"type": "session_end", "status": "interrupted"})
    os._exit(0)
signal.signal(signal.SIGINT, end)
srv.serve_forever()
"""


@pytest.fixture
def fake_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``instr replay -- llama-server ...`` runs the script above."""
    import sys

    from llamacpp_instr.native import tools

    exe = tmp_path / "llama-server"
    exe.write_text(f"#!{sys.executable}\n{FAKE_SERVER}")
    exe.chmod(0o755)
    monkeypatch.setattr(tools, "find_logged", lambda program, *a: exe)
    return exe


def _recorded_for_fake(tmp_path: Path, n: int) -> Path:
    recs = [_session()]
    recs += [_record(i, i * 100_000_000, {"prompt": f"p{i}", "n_predict": 2}) for i in range(n)]
    return write_log(tmp_path / "recorded.log", recs)


def test_the_command_starts_a_server_per_setting_and_stops_it(
    tmp_path: Path, fake_server: Path
) -> None:
    log = _recorded_for_fake(tmp_path, 4)
    out = tmp_path / "new.log"
    out.write_text("an earlier replay's log\n")
    r = _cli("replay", str(log), "-o", str(out), "--format", "json", "--set", "-c 64",
             "--set", "-c 32", "--", "llama-server", "-m", "m.gguf")  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [s["setting"] for s in data["settings"]] == ["recorded", "-c 64", "-c 32"]
    peaks = {s["setting"]: s["peak_memory"] for s in data["settings"]}
    assert peaks["-c 64"] == {"device 0": 64 * 1024} and peaks["-c 32"] == {"device 0": 32 * 1024}
    rows = data["requests"]
    assert len(rows) == 8 and all(r["ok"] and r["identical"] is False for r in rows)  # (0, 1)
    assert all(
        r["server_ttft_ms"] is not None and r["ttft_ms"] == r["server_ttft_ms"] for r in rows
    )
    for k in (1, 2):
        recs = [json.loads(x) for x in (tmp_path / f"new.{k}.log").read_text().splitlines()]
        assert recs[0]["level"] == "detailed" and recs[-1]["type"] == "session_end"
        assert sum(x["type"] == "request" for x in recs) == 4
    assert out.read_text() == "an earlier replay's log\n"  # (-o with --set: new.1.log, new.2.log)
    assert "instr replay: session log" in r.stderr and "--port" in r.stderr


def test_a_server_that_dies_mid_replay_ends_it_in_one_line(
    tmp_path: Path, fake_server: Path
) -> None:
    log = _recorded_for_fake(tmp_path, 6)
    out = tmp_path / "cut.log"
    r = _cli("replay", str(log), "-o", str(out), "--", "llama-server", "--die-after", "3")
    assert r.exit_code == 1, r.output
    errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert errors == [f"error: llama-server ended (exit status -9); its log: {out}"], r.stderr
    assert "Traceback" not in r.stderr
    recs = [json.loads(x) for x in out.read_text().splitlines()]  # kept, every line whole
    assert sum(x["type"] == "request" for x in recs) == 2
    assert len((tmp_path / "cut.log.responses.jsonl").read_text().splitlines()) >= 2


def test_each_cdf_ends_at_every_request() -> None:
    from llamacpp_instr.converters.reports.replay_report import CDF_POINTS, cdf_chart

    rows = [{"ok": True, "e2e_ms": v} for v in (0.1, 0.7, 31.50000315, 2.0)]
    rows.append({"ok": False, "e2e_ms": 99.0})  # (failed: not in the CDF)
    chart = cdf_chart([fig.Setting("a", rows), fig.Setting("b", rows[:2])], "e2e_ms")
    assert chart is not None and len(chart.x) == CDF_POINTS and chart.x[-1] == 31.50000315
    assert [s.values[-1] for s in chart.series] == [1.0, 1.0]
    assert chart.series[0].values[0] == 0.0


def test_a_server_that_writes_no_log_is_said_in_one_line(tmp_path: Path, fake_server: Path) -> None:
    log = _recorded_for_fake(tmp_path, 2)
    r = _cli("replay", str(log), "-o", str(tmp_path / "n.log"), "--", "llama-server", "--no-log")
    assert r.exit_code == 2 and "Traceback" not in r.stderr, r.output
    assert [x for x in r.stderr.splitlines() if x.startswith("error:")] == [
        f"error: llama-server wrote no session log at {tmp_path / 'n.log'}: llama-instr: "
        "LLAMA_INSTR_TOPK=0 is not a number: running uninstrumented"
    ]


def _nowhere(secret: str, *where: Path | str) -> None:
    """``secret`` is in none of the files and texts given."""
    for w in where:
        text = w.read_text(errors="replace") if isinstance(w, Path) else w
        assert secret not in text, w if isinstance(w, Path) else text[:200]


def test_a_keyed_server_gets_its_key_and_the_key_is_written_nowhere(
    tmp_path: Path, fake_server: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _recorded_for_fake(tmp_path, 3)
    key_file = tmp_path / "keys.txt"
    key_file.write_text("# the server's keys\nfrom-a-file\n")
    monkeypatch.delenv("LLAMA_API_KEY", raising=False)
    for k, (server, settings, secret) in enumerate(
        [
            (["--api-key", "from-the-args,another"], [], "from-the-args"),
            (["--api-key-file", str(key_file)], [], "from-a-file"),
            ([], ["--set", "-c 32 --api-key from-a-setting"], "from-a-setting"),
        ]
    ):
        out = tmp_path / f"keyed{k}.log"
        r = _cli("replay", str(log), "-o", str(out), "--format", "json", *settings, "--",
                 "llama-server", "-m", "m.gguf", *server)  # fmt: skip
        assert r.exit_code == 0, r.output
        data = json.loads(r.stdout)
        assert len(data["requests"]) == 3 and all(x["ok"] for x in data["requests"]), r.stdout
        logs = list(tmp_path.glob(f"keyed{k}*.log")) + list(tmp_path.glob(f"keyed{k}*.jsonl"))
        assert len(logs) == 2
        # the server's command line (which its log records) holds no key; nor anything written
        argv = json.loads(logs[0].read_text().splitlines()[0])["metadata"]["argv"]
        assert "--api-key" not in argv
        _nowhere(secret, *logs, r.stdout, r.stderr)
    assert [s["setting"] for s in data["settings"]] == ["recorded", "-c 32 --api-key ***"]
    # LLAMA_API_KEY, which the server reads too
    monkeypatch.setenv("LLAMA_API_KEY", "from-the-environment")
    r = _cli("replay", str(log), "-o", str(tmp_path / "env.log"), "--format", "json", "--",
             "llama-server", "-m", "m.gguf")  # fmt: skip
    assert r.exit_code == 0 and all(x["ok"] for x in json.loads(r.stdout)["requests"]), r.output
    missing = tmp_path / "gone.txt"
    out = tmp_path / "never.log"
    _one_line(
        _cli("replay", str(log), "-o", str(out), "--", "llama-server", "--api-key-file",
             str(missing)),
        f"llama-server --api-key-file {missing}: No such file or directory",
    )  # fmt: skip
    # no half-written file: the responses' file of a replay that never started is not left
    assert not out.with_name("never.log.responses.jsonl").exists()


def test_a_keyed_server_at_a_url(tmp_path: Path, stand_in: str) -> None:
    media = tmp_path / "media"
    media.mkdir()
    log = _traffic(tmp_path, media)
    _Handler.key = "url-secret"
    out = tmp_path / "n.log"
    base = ("replay", str(log), "--url", stand_in, "-o", str(out), "--first", "3")
    r = _cli(*base, "--format", "json")
    assert r.exit_code == 0, r.output
    assert {x["status"] for x in json.loads(r.stdout)["requests"]} == {401}  # (no key: refused)
    r = _cli(*base, "--api-key", "url-secret", "--format", "json")
    assert r.exit_code == 0, r.output
    assert all(x["ok"] for x in json.loads(r.stdout)["requests"]), r.stdout
    _nowhere("url-secret", out.with_name("n.log.responses.jsonl"), r.stdout, r.stderr)
    _one_line(
        _cli("replay", str(log), "--api-key", "k", "--", "llama-server", "-m", "m"),
        "--api-key is --url's",
    )


# --- stalls: late tokens as `instr requests` names them ----------------------------------------


def _stalled_log(tmp_path: Path) -> Path:
    """test_requests' slot 0 (task-a), whose seventh token waits 250 ms behind slot 1's prefill of
    300 tokens (task-b), as a server's log: its steps and its two requests, bodies and all."""
    from test_requests import _steps_with_a_prefill

    rows, reqs = _steps_with_a_prefill()
    recs = [_session()]
    for k, (t, d, n, seqs) in enumerate(rows):
        head = {"sid": SID, "step": k, "ctx": 1, "n_tokens": n}
        recs.append(head | {"type": "step_begin", "ts": t, "pos": [0, n - 1],
                            "kind": "prompt" if n > 1 else "gen",
                            "seqs": [[q, m, 0, m - 1] for q, m in seqs]})  # fmt: skip
        recs.append(head | {"type": "step_end", "ts": t + d, "t_start": t, "dur": d,
                            "status": 0, "n_outputs": len(seqs), "kv_used": 0})  # fmt: skip
    for r in reqs:
        body = {"prompt": r["id"], "n_predict": 4, "stream": True}
        recs.append(r | {"sid": SID, "body": body, "gen_ids": [1, 2, 3, 4]})
    return write_log(tmp_path / "stalled.log", sorted(recs, key=lambda r: r["ts"]))


def test_a_stall_is_named_by_each_logs_ids_and_the_recorded_ones(tmp_path: Path) -> None:
    from llamacpp_instr.converters.reports.replay_stalls import stalls

    log = _stalled_log(tmp_path)
    (row,) = stalls("recorded", log, None, None, {"task-a", "task-b"})
    assert row["cause"] == (
        "token 7 of task-a came 240 ms late: slot 1 was prefilling 300 tokens of task-b "
        "in the same batch"
    )
    assert (row["token"], row["gap_ms"], row["late_ms"]) == (7, 250.0, 240.0)
    assert row["prefill_recorded_id"] == "task-b" and row["prefill_tokens"] == 300
    # as a replay's log: its ids mapped to the recorded ones, those of no replayed request left out
    (row,) = stalls("-b 64", log, None, {"task-a": "task-3", "task-b": "task-9"})
    assert (row["recorded_id"], row["prefill_recorded_id"]) == ("task-3", "task-9")
    assert row["request"] == "task-a" and row["setting"] == "-b 64"
    assert stalls("x", log, None, {"task-b": "task-9"}) == []
    assert stalls("recorded", log, None, None, {"task-b"}) == []
    assert stalls("x", tmp_path / "no.log", None, {}) == []


def test_the_report_names_the_recordings_stalls(tmp_path: Path, stand_in: str) -> None:
    log = _stalled_log(tmp_path)
    base = ("replay", str(log), "--url", stand_in, "-o", str(tmp_path / "n.log"))
    r = _cli(*base, "--format", "json")
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.stdout)["stalls"]
    assert row["setting"] == "recorded" and row["prefill_recorded_id"] == "task-b"
    text = _cli(*base).stdout
    assert "late tokens, recorded:" in text and "behind task-b's prefill" in text
    assert "slot 1 was prefilling 300 tokens of task-b in the same batch" in text


# --- instr compare RECORDED.log REPLAYED.log --------------------------------------------------


def _same_rows(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    """The same rows, their times within a rounding of ns to ms and back."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], float):
                assert y[k] == pytest.approx(x[k], abs=1e-5), k
            else:
                assert y[k] == x[k], k


def _summaries_alike(a: dict[str, Any], b: dict[str, Any]) -> None:
    for key in ("requests", "failed", "output_tokens", "peak_memory", "goodput"):
        assert a[key] == b[key], key
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert a[key] == pytest.approx(b[key], abs=1e-5), key
    assert a["throughput"] == pytest.approx(b["throughput"], rel=1e-6)


def test_compare_sets_a_replay_against_its_recording_as_the_replay_does(
    tmp_path: Path, fake_server: Path
) -> None:
    log = _recorded_for_fake(tmp_path, 4)
    out = tmp_path / "new.log"
    slo = ("--slo", "ttft=1000,tpot=1000")
    r = _cli("replay", str(log), "-o", str(out), "--format", "json", *slo, "--",
             "llama-server", "-m", "m.gguf")  # fmt: skip
    assert r.exit_code == 0, r.output
    replay = json.loads(r.stdout)
    c = _cli("compare", str(log), str(out), "--format", "json", *slo)
    assert c.exit_code == 0, c.output
    got = json.loads(c.stdout)["requests"]
    assert (got["why"], got["matched"], got["times"]) == (None, 4, "client")
    # the replay's own rows and summaries: one derivation, from the two logs and the responses
    mine = [dict(row, setting=out.name) for row in replay["requests"]]
    _same_rows(mine, got["requests"])
    for a, b in zip(replay["settings"], got["settings"], strict=True):
        _summaries_alike(a, b | {"setting": a["setting"]})
    assert got["settings"][1]["goodput"] is not None
    text = _cli("compare", str(log), str(out)).stdout
    assert "Requests, recorded against replayed" in text and "requests compared: 4 of" in text
    # without the responses file: the server's own times, the same requests and tokens
    out.with_name("new.log.responses.jsonl").unlink()
    got = json.loads(_cli("compare", str(log), str(out), "--format", "json").stdout)["requests"]
    assert got["times"] == "server" and got["matched"] == 4
    for row, new in zip(got["requests"], request_records_of(out), strict=True):
        assert row["ttft_ms"] == new["ttft"] / 1e6 and row["e2e_ms"] == new["dur"] / 1e6
        assert row["identical"] is False and row["ok"]  # (the fake generates 0, 1)


def request_records_of(log: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in log.read_text().splitlines() if '"type": "request"' in x]


def test_compare_of_two_logs_that_are_not_a_recording_and_its_replay(
    tmp_path: Path, fake_server: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _recorded_for_fake(tmp_path, 3)
    out = tmp_path / "new.log"
    r = _cli("replay", str(log), "-o", str(out), "--first", "2", "--", "llama-server", "-m", "m")
    assert r.exit_code == 0, r.output

    def why(a: Path, b: Path) -> Any:
        c = _cli("compare", str(a), str(b), "--format", "json")
        assert c.exit_code == 0, c.output
        return json.loads(c.stdout).get("requests", {"absent": True})

    assert why(log, log)["why"] == (
        "recorded.log is not a replay of recorded.log: none of its requests carries instr "
        "replay's traceparent"
    )
    assert why(out, log)["why"] == (
        "new.log is a replay (its requests carry instr replay's traceparent) and recorded.log is "
        "not: give the recording first, then its replay"
    )
    other = tmp_path / "other"
    other.mkdir()
    foreign = write_log(
        other / "foreign.log",
        [_session(), *(_record(i, i * 10**8, {"prompt": f"q{i}"}) for i in range(3))],
    )
    assert why(foreign, out)["why"] == (
        "new.log is not a replay of foreign.log: none of its 2 replayed requests has the body of "
        "one of foreign.log's"
    )
    # part of a replay's requests matched, the others counted; the first two of three replayed
    assert why(log, out)["matched"] == 2
    bare = write_log(tmp_path / "bare.log", [_session()])
    assert why(bare, bare) == {"absent": True}  # (no requests on either side: no section)
    one = _cli("compare", str(foreign), str(out))
    assert one.stdout.count("none of its 2 replayed requests") == 1
    # a recording past a replay's bounds: its one line, not "no requests"
    monkeypatch.setattr(replay_log, "REQUESTS_MAX", 2)
    assert "holds over 2 requests to replay" in why(log, out)["why"]


def test_a_replays_requests_are_matched_by_body_the_responses_id_first(tmp_path: Path) -> None:
    from llamacpp_instr.converters.session.replay_match import (
        match,
        read_responses,
        replay_place,
        response,
        traceparent,
    )

    assert replay_place(traceparent(7, 0)) == (7, 0) and replay_place(traceparent(-1, 41))[1] == 41
    for odd in (None, 5, "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "00-abc-def-01"):
        assert replay_place(odd) is None
    # a client's own traceparent (its parent id not the replay's place): not a replay's
    assert replay_place("00-" + "1" * 32 + "-" + "2" * 16 + "-01") is None
    rec = [request_record(_record(i, i, {"prompt": p})) for i, p in enumerate("xyxz")]
    new = [request_record(_record(10 + k, k, {"prompt": p}, traceparent=traceparent(3, k)))
           for k, p in enumerate("xyxw")]  # fmt: skip
    m = match(rec, new, None)
    # by body in arrival order, each recorded request once; w is none of the recording's
    assert [(a["id"], b["id"]) for a, b, _ in m.pairs] == [
        ("task-0", "task-10"), ("task-1", "task-11"), ("task-2", "task-12"),
    ]  # fmt: skip
    assert (m.replayed, m.unmatched, m.why) == (4, 1, None)
    # the responses file's id first (a window that began at task-2), but only for the same body
    m = match(rec, new[:1], {0: {"index": 0, "id": "task-2"}})
    assert [a["id"] for a, _, _ in m.pairs] == ["task-2"]
    m = match(rec, new[:1], {0: {"index": 0, "id": "task-3"}})
    assert [a["id"] for a, _, _ in m.pairs] == ["task-0"]
    # a responses file is foreign bytes too: what is not instr replay's is passed over
    f = tmp_path / "r.jsonl"
    f.write_bytes(b'not json\n[1]\n{"index": 1, "status": 200, "itl_ms": [1.5, "x"]}\n'
                  b'{"index": 0, "status": 200, "itl_ms": [2.5], "ttft_ms": 3, "text": "hi"}\n')  # fmt: skip
    lines = read_responses(f)
    assert lines is not None and set(lines) == {0, 1} and "text" not in lines[0]
    assert response(lines[1], "tp") is None
    x = response(lines[0], "tp")
    assert x is not None and list(x.gaps_ns) == [2_500_000] and x.ttft_ns == 3_000_000
    assert read_responses(tmp_path / "none.jsonl") is None
