"""llama-server's time between decodes, against its own counters: each request's sampling (every
sampler apart, the grammar apart) and the server's own work (detokenizing, stop checks,
responses, the next batch, the HTTP thread's sends), on a model of a 131072-token vocabulary.

One server, one slot, requests one after the other: greedy; a JSON schema (a grammar); penalties,
DRY, top-p and min-p at temperature 0.8; the same streamed; then requests whose grammar or
sampler parameters do not parse. Checked against what llama.cpp measures itself: each chain's
``llama_perf_sampler`` (the `chain` records), the context's ``llama_perf_context`` (`perf`), and
the server's own ``timings.predicted_ms`` in each response.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from helpers.support import by_type, exec_server, read_log, signal_server

from llamacpp_instr.converters import load_session

pytestmark = pytest.mark.native

N_PREDICT = 24
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
PENALTIES = {
    "temperature": 0.8,
    "repeat_penalty": 1.1,
    "frequency_penalty": 0.2,
    "presence_penalty": 0.2,
    "dry_multiplier": 0.8,
    "top_p": 0.9,
    "min_p": 0.05,
}
ASKED = {
    "greedy": {"temperature": 0},
    "schema": {"temperature": 0.8, "json_schema": SCHEMA},
    "penalties": PENALTIES,
}
# what does not parse: a grammar, a sampler parameter llama.cpp refuses when it makes the chain,
# one the server refuses as it reads the request
HOSTILE = {
    "grammar": {"grammar": 'root ::= ( "a" '},
    "penalty": {"repeat_penalty": -1.0},
    "breakers": {"dry_sequence_breakers": []},
}


def _post(port: int, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            raw = r.read().decode()
            if body.get("stream"):
                chunks = [json.loads(x[6:]) for x in raw.splitlines() if x.startswith("data: {")]
                return r.status, chunks[-1]
            return r.status, json.loads(raw)
    except urllib.error.HTTPError as e:
        return e.code, None


@pytest.fixture(scope="module")
def sampling_server(
    tools_bin: Path, big_vocab: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    log = tmp_path_factory.mktemp("host") / "server.log"
    proc, port = exec_server(
        log, big_vocab, "--parallel", "1", "-c", "1024", "-t", "1", "--seed", "5",
        instr_args=("--level", "detailed"),
    )  # fmt: skip
    answers: dict[str, Any] = {}
    try:
        for name, params in ASKED.items():
            body = {"prompt": "hello world", "n_predict": N_PREDICT, "cache_prompt": False}
            answers[name] = _post(port, body | params)
        body = {"prompt": "hello world", "n_predict": N_PREDICT, "stream": True}
        answers["stream"] = _post(port, body | PENALTIES)
        for name, params in HOSTILE.items():
            answers[name] = _post(port, {"prompt": "hi", "n_predict": 4} | params)
        signal_server(proc)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    recs = read_log(log)
    # each request's record, in the order they were sent (ids are the server's task ids)
    requests = sorted(by_type(recs, "request"), key=lambda r: r["t_arrive"])
    return {"log": log, "recs": recs, "answers": answers, "requests": requests, "err": err}


def _target(server: dict[str, Any]) -> int:
    """The context the server decodes its requests with (its first context fits the parameters)."""
    return int(by_type(server["recs"], "step_end")[-1]["ctx"])


def _by_name(server: dict[str, Any]) -> dict[str, dict[str, Any]]:
    names = [*ASKED, "stream", *HOSTILE]
    assert len(server["requests"]) == len(names), server["err"][-3000:]
    return dict(zip(names, server["requests"], strict=True))


def test_every_record_validates_and_each_request_has_one(
    sampling_server: dict[str, Any], schema_validator: Any
) -> None:
    for rec in sampling_server["recs"]:
        schema_validator.validate(rec)
    reqs = _by_name(sampling_server)
    for name in HOSTILE:
        # a request whose grammar or sampler parameters do not parse: one record, an error
        status, _ = sampling_server["answers"][name]
        assert status >= 400 and reqs[name]["status"] == status, name
        assert reqs[name]["outcome"] == "error" and reqs[name]["error"], reqs[name]
    assert len({r["id"] for r in sampling_server["requests"]}) == len(sampling_server["requests"])


def test_each_requests_samplers_are_named_and_the_costliest_shown(
    sampling_server: dict[str, Any],
) -> None:
    reqs = _by_name(sampling_server)
    f = load_session(sampling_server["log"])
    s = f.samplers
    mine = {name: s[s["request"] == reqs[name]["id"]] for name in (*ASKED, "stream")}
    chains = {c["request"]: c for c in by_type(sampling_server["recs"], "chain")}
    for name, parts in mine.items():
        samplers = parts[parts["kind"] == "sampler"]
        # every sampler of the request's chain, by the name llama.cpp gives it, and no other
        assert set(samplers["sampler"]) == set(chains[reqs[name]["id"]]["samplers"]), name
        assert (parts["seq"] == reqs[name]["slot"]).all()
    pen = mine["penalties"]
    for wanted in ("penalties", "dry", "top-p", "min-p", "temp-ext", "dist"):
        assert wanted in set(pen["sampler"]), wanted
    # the grammar, apart: its check of each sampled token, its full pass where the check refused it
    # (a random model's tokens mostly have no place in a JSON object), its acceptance of each token
    grammar = mine["schema"][mine["schema"]["kind"] == "grammar"]
    by_pass = grammar.groupby("sampler", observed=True)["n"].sum().to_dict()
    assert set(by_pass) == {"check", "full", "accept"} and by_pass["full"] >= 1, by_pass
    assert "grammar" not in set(mine["penalties"]["kind"])
    # per request, the sampler that costs most: on 131072 tokens, the repetition penalties or DRY
    # (each a pass over the whole vocabulary) cost more than the final pick
    ns = pen[pen["kind"] == "sampler"].groupby("sampler", observed=True)["ns"].sum()
    assert ns.idxmax() in ("penalties", "dry", "top-p"), ns.sort_values()
    assert ns["penalties"] > ns["dist"]
    # and the request sampled with penalties and DRY spent more per token sampling than greedy
    per_token = {
        name: f.host_seqs[f.host_seqs["request"] == reqs[name]["id"]]["sample_ns"].sum() / N_PREDICT
        for name in ("greedy", "penalties")
    }
    assert per_token["penalties"] > per_token["greedy"], per_token


def test_sampling_equals_each_chains_own_counter(sampling_server: dict[str, Any]) -> None:
    recs = sampling_server["recs"]
    ctx = _target(sampling_server)
    chains = by_type(recs, "chain")
    # one chain a request that sampled: the four asked for, and none of those that failed
    assert sorted(c["request"] for c in chains) == sorted(r["id"] for r in recs_ok(sampling_server))
    assert all(c["ctx"] == ctx for c in chains)
    llama_us = sum(c["t_sample_us"] for c in chains)
    ours_ns = sum(h["chain_ns"] for h in by_type(recs, "host") if h["ctx"] == ctx)
    assert llama_us > 1000  # a 131072-token vocabulary: milliseconds of sampling
    assert abs(ours_ns / 1000 - llama_us) <= max(0.02 * llama_us, 100), (ours_ns, llama_us)


def recs_ok(server: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in server["requests"] if r["outcome"] == "ok"]


def test_a_requests_parts_account_for_the_servers_predicted_ms(
    sampling_server: dict[str, Any],
) -> None:
    """Its steps' decode time, its sampling and the server's work between them, and the time the
    server's thread was off the CPU where nothing recorded ran (a shared machine's other work),
    account for the server's own timings: from its first sampled token to its last."""
    reqs = _by_name(sampling_server)
    f = load_session(sampling_server["log"])
    steps = f.steps[f.steps["ctx"] == _target(sampling_server)].set_index("step")
    seqs = f.host_seqs.assign(seq=f.host_seqs["seq"].fillna(-1))
    windows = f.host.set_index("step")
    gap = steps["t_start"].shift(-1) - (steps["t_start"] + steps["dur_ns"])
    for name in (*ASKED, "stream"):
        r, answer = reqs[name], sampling_server["answers"][name][1]
        predicted_ns = answer["timings"]["predicted_ms"] * 1e6
        t_first, t_last = r["t_arrive"] + r["ttft"], r["t_arrive"] + r["last_token"]
        decode = steps.loc[(steps["t_start"] >= t_first) & (steps["t_start"] < t_last), "dur_ns"]
        assert len(decode) == answer["tokens_predicted"] - 1, name
        # the host's work after each step (one slot: all of it is this request's, or the next
        # batch's): the first token was sampled before the first window's end, the last token's
        # detokenizing and response came after the server's timings end
        first = steps[steps["t_start"] < t_first].index.max()
        last = steps[steps["t_start"] < t_last].index.max()
        mine = seqs[seqs["seq"].isin([r["slot"], -1]) & seqs["step"].between(first, last)]
        work = mine.groupby("step")[["sample_ns", "host_ns"]].sum()
        sampling = work["sample_ns"].drop(first, errors="ignore").sum()
        rest = work["host_ns"].drop(last, errors="ignore").sum()
        inside = work.index[(work.index > first) & (work.index < last)]
        other = gap[inside] - work.loc[inside].sum(axis=1)
        off_cpu = gap[inside] - windows.loc[inside, "cpu_ns"].astype(float)
        waited = other.clip(lower=0).combine(off_cpu.clip(lower=0), min).sum()
        accounted = int(decode.sum()) + int(sampling) + int(rest) + int(waited)
        # the first and last windows' time off the CPU may fall either side of the span's ends:
        # on a busy machine it widens the bound (0 on a quiet one)
        ends = [x for x in (first, last) if x in windows.index and x + 1 in steps.index]
        edge = float((gap[ends] - windows.loc[ends, "cpu_ns"].astype(float)).clip(lower=0).sum())
        assert abs(accounted - predicted_ns) <= 0.05 * predicted_ns + edge, (
            name, accounted, predicted_ns, int(waited), edge
        )  # fmt: skip


