"""A rotation never holds a decode for long (issue 35): a new file begins between steps, so a
step that joins while a rotation is due waits for the steps other contexts have open. That wait is
bounded (50 ms); past it the step goes on in the current file and the rotation is left to the next
moment no step is open.

Context B's step is held open (its graph's eval callback blocks) while context A decodes with the
log at --max-bytes 64K: the file fills, and every step of A after that finds a rotation due and B's
step open. Before the bound, each such step of A waited a whole second."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import series, whole_lines

pytestmark = pytest.mark.native

MAX_BYTES = 64 * 1024
N_GEN = 40

# A (a Llama) decodes a prompt and N_GEN tokens, each timed, while B (a second context of the same
# model, made with an eval callback) is inside a step that waits for A to finish; prints A's times.
CHILD = r"""
import ctypes, json, sys, threading, time
import llama_cpp, llamacpp_instr
from llama_cpp import llama_cpp as L
model, log, max_bytes, n_gen = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
a = llama_cpp.Llama(model_path=model, n_ctx=256, n_batch=64, n_threads=1, verbose=False)
held, release, hold = threading.Event(), threading.Event(), {"on": True}

@L.ggml_backend_sched_eval_callback
def cb(t, ask, user):
    if not ask and hold["on"]:  # the first node computed: B's step stays open until A is done
        hold["on"] = False
        held.set()
        release.wait(600)
    return True

p = L.llama_context_default_params()
p.n_ctx, p.n_batch, p.n_threads, p.n_threads_batch = 256, 64, 1, 1
p.cb_eval = cb
b = L.llama_init_from_model(a.model, p)

def decode_b():
    tok = (ctypes.c_int32 * 1)(5)
    L.llama_decode(b, L.llama_batch_get_one(tok, 1))

times = []
with llamacpp_instr.session(a, log, "detailed", max_bytes=max_bytes, keep=100):
    tb = threading.Thread(target=decode_b)
    tb.start()
    held.wait(60)
    a.reset()
    for toks in [[1] + list(range(5, 24))] + [[7 + i % 200] for i in range(n_gen)]:
        t0 = time.perf_counter()
        a.eval(toks)
        times.append(time.perf_counter() - t0)
    release.set()
    tb.join()
L.llama_free(b)
a.close()
print(json.dumps(times))
"""


def test_a_due_rotation_waits_briefly_for_another_contexts_step(
    tiny_llama_f32: Path, tmp_path: Path
) -> None:
    log = tmp_path / "held.log"
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(tiny_llama_f32), str(log), str(MAX_BYTES), str(N_GEN)],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    times = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(times) == N_GEN + 1
    # A's steps (ctx 1, in order), and which of them began when the file already held MAX_BYTES:
    # each found a rotation due, and could not start it while B's step was open
    due: list[bool] = []
    for f in series(log):
        offset = 0
        for line in f.read_bytes().splitlines(keepends=True):
            rec = json.loads(line)
            if rec["type"] == "step_begin" and rec["ctx"] == 1:
                due.append(offset >= MAX_BYTES)
            offset += len(line)
    assert len(due) == len(times)
    waited = [t for t, d in zip(times, due, strict=True) if d]
    assert len(waited) >= 5, due  # the file filled while B's step was open
    # B's step ended only after A's last: no file was started while it was open, so every step
    # of A that found a rotation due waited for the bound. Before it was bounded, each waited 1 s.
    ends = [r for f in series(log) for r in whole_lines(f) if r["type"] == "step_end"]
    assert [r["ctx"] for r in ends][-1] == 2
    print(f"steps that found a rotation due: {len(waited)}, max {max(waited) * 1e3:.1f} ms")
    assert sum(waited) < 0.5 * len(waited), waited
