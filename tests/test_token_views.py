"""The host's work between steps as users read it: the summary's "A token's time", the requests'
costliest sampler, the trace's slot tracks beside the decode steps, and Prometheus' histogram of
sampling time per token by sampler. Hand-made ``host`` records (tests/test_host_work.py's), whose
sums are worked out here; llama-server's real run is in tests/test_host_server.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import write_log
from test_host_work import MS, _host, _log
from test_perfetto import check_trace

from llamacpp_instr.cli import main
from llamacpp_instr.converters import load_session
from llamacpp_instr.converters.formats.live_figures import RequestTracker
from llamacpp_instr.converters.formats.prometheus import Metrics
from llamacpp_instr.converters.reports.summary import summary_report

pytestmark = pytest.mark.fast


def _two_steps(tmp_path: Path) -> Path:
    """Two generation steps of 1 ms at 1 and 4 ms; after each, a host record of 0.4 ms of
    sampling and 0.05 ms of the program's work (slot 0: penalties 0.15, dist 0.03, the grammar's
    check 0.005, detokenize 0.05; slot 1: top-k 0.09, candidates 0.04)."""
    return write_log(tmp_path / "h.log", _log([_host(0), _host(1)]))


def test_a_tokens_time_sums_the_records_by_kind_of_step(tmp_path: Path) -> None:
    f = load_session(_two_steps(tmp_path))
    data = summary_report(f).data["between_steps"]
    [gen] = data["kinds"]
    assert gen["kind"] == "gen" and gen["steps"] == 2 and gen["tokens"] == 2
    assert gen["decode_ms"] == 2.0 and gen["sampling_ms"] == 0.8
    assert gen["grammar_ms"] == 0.01 and gen["program_ms"] == 0.1
    # the gap after step 0: 4 - 2 = 2 ms, of which 0.45 recorded; step 1 is the context's last
    assert abs(gen["unrecorded_ms"] - 1.55) < 1e-9
    assert abs(gen["per_token_ms"] - (2 + 0.8 + 0.1 + 1.55) / 2) < 1e-9
    names = [(s["sampler"], s["total_ms"]) for s in data["samplers"]]
    assert names == [
        ("penalties", 0.3), ("top-k", 0.18), ("candidates", 0.08), ("dist", 0.06),
        ("grammar: check", 0.01),
    ]  # fmt: skip
    assert abs(data["samplers"][0]["share"] - 0.3 / 0.8) < 1e-9
    text = CliRunner().invoke(main, ["summary", str(tmp_path / "h.log")])
    assert text.exit_code == 0, text.output
    section = text.output.split("A token's time", 1)[1]
    assert "(most: penalties)" in section and "The costliest samplers" in section


def test_a_log_without_host_records_has_no_such_section(tmp_path: Path) -> None:
    f = load_session(write_log(tmp_path / "n.log", _log([])))
    assert "between_steps" not in summary_report(f).data


def test_the_trace_puts_each_slots_sampling_under_its_decode_steps(tmp_path: Path) -> None:
    log = _two_steps(tmp_path)
    out = tmp_path / "h.pftrace"
    r = CliRunner().invoke(main, ["to-perfetto", str(log), "-o", str(out)])
    assert r.exit_code == 0, r.output
    res = check_trace(out)
    tracks = res["tracks"]
    slots = {d.name: d for d in tracks.values() if d.name.startswith("slot ")}
    assert set(slots) == {"slot 0: sampling", "slot 1: sampling"}
    assert {tracks[d.parent_uuid].name for d in slots.values()} == {"decode steps"}
    mine = [s for s in res["slices"] if s["track"] == "slot 0: sampling"]
    # one slice per window, from the sequence's first recorded instant to its last
    assert [(s["ts"], s["dur"]) for s in mine] == [(2 * MS, 400_000), (5 * MS, 400_000)]
    assert {s["name"] for s in mine} == {"sampling (penalties)"}
    assert mine[0]["args"]["request"] == "task-1"
    assert mine[0]["args"]["sampler: penalties (ms)"] == 0.15


def test_prometheus_histograms_sampling_per_token_by_bounded_sampler_names(
    tmp_path: Path,
) -> None:
    odd = _host(1)
    odd["parts"] = [*odd["parts"], [1, "sampler", "my-own-sampler", 7_000, 1]]
    tracker, metrics = RequestTracker(), Metrics()
    for rec in _log([_host(0), odd]):
        metrics.observe(tracker.add(json.loads(json.dumps(rec))))

    def value(name: str, sampler: str) -> float | None:
        return metrics.registry.get_sample_value(
            f"llamacpp_instr:sampling_time_per_token_seconds_{name}", {"sampler": sampler}
        )

    # two records of two sequences, one token each
    assert value("count", "total") == 4
    assert abs(value("sum", "total") - 2 * (250_000 + 150_000) * 1e-9) < 1e-12
    assert value("count", "penalties") == 2
    assert abs(value("sum", "penalties") - 2 * 150_000 * 1e-9) < 1e-12
    assert value("count", "grammar") == 2  # the grammar's passes outside the chain
    # a name the pin does not give is "other"; the program's own work is not sampling
    assert value("count", "other") == 1 and value("count", "my-own-sampler") is None
    assert value("count", "detokenize") is None


def test_predict_prices_sampling_as_measured_by_vocabulary_and_slots(tmp_path: Path) -> None:
    from llamacpp_instr.deciding.prediction import sampling_price

    recs = _log([_host(0), _host(1)])
    recs[0]["model"] = {"n_vocab": 1000}
    for r in recs:  # two slots' tokens a step, each sampled after it: generation
        if r["type"] in ("step_begin", "step_end"):
            r["n_tokens"] = 2
    f = load_session(write_log(tmp_path / "v.log", recs))
    price = sampling_price.measure([f])
    assert price is not None
    # 2 records of 0.4 ms sampling for 2 tokens each; steps of 1 ms
    assert price.sample_ns == 200_000 and price.decode_ns == 1_000_000
    assert price.by_slots == {2: 200_000}
    two, four = price.at(slots=2), price.at(slots=4)
    assert two["sampling_ms_per_step"] == 0.4 and four["sampling_ms_per_step"] == 0.8
    assert abs(four["sampling_share_of_step"] - 0.8 / 1.8) < 1e-9
    # each pass over the vocabulary
    assert price.at(n_vocab=2000, slots=2)["sampling_ms_per_token"] == 0.4
    assert list(two["samplers_ms_per_token"])[0] == "penalties"
    # a sixth of a step: backend sampling is worth a run; no one sampler holds half of it
    assert any("-bs" in a for a in two["advice"])
    assert not any("fewer" in a for a in two["advice"])
    # 4 slots, from steps of 2: said
    assert four["measured"]["slots"] == 2 and any("from steps of 2" in a for a in four["advice"])
    assert not any("from steps of" in a for a in two["advice"])
    # a log that recorded no sampling prices none
    assert sampling_price.measure([load_session(write_log(tmp_path / "n.log", _log([])))]) is None


def _spec_log(tmp_path: Path) -> Path:
    """A target (ctx 2) and its draft (ctx 3), times in ms: the target's prompt step 1-3, its
    sampling 5-5.2 (0.2), its host work 3.0 (batch 2.9, log 0.1); the draft's catch-up 3.5-4.5
    (before the target's sampling), its sampling at 5.5 (0.1: in the next batch's building), its
    drafting step 6-7, sampled at 7.2 (0.1); each draft step's recording 0.05; the target's
    verify step 8-10."""
    sid = "00000000000000ad"
    recs: list[dict[str, Any]] = [
        {"type": "session_start", "ts": 0, "sid": sid, "schema_version": 3, "level": "detailed"}
        | {"metadata": {"program": "llama-server"}}
    ]
    for ctx, role in ((2, "target"), (3, "draft")):
        recs.append(
            {"type": "context", "ts": 1, "sid": sid, "ctx": ctx, "role": role, "n_ctx": 512}
            | {"model": {"name": role, "n_layer": 2}, "n_seq_max": 1}
        )
    for step, ctx, n, t0, t1 in (
        (0, 2, 4, 1, 3),
        (1, 3, 4, 3.5, 4.5),
        (2, 3, 1, 6, 7),
        (3, 2, 2, 8, 10),
    ):
        kind = "prompt" if n > 1 else "gen"
        recs.append(
            {"type": "step_begin", "ts": int(t0 * MS), "sid": sid, "step": step, "ctx": ctx}
            | {"n_tokens": n, "pos": [0, n - 1], "kind": kind, "level": "detailed"}
        )
        recs.append(
            {"type": "step_end", "ts": int(t1 * MS), "sid": sid, "step": step, "ctx": ctx}
            | {"t_start": int(t0 * MS), "dur": int((t1 - t0) * MS), "status": 0, "n_tokens": n}
            | {"n_outputs": 1, "n_computes": 0, "kv_used": n}
        )
    host = {"type": "host", "ts": 20 * MS, "sid": sid, "level": "detailed"}
    recs.append(
        host | {"ctx": 2, "step": 0, "t_start": 3 * MS, "dur": int(2.2 * MS), "sampled": 1}
        | {"sample_ns": 200_000, "chain_ns": 100_000, "host_ns": 3 * MS}
        | {"seqs": [[-1, None, 0, 0, 0, 3 * MS, 0, int(2.2 * MS)],
                    [0, "task-1", 1, 200_000, 100_000, 0, 2 * MS, int(2.2 * MS)]],
           "parts": [[0, "host", "batch", int(2.9 * MS), 2], [0, "host", "log", 100_000, 1],
                     [1, "sampler", "penalties", 150_000, 2]]}
    )  # fmt: skip
    for step, t_end, off in ((1, 4.5, 1.0), (2, 7, 0.2)):
        recs.append(
            host | {"ctx": 3, "step": step, "t_start": int(t_end * MS), "dur": int(1.2 * MS), "sampled": 1}
            | {"sample_ns": 100_000, "chain_ns": 60_000, "host_ns": 50_000}
            | {"seqs": [[-1, None, 0, 0, 0, 50_000, 0, 0],
                        [0, None, 1, 100_000, 60_000, 0, int(off * MS), int(off * MS) + 100_000]],
               "parts": [[0, "host", "log", 50_000, 1], [1, "sampler", "top-k", 60_000, 2],
                         [1, "sampling", "candidates", 40_000, 1]]}
        )  # fmt: skip
    recs.append(
        {"type": "spec", "ts": 11 * MS, "sid": sid, "request": "task-1", "slot": 0}
        | {"spec_type": "draft-simple", "ctx": 2, "step": 3, "draft_ctx": 3}
        | {"draft_steps": [2, 2], "catchup_step": 4, "drafted": 1, "accepted": 1}
        | {"rejected_at": None, "t_draft": 6 * MS, "draft_dur": MS, "draft_ns": MS}
        | {"t_verify": 8 * MS, "verify_dur": 2 * MS, "verify_ns": 2 * MS, "rejected_ns": 0}
    )
    recs.append({"type": "session_end", "ts": 30 * MS, "sid": sid, "status": "ok"})
    return write_log(tmp_path / "spec.log", recs)


def test_the_drafts_work_in_the_targets_gap_is_the_drafts(tmp_path: Path) -> None:
    """The draft's decode, sampling and recording in the target's gap come out of the target's
    program's own work (after the target's sampling: the next batch's building) and out of its
    unrecorded time (before it), into its "draft" figure; the draft's own rows keep them."""
    from llamacpp_instr.converters.reports.requests_report import host_rows

    f = load_session(_spec_log(tmp_path))
    kinds = {k["kind"]: k for k in summary_report(f).data["between_steps"]["kinds"]}
    assert list(kinds) == ["prompt", "verify", "draft prompt", "draft gen"]
    prompt = kinds["prompt"]
    # in the batch: step 1's sampling 0.1, step 2's decode 1, recording 0.05, sampling 0.1
    assert abs(prompt["program_ms"] - (3.0 - 0.1 - 1.25)) < 1e-9
    # the gap 3-8 less 3.2 recorded, less step 1's decode 1 and recording 0.05
    assert abs(prompt["unrecorded_ms"] - (1.8 - 1.05)) < 1e-9
    assert abs(prompt["draft_ms"] - 2.3) < 1e-9 and prompt["sampling_ms"] == 0.2
    assert abs(prompt["per_token_ms"] * 4 - 7.0) < 1e-9  # from the prompt's start to the verify's
    # the draft's rows: its own work; a draft's gap ends at the target's next step (8)
    assert kinds["draft gen"]["sampling_ms"] == 0.1 and kinds["draft gen"]["draft_ms"] == 0
    assert abs(kinds["draft gen"]["unrecorded_ms"] - (1 - 0.15)) < 1e-9
    assert kinds["verify"]["steps"] == 1 and kinds["verify"]["decode_ms"] == 2.0
    # instr requests reads the target's batch less the draft's work in it
    batch = [ns for _, _, kind, name, ns in host_rows(f) if (kind, name) == ("host", "batch")]
    assert batch == [int(1.65 * MS)]