def test_the_steps_decode_time_equals_llama_perf_context(sampling_server: dict[str, Any]) -> None:
    recs = sampling_server["recs"]
    ctx = _target(sampling_server)
    [perf] = [p for p in by_type(recs, "perf") if p["ctx"] == ctx]
    # llama.cpp's counters start over after the server's warm-up (common's
    # llama_perf_context_reset): the steps since, those whose counts are its own
    steps = [s for s in by_type(recs, "step_end") if s["ctx"] == ctx]
    for k in range(len(steps)):
        since = steps[k:]
        n_eval = sum(1 for s in since if s["n_tokens"] == 1)
        n_p_eval = sum(s["n_tokens"] for s in since if s["n_tokens"] > 1)
        if (n_eval, n_p_eval) == (perf["n_eval"], perf["n_p_eval"]):
            break
    else:
        raise AssertionError(f"no steps count as llama.cpp's: {perf}")
    assert k <= 2 and n_eval > 50  # its warm-up steps, no more
    # llama.cpp's counter of a step runs until the outputs are read, after llama_decode returned:
    # it holds the hooks' own work at the step's end too (its records: the `log` part)
    numbers = {s["step"] for s in since}
    parts = load_session(sampling_server["log"]).samplers
    log = parts[(parts["sampler"] == "log") & parts["step"].isin(numbers)]["ns"].sum()
    ours_us = (sum(s["dur"] for s in since) + log) / 1000
    llama_us = perf["t_eval_us"] + perf["t_p_eval_us"]
    assert abs(ours_us - llama_us) <= 0.05 * llama_us, (ours_us, llama_us)


