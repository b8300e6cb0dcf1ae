"""A log from a busy machine (issue 53 §4): ``summary``, ``predict`` and ``plan`` flag a log whose
steps spread like a contended machine's (``converters/analysis/contention.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from helpers.support import FIXTURES, REAL_FIXTURES, instr, read_log, write_log

from llamacpp_instr.cli import main
from llamacpp_instr.converters.analysis.contention import verdict
from llamacpp_instr.converters.analysis.frames import load_session

N_GEN = 30  # generation steps of the built logs


def _summary(log: Path) -> dict[str, Any]:
    r = CliRunner().invoke(main, ["summary", str(log), "--format", "json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


@pytest.mark.fast
@pytest.mark.parametrize("log", REAL_FIXTURES, ids=lambda p: p.name)
def test_no_committed_fixture_is_flagged(log: Path) -> None:
    assert not verdict(load_session(log).steps).flagged
    assert _summary(log)["overview"]["busy_machine"]["flagged"] is False


def _steps(durs: list[float], pos0: list[int] | None = None) -> pd.DataFrame:
    n = len(durs)
    return pd.DataFrame(
        {
            "kind": ["gen"] * n,
            "ctx": [1] * n,
            "n_tokens": [1] * n,
            "pos0": pos0 if pos0 is not None else [100 + i for i in range(n)],
            "dur_ns": durs,
            "status": [0] * n,
        }
    )


@pytest.mark.fast
def test_the_rule_on_steps_tables() -> None:
    """Quiet steps whose time triples as the KV cache grows, one slow step (cold caches), and the
    first two slow (a GPU backend's uncaptured computes before it captures its graph) are not
    flagged; a third of the steps 30 times slower, or most of them (the median itself delayed),
    are; a group's first two steps never count as slow."""
    rng = np.random.default_rng(7)
    n = 600
    pos = list(range(10, 10 + n))
    grow = [1e6 * (1 + 2 * i / n) * rng.uniform(0.95, 1.1) for i in range(n)]
    assert not verdict(_steps(grow, pos)).flagged
    one = [1e6] * 20 + [30e6] + [1e6] * 19
    assert not verdict(_steps(one)).flagged
    warmup = [15e6, 4e6] + [1e6] * 13  # an H200's first two decode steps of a 1B, then replays
    assert not verdict(_steps(warmup)).flagged
    third = [30e6 if i % 3 == 2 else 1e6 for i in range(60)]
    v = verdict(_steps(third))
    # 20 slow, one of them the second step of the positions 128 and up (a group of its own)
    assert v.flagged and v.kinds[0].slow == 19
    assert "19 of 60 steps" in v.line() and "predictions from it are unreliable" in v.line()
    most = [30e6 if i % 5 else 1e6 for i in range(60)]  # 48 of 60 slow: p50 is 30 ms
    v = verdict(_steps(most))
    assert v.flagged and v.kinds[0].slow == 45  # (the first two of each group warm up: 3 slow)
    # too few steps of one shape to tell
    assert not verdict(_steps([30e6, 1e6, 1e6, 30e6, 1e6])).flagged


def _built_log(tmp_path: Path, slow_every: int | None) -> tuple[Path, int]:
    """The detailed fixture with its last generation step repeated ``N_GEN`` times at growing
    positions; with ``slow_every``, every such step's step_end comes 30 times its duration after
    its start. Returns the log and its number of slow steps."""
    recs = read_log(FIXTURES / "tiny-llama-detailed.log.gz")
    head = [r for r in recs if r["type"] in ("session_start", "graph")]
    prompt = [r for r in recs if r.get("step") == 0 and r["type"] != "graph"]
    last = max(r["step"] for r in recs if r["type"] == "step_begin")
    group = [r for r in recs if r.get("step") == last and r["type"] not in ("graph", "session_end")]
    t0 = min(r["ts"] for r in group)
    t_end = max(r["ts"] for r in prompt)
    pos = prompt[0]["pos"][1] + 1
    fast = next(r["dur"] for r in group if r["type"] == "step_end")
    span = 40 * fast
    out = head + prompt
    n_slow = 0
    for k in range(N_GEN):
        at = t_end + (k + 1) * span
        slow = slow_every is not None and k % slow_every == slow_every - 1
        n_slow += slow
        for r in group:
            r2 = dict(r, step=k + 1, ts=r["ts"] - t0 + at)
            if r["type"] == "step_begin":
                r2["pos"] = [pos + k, pos + k]
            if r["type"] == "step_end":
                r2["t_start"] = r["t_start"] - t0 + at
                r2["kv_used"] = pos + k + 1
                if slow:
                    r2["dur"] = 30 * fast
                    r2["ts"] = r2["t_start"] + r2["dur"]
            out.append(r2)
    out.append(dict(recs[-1], ts=t_end + (N_GEN + 2) * span))
    assert recs[-1]["type"] == "session_end"
    return write_log(tmp_path / ("busy.log" if slow_every else "quiet.log"), out), n_slow


@pytest.mark.fast
def test_a_log_with_slow_steps_is_flagged_in_summary(tmp_path: Path) -> None:
    quiet, _ = _built_log(tmp_path, None)
    busy, n_slow = _built_log(tmp_path, 3)
    assert n_slow == 10
    durs = [r["dur"] for r in read_log(busy) if r["type"] == "step_end" and r["n_tokens"] == 1]
    assert len(durs) == N_GEN and sum(d > 3 * np.median(durs) for d in durs) == n_slow
    assert _summary(quiet)["overview"]["busy_machine"] == {
        "flagged": False,
        "note": "",
        "by_kind": [
            {
                "kind": "gen",
                "steps": N_GEN,
                "slow_steps": 0,
                "p90_over_p50": 1.0,
                "p50_over_p10": 1.0,
                "flagged": False,
            }
        ],
    }
    doc = _summary(busy)["overview"]["busy_machine"]
    assert doc["flagged"] is True and doc["by_kind"][0]["slow_steps"] == n_slow
    line = doc["note"]
    assert f"{n_slow} of {N_GEN} steps" in line and "upper bounds on time" in line
    text = CliRunner().invoke(main, ["summary", str(busy)]).output
    assert f"busy machine: {line}" in " ".join(text.split())


def test_a_log_with_slow_steps_is_flagged_by_predict(tmp_path: Path, tiny_llama_f32: Path) -> None:
    quiet, _ = _built_log(tmp_path, None)
    busy, n_slow = _built_log(tmp_path, 3)
    model = ("--model", str(tiny_llama_f32))  # the fixture's model, made here
    r = instr("predict", str(quiet), *model, "--format", "json")
    assert json.loads(r.stdout)["contended"] == [], r.stderr
    r = instr("predict", str(busy), *model, "--format", "json")
    (line,) = json.loads(r.stdout)["contended"]
    assert line.startswith(f"{busy}: ") and f"{n_slow} of {N_GEN} steps" in line
    r = instr("predict", str(busy), *model)
    assert "busy machine" in r.stdout and "predictions from it are unreliable" in r.stdout


def test_a_run_against_processes_burning_its_cores_is_flagged(
    smollm2_path: Path, tmp_path: Path
) -> None:
    """A real contended run: SmolLM2 on 2 threads while 4 processes burn the same 2 cores (the
    run's affinity, inherited) 150 ms of every 200, together, as a batch job on the machine
    would. The steps that fall in a burst wait for a core (13 to 18 of 63 over 3x the fastest
    tenth's time here); the others are quiet: flagged.

    The bursts make the test hold on any scheduler: 4 processes burning all the time slowed
    the tiny model's 0.1 ms steps only where a time slice ended, none of 63 in a run on CI."""
    import os
    import subprocess
    import sys

    from helpers.support import make_run

    burst = (
        "import time\n"
        "while 1:\n"
        "    t = time.monotonic()\n"
        "    if t % 0.2 >= 0.15:\n"
        "        time.sleep(0.2 - t % 0.2)\n"
    )
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(sorted(mask)[:2]))  # this thread: the run's, the burners'
    burners: list[subprocess.Popen[bytes]] = []
    try:
        burners += [subprocess.Popen([sys.executable, "-c", burst]) for _ in range(4)]
        result = make_run(smollm2_path, tmp_path / "busy.log", "detailed", n_predict=64)
    finally:
        os.sched_setaffinity(0, mask)
        for b in burners:
            b.kill()
            b.wait()
    v = verdict(load_session(result.log_path).steps)
    assert v.flagged, v.to_json()
