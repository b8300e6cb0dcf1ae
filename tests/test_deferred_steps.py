"""A step whose records wait for the host's own synchronization (the CUDA op timer reads its marks
after it, so that a compute ends without one): on the CPU, with the testing build's switch that
makes every step wait (llama_instr_test_defer_steps), a greedy run writes the same log as one
written at each llama_decode's return: the same steps, computes and ops, each step's records before
its step_end, the same text; and a step decoded again before its outputs were read is written when
the next one begins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import read_log

pytestmark = pytest.mark.native

SCRIPT = r"""
import ctypes, json, sys
import llama_cpp
import numpy as np
import llamacpp_instr
from llamacpp_instr.native import bindings

model, out, defer = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
api = bindings.load()
api.test_defer_steps(defer)
llm = llama_cpp.Llama(model, n_ctx=256, n_threads=2, verbose=False)
toks = []
with llamacpp_instr.session(llm, out, level="detailed"):
    llm.reset()
    llm.eval(llm.tokenize(b"The capital of France is"))
    for _ in range(5):
        p = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)  # synchronizes: the step is written
        logits = np.ctypeslib.as_array(p, shape=(llm.n_vocab(),))
        toks.append(int(np.argmax(logits)))
        llm.eval([toks[-1]])
    llm.eval([toks[-1]])  # decoded again before the outputs were read: written at this one's start
    llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
print(json.dumps(toks))
"""


def _run(testing_lib: Path, model: Path, out: Path, defer: bool) -> list[int]:
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(model), str(out), "1" if defer else "0"],
        env=dict(os.environ, LLAMA_CPP_LIB_PATH=str(testing_lib)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return list(json.loads(r.stdout.strip().splitlines()[-1]))


def _shape(path: Path) -> list[tuple[str, int, int]]:
    """Per record of a step: its type, step and op count (the order records come in)."""
    out = []
    for r in read_log(path):
        if r["type"] in ("step_begin", "compute", "step_end"):
            out.append((r["type"], r["step"], len(r.get("ops", []))))
    return out


def test_a_step_written_at_the_synchronization_is_the_step_written_at_decode(
    testing_lib: Path, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    now = _run(testing_lib, tiny_llama_f32, tmp_path / "now.log", False)
    later = _run(testing_lib, tiny_llama_f32, tmp_path / "later.log", True)
    assert later == now
    a, b = _shape(tmp_path / "now.log"), _shape(tmp_path / "later.log")
    assert b == a
    # 1 prompt step, 5 generated, 1 decoded again: each begins, computes and ends, in that order
    assert [t for t, _, _ in b if t == "step_end"] == ["step_end"] * 7
    for step in {s for _, s, _ in b}:
        kinds = [t for t, s, _ in b if s == step]
        assert kinds[0] == "step_begin" and kinds[-1] == "step_end" and "compute" in kinds
    recs = read_log(tmp_path / "later.log")
    assert recs[-1]["type"] == "session_end" and recs[-1]["status"] == "ok"
    # a step that waited: its compute's `wait` runs to the synchronization, after its return
    ends = {r["step"]: r for r in recs if r["type"] == "step_end"}
    comp = [r for r in recs if r["type"] == "compute"]
    assert all(c["wait"] >= 0 for c in comp)
    assert any(
        c["t_start"] + c["dur"] + c["wait"] > ends[c["step"]]["t_start"] + ends[c["step"]]["dur"]
        for c in comp
    )
