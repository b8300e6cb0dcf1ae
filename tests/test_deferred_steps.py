"""A step whose records wait for the host's own synchronization (the CUDA op timer reads its marks
after it, so that a compute ends without one): on the CPU, with the testing build's switch that
makes every step wait (llama_instr_test_defer_steps), a greedy run writes the same log as one
written at each llama_decode's return: the same steps, computes and ops, each step's records before
its step_end, the same text; and a step decoded again before its outputs were read is written when
the next one begins."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.support import by_type, read_log, run_on_lib

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
    return list(run_on_lib(SCRIPT, testing_lib, model, out, "1" if defer else "0"))


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


# A program's own loop on llama.cpp's C API: decode, then llama_sampler_sample, whose scope opens
# before the synchronization that reads the output (llama_get_sampled_token_ith).
C_LOOP = r"""
import ctypes, json, sys
import llama_cpp
import llamacpp_instr
from llamacpp_instr.native import bindings

model, out, n, delay_us = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
api = bindings.load()
api.test_defer_steps(True)
api.test_write_delay(delay_us)
llm = llama_cpp.Llama(model, n_ctx=256, n_threads=2, verbose=False)
ctx = llm._ctx.ctx
chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(64))
llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(0.8))
llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(7))
with llamacpp_instr.session(llm, out, level="detailed"):
    toks = llm.tokenize(b"hello world")
    for _ in range(n):
        arr = (llama_cpp.llama_token * len(toks))(*toks)
        assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(toks))) == 0
        toks = [llama_cpp.llama_sampler_sample(chain, ctx, -1)]
    perf = llama_cpp.llama_perf_context(ctx)
    llama_cpp.llama_sampler_free(chain)
print(json.dumps({"t_eval_ms": perf.t_eval_ms, "n_eval": perf.n_eval}))
"""


def test_a_deferred_steps_writing_is_the_loggers_not_sampling_nor_llama_s(
    testing_lib: Path, big_vocab: Path, tmp_path: Path
) -> None:
    """A deferred step written at the synchronization inside a sampling's scope, its writing made
    slow on purpose (50 ms): that time is the logger's ("log", in the step's host window), not the
    sampling's (its scope and its candidates), and not llama.cpp's own t_eval."""
    n, delay_us = 6, 50_000
    perf = run_on_lib(C_LOOP, testing_lib, big_vocab, tmp_path / "c.log", n, delay_us)
    recs = read_log(tmp_path / "c.log")
    hosts = by_type(recs, "host")
    assert [h["step"] for h in hosts] == list(range(n)) and sum(h["sampled"] for h in hosts) == n
    for h in hosts:
        assert h["sample_ns"] < delay_us * 1000 / 2, h
        parts = {(p[1], p[2]): p[3] for p in h["parts"]}
        assert parts[("sampling", "candidates")] < delay_us * 1000 / 2, h
        assert parts[("host", "log")] >= delay_us * 1000, h
    [chain] = by_type(recs, "chain")
    assert chain["n_sample"] == n and chain["samplers"] == ["top-k", "temp", "dist"]
    assert perf["n_eval"] == n - 1
    assert _excess_us(recs, perf["t_eval_ms"]) < delay_us / 2


SAMPLING = r"""
import json, sys
import llama_cpp
import llamacpp_instr
from llamacpp_instr.native import bindings

model, out, defer, n = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
api = bindings.load()
api.test_defer_steps(defer)
llm = llama_cpp.Llama(model, n_ctx=256, n_threads=2, seed=5, verbose=False)
kw = {"temp": 0.8, "top_k": 64, "top_p": 0.9, "min_p": 0.01, "repeat_penalty": 1.1}
toks = []
llm.set_seed(5)
with llamacpp_instr.session(llm, out, level="detailed"):
    for t in llm.generate(llm.tokenize(b"hello world"), **kw):
        toks.append(int(t))
        if len(toks) == n:
            break
    smpl = llama_cpp.llama_perf_sampler(llm._sampler.sampler)
    ctx = llama_cpp.llama_perf_context(llm._ctx.ctx)
print(json.dumps({"tokens": toks, "t_sample_ms": smpl.t_sample_ms, "n_sample": smpl.n_sample,
                  "t_eval_ms": ctx.t_eval_ms, "n_eval": ctx.n_eval}))
