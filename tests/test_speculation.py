"""Speculative decoding (issue 54): the target and its draft apart, what each verify did, and
whether the drafts paid.

Hand-made logs first, shaped as llama-server writes them (a target context, a draft context, a
``spec`` record per verify step), whose answers are worked out here from the same numbers; then a
real llama-server built from the pin, with a draft made of the bundled SmolLM2's first layers,
checked against the server's own HTTP ``timings`` (tests/test_speculation_server.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.support import instr

from llamacpp_instr.converters import load_session
from llamacpp_instr.converters.analysis import spec_split

pytestmark = pytest.mark.fast

MS = 1_000_000
SID = "00000000000000ac"
TGT, DFT = 2, 3


class LogWriter:
    """A llama-server log of one slot: steps of the target (ctx 2) and of its draft (ctx 3)."""

    def __init__(self) -> None:
        self.recs: list[dict[str, Any]] = [
            {"type": "session_start", "ts": 0, "sid": SID, "schema_version": 3}
            | {"level": "minimal", "metadata": {"program": "llama-server"}},
            self._context(TGT, "target", "SmolLM2", 30, {"type": "draft-simple", "n_max": 3}),
            self._context(DFT, "draft", "SmolLM2 draft 6L", 6, None),
        ]
        self.t = 10 * MS
        self.step = 0
        self.pos = 0

    @staticmethod
    def _context(ctx: int, role: str, name: str, n_layer: int, spec: Any) -> dict[str, Any]:
        rec = {"type": "context", "ts": 1, "sid": SID, "ctx": ctx, "role": role}
        rec |= {"model": {"name": name, "n_layer": n_layer}, "n_ctx": 4096, "n_seq_max": 1}
        return rec | ({"spec": spec} if spec else {})

    def decode(self, ctx: int, n: int, dur: int) -> int:
        """A step of ``n`` tokens taking ``dur`` ns; returns its number."""
        s, t = self.step, self.t
        kind = "gen" if n == 1 and self.pos > 0 else "prompt"
        begin = {"type": "step_begin", "ts": t, "sid": SID, "step": s, "ctx": ctx, "n_tokens": n}
        begin |= {"kind": kind, "level": "minimal", "pos": [self.pos, self.pos + n - 1]}
        end = {"type": "step_end", "ts": t + dur, "sid": SID, "step": s, "ctx": ctx}
        end |= {"t_start": t, "dur": dur, "status": 0, "n_tokens": n, "n_outputs": 1}
        end |= {"n_computes": 1, "kv_used": self.pos + n}
        self.recs += [begin, end]
        self.step += 1
        self.t += dur
        return s

    def verify(self, drafted: int, accepted: int, draft_ms: float, verify_ms: float) -> None:
        """A round: the draft's single-token steps, the target's verify step, the draft's catch-up,
        and the server's ``spec`` record (this slot had the whole round and step)."""
        t_draft = self.t
        first = self.decode(DFT, 1, int(draft_ms * MS))
        for _ in range(drafted - 1):
            self.decode(DFT, 1, int(draft_ms * MS))
        last = self.step - 1
        draft_dur = self.t - t_draft
        t_verify = self.t
        step = self.decode(TGT, drafted + 1, int(verify_ms * MS))
        catchup = self.decode(DFT, drafted + 1, int(draft_ms * MS))
        verify_ns = int(verify_ms * MS)
        draft_ns = draft_dur + int(draft_ms * MS)
        rej = drafted - accepted
        rejected_ns = verify_ns * rej // (drafted + 1) + draft_ns * rej // drafted
        self.recs.append(
            {"type": "spec", "ts": self.t, "sid": SID, "request": "task-0", "slot": 0}
            | {"spec_type": "draft-simple", "ctx": TGT, "step": step, "draft_ctx": DFT}
            | {"draft_steps": [first, last], "catchup_step": catchup, "drafted": drafted}
            | {"accepted": accepted, "rejected_at": accepted if accepted < drafted else None}
            | {"t_draft": t_draft, "draft_dur": draft_dur, "draft_ns": draft_ns}
            | {"t_verify": t_verify, "verify_dur": verify_ns, "verify_ns": verify_ns}
            | {"rejected_ns": rejected_ns}
        )
        self.pos += accepted + 1

    def finish(self, path: Path, gen_tokens: int, t_arrive: int = 5 * MS) -> Path:
        req = {"type": "request", "ts": self.t + MS, "sid": SID, "id": "task-0", "slot": 0}
        req |= {"endpoint": "/completion", "method": "POST", "status": 200, "outcome": "ok"}
        req |= {"stream": False, "t_arrive": t_arrive, "wait": 5 * MS, "ttft": 28 * MS}
        req |= {"model": self.t - t_arrive - 5 * MS, "dur": self.t - t_arrive + MS}
        req |= {"prompt_tokens": 10, "gen_tokens": gen_tokens}
        recs = [*self.recs, req]
        recs.append({"type": "session_end", "ts": self.t + 2 * MS, "sid": SID, "status": "ok"})
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
        return path


