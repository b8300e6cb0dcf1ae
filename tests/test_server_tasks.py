"""A llama-server request that becomes several tasks: ``n_cmpl`` (or ``n``) completions of one
prompt, each a task on a slot of its own (the first task's children take its prompt as a copy of
its cells). Its record is the request's one record, its first task's figures at the top and the
others' in ``tasks``; every request id the log names anywhere (the `host` records' sequences, the
`chain` records, the steps) is a request record's. And the HTTP thread's sends, two streams in a
row on the server's one HTTP thread with a replayed conversation between them: each stream's are
its own.

The figures are checked against what the server answered (each completion's
``tokens_predicted``, its ``index``) and against the steps: the tokens of each task's sequence in
the steps of its window are its prompt and generated tokens.
"""

from __future__ import annotations

import http.client
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers.support import by_type, exec_server, read_log, signal_server

pytestmark = pytest.mark.native

N_PREDICT = 10
CMPL = {
    "prompt": "hello world",
    "n_predict": N_PREDICT,
    "n_cmpl": 3,
    "temperature": 0.8,
    "ignore_eos": True,
    "cache_prompt": False,
}
# "n", the alias of n_cmpl (OpenAI's completions), streamed
STREAMED = {
    "prompt": "a stream",
    "n_predict": 6,
    "n": 2,
    "stream": True,
    "temperature": 0.8,
    "ignore_eos": True,
}


