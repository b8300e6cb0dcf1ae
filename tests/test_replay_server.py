"""``instr replay`` on a real llama-server: a server's recorded traffic (streams and whole answers,
native and OpenAI endpoints, two slots) replayed under the recorded setting and under others, each
figure checked against an independent measure of the same thing: the client's TTFT and end to end
against the new log's own request record (within 5 % or 5 ms), the server's ``timings`` against
that record's times, the generated tokens against the recording's; a setting whose context is too
small for a request counts it as failed and goes on; a server killed mid-replay ends it in one line
with exit status 1, its log kept and readable; `instr compare` on the recording and the replay gives
the replay's own rows; a server with --api-key (started by the replay, or at --url) is sent its key,
which no file holds. A long prefill arriving while two slots generate (llama.cpp #29175) stalls
them by the batch size: at -b/-ub 2048 for all of it, at 32 for one chunk, the client's worst gap
the server's own (its steps' ends, read here apart from the converters), and the report names the
long prompt's request as the cause.

The recording needs llama-server to record each request's body and generated tokens (``body``,
``gen_ids``, at detailed): with a build that does not, the tests of it are skipped, saying so. The
HTML page, with each setting's latency CDFs, is checked in a real browser against test_replay's
stand-in server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest
from helpers.support import (
    PROMPT,
    Page,
    exec_server,
    post_json,
    read_log,
    realtime,
    request_records,
    signal_server,
)

pytestmark = pytest.mark.native

# one compute thread: on two cores the server's HTTP thread and the replay's client each keep a
# core, so that a stream's first chunk reaches the client within 5 ms of its sampling (with -t 2
# they waited behind the decode's threads: 6 ms and more)
SERVER_ARGS = ("--parallel", "2", "-c", "2048", "-t", "1", "--seed", "7", "--no-webui")
LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 32)  # ~290 tokens
# (endpoint, body, seconds after the first): two streams overlapping a whole answer, a chat
# stream, a long prompt (refused by a small context)
TRAFFIC: list[tuple[str, dict[str, Any], float]] = [
    ("/completion", {"prompt": PROMPT, "n_predict": 16, "temperature": 0, "seed": 1, "stream": True}, 0.0),
    ("/completion", {"prompt": "Once upon a time", "n_predict": 12, "temperature": 0, "seed": 2}, 0.2),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Name a color."}],
            "max_tokens": 12, "temperature": 0, "seed": 3, "stream": True,
        },
        0.4,
    ),
    ("/completion", {"prompt": LONG, "n_predict": 4, "temperature": 0, "seed": 4}, 1.2),
]  # fmt: skip


def _post(port: int, endpoint: str, body: dict[str, Any]) -> None:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", endpoint, json.dumps(body), {"Content-Type": "application/json"})
        conn.getresponse().read()
    finally:
        conn.close()


def send_at_times(port: int, traffic: list[tuple[str, dict[str, Any], float]]) -> None:
    """Each (endpoint, body, seconds after the first) POSTed at its time on a thread of its own;
    back once all are answered."""
    t0 = time.monotonic()
    threads = []
    for endpoint, body, at in traffic:
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        threads.append(threading.Thread(target=_post, args=(port, endpoint, body)))
        threads[-1].start()
    for t in threads:
        t.join(300)


def record(
    log: Path,
    model: Path,
    traffic: list[tuple[str, dict[str, Any], float]],
    server_args: tuple[str, ...] = SERVER_ARGS[:-1],
) -> Path:
    """``traffic`` sent at its times to llama-server under ``instr exec -o log`` (level detailed):
    the log; skips the test when the build records no request bodies, which a replay sends."""
    proc, port = exec_server(log, model, *server_args)
    try:
        send_at_times(port, traffic)
    finally:
        signal_server(proc)
        proc.wait(120)
    if not any("body" in r for r in request_records(log)):
        pytest.skip(
            "this build's llama-server records no request bodies (`body`, `gen_ids` of the "
            "request record at detailed): instr replay has nothing to send"
        )
    return log


@pytest.fixture(scope="module")
def recorded(tools_bin: Path, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The traffic above, sent at its times to llama-server under ``instr exec`` (level detailed)."""
    log = record(tmp_path_factory.mktemp("replay") / "recorded.log", smollm2_path, TRAFFIC)
    assert len(request_records(log)) == len(TRAFFIC)
    return log