# (drafted, accepted) of each verify: 5 verifies of 3 drafted, 4 accepted of 15
ROUNDS = [(3, 0), (3, 2), (3, 0), (3, 1), (3, 1)]
DRAFT_MS, VERIFY_MS, SINGLE_MS = 1.0, 6.0, 4.0


def write_spec_log(path: Path) -> Path:
    w = LogWriter()
    w.decode(TGT, 10, 20 * MS)  # the prompt
    w.decode(DFT, 10, 3 * MS)  # the draft takes the prompt in
    w.pos = 10
    for d, a in ROUNDS:
        w.verify(d, a, DRAFT_MS, VERIFY_MS)
    w.decode(TGT, 1, int(SINGLE_MS * MS))  # the last token: no draft
    w.decode(DFT, 1, int(DRAFT_MS * MS))  # (the draft takes it in)
    return w.finish(path, gen_tokens=sum(a + 1 for _, a in ROUNDS) + 1)


def test_the_tables_keep_the_target_and_the_draft_apart(tmp_path: Path) -> None:
    f = load_session(write_spec_log(tmp_path / "s.log"))
    roles = f.steps.groupby("ctx")["role"].first().astype(str).to_dict()
    assert roles == {TGT: "target", DFT: "draft"}
    assert list(f.contexts["role"].astype(str)) == ["target", "draft"]
    assert list(f.contexts["n_layer"]) == [30, 6]
    assert len(f.spec) == len(ROUNDS)
    assert list(f.spec["accepted"]) == [a for _, a in ROUNDS]
    # the first rejected position: the accepted count, null when all were accepted
    assert list(f.spec["rejected_at"]) == [a for _, a in ROUNDS]
    # each verify names the draft steps that made it, all of the draft's context
    for first, last in f.spec[["draft_first", "draft_last"]].itertuples(False):
        named = f.steps[f.steps["step"].between(first, last)]
        assert set(named["ctx"]) == {DFT} and len(named) == 3


def test_the_summary_counts_the_targets_tokens_over_its_time_and_the_drafts(
    tmp_path: Path,
) -> None:
    log = write_spec_log(tmp_path / "s.log")
    r = instr("summary", str(log), "--format", "json")
    assert r.returncode == 0, r.stderr
    ov = json.loads(r.stdout)["overview"]
    tokens = sum(a + 1 for _, a in ROUNDS) + 1  # the verifies' and the last single step's
    target_ms = len(ROUNDS) * VERIFY_MS + SINGLE_MS
    # drafting: each round's 3 steps and its catch-up (the prompt's and the last token's are not)
    draft_gen_ms = len(ROUNDS) * 4 * DRAFT_MS
    assert ov["gen_tokens"] == tokens
    assert ov["gen_tok_s"] == pytest.approx(tokens / ((target_ms + draft_gen_ms) / 1e3))
    spec = ov["speculation"]
    assert spec["gen_tok_s_target_steps"] == pytest.approx(tokens / (target_ms / 1e3))
    assert spec["draft_steps"] == 2 + len(ROUNDS) * 4
    assert spec["drafted"] == 15 and spec["accepted"] == 4
    # the prompt is the target's one prompt step, not its verify steps
    assert ov["prompt_tokens"] == 10
    text = instr("summary", str(log))
    assert "draft-simple (ctx 3, SmolLM2 draft 6L)" in text.stdout
    # the verdict, priced from the one single-token target step (4 ms a token)
    plain = sum(a + 1 for _, a in ROUNDS) * SINGLE_MS
    spent = len(ROUNDS) * (VERIFY_MS + 4 * DRAFT_MS)
    assert spent > plain
    pct = 100 * (spent - plain) / plain
    assert (
        f"speculation cost {spent - plain:,.0f} ms ({pct:,.0f} % more than a plain decode's "
        in (text.stdout)
    )
    assert "the median of the log's 1 single-token step of the target" in text.stdout