def test_the_server_says_its_own_work_and_the_streams_sends(
    sampling_server: dict[str, Any],
) -> None:
    reqs = _by_name(sampling_server)
    f = load_session(sampling_server["log"])
    host = f.samplers[f.samplers["kind"] == "host"]
    for part in ("detokenize", "stop", "response", "batch"):
        assert part in set(host["sampler"]), part
    # the next batch is built for no slot in particular
    assert host[host["sampler"] == "batch"]["seq"].isna().all()
    stream = reqs["stream"]
    predicted = sampling_server["answers"]["stream"][1]["tokens_predicted"]
    assert stream["stream"] and stream["sends"] >= predicted and stream["send_ns"] > 0
    assert "sends" not in reqs["greedy"]


def test_backend_sampling_is_named_where_it_ran(
    tools_bin: Path, big_vocab: Path, tmp_path: Path
) -> None:
    """With `-bs` the chain runs in the graph: its ops are timed as the step's ops (`dist_*` nodes
    in the graph table), each sampler of it is a `backend` part, and what still runs on the host
    (each token's accept) is timed as always."""
    log = tmp_path / "bs.log"
    proc, port = exec_server(
        log, big_vocab, "--parallel", "1", "-c", "512", "-t", "1", "-bs",
        instr_args=("--level", "detailed"),
    )  # fmt: skip
    try:
        status, answer = _post(port, {"prompt": "hello", "n_predict": 8, "temperature": 0.8})
        signal_server(proc)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert status == 200
    f = load_session(log)
    backend = f.samplers[f.samplers["kind"] == "backend"]
    # llama.cpp names a sampler that runs on the backend with a "+" ("+top-k", "+dist")
    assert "+dist" in set(backend["sampler"]) and (backend["ns"] == 0).all()
    assert (
        backend.groupby("sampler", observed=True)["n"].sum()["+dist"] == answer["tokens_predicted"]
    )
    names = {n.name for g in f.graphs.values() for n in g.nodes}
    assert "dist_sampled_token" in names
    timed = f.ops[f.ops["name"].astype(str).str.startswith("dist_")]
    assert len(timed) > 0 and (timed["dur_ns"] >= 0).all()


