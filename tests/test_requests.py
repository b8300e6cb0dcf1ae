"""`instr requests`: why a request was slow (issue 37, section 3).

Hand-made records first, whose answers are worked out here from the same times (the split of a
request's time, which token came late, what shared its batch, each reason a prompt cache was not
reused), then a real llama-server under `instr exec` with two slots: a long prompt sent while
another request streams makes that request's tokens late, and the log says by whom; a prompt
sent again after both slots were taken over says it was evicted; a prompt that continues a
conversation with one word changed says where it diverged.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from helpers.support import (
    exec_server,
    instr,
    post_completion,
    request_records,
    signal_server,
    wait_requests,
)

from llamacpp_instr.converters.session.request_causes import (
    MISS_REASONS,
    cache_reason,
    split,
    stories,
)

MS = 1_000_000
SID = "00000000000000ab"


def _req(
    rid: str, slot: int, t: int, wait: int, ttft: int, model: int, dur: int, **kw: Any
) -> dict:
    rec: dict[str, Any] = {"type": "request", "sid": SID, "id": rid, "endpoint": "/completion"}
    rec["method"] = "POST"
    rec |= {"status": 200, "outcome": "ok", "stream": True, "t_arrive": t, "wait": wait}
    rec |= {"ttft": ttft, "model": model, "dur": dur, "slot": slot, "ts": t + dur}
    return rec | kw


@pytest.mark.fast
def test_the_split_adds_up_to_the_total_from_the_records_own_times() -> None:
    r = _req("a", 0, 1000, wait=5 * MS, ttft=12 * MS, model=40 * MS, dur=47 * MS)
    # queue 5, prompt 12 - 5, generation (5 + 40) - 12, stream 47 - 45
    assert split(r) == (47 * MS, 5 * MS, 7 * MS, 33 * MS, 2 * MS)
    never = _req("b", 0, 0, wait=None, ttft=None, model=None, dur=9 * MS)
    assert split(never) == (9 * MS, 9 * MS, 0, 0, 0)


def _steps_with_a_prefill() -> tuple[list, list[dict]]:
    """Slot 0 (task-a): a 4-token prompt step, then one token per 10 ms step, except that its
    sixth generation step also carries 300 prompt tokens of slot 1 (task-b) and takes 250 ms."""
    rows, t = [], 100 * MS
    rows.append((t, 10 * MS, 4, [(0, 4)]))
    t += 10 * MS
    for k in range(12):
        if k == 5:
            rows.append((t, 250 * MS, 301, [(0, 1), (1, 300)]))
            t += 250 * MS
        else:
            rows.append((t, 10 * MS, 1, [(0, 1)]))
            t += 10 * MS
    a = _req("task-a", 0, 99 * MS, MS, 11 * MS, t - 100 * MS, t - 99 * MS, prompt_tokens=4)
    b_start = rows[6][0] - MS
    b = _req("task-b", 1, b_start - MS, MS, 300 * MS, 400 * MS, 401 * MS, prompt_tokens=300)
    return rows, [a, b]


@pytest.mark.fast
def test_a_token_late_behind_another_slots_prefill_names_it() -> None:
    rows, reqs = _steps_with_a_prefill()
    a = next(s for s in stories(reqs, rows) if s.id == "task-a")
    # arrivals: token 1 at the prompt step's end, token k + 1 at the k-th generation step's end;
    # the gap into token 7 (the sixth generation step) is 250 ms, the median gap 10 ms
    assert len(a.late_tokens) == 1
    late = a.late_tokens[0]
    assert late.token == 7 and late.gap_ns == 250 * MS and late.late_ns == 240 * MS
    assert late.shared == [{"request": "task-b", "slot": 1, "tokens": 300, "prefill": True}]
    assert late.cause == (
        "token 7 of task-a came 240 ms late: slot 1 was prefilling 300 tokens of task-b "
        "in the same batch"
    )


@pytest.mark.fast
def test_even_gaps_make_no_late_tokens() -> None:
    rows = [(k * 10 * MS, 10 * MS, 1, [(0, 1)]) for k in range(10)]
    r = _req("even", 0, 0, 0, 10 * MS, 100 * MS, 100 * MS, prompt_tokens=1)
    (s,) = stories([r], rows)
    assert s.late_tokens == []
    assert s.cache_miss_reason is None and s.cache_reused_tokens is None


@pytest.mark.fast
def test_a_request_without_a_slot_reads_sequence_0() -> None:
    """instr serve's requests name no slot: its steps (no seqs) hold sequence 0, one request at a
    time, so a slow step is its own."""
    rows = [(k * 10 * MS, 10 * MS, 1, [(0, 1)]) for k in range(10)]
    rows[6] = (60 * MS, 10 * MS, 1, [(0, 1)])
    rows = [r if i < 6 else (r[0] + 90 * MS, r[1], r[2], r[3]) for i, r in enumerate(rows)]
    r = _req("serve-1", 0, 0, 0, 10 * MS, 190 * MS, 190 * MS, prompt_tokens=1)
    del r["slot"]
    (s,) = stories([r], rows)
    # the gap into the token of step 6 (the 7th token) is 100 ms against a median of 10
    assert [(t.token, t.late_ns) for t in s.late_tokens] == [(7, 90 * MS)]
    assert "outside decode steps" in s.late_tokens[0].cause


@pytest.mark.fast
@pytest.mark.parametrize(
    ("cache", "reason"),
    [
        ({"prompt": 50, "held": 60, "common": 49, "reused": 49}, None),
        ({"prompt": 50, "enabled": False, "held": 60, "common": 40, "reused": 0}, "disabled"),
        ({"prompt": 50, "held": 60, "common": 40, "reused": 0}, "sliding_window"),
        (
            {
                "prompt": 50,
                "held": 5,
                "common": 2,
                "reused": 2,
                "other_slot": 1,
                "other_common": 30,
            },
            "another_slot",
        ),
        (
            {
                "prompt": 80,
                "held": 60,
                "common": 20,
                "reused": 20,
                "diverged": {"at": 20, "before": "a", "held": "b", "prompt": "c"},
            },
            "template_drift",
        ),
        (
            {
                "prompt": 50,
                "held": 0,
                "common": 0,
                "reused": 0,
                "seen": {"tokens": 32, "request": "task-3"},
            },
            "evicted",
        ),
        (
            {
                "prompt": 50,
                "held": 60,
                "common": 20,
                "reused": 20,
                "diverged": {"at": 20, "before": "a", "held": "b", "prompt": "c"},
            },
            "diverged",
        ),
        # a template's first tokens in common, no more: nothing a cache could have saved
        (
            {
                "prompt": 80,
                "held": 60,
                "common": 2,
                "reused": 2,
                "other_slot": 1,
                "other_common": 3,
                "diverged": {"at": 2, "before": "a", "held": "b", "prompt": "c"},
            },
            "new",
        ),
        ({"prompt": 50, "held": 0, "common": 0, "reused": 0}, "new"),
    ],
)
def test_each_reason_a_prompt_was_not_reused(cache: dict, reason: str | None) -> None:
    reused, got, note = cache_reason(cache)
    assert reused == cache["reused"] and got == reason
    assert note.startswith(f"reused {cache['reused']:,} of {cache['prompt']:,} prompt tokens")
    assert reason is None or reason in MISS_REASONS


def _write_log(path: Path, rows: list, reqs: list[dict]) -> None:
    recs: list[dict] = [
        {"type": "session_start", "ts": 0, "sid": SID, "schema_version": 2, "level": "minimal"}
        | {"metadata": {"program": "llama-server"}, "context": {"n_ctx": 4096, "n_seq_max": 2}}
    ]
    for i, (start, dur, n, seqs) in enumerate(rows):
        begin = {"type": "step_begin", "ts": start, "sid": SID, "step": i, "ctx": 1}
        begin |= {"n_tokens": n, "kind": "gen" if n == 1 else "prompt", "level": "minimal"}
        begin |= {"pos": [0, 0], "seqs": [[q, k, 0, k - 1] for q, k in seqs]}
        end = {"type": "step_end", "ts": start + dur, "sid": SID, "step": i, "ctx": 1}
        end |= {"t_start": start, "dur": dur, "status": 0, "n_tokens": n, "n_outputs": len(seqs)}
        end |= {"n_computes": 1, "kv_used": n}
        recs += [begin, end]
    recs += reqs
    recs.sort(key=lambda r: r["ts"])
    recs.append({"type": "session_end", "ts": recs[-1]["ts"] + 1, "sid": SID, "status": "ok"})
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.mark.fast
def test_the_command_lists_slowest_first_with_one_object_per_request(tmp_path: Path) -> None:
    rows, reqs = _steps_with_a_prefill()
    log = tmp_path / "s.log"
    _write_log(log, rows, reqs)
    r = instr("requests", str(log), "--format", "json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["requests"]
    # task-b took 401 ms; task-a 371 (from 99 ms to the end of its last step: 100 + 10 + 11 x 10
    # + 250 = 470 ms)
    assert [g["id"] for g in got] == ["task-b", "task-a"]
    assert [g["total_ms"] for g in got] == [401.0, 371.0]
    assert got[1]["late_tokens"][0]["token"] == 7
    for g in got:
        parts = ("queue_ms", "prompt_ms", "generation_ms", "stream_ms")
        assert sum(g[k] for k in parts) == pytest.approx(g["total_ms"])
    text = instr("requests", str(log))
    assert text.returncode == 0 and "slot 1 was prefilling 300 tokens of task-b" in text.stdout
    summary = instr("summary", str(log), "--format", "json")
    assert summary.returncode == 0, summary.stderr
    assert json.loads(summary.stdout)["request_causes"] == got


@pytest.mark.fast
def test_a_log_without_requests_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    _write_log(log, [(0, MS, 1, [(0, 1)])], [])
    r = instr("requests", str(log))
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "no request records" in r.stderr
    missing = instr("requests", str(tmp_path / "none.log"))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


# --- a real llama-server ------------------------------------------------------------------------

WORDS = "river mill miller accounts book red leather evening sacks flour carts town".split()


def text(seed: int, n_words: int) -> str:
    """Prose of ``n_words`` words beginning with a word of its own (``seed``)."""
    return f"Story {seed}: " + " ".join(WORDS[(seed * 7 + i) % len(WORDS)] for i in range(n_words))


def scenario(port: int) -> dict[str, str]:
    """The requests of the test, in order; the ids its story needs, by name, from the order the
    server numbered its tasks in (one task per request, counted from 0)."""
    import threading
    import urllib.request

    def post(prompt: str, n: int, stream: bool = False, on_chunk: Any = None) -> None:
        body = {"prompt": prompt, "n_predict": n, "temperature": 0, "stream": stream}
        body |= {"cache_prompt": True, "ignore_eos": True}
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/completion",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            for k, _ in enumerate(r):
                if on_chunk is not None:
                    on_chunk(k)

    ids: dict[str, str] = {}
    task = iter(range(1000))

    def named(name: str) -> None:
        ids[name] = f"task-{next(task)}"

    # 1. a long prompt arrives while another request streams: the stream's tokens wait for it
    started = threading.Event()
    named("streamer")
    t = threading.Thread(
        target=post, args=(text(1, 20), 40, True, lambda k: k == 4 and started.set())
    )
    t.start()
    assert started.wait(120)
    named("prefill")
    post(text(2, 400), 2)
    t.join(300)
    # 2. a prompt, then two others that take both slots over (LRU), then the first again
    for name, seed in (("first", 3), ("other1", 4), ("other2", 5), ("evicted", 3)):
        named(name)
        post(text(seed, 150), 4)
    # 3. a conversation whose earlier turn comes back with one word changed, halfway through
    turn = text(6, 120)
    named("turn1")
    post(turn, 8)
    words = turn.split()
    words[60] = "barley"
    named("drift")
    post(" ".join(words) + " and then " + text(7, 80), 4)
    return ids


def test_a_real_server_says_who_made_a_token_late_and_why_a_prompt_was_not_reused(
    tools_bin: Path, smollm2_path: Path, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    server, port = exec_server(
        log,
        smollm2_path,
        *["--parallel", "2", "-c", "4096", "-t", "2", "--cache-ram", "0"],
        instr_args=("--level", "minimal"),
    )
    try:
        names = scenario(port)
        wait_requests(log, len(names))
    finally:
        signal_server(server, signal.SIGTERM)
        server.wait(60)
    recs = sorted(request_records(log), key=lambda r: r["t_arrive"])
    assert len(recs) == len(names) == 8
    by = dict(zip(names, recs, strict=True))  # the scenario sent them one after another
    for r in recs:  # two counters of the server's agree: reused + decoded = the prompt
        assert r["cache"]["reused"] + r["prompt_tokens"] == r["cache"]["prompt"]
    out = instr("requests", str(log), "--format", "json", "--top", "0")
    assert out.returncode == 0, out.stderr
    got = {g["id"]: g for g in json.loads(out.stdout)["requests"]}
    assert len(got) == 8
    totals = [g["total_ms"] for g in json.loads(out.stdout)["requests"]]
    assert totals == sorted(totals, reverse=True)

    # the streamer's tokens waited while the other slot prefilled the long prompt
    pre = by["prefill"]
    late = got[by["streamer"]["id"]]["late_tokens"]
    assert late, "the streamer had no late token"
    behind = [t for t in late for s in t["shared_with"] if s["request"] == pre["id"]]
    assert behind and behind[0]["shared_with"][0] == {
        "request": pre["id"],
        "slot": pre["slot"],
        "tokens": pre["prompt_tokens"],
        "prefill": True,
    }
    assert f"slot {pre['slot']} was prefilling {pre['prompt_tokens']:,} tokens of {pre['id']}" in (
        behind[0]["cause"]
    )
    # the first prompt again, after two others took both slots over: evicted, and by whom
    ev = got[by["evicted"]["id"]]
    assert ev["cache_miss_reason"] == "evicted"
    assert by["evicted"]["cache"]["seen"]["request"] == by["first"]["id"]
    # a conversation's earlier turn changed halfway: where, and the text on either side
    dr = by["drift"]["cache"]
    assert got[by["drift"]["id"]]["cache_miss_reason"] == "template_drift"
    assert dr["slot_by"] == "similarity" and dr["reused"] == dr["common"] > 16
    assert "barley" in dr["diverged"]["prompt"] and "barley" not in dr["diverged"]["held"]
    assert got[by["first"]["id"]]["cache_miss_reason"] == "new"


def test_a_prompt_of_any_bytes_keeps_its_request_record(
    tools_bin: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A prompt whose tokens' bytes are no UTF-8 (a surrogate's encoding ED A0 80, an overlong
    form, a code point past U+10FFFF) where it diverges from the slot's cache (issue 55 §1): its
    `request` record is written, the diverged text with '?' for those bytes, and the session
    loses no record. Before the fix the text path let them through, llama_instr_write_record
    refused the record and llama-server ignored that: the request vanished without a trace."""

    from helpers.tiny_gguf import FIRST_RAW_PIECE, write_tiny_model

    pieces = [b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80"]
    model = write_tiny_model(tmp_path_factory.mktemp("raw") / "raw.gguf", seed=5, raw_pieces=pieces)
    raw = [FIRST_RAW_PIECE + i for i in range(len(pieces))]
    log = tmp_path / "server.log"
    server, port = exec_server(
        log,
        model,
        *["--parallel", "1", "-c", "512", "-t", "1", "--cache-ram", "0"],
        instr_args=("--level", "minimal"),
    )
    prefix = [1] + [5 + k for k in range(20)]
    try:
        for prompt in (prefix + [40, 41, 42, 43], prefix + raw + raw + [44]):
            body = {"prompt": prompt, "n_predict": 2, "temperature": 0, "cache_prompt": True}
            post_completion(port, body)
        wait_requests(log, 2, timeout=30)
    finally:
        signal_server(server, signal.SIGTERM)
        _, err = server.communicate(timeout=60)
    recs = sorted(request_records(log), key=lambda r: r["t_arrive"])
    assert len(recs) == 2, err[-2000:]
    diverged = recs[1]["cache"]["diverged"]
    assert diverged["at"] == len(prefix) and diverged["prompt"].startswith("?" * 4), diverged
    assert "refused" not in err, err[-2000:]
    end = [json.loads(ln) for ln in log.read_text().splitlines() if '"session_end"' in ln]
    assert end and end[-1]["totals"]["lost"] == 0, end