def test_each_request_says_what_it_drafted_and_whether_it_paid(tmp_path: Path) -> None:
    log = write_spec_log(tmp_path / "s.log")
    r = instr("requests", str(log), "--format", "json")
    assert r.returncode == 0, r.stderr
    (req,) = json.loads(r.stdout)["requests"]
    s = req["speculation"]
    assert (req["drafted"], req["accepted"]) == (15, 4)
    assert s["drafted_by_pos"] == [5, 5, 5]
    # position 1 accepted in 3 of 5 verifies, position 2 in 1 (the one that accepted 2)
    assert s["accepted_by_pos"] == [3, 1, 0]
    assert s["verify_ms"] == pytest.approx(len(ROUNDS) * VERIFY_MS)
    assert s["draft_ms"] == pytest.approx(len(ROUNDS) * 4 * DRAFT_MS)
    rejected = sum(VERIFY_MS * (d - a) / (d + 1) + 4 * DRAFT_MS * (d - a) / d for d, a in ROUNDS)
    assert s["rejected_ms"] == pytest.approx(rejected, abs=1e-3)
    assert s["saved_ms"] == pytest.approx(
        sum(a + 1 for _, a in ROUNDS) * SINGLE_MS - len(ROUNDS) * (VERIFY_MS + 4 * DRAFT_MS)
    )
    assert s["priced_by"] == "log"
    text = instr("requests", str(log))
    assert "speculation (draft-simple): 4 of 15 drafted tokens accepted (27 %)" in text.stdout


def test_a_damaged_spec_record_is_skipped_and_counted(tmp_path: Path) -> None:
    log = write_spec_log(tmp_path / "s.log")
    lines = log.read_text().splitlines()
    k = next(i for i, ln in enumerate(lines) if '"type": "spec"' in ln)
    bad = json.loads(lines[k])
    bad["accepted"] = bad["drafted"] + 1
    lines[k] = json.dumps(bad)
    log.write_text("\n".join(lines) + "\n")
    f = load_session(log)
    assert len(f.spec) == len(ROUNDS) - 1 and len(f.report.skipped) == 1
    strict = instr("summary", str(log), "--strict")
    assert strict.returncode != 0 and len(strict.stderr.strip().splitlines()) == 1


def test_a_log_without_speculation_has_no_speculation(tmp_path: Path) -> None:
    w = LogWriter()
    w.recs = w.recs[:1]
    w.decode(1, 10, 20 * MS)
    w.pos = 10
    for _ in range(4):
        w.decode(1, 1, 4 * MS)
    f = load_session(w.finish(tmp_path / "s.log", gen_tokens=4))
    assert spec_split.split(f) is None and f.spec.empty
    assert f.steps["role"].isna().all()