"""


def _sample(testing_lib: Path, model: Path, out: Path, defer: bool, n: int) -> dict[str, Any]:
    return dict(run_on_lib(SAMPLING, testing_lib, model, out, "1" if defer else "0", n))


def _kinds(recs: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["type"] for r in recs)


def _excess_us(recs: list[dict[str, Any]], t_eval_ms: float) -> float:
    """llama.cpp's generation time (t_eval: from each single-token decode's start to the
    synchronization that reads its output) less the steps' own durations: the time between a
    decode's return and its synchronization, per generated step."""
    gen = [r for r in recs if r["type"] == "step_end" and r["n_tokens"] == 1]
    return (t_eval_ms * 1000 - sum(r["dur"] for r in gen) / 1000) / len(gen)


def test_a_deferred_step_keeps_its_host_window_and_its_accounts(
    testing_lib: Path, big_vocab: Path, tmp_path: Path
) -> None:
    """Sampling through llama-cpp-python after steps whose records wait for the synchronization:
    the same records as without deferral (a `host` record after every step, with the same parts,
    and the chain's `chain` record), the chain's time still llama_perf_sampler's."""
    n = 24
    now = _sample(testing_lib, big_vocab, tmp_path / "now.log", False, n)
    later = _sample(testing_lib, big_vocab, tmp_path / "later.log", True, n)
    assert later["tokens"] == now["tokens"] and len(now["tokens"]) == n
    a, b = read_log(tmp_path / "now.log"), read_log(tmp_path / "later.log")
    assert _kinds(b) == _kinds(a)
    steps = [r["step"] for r in b if r["type"] == "step_end"]
    hosts = by_type(b, "host")
    assert [h["step"] for h in hosts] == steps[:n] and sum(h["sampled"] for h in hosts) == n
    [chain] = by_type(b, "chain")
    assert chain["n_sample"] == n and chain["t_sample_us"] == round(later["t_sample_ms"] * 1000)
    chain_ns = sum(h["chain_ns"] for h in hosts)
    assert abs(chain_ns / 1000 - chain["t_sample_us"]) <= max(0.02 * chain["t_sample_us"], 100)
    # the deferred write is the logger's ("log"), never sampling's
    for h_now, h_later in zip(by_type(a, "host"), hosts, strict=True):
        parts = {(p[1], p[2]) for p in h_later["parts"]}
        assert parts == {(p[1], p[2]) for p in h_now["parts"]}, (h_now["parts"], h_later["parts"])


TWO_CONTEXTS = r"""
import json, sys, time
import llama_cpp
import llamacpp_instr
from llamacpp_instr.native import bindings

model, out = sys.argv[1], sys.argv[2]
api = bindings.load()
api.test_defer_steps(True)
a = llama_cpp.Llama(model, n_ctx=128, n_threads=1, verbose=False)
b = llama_cpp.Llama(model, n_ctx=128, n_threads=1, verbose=False)
gaps = []
with llamacpp_instr.session([a, b], out, level="detailed", max_bytes=64 * 1024, keep=3):
    toks = a.tokenize(b"hello")
    arr = (llama_cpp.llama_token * len(toks))(*toks)
    # context a decodes and reads nothing: its step waits for a synchronization that never comes
    assert llama_cpp.llama_decode(a._ctx.ctx, llama_cpp.llama_batch_get_one(arr, len(toks))) == 0
    b.eval(b.tokenize(b"hello"))
    for i in range(40):
        t0 = time.monotonic()
        b.eval([i + 5])  # reads its outputs: its steps are written, the file fills
        gaps.append(time.monotonic() - t0)
    a._ctx.get_logits()  # a synchronizes at last: its step is written, the rotation goes on
    b.eval([3])
print(json.dumps(gaps))
"""


