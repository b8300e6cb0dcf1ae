"""`instr follow` on a log another process is writing, and the live view's bounded state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.support import FIXTURES, PROMPT, REAL_FIXTURES, by_type, read_log

from llamacpp_instr.converters.analysis.follow import WINDOW, LiveState
from llamacpp_instr.converters.reading.tail import tail


def test_follow_a_run_while_it_writes(instr_api: Any, smollm2_path: Path, tmp_path: Path) -> None:
    log = tmp_path / "live.log"
    # the follower starts first and waits for the log to appear
    follower = subprocess.Popen(
        [sys.executable, "-m", "llamacpp_instr.cli", "follow", str(log), "--wait", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = subprocess.run(
        [sys.executable, "-m", "llamacpp_instr.cli", "run", str(smollm2_path), "-p", PROMPT]
        + ["-n", "24", "--ignore-eos", "-t", "2", "-o", str(log)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    assert err.strip().endswith("session ended: status ok")
    lines = out.strip().splitlines()
    ends = [json.loads(x) for x in log.open() if '"type":"step_end"' in x]
    # one line per step, in order, with the step's own measured duration
    assert len(lines) == len(ends) == 24
    for line, end in zip(lines, ends, strict=True):
        fields = dict(kv.split("=", 1) for kv in line.split()[3:])
        assert line.startswith(f"step {end['step']} ")
        assert float(fields["ms"]) == round(end["dur"] / 1e6, 2)
        assert int(fields["kv"]) == end["kv_used"]


@pytest.mark.fast
def test_follow_exits_on_a_missing_log_with_one_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "llamacpp_instr.cli", "follow", str(tmp_path / "no.log")]
        + ["--wait", "0.2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: log file not found: {tmp_path / 'no.log'} (waited 0 s)"


@pytest.mark.fast
def test_live_state_holds_a_window_not_the_run() -> None:
    """Thousands of steps: the state keeps WINDOW steps, whatever the run's length."""
    recs = read_log(FIXTURES / "tiny-llama-detailed.log.gz")
    head = [r for r in recs if r["type"] in ("session_start", "graph")]
    step_recs = [r for r in recs if r["type"] in ("step_begin", "compute", "step_end")]
    state = LiveState()
    for r in head:
        state.add(r)
    n = 0
    for k in range(500):
        for r in step_recs:
            r = dict(r, step=r["step"] + k * 100)
            if state.add(r) is not None:
                n += 1
    assert n == 500 * sum(r["type"] == "step_end" for r in step_recs)
    assert len(state.window) == WINDOW and len(state._op_by_step) == WINDOW
    assert state.fold.open_steps() == 0  # every begun step ended, none held
    assert state.steps_done == n and state.top_ops()


@pytest.mark.fast
def test_the_terminal_view_renders() -> None:
    from rich.console import Console

    from llamacpp_instr.converters.reports.renderers.live import view

    state = LiveState()
    for r in read_log(FIXTURES / "tiny-llama-detailed.log.gz"):
        state.add(r)
    console = Console(record=True, width=110, force_terminal=True)
    console.print(view(state))
    text = console.export_text()
    assert "tok/s" in text and "layer 0" in text and "MUL_MAT" in text
    assert f"steps {state.steps_done}" in text


@pytest.mark.fast
def test_tail_skips_nothing_of_a_complete_log() -> None:
    import gzip
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        plain = Path(d) / "x.log"
        plain.write_bytes(gzip.open(FIXTURES / "tiny-llama-verbose.log.gz").read())
        got = list(tail(plain, to_session_end=True))
        assert got == [json.loads(x) for x in plain.open()]