def test_the_trace_shows_each_draft_and_the_verify_it_fed(tmp_path: Path) -> None:
    from helpers.support import assert_same_trace, fast_trace, trace_slices

    log = write_spec_log(tmp_path / "s.log")
    assert_same_trace(log)  # the fast writer as the reference's
    slices, _ = trace_slices(fast_trace(log)[0])
    mine = [s for s in slices if s["track"] == "requests" and "speculation" in s["cats"]]
    drafts = [s for s in mine if s["name"].startswith("draft")]
    verifies = [s for s in mine if s["name"].startswith("verify")]
    assert len(drafts) == len(verifies) == len(ROUNDS)
    assert [v["name"] for v in verifies] == [f"verify: {a} of {d} accepted" for d, a in ROUNDS]
    for d, v in zip(drafts, verifies, strict=True):
        assert d["depth"] == v["depth"] == 1  # inside the request's slice
        assert d["flows_out"] and list(d["flows_out"]) == list(v["flows_in"])
        assert d["ts"] + d["dur"] <= v["ts"] and v["dur"] == VERIFY_MS * MS
        assert d["dur"] == 3 * DRAFT_MS * MS
    chrome = tmp_path / "t.json"
    r = instr("to-perfetto", str(log), "--format", "json", "-o", str(chrome))
    assert r.returncode == 0, r.stderr
    events = json.loads(chrome.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert sum(1 for e in events if e.get("cat") == "spec_flow") == 2 * len(ROUNDS)


# --- instr predict --spec-draft-n-max --------------------------------------------------------


def write_length_log(path: Path, n_max: int, rounds: int, accept: Any, verify_ms: Any) -> Path:
    """A request drafted for at ``n_max``: ``accept(k)`` tokens accepted at round k, a verify of
    n tokens taking ``verify_ms(n)``, 1 ms a draft step, 5 ms the last single-token step."""
    w = LogWriter()
    w.recs[1]["spec"]["n_max"] = n_max
    w.decode(TGT, 10, 20 * MS)
    w.decode(DFT, 10, 3 * MS)
    w.pos = 10
    for k in range(rounds):
        w.verify(n_max, accept(k), 1.0, verify_ms(n_max + 1))
    w.decode(TGT, 1, 5 * MS)
    return w.finish(path, gen_tokens=sum(accept(k) + 1 for k in range(rounds)) + 1)


def test_predict_reads_acceptance_by_position_and_reproduces_a_run(tmp_path: Path) -> None:
    from llamacpp_instr.deciding.prediction import spec_predict

    # every other round accepts 1 token, the others none: position 0 half the time, 1 never
    log = write_length_log(tmp_path / "a.log", 3, 20, lambda k: k % 2, lambda n: 6.0 + n)
    m = spec_predict.measure([("a", load_session(log))])
    assert (m.reached[:2], m.accepted[:2]) == ([20, 10], [10, 0])
    assert m.expected(3) == pytest.approx(1.5)
    doc = spec_predict.run([log], 3)
    measured = doc["measured_gen_tokens_per_s"]
    # tokens 31 after the first, over 20 rounds of 3 + 1 + 10 ms and the 5 ms last step
    assert measured == pytest.approx(31 / ((20 * 14 + 5) / 1e3))
    assert doc["asked"]["gen_tokens_per_s"] == pytest.approx(measured, rel=0.05)
    # a plain decode at the single step's 5 ms a token is faster: no speculation is best
    assert doc["by_n_max"][0]["gen_tokens_per_s"] == pytest.approx(1e3 / 5, rel=0.01)
    assert doc["best_n_max"] == 0


def test_predict_prices_another_length_from_the_batch_costs_between(tmp_path: Path) -> None:
    from llamacpp_instr.deciding.prediction import spec_predict

    # every draft accepted whole: E(d) = d + 1; a verify of n tokens takes 2 + n ms
    logs = [
        write_length_log(tmp_path / f"{n}.log", n, 12, lambda k, n=n: n, lambda x: 2.0 + x)
        for n in (2, 6)
    ]
    doc = spec_predict.run(logs, 4, 40)
    # 40 tokens: 8 rounds of 5 (the server drafts at most the tokens left but one: 4 of the
    # last 5); each round 4 ms drafting, 1 ms catch-up and a verify of 5 tokens, 7 ms between
    # the logs' 3 (5 ms) and 7 (9 ms)
    assert doc["asked"]["gen_tokens_per_s"] == pytest.approx(40 / (8 * (4 + 1 + 7) / 1e3))
    assert doc["asked"]["extrapolated"] == []
    longer = spec_predict.run(logs, 8, 40)
    assert longer["asked"]["extrapolated"]  # verify of 9 tokens: beyond the sizes the logs ran
    assert doc["best_n_max"] > 0


def test_predict_without_speculation_in_the_logs_is_one_line(tmp_path: Path) -> None:
    w = LogWriter()
    w.recs = w.recs[:1]
    w.decode(1, 10, 20 * MS)
    log = w.finish(tmp_path / "s.log", gen_tokens=0)
    r = instr("predict", str(log), "--spec-draft-n-max", "4")
    assert r.returncode != 0 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "speculat" in r.stderr


# --- the summary's per-step views: the target's steps, the draft's beside them ------------------

LAYERS = {TGT: 3, DFT: 1}  # the hand-made graphs' layers: the target's 3, the draft's 1


def detailed(log: Path) -> Path:
    """``log`` at level detailed: each step computes a graph of its context (a matmul per layer,
    then the output projection outside the layers), its ops sharing the step's time."""
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    recs[0]["level"] = "detailed"
    out: list[dict[str, Any]] = []
    graphs: dict[tuple[int, int], int] = {}
    ends = {r["step"]: r for r in recs if r["type"] == "step_end"}
    for r in recs:
        if r["type"] == "step_begin":
            r["level"] = "detailed"
        out.append(r)
        if r["type"] != "step_begin":
            continue
        ctx, n, end = r["ctx"], r["n_tokens"], ends[r["step"]]
        layers = [*range(LAYERS[ctx]), None]
        if (ctx, n) not in graphs:
            graphs[(ctx, n)] = len(graphs) + 1
            nodes = [
                {"i": i, "name": f"mm-{lay}" if lay is not None else "result_output"}
                | {"op": "MUL_MAT", "sub": None, "layer": lay, "shape": [8, n], "dtype": "f32"}
                | {"bytes": 32 * n, "src": [], "flags": []}
                for i, lay in enumerate(layers)
            ]
            out.append(
                {"type": "graph", "ts": r["ts"], "sid": SID, "ctx": ctx, "graph": graphs[(ctx, n)]}
                | {"n_tokens": n, "nodes": nodes}
            )
        each = end["dur"] // (len(layers) + 1)
        out.append(
            {"type": "compute", "ts": r["ts"] + end["dur"], "sid": SID, "ctx": ctx}
            | {"step": r["step"], "ubatch": 0, "graph": graphs[(ctx, n)], "t_start": r["ts"]}
            | {"dur": end["dur"], "n_tokens": n, "status": 0, "n_threads": 1}
            | {
                "layers": [
                    [lay, i * each, each, 1] for i, lay in enumerate(layers) if lay is not None
                ]
            }
            | {"ops": [[i, i * each, each] for i in range(len(layers))]}
        )
    log.write_text("".join(json.dumps(r) + "\n" for r in out))
    return log


def test_every_per_step_view_is_the_targets_with_the_drafts_beside_it(tmp_path: Path) -> None:
    """Step percentiles, the typical generation step, the per-layer heatmap, the step times and
    the speed over the run: the target's steps (its verifies, 6 ms, and its last single token, 4
    ms: a typical step of 6 ms over its 3 layers), then the draft's single-token steps (1 ms, its
    one layer), each chart named for them."""
    from llamacpp_instr.converters.reports.summary import summary_report

    log = detailed(write_spec_log(tmp_path / "s.log"))
    f = load_session(log)
    r = instr("summary", str(log), "--format", "json")
    assert r.returncode == 0, r.stderr
    ov = json.loads(r.stdout)["overview"]
    assert (ov["gen_step_ms_p50"], ov["gen_step_ms_p90"]) == (6.0, 6.0)
    assert (ov["draft_step_ms_p50"], ov["draft_step_ms_p99"]) == (1.0, 1.0)
    charts = {c.name: c for s in summary_report(f).sections for c in s.charts}
    target = set(f.steps.loc[f.steps["role"] == "target", "step"])
    typical = charts["typical_step_by_layer"]
    step = int(typical.title.split("(step ")[1].split(",")[0])
    assert step in target and "of the target" in typical.title
    assert f.steps.set_index("step").loc[step, "dur_ns"] == VERIFY_MS * MS
    assert typical.categories == ["layer 0", "layer 1", "layer 2", "outside layers"]
    assert charts["layer_op_heatmap"].categories == ["layer 0", "layer 1", "layer 2"]
    draft = charts["draft_typical_step_by_layer"]
    assert "of the draft" in draft.title and draft.categories == ["layer 0", "outside layers"]
    assert charts["draft_layer_op_heatmap"].categories == ["layer 0"]
    # one point per step: the target's generation (5 verifies and a single token), the draft's
    # single tokens (3 per round and the last)
    assert len(charts["tokens_per_second"].x) == len(ROUNDS) + 1
    assert len(charts["draft_tokens_per_second"].x) == 3 * len(ROUNDS) + 1
    text = instr("summary", str(log)).stdout
    assert "the draft's generation step p50 (ms)" in text


def test_a_report_splits_the_targets_and_the_drafts_steps_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary's sections (overview, speculation, charts, the work between steps, the price)
    share one split of the session's steps; a new steps table gets its own."""
    from llamacpp_instr.converters import load_session
    from llamacpp_instr.converters.reports.renderers import render
    from llamacpp_instr.converters.reports.summary import summary_report

    made = []
    real = spec_split._split
    monkeypatch.setattr(spec_split, "_split", lambda f: made.append(f) or real(f))
    f = load_session(write_spec_log(tmp_path / "s.log"))
    for fmt in ("text", "json", "html"):
        render(summary_report(f, "op", None), fmt)
    assert len(made) == 1
    first = spec_split.split(f)
    f.steps = f.steps.copy()
    assert spec_split.split(f) is not first and len(made) == 2