def test_a_deferred_step_holds_no_other_contexts_rotation(
    testing_lib: Path, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """One context's step waits for a synchronization its program does not make yet; another
    context's steps fill the file past its size: they never wait for the first's step (a rotation
    waits 50 ms for steps in a decode, not for a deferred one), and the rotation happens once the
    deferred step is written, its records all in the file its step began in."""
    out = tmp_path / "two.log"
    gaps = run_on_lib(TWO_CONTEXTS, testing_lib, tiny_llama_f32, out)
    assert max(gaps) < 0.040, gaps  # a tiny model's step: well under the rotation's 50 ms wait
    files = sorted(tmp_path.glob("two.log*"))
    assert len(files) >= 2, files
    first_step = [r for r in read_log(out.with_name("two.log.1")) if r.get("ctx") == 1]
    kinds = [r["type"] for r in first_step if r["type"] in ("step_begin", "step_end")]
    assert kinds == ["step_begin", "step_end"], kinds


ASYNC = r"""
import json, sys
import llama_cpp
import numpy as np
import llamacpp_instr
from llamacpp_instr.native import bindings

model, out, on = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
api = bindings.load()
api.test_async_devices(on)
llm = llama_cpp.Llama(model, n_ctx=128, n_threads=2, verbose=False)
with llamacpp_instr.session(llm, out, level="detailed"):
    llm.eval(llm.tokenize(b"The capital of France is"))
    for _ in range(3):
        p = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        logits = np.ctypeslib.as_array(p, shape=(llm.n_vocab(),))
        llm.eval([int(np.argmax(logits))])
"""


def test_a_device_no_timer_synchronizes_has_its_wait_run_to_the_hosts_synchronization(
    testing_lib: Path, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """With a device that may still compute after its split returns (a GPU's; here the CPU taken
    for one) and no op timer that synchronizes it (device timing off, or a timer that could not
    arm), a step's records wait for the host's synchronization, so that its computes' `wait`
    runs to it as documented: past the step's return. A CPU alone is written at the return."""
    ends: dict[bool, bool] = {}
    for on in (False, True):
        out = tmp_path / f"async{int(on)}.log"
        r = subprocess.run(
            [sys.executable, "-c", ASYNC, str(tiny_llama_f32), str(out), "1" if on else "0"],
            env=dict(os.environ, LLAMA_CPP_LIB_PATH=str(testing_lib)),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        recs = read_log(out)
        step_ends = {s["step"]: s for s in by_type(recs, "step_end")}
        comp = by_type(recs, "compute")
        assert len(step_ends) == 4 and comp
        ends[on] = all(
            c["t_start"] + c["dur"] + c["wait"]
            > step_ends[c["step"]]["t_start"] + step_ends[c["step"]]["dur"]
            for c in comp
        )
    assert ends == {False: False, True: True}


PAUSED_FREE = r"""
import json, os, sys
import llama_cpp
from llamacpp_instr.native import bindings

model, out = sys.argv[1], sys.argv[2]
api = bindings.load()
api.test_defer_steps(True)
api.session_begin(None, out, "detailed", {})
llm = llama_cpp.Llama(model, n_ctx=256, n_threads=2, verbose=False)
llm.eval(llm.tokenize(b"The capital of France is"))  # its records wait for a synchronization
api.set_level("off")                                  # recording paused
llm.close()                                           # freed with its step still waiting
api.set_level("detailed")
os.rename(out, out + ".moved")
api.reopen()
llm = llama_cpp.Llama(model, n_ctx=256, n_threads=2, verbose=False)
llm.eval(llm.tokenize(b"Hello"))
llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)      # synchronizes: its step is written
api.session_end("ok")
llm.close()
print(json.dumps({"reopened": os.path.exists(out)}))
"""


def test_a_step_waiting_when_its_context_is_freed_while_paused_ends(
    testing_lib: Path, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """A step whose records wait for the synchronization, its context freed while recording is
    paused (set_level off, then llama_free): the step's records are written at the free (the
    destructor synchronized), it ends, and the log reopens at the next step as logrotate asks."""
    out = tmp_path / "paused.log"
    got = run_on_lib(PAUSED_FREE, testing_lib, tiny_llama_f32, out)
    assert got["reopened"]
    moved = read_log(Path(str(out) + ".moved"))
    [begin] = by_type(moved, "step_begin")
    [end] = by_type(moved, "step_end")
    assert end["step"] == begin["step"] and end["n_tokens"] == begin["n_tokens"] > 1
    assert [c["step"] for c in by_type(moved, "compute")] == [begin["step"]]
    now = read_log(out)
    assert [r["n_tokens"] for r in by_type(now, "step_end")] == [
        by_type(now, "step_begin")[0]["n_tokens"]
    ]
    assert now[-1]["type"] == "session_end" and now[-1]["status"] == "ok"