def _request(
    port: int, method: str, path: str, body: Any, headers: dict[str, str]
) -> tuple[int, str]:
    """One request on a connection of its own (the server closes a stream's when it ends)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def _events(raw: str) -> list[dict[str, Any]]:
    return [json.loads(x[6:]) for x in raw.splitlines() if x.startswith("data: {")]


@pytest.fixture(scope="module")
def served(
    tools_bin: Path, big_vocab: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    log = tmp_path_factory.mktemp("tasks") / "server.log"
    # one HTTP thread: every request below is served on it, in turn
    proc, port = exec_server(
        log, big_vocab, "--parallel", "3", "-c", "1536", "-t", "1", "--seed", "5",
        "--threads-http", "1", instr_args=("--level", "detailed"),
    )  # fmt: skip
    out: dict[str, Any] = {}
    json_h = {"Content-Type": "application/json"}
    try:
        out["cmpl"] = _request(port, "POST", "/completion", CMPL, json_h)
        out["streamed"] = _request(port, "POST", "/completion", STREAMED, json_h)
        # two streams in a row, a replay of the first's conversation between them: a stream whose
        # chunks name no request
        one = {"prompt": "first", "n_predict": 6, "stream": True, "ignore_eos": True}
        conv = json_h | {"X-Conversation-Id": "c1"}
        out["first"] = _request(port, "POST", "/completion", one, conv)
        out["replay"] = _request(port, "GET", "/v1/stream?conv_id=c1", None, {})
        two = {"prompt": "second", "n_predict": 8, "stream": True, "ignore_eos": True}
        out["second"] = _request(port, "POST", "/completion", two, json_h)
        signal_server(proc)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.terminate()  # instr exec passes it on: the server ends too
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(60)
    recs = read_log(log)
    requests = sorted(by_type(recs, "request"), key=lambda r: r["t_arrive"])
    names = ["cmpl", "streamed", "first", "second"]
    assert len(requests) == len(names), err[-3000:]
    return {
        "log": log,
        "recs": recs,
        "answers": out,
        "by_name": dict(zip(names, requests, strict=True)),
    }


def test_every_request_id_in_the_log_is_a_request_records(
    served: dict[str, Any], schema_validator: Any
) -> None:
    recs = served["recs"]
    for rec in recs:
        schema_validator.validate(rec)
    ids = {r["id"] for r in by_type(recs, "request")}
    named: dict[str, set[str]] = {"steps": set(), "host": set(), "chain": set(), "spec": set()}
    for s in by_type(recs, "step_begin"):
        if s.get("request"):
            named["steps"].add(s["request"])
    for h in by_type(recs, "host"):
        named["host"] |= {row[1] for row in h.get("seqs", []) if row[1] is not None}
    named["chain"] = {c["request"] for c in by_type(recs, "chain") if c.get("request")}
    named["spec"] = {s["request"] for s in by_type(recs, "spec")}
    for where, found in named.items():
        assert found <= ids, (where, found - ids)
    # the server's three slots each served the request of three completions
    cmpl = served["by_name"]["cmpl"]
    slots = {row[0] for h in by_type(recs, "host") for row in h.get("seqs", [])
             if row[1] == cmpl["id"]}  # fmt: skip
    assert slots == {0, 1, 2}, slots


def _tokens_in_window(recs: list[dict[str, Any]], rec: dict[str, Any], task: dict[str, Any]) -> int:
    """The tokens of ``task``'s sequence in the steps that began in its window (its slot's)."""
    begins = {(s["ctx"], s["step"]): s for s in by_type(recs, "step_begin")}
    t0 = rec["t_arrive"] + task["wait"]
    t1 = t0 + task["model"]
    n = 0
    for e in by_type(recs, "step_end"):
        if t0 <= e["t_start"] <= t1:
            seqs = begins[(e["ctx"], e["step"])].get("seqs") or [[0, e["n_tokens"]]]
            n += sum(row[1] for row in seqs if row[0] == task["slot"])
    return n


def test_a_request_of_three_completions_is_one_record_with_its_tasks(
    served: dict[str, Any],
) -> None:
    status, raw = served["answers"]["cmpl"]
    assert status == 200
    results = {r["index"]: r for r in json.loads(raw)}
    assert sorted(results) == [0, 1, 2]
    rec = served["by_name"]["cmpl"]
    first = {k: rec[k] for k in ("slot", "wait", "model", "prompt_tokens", "gen_tokens")}
    tasks = [first | {"index": 0}, *rec["tasks"]]
    assert [k["index"] for k in tasks] == [0, 1, 2]
    assert len({k["slot"] for k in tasks}) == 3
    for k in rec["tasks"]:
        # a further completion of the first task: its prompt is the first's, copied, not decoded
        assert k["parent"] == rec["id"] and k["id"] != rec["id"] and k["prompt_tokens"] == 0
        assert k["wait"] is not None and k["model"] > 0
    for k in tasks:
        # what the server answered for that completion: its tokens, the last never decoded
        assert k["gen_tokens"] == results[k["index"]]["tokens_predicted"] - 1 == N_PREDICT - 1
        # and what the steps decoded on its sequence while it held its slot
        assert _tokens_in_window(served["recs"], rec, k) == k["prompt_tokens"] + k["gen_tokens"], k
    assert rec["prompt_tokens"] == results[0]["tokens_evaluated"] > 0
    # the request is done when its last task is: no task's slot was let go after it
    assert rec["wait"] + rec["model"] <= rec["dur"]
    assert all(k["wait"] + k["model"] <= rec["dur"] for k in rec["tasks"])


def test_a_streamed_request_of_two_completions_counts_both_tokens_sent(
    served: dict[str, Any],
) -> None:
    status, raw = served["answers"]["streamed"]
    assert status == 200
    sent: dict[int, int] = {}
    for e in _events(raw):
        if not e.get("stop"):
            sent[e["index"]] = max(sent.get(e["index"], 0), e["tokens_predicted"])
    assert sorted(sent) == [0, 1]
    rec = served["by_name"]["streamed"]
    assert rec["stream"] and len(rec["tasks"]) == 1 and rec["tasks"][0]["index"] == 1
    assert rec["tokens_sent"] == sum(sent.values()) == 2 * STREAMED["n_predict"]


def test_two_streams_on_one_http_thread_each_count_their_own_sends(
    served: dict[str, Any],
) -> None:
    """A stream's last call of the content provider writes nothing (llama-server's /completion
    ends on an empty chunk), and a replayed conversation's chunks name no request: the HTTP
    thread counts each chunk for the request whose stream wrote it, and no other."""
    for name in ("first", "second"):
        status, raw = served["answers"][name]
        assert status == 200
        rec = served["by_name"][name]
        # one write a chunk: each event the client read
        assert rec["sends"] == len(_events(raw)), (name, rec["sends"], len(_events(raw)))
        assert rec["send_ns"] > 0
    status, raw = served["answers"]["replay"]
    assert status == 200 and _events(raw)  # the first's chunks again


def test_instr_requests_shows_the_request_with_its_tasks(served: dict[str, Any]) -> None:
    from click.testing import CliRunner

    from llamacpp_instr.cli import main

    r = CliRunner().invoke(main, ["requests", str(served["log"]), "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = {x["id"]: x for x in json.loads(r.output)["requests"]}
    assert set(rows) == {x["id"] for x in served["by_name"].values()}
    rec = served["by_name"]["cmpl"]
    row = rows[rec["id"]]
    results = json.loads(served["answers"]["cmpl"][1])
    # its tokens are all its completions', as the server answered them
    assert row["gen_tokens"] == sum(x["tokens_predicted"] - 1 for x in results)
    assert row["prompt_tokens"] == rec["prompt_tokens"]
    assert [(t["id"], t["index"], t["slot"]) for t in row["tasks"]] == [
        (k["id"], k["index"], k["slot"]) for k in rec["tasks"]
    ]
    # its time split adds up to its total, its generation until its last task let its slot go
    parts = ("queue_ms", "prompt_ms", "generation_ms", "stream_ms")
    assert abs(sum(row[p] for p in parts) - row["total_ms"]) < 1e-6
    last = max(rec["wait"] + rec["model"], *(k["wait"] + k["model"] for k in rec["tasks"]))
    assert abs(row["queue_ms"] + row["prompt_ms"] + row["generation_ms"] - last / 1e6) < 1e-6
    text = CliRunner().invoke(main, ["requests", str(served["log"])])
    assert text.exit_code == 0 and "3 tasks" in text.output, text.output
