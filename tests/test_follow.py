"""`instr follow` on a log another process is writing, and the live view's bounded state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from support import FIXTURES, PROMPT, read_log

from llamacpp_instr.converters.follow import WINDOW, LiveState, tail_records


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
    assert not state._begin  # every begun step ended
    assert state.steps_done == n and state.top_ops()


def test_the_terminal_view_renders() -> None:
    from rich.console import Console

    from llamacpp_instr.converters.renderers.live import view

    state = LiveState()
    for r in read_log(FIXTURES / "tiny-llama-detailed.log.gz"):
        state.add(r)
    console = Console(record=True, width=110, force_terminal=True)
    console.print(view(state))
    text = console.export_text()
    assert "tok/s" in text and "layer 0" in text and "MUL_MAT" in text
    assert f"steps {state.steps_done}" in text


def test_tail_skips_nothing_of_a_complete_log() -> None:
    import gzip
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        plain = Path(d) / "x.log"
        plain.write_bytes(gzip.open(FIXTURES / "tiny-llama-verbose.log.gz").read())
        got = list(tail_records(plain))
        assert got == [json.loads(x) for x in plain.open()]


def test_run_live_refuses_an_existing_log(tmp_path: Path) -> None:
    """The live view follows the file from its start: an earlier session in it is refused, in one
    line, before any model loads."""
    log = tmp_path / "old.log"
    log.write_text('{"type":"session_start"}\n')
    r = subprocess.run(
        [sys.executable, "-m", "llamacpp_instr.cli", "run", str(tmp_path / "nope.gguf"), "-p", "x"]
        + ["--live", "-o", str(log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: --live needs a new log file; {log} exists"
    assert log.read_text() == '{"type":"session_start"}\n'