def test_the_views_name_each_requests_costliest_sampler(
    sampling_server: dict[str, Any], tmp_path: Path
) -> None:
    """`instr requests` names each request's costliest sampler, `instr summary` a token's time
    with the grammar apart, and the trace puts each request's sampling on its slot's track."""
    from click.testing import CliRunner

    from llamacpp_instr.cli import main

    log, reqs = str(sampling_server["log"]), _by_name(sampling_server)
    r = CliRunner().invoke(main, ["requests", log, "--format", "json"])
    assert r.exit_code == 0, r.output
    top = {x["id"]: x["costliest_sampler"] for x in json.loads(r.output)["requests"]}
    chains = {c["request"]: c["samplers"] for c in by_type(sampling_server["recs"], "chain")}
    for name in (*ASKED, "stream"):
        rid = reqs[name]["id"]
        # one of the request's own chain's samplers, the grammar's pass outside it, or building
        # the candidates from the logits (a greedy request's costliest: its chain is cheap)
        named = top[rid]["name"]
        assert named in [*chains[rid], "candidates"] or named.startswith("grammar "), name
        assert top[rid]["ms"] > 0
    # on 131072 tokens a pass over the vocabulary costs most: not the final pick
    assert top[reqs["penalties"]["id"]]["name"] in ("penalties", "dry", "top-p")
    for name in HOSTILE:  # a request that never sampled names none
        assert top[reqs[name]["id"]]["name"] is None
    r = CliRunner().invoke(main, ["summary", log, "--format", "json"])
    kinds = {k["kind"]: k for k in json.loads(r.output)["between_steps"]["kinds"]}
    assert (
        kinds["gen"]["grammar_ms"] > 0 and kinds["gen"]["sampling_ms"] > kinds["gen"]["grammar_ms"]
    )
    out = tmp_path / "s.json"
    r = CliRunner().invoke(main, ["to-perfetto", log, "--format", "json", "-o", str(out)])
    assert r.exit_code == 0, r.output
    events = json.loads(out.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    slot = reqs["greedy"]["slot"]
    tid = next(
        e["tid"] for e in events
        if e.get("ph") == "M" and e["args"].get("name") == f"slot {slot}: sampling"
    )  # fmt: skip
    served = {
        e["args"].get("request") for e in events if e.get("tid") == tid and e.get("ph") == "X"
    }
    assert {reqs[n]["id"] for n in (*ASKED, "stream")} <= served