def _client() -> list[str]:
    """The replay's prefix: its client at a real-time priority where it may, its server not, so
    that a stream's chunk is timed when it arrives, not when the client next gets a core (5.2 ms
    late once on a loaded machine, against the 5 ms the figures may differ by)."""
    return realtime(children=False)


def _replay(
    recorded: Path, out: Path, *args: str, server: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
    from llamacpp_instr.native import models

    return subprocess.Popen(
        [*_client(), sys.executable, "-m", "llamacpp_instr.cli", "replay", str(recorded), "-o", str(out),
         "--format", "json", *args, "--", "llama-server", "-m", str(models.default_model()),
         *SERVER_ARGS, *server],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _near(a: float, b: float) -> bool:
    """Within 5 % or 5 ms of each other."""
    return abs(a - b) <= max(5.0, 0.05 * max(abs(a), abs(b)))


def test_a_replay_under_the_recorded_setting_is_the_servers_own_figures(
    recorded: Path, tmp_path: Path
) -> None:
    out = tmp_path / "new.log"
    p = _replay(recorded, out)
    stdout, stderr = p.communicate(timeout=600)
    assert p.returncode == 0, stderr
    data = json.loads(stdout)
    rows = data["requests"]
    assert len(rows) == len(TRAFFIC) and all(r["ok"] for r in rows), rows
    # the same tokens, request by request (temperature 0, the recorded seed)
    assert [r["identical"] for r in rows] == [True] * len(TRAFFIC)
    # instr compare on the two logs: the same rows, from the logs and the responses file alone
    c = subprocess.run(
        [sys.executable, "-m", "llamacpp_instr.cli", "compare", str(recorded), str(out),
         "--format", "json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert c.returncode == 0, c.stderr
    got = json.loads(c.stdout)["requests"]
    assert got["matched"] == len(TRAFFIC) and got["times"] == "client"
    for mine, theirs in zip(rows, got["requests"], strict=True):
        assert theirs["id"] == mine["id"] and theirs["identical"] is True
        for k in ("ttft_ms", "tpot_ms", "e2e_ms", "itl_max_ms", "cache_n", "cache_reused"):
            assert theirs[k] == pytest.approx(mine[k], abs=1e-5), k
    for r in rows:
        assert _near(r["e2e_ms"], r["server_dur_ms"]), r
        if r["stream"]:
            assert _near(r["ttft_ms"], r["server_ttft_ms"]), r
        else:  # the server's own, taken from its record
            assert r["ttft_ms"] == r["server_ttft_ms"]
    # the server's timings against its record of the same request: generation runs from the first
    # token to the last, the prompt from the slot's start to the first token
    new = {r["traceparent"][-19:-3]: r for r in request_records(out)}
    answers = [
        json.loads(x) for x in out.with_name("new.log.responses.jsonl").read_text().splitlines()
    ]
    assert len(answers) == len(TRAFFIC)
    for a in answers:
        rec = new[(a["index"] + 1).to_bytes(8, "big").hex()]
        t = a["timings"]
        assert _near(t["predicted_ms"], (rec["last_token"] - rec["ttft"]) / 1e6), (t, rec)
        assert _near(t["prompt_ms"], (rec["ttft"] - rec["wait"]) / 1e6), (t, rec)
        # every token sampled, the last one never decoded (gen_tokens counts those fed back)
        assert a["n_out"] == t["predicted_n"] == rec["gen_tokens"] + 1
    settings = {s["setting"]: s for s in data["settings"]}
    assert set(settings) == {"recorded", "replay"}
    assert settings["replay"]["peak_memory"] and settings["recorded"]["peak_memory"]
    assert data["best"] == "replay"


def test_settings_side_by_side_and_a_request_a_setting_refuses(
    recorded: Path, tmp_path: Path
) -> None:
    out = tmp_path / "what-if.log"
    p = _replay(
        recorded, out, "--slo", "ttft=60000,tpot=10000", "--set", "-c 2048", "--set", "-c 128"
    )
    stdout, stderr = p.communicate(timeout=600)
    assert p.returncode == 0, stderr
    data = json.loads(stdout)
    names = [s["setting"] for s in data["settings"]]
    assert names == ["recorded", "-c 2048", "-c 128"]
    s = {x["setting"]: x for x in data["settings"]}
    # -c 128: each slot has 256 cells (llama.cpp pads a sequence's context to 256), under the long
    # prompt: refused, the rest served
    assert s["-c 2048"]["failed"] == 0 and s["-c 128"]["failed"] == 1
    refused = [r for r in data["requests"] if r["setting"] == "-c 128" and not r["ok"]]
    assert len(refused) == 1 and refused[0]["status"] >= 400
    assert s["-c 128"]["goodput"] < s["-c 2048"]["goodput"] and data["best"] == "-c 2048"
    # each from its own log: the smaller context holds less KV cache
    assert (tmp_path / "what-if.1.log").is_file() and (tmp_path / "what-if.2.log").is_file()
    (device,) = set(s["-c 128"]["peak_memory"]) & set(s["-c 2048"]["peak_memory"])
    assert s["-c 128"]["peak_memory"][device] < s["-c 2048"]["peak_memory"][device]


def _child_server(parent: int) -> int | None:
    """The pid of the llama-server that process ``parent`` started, if any."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == parent and comm.startswith("llama-server"):
            return int(d.name)
    return None


def test_a_server_killed_mid_replay_ends_it_in_one_line(recorded: Path, tmp_path: Path) -> None:
    out = tmp_path / "cut.log"
    p = _replay(recorded, out, "--speed", "0.1")  # the traffic over 12 s
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (
        out.is_file() and '"type":"request"' in out.read_text(errors="replace")
    ):
        assert p.poll() is None, p.communicate()
        time.sleep(0.2)
    server = _child_server(p.pid)
    assert server is not None
    os.kill(server, signal.SIGKILL)
    _, stderr = p.communicate(timeout=120)
    assert p.returncode == 1, stderr
    assert "Traceback" not in stderr
    errors = [x for x in stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "llama-server ended (exit status -9)" in errors[0], stderr
    assert str(out) in errors[0]
    # the partial log is kept and reads
    from llamacpp_instr.converters import load_session

    frames = load_session(out)
    assert len(frames.requests) >= 1
    assert read_log(out)[0]["type"] == "session_start"


def test_a_keyed_server_is_sent_its_key(recorded: Path, smollm2_path: Path, tmp_path: Path) -> None:
    """llama-server with --api-key refuses a request without it (401); a replay that starts it
    sends it, as one at --url does with --api-key; the key in no file and on no output."""
    key = "replay-test-key-7"
    out = tmp_path / "keyed.log"
    p = _replay(recorded, out, "--first", "2", server=("--api-key", key))
    stdout, stderr = p.communicate(timeout=600)
    assert p.returncode == 0, stderr
    assert [r["ok"] for r in json.loads(stdout)["requests"]] == [True, True], stdout
    for text in (out.read_text(), out.with_name("keyed.log.responses.jsonl").read_text(), stdout,
                 stderr):  # fmt: skip
        assert key not in text
    # a keyed server of its own, at --url (its log, the test's, holds its command line)
    proc, port = exec_server(tmp_path / "url.log", smollm2_path, "-t", "1", "--api-key", key)
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            post_json(port, "/completion", {"prompt": "Hi", "n_predict": 1})
        assert refused.value.code == 401
        url = ("--url", f"http://127.0.0.1:{port}", "--first", "2", "--format", "json")
        for given, ok in (((), False), (("--api-key", key), True)):
            r = subprocess.run(
                [sys.executable, "-m", "llamacpp_instr.cli", "replay", str(recorded), "-o",
                 str(tmp_path / "at-url.log"), *url, *given],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert r.returncode == 0, r.stderr
            rows = json.loads(r.stdout)["requests"]
            assert [x["ok"] for x in rows] == [ok, ok], rows
            assert ok or {x["status"] for x in rows} == {401}
            assert key not in r.stdout + r.stderr
    finally:
        signal_server(proc)
        proc.wait(120)


def test_the_page_in_a_browser(browser: Any, tmp_path: Path) -> None:
    from http.server import ThreadingHTTPServer

    from test_replay import _Handler, _traffic

    from llamacpp_instr.converters.reports.replay_report import CDF_POINTS

    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    media = tmp_path / "media"
    media.mkdir()
    log = _traffic(tmp_path, media)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "llamacpp_instr.cli", "replay", str(log), "--url",
             f"http://127.0.0.1:{srv.server_address[1]}", "-o", str(tmp_path / "n.log"),
             "--media", str(media), "--format", "html"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        srv.shutdown()
        srv.server_close()
    assert r.returncode == 0, r.stderr
    html = tmp_path / "replay.html"
    html.write_text(r.stdout)
    page = Page(browser, html)
    try:
        assert page.rows("settings") == 2 and page.rows("requests") == 5
        # one series a setting (the recording's and the replay's), a mark per point of its CDF
        for chart in ("e2e_cdf", "ttft_cdf"):
            assert page.marks(chart) == 2 * CDF_POINTS == page.declared_marks(chart)
        statuses = page.column("requests", 3)
        page.sort_by("requests", 3)
        assert sorted(statuses, key=float) == page.column("requests", 3)
    finally:
        page.close()


def test_an_image_is_sent_again_from_media_by_its_hash(
    tools_bin: Path, smollm2_path: Path, mm_dir: Path, media: dict[str, Path], tmp_path: Path
) -> None:
    """A chat with an image (a small gemma3 projector takes it), recorded as the image's hash:
    replayed with --media, the same image goes out (the same tokens come back); a body past 1 MiB
    was not recorded and is counted, not sent."""
    import base64

    from helpers.mmproj_gguf import write_vision_mmproj

    mmproj = write_vision_mmproj(mm_dir / "replay-gemma3.gguf", projector="gemma3")
    args = ("--mmproj", str(mmproj), "-c", "1024", "-t", "2", "--seed", "7")
    image = media["test-1.jpeg"]
    url = "data:image/jpeg;base64," + base64.b64encode(image.read_bytes()).decode()
    chat = {
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What is it?"},
        ]}],
        "max_tokens": 4, "temperature": 0,
    }  # fmt: skip
    big = {"prompt": "Hello", "n_predict": 2, "padding": "x" * (1 << 20)}
    log = tmp_path / "recorded.log"
    proc, port = exec_server(log, smollm2_path, *args)
    try:
        _post(port, "/v1/chat/completions", chat)
        _post(port, "/completion", big)
    finally:
        signal_server(proc)
        proc.wait(120)
    if not any("body" in r for r in request_records(log)):
        pytest.skip("this build's llama-server records no request bodies")
    folder = tmp_path / "media"
    folder.mkdir()
    (folder / "photo.jpg").write_bytes(image.read_bytes())
    r = subprocess.run(
        [sys.executable, "-m", "llamacpp_instr.cli", "replay", str(log), "-o",
         str(tmp_path / "new.log"), "--media", str(folder), "--format", "json", "--",
         "llama-server", "-m", str(smollm2_path), *args],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["skipped"] == {"no body (size)": 1}
    (row,) = data["requests"]
    assert row["endpoint"] == "/v1/chat/completions" and row["ok"] and row["identical"] is True
    # the replay's own record names the same image
    (new,) = request_records(tmp_path / "new.log")
    assert new["body"] == next(x for x in request_records(log) if "body" in x)["body"]


# --- one long prefill stalls the other slots (llama.cpp #29175) --------------------------------

STALL_ARGS = ("--parallel", "3", "-c", "3072", "-t", "1", "--seed", "7")
STALL_LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)  # ~360 tokens
STREAMS = ("Once upon a time", "The capital of France is")
# (the prefill in one step of its 360 tokens, or in steps of 32 beside the streams' tokens)
BIG, SMALL = "-b 2048 -ub 2048", "-b 32 -ub 32"


@pytest.fixture(scope="module")
def stalled(tools_bin: Path, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two streams generating on two of three slots when a long prompt arrives on the third."""
    traffic = [
        ({"prompt": p, "n_predict": 48, "temperature": 0, "stream": True}, at)
        for p, at in zip(STREAMS, (0.0, 0.05), strict=True)
    ] + [({"prompt": STALL_LONG, "n_predict": 2, "temperature": 0}, 0.6)]
    log = tmp_path_factory.mktemp("stall") / "recorded.log"
    sends = [("/completion", body, at) for body, at in traffic]
    return record(log, smollm2_path, sends, STALL_ARGS)


def _token_times(log: Path, rec: dict[str, Any]) -> list[int]:
    """When each of a request's tokens came, as its server's steps say (read here from the raw
    records, apart from the converters): the end of each step that carried its slot's sequence
    while it held the slot, from the one that ended its prompt."""
    begins, ends = {}, []
    for r in read_log(log):
        if r["type"] == "step_begin":
            begins[(r["ctx"], r["step"])] = r.get("seqs") or [[0, r["n_tokens"]]]
        elif r["type"] == "step_end":
            ends.append(r)
    t0 = rec["t_arrive"] + rec["wait"]
    t1 = t0 + rec["model"]
    left, times = rec["prompt_tokens"], []
    for e in sorted(ends, key=lambda e: e["t_start"]):
        if not t0 <= e["t_start"] <= t1:
            continue
        n = sum(q[1] for q in begins[(e["ctx"], e["step"])] if q[0] == rec["slot"])
        if n and left > 0:
            left -= n
            if left <= 0:
                times.append(e["t_start"] + e["dur"])
        elif n:
            times.append(e["t_start"] + e["dur"])
    return times


def test_a_long_prefill_stalls_the_other_slots_by_the_batch_size(
    stalled: Path, tmp_path: Path
) -> None:
    from llamacpp_instr.native import models

    out = tmp_path / "b.log"
    r = subprocess.run(
        [*_client(), sys.executable, "-m", "llamacpp_instr.cli", "replay", str(stalled), "-o", str(out),
         "--format", "json", "--set", BIG, "--set", SMALL, "--", "llama-server", "-m",
         str(models.default_model()), *STALL_ARGS],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    recorded = {x["id"]: x for x in request_records(stalled)}
    long_id = next(k for k, x in recorded.items() if x["prompt_tokens"] > 300)
    worst: dict[str, tuple[float, float]] = {}  # setting: (the client's worst gap, the server's)
    for k, setting in enumerate((BIG, SMALL), start=1):
        log = tmp_path / f"b.{k}.log"
        mine = [x for x in data["requests"] if x["setting"] == setting]
        assert all(x["ok"] for x in mine), mine
        client = max(x["itl_max_ms"] for x in mine if x["id"] != long_id)
        server = 0.0
        for rec in request_records(log):
            if rec["prompt_tokens"] < 300:
                t = _token_times(log, rec)
                assert len(t) == 48, (setting, len(t))
                server = max(server, max(b - a for a, b in zip(t, t[1:], strict=False)) / 1e6)
        worst[setting] = (client, server)
        print(f"{setting}: worst gap, the client's {client:.1f} ms, the server's {server:.1f} ms")
        assert abs(client - server) <= max(10.0, 0.1 * server), (setting, client, server)
    # the prefill in one step stalls the streams for all of it; in steps of 32, for one of them
    assert worst[BIG][0] > 4 * worst[SMALL][0] and worst[BIG][1] > 4 * worst[SMALL][1], worst
    # the report names the long prompt's prefill as the cause, in each run's own log
    for setting in ("recorded", BIG):
        rows = [x for x in data["stalls"] if x["setting"] == setting]
        assert rows and rows[0]["prefill_recorded_id"] == long_id, rows
        assert rows[0]["recorded_id"] != long_id and "was prefilling" in rows[0]["cause"]
    (top,) = [x for x in data["stalls"] if x["setting"] == BIG][:1]
    assert abs(top["gap_ms"] - worst[BIG][1]) <= max(10.0, 0.1 * worst[BIG][1]), (top, worst)