@pytest.mark.fast
def test_run_live_refuses_an_existing_log(tmp_path: Path) -> None:
    """The live view follows the file from its start: an earlier session in it (--append) is
    refused, in one line, before any model loads; without --append, a run that cannot start
    leaves the old log where it is."""
    log = tmp_path / "old.log"
    log.write_text('{"type":"session_start"}\n')
    r = subprocess.run(
        [sys.executable, "-m", "llamacpp_instr.cli", "run", str(tmp_path / "nope.gguf"), "-p", "x"]
        + ["--live", "-o", str(log), "--append"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: --live needs a new log file; {log} exists (drop --append)"
    assert log.read_text() == '{"type":"session_start"}\n'
    r = subprocess.run(
        [sys.executable, "-m", "llamacpp_instr.cli", "run", str(tmp_path / "nope.gguf"), "-p", "x"]
        + ["--live", "-o", str(log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "model file not found" in r.stderr, r.stderr
    assert (
        log.read_text() == '{"type":"session_start"}\n' and not (tmp_path / "old.log.old").exists()
    )


def _live(records: list[dict[str, Any]]) -> tuple[LiveState, list[Any]]:
    state = LiveState()
    done = [v for r in records if (v := state.add(r)) is not None]
    return state, done


def test_live_state_agrees_with_the_raw_log(smollm2_detailed: Any) -> None:
    """A real log fed record by record: the live totals are the log's, computed here from the
    raw JSON alone (tokens per kind, step durations, the last step's time per layer, op time per
    label over the window), and the same as the session model's tables (``load_session``)."""
    from llamacpp_instr.converters import load_session

    for path in [*REAL_FIXTURES, smollm2_detailed.path]:
        recs = read_log(path)
        state, done = _live(recs)
        begins = {(r["ctx"], r["step"]): r for r in by_type(recs, "step_begin")}
        all_ends = by_type(recs, "step_end")
        # an encoder's encodes are counted apart from the decode steps (never in their figures)
        encodes = [e for e in all_ends if begins[(e["ctx"], e["step"])]["kind"] == "encode"]
        assert state.encodes_done == len(encodes)
        assert state.encode_ns == sum(e["dur"] for e in encodes)
        ends = [e for e in all_ends if e not in encodes]
        done = [v for v in done if v.kind != "encode"]
        assert ends and len(done) == len(ends) == state.steps_done
        kinds = [begins[(e["ctx"], e["step"])]["kind"] for e in ends]
        assert [(v.step, v.kind, v.dur_ns, v.kv_used) for v in done] == [
            (e["step"], k, e["dur"], e["kv_used"]) for e, k in zip(ends, kinds, strict=True)
        ]
        n_tok = [begins[(e["ctx"], e["step"])]["n_tokens"] for e in ends]
        assert state.prompt_tokens == sum(
            n for n, k in zip(n_tok, kinds, strict=True) if k == "prompt"
        )
        assert state.gen_tokens == sum(n for n, k in zip(n_tok, kinds, strict=True) if k == "gen")
        start = by_type(recs, "session_start")[0]
        assert state.sid == start["sid"] and state.level == start["level"]
        assert state.status == by_type(recs, "session_end")[0]["status"]
        # op time per label over the last WINDOW steps, and the last step's time per layer
        labels = {
            (g["ctx"], g["graph"]): [f"{n['op']}:{n['sub']}" if n.get("sub") else n["op"]
                                     for n in g["nodes"]]
            for g in by_type(recs, "graph")
        }  # fmt: skip
        window = {(e["ctx"], e["step"]) for e in ends[-WINDOW:]}
        want: dict[str, int] = {}
        step_layers: dict[tuple[int, int], dict[int, int]] = {}
        for c in by_type(recs, "compute"):
            if (c["ctx"], c["step"]) in window:
                for e in c.get("ops", []):
                    lab = labels[(c["ctx"], c["graph"])][e[0]]
                    want[lab] = want.get(lab, 0) + e[2]
            per_layer = step_layers.setdefault((c["ctx"], c["step"]), {})
            for layer, _, dur, *_ in c["layers"]:
                per_layer[layer] = per_layer.get(layer, 0) + dur
        assert dict(state.top_ops(1000)) == want
        # the last step that timed layers (a minimal log's steps time none)
        timed = [step_layers[k] for e in ends if step_layers.get(k := (e["ctx"], e["step"]))]
        assert state.last_layers == (timed[-1] if timed else {})
        # the session model's tables say the same
        f = load_session(path)
        assert state.steps_done == len(f.steps)
        assert state.prompt_tokens + state.gen_tokens == int(f.steps["n_tokens"].sum())
        if want:
            ops = f.ops[f.ops["step"].isin([s for _, s in window])]
            by_label = ops.groupby("label", observed=True)["dur_ns"].sum()
            assert {str(k): int(v) for k, v in by_label.items() if v} == {
                k: v for k, v in want.items() if v
            }


@pytest.mark.fast
def test_tail_waits_for_the_file_holds_partial_lines_and_follows_a_rotation(
    tmp_path: Path,
) -> None:
    """One follower for instr follow and the exporters: it waits for a log that appears later,
    yields a line only once it is complete, reads the old file to its end after a rotation and
    goes on into the new one, and (for instr follow) stops at the session's end."""
    import threading
    import time

    log = tmp_path / "live.log"
    recs = [{"type": "session_start", "n": 0}, {"type": "step_begin", "n": 1}]
    recs += [{"type": "step_end", "n": 2}, {"type": "session_end", "n": 3}]
    lines = [json.dumps(r).encode() + b"\n" for r in recs]

    def write() -> None:
        time.sleep(0.3)  # the follower is waiting for the file
        with log.open("wb") as f:
            f.write(lines[0] + lines[1][:7])  # a partial line: not a record yet
            f.flush()
            time.sleep(0.3)
            f.write(lines[1][7:])
            f.flush()
            time.sleep(0.2)
            log.rename(tmp_path / "live.log.1")  # rotated: what follows goes to the old file
            f.write(lines[2])
        time.sleep(0.3)
        log.write_bytes(lines[3] + lines[0])  # after session_end: never read

    writer = threading.Thread(target=write)
    writer.start()
    got = list(tail(log, wait=10, to_session_end=True, poll=0.01))
    writer.join()
    assert got == recs
