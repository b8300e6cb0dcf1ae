"""A step runs until its outputs are ready (issue 53 §1), not until ``llama_decode`` returns.

On an RPC device ``llama_decode`` returns once the step's last graph is sent (``graph_compute`` has
no reply) and the read of its outputs is queued; the server computes the graph afterwards, and the
program waits for it when it reads the outputs. A step's time, and every headline made from it
(tokens/s, step percentiles, op-time coverage, Prometheus and OTLP), must include that compute.

Checked against facts the log records apart from the step's derived time: each remote graph's end
as its server timed it (placed on the client's clock, always before the reply that carried it), the
raw ``step_end`` and ``transfers`` records, and ``token_time`` (the step's window, until its
outputs were read). On the committed RPC fixture and on a real run against an RPC server on
loopback (tests/helpers/rpc_backend.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.rpc_backend import run_offloaded
from helpers.support import read_log

from llamacpp_instr.converters import load_session
from llamacpp_instr.converters.analysis.frames import SessionFrames
from llamacpp_instr.converters.formats.live_figures import RequestTracker, StepFigures
from llamacpp_instr.converters.reports.summary import overview

FIXTURE = Path(__file__).parent / "fixtures" / "tiny-llama-rpc2-detailed.log.gz"
N_GEN = 8


def _ready_from_records(recs: list[dict[str, Any]]) -> dict[int, tuple[int, int, int]]:
    """Per step, from the raw records: (start, llama_decode's return, the reply to the last of the
    step's commands or the return, whichever is later)."""
    last: dict[int, int] = {}
    for r in recs:
        if r["type"] == "transfers" and r["phase"] == "step" and r["rows"]:
            end = r["t_start"] + max(row[9] for row in r["rows"])
            last[r["step"]] = max(last.get(r["step"], end), end)
    out = {}
    for r in recs:
        if r["type"] == "step_end":
            start, ret = r["t_start"], r["t_start"] + r["dur"]
            out[r["step"]] = (start, ret, max(ret, last.get(r["step"], ret)))
    return out


def _check_covers_remote(f: SessionFrames) -> int:
    """Every remote graph ends inside its step; returns how many ended after llama_decode's return
    (what the step's time missed before)."""
    steps = f.steps.set_index("step")
    assert len(f.remote) > 0
    rows = list(zip(f.remote["step"], f.remote["t_end"], strict=True))
    for step, t_end in rows:
        assert int(steps.at[step, "t_start"] + steps.at[step, "dur_ns"]) >= int(t_end), step
    returned = steps["t_start"] + steps["llama_decode_ns"]
    return sum(int(returned[step]) < int(t_end) for step, t_end in rows)


def _check_headlines(f: SessionFrames, recs: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary's tokens/s against the raw records' and token_time's; returns the overview."""
    ready = _ready_from_records(recs)
    kinds = {r["step"]: (r["kind"], r["n_tokens"]) for r in recs if r["type"] == "step_begin"}
    ov = overview(f)
    for kind, key in (("gen", "gen_tok_s"), ("prompt", "prompt_tok_s")):
        mine = [s for s in ready if kinds[s][0] == kind]
        tokens = sum(kinds[s][1] for s in mine)
        ns = sum(ready[s][2] - ready[s][0] for s in mine)
        assert ov[key] == pytest.approx(tokens / (ns / 1e9), rel=1e-9)
        tt = f.token_time[f.token_time["kind"] == kind]
        assert ov[key] == pytest.approx(tt["n_tokens"].sum() / (tt["token_ns"].sum() / 1e9))
    got = f.steps.set_index("step")
    for s, (start, ret, end) in ready.items():
        assert got.at[s, "llama_decode_ns"] == ret - start
        assert got.at[s, "dur_ns"] == end - start
    return ov


def _tracker_durations(recs: list[dict[str, Any]]) -> list[float]:
    tracker = RequestTracker()
    out = []
    for r in recs:
        fig = tracker.add(r)
        if isinstance(fig, StepFigures):
            out.append(fig.dur_s)
    return out


@pytest.mark.fast
def test_the_rpc_fixture_steps_run_until_their_outputs_are_ready() -> None:
    f = load_session(FIXTURE)
    recs = read_log(FIXTURE)
    # the fixture's remote graphs end after llama_decode returned: what the step's time missed
    assert _check_covers_remote(f) >= 2
    ov = _check_headlines(f, recs)
    # the figures: 314 tok/s from llama_decode's returns, 183 from the token time
    assert ov["gen_tok_s"] == pytest.approx(183.5, abs=0.5)
    gen = f.steps[f.steps["kind"] == "gen"]
    assert 2 / (gen["llama_decode_ns"].sum() / 1e9) == pytest.approx(314.6, abs=0.5)
    # Prometheus and OTLP read the log's records as they come (live_figures): the same times
    assert _tracker_durations(recs) == pytest.approx((f.steps["dur_ns"] / 1e9).tolist(), abs=1e-12)


@pytest.mark.fast
def test_a_cpu_log_keeps_llama_decode_s_time() -> None:
    f = load_session(FIXTURE.with_name("tiny-llama-detailed.log.gz"))
    assert (f.steps["dur_ns"] == f.steps["llama_decode_ns"]).all()


def test_an_rpc_run_s_steps_cover_their_remote_compute(
    tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """Every layer and the output on an RPC server on loopback: each step covers its graph's remote
    compute, and the headlines agree with the raw records and the token time."""
    log = tmp_path / "rpc.log"
    run_offloaded(f"""
import llama_cpp, llamacpp_instr
llm = llama_cpp.Llama({str(tiny_llama_f32)!r}, n_ctx=128, n_batch=64, n_threads=2, verbose=False,
                      n_gpu_layers=99)
with llamacpp_instr.session(llm, {str(log)!r}, level="detailed"):
    llm.eval([1, 40, 41, 42, 43, 44])
    for t in range({N_GEN}):
        llm.eval([45 + t])
llm.close()
""")
    f = load_session(log)
    recs = read_log(log)
    assert (f.steps["kind"] == "gen").sum() == N_GEN
    assert set(f.remote["step"]) == set(f.steps["step"])  # every step's graph timed remotely
    _check_covers_remote(f)
    _check_headlines(f, recs)
    assert _tracker_durations(recs) == pytest.approx((f.steps["dur_ns"] / 1e9).tolist(), abs=1e-12)
