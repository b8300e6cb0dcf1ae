"""A decode's step under each allocation failed in turn (the testing build): the n-th allocation
made on behalf of llama_instr code during one decode fails, for n = 1, 2, ... until a decode
reaches none. Each decode succeeds (no failure of ours reaches llama_decode), the session stays
open, the next decode is recorded whole (its step's begin and end), and the log reopens after it
as logrotate asks: a step left open by a failure would hold rotation back for every context.

The sweep makes a new context of the tiny llama for each n (a context's first steps allocate what
its later ones reuse) and decodes a prompt of two computes, then a token: cheap enough for
AddressSanitizer (`.ci/sanitize`), where a failure path that reads freed memory is a report; the
whole C API's sweep (test_alloc_failure) is too long to run there."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.support import by_type, read_log, run_on_lib

pytestmark = pytest.mark.native

DECODES = r"""
import json, os, sys
import llama_cpp
from llamacpp_instr.native import bindings

api = bindings.load()
lib = api.lib
log = sys.argv[2]
model = llama_cpp.llama_model_load_from_file(sys.argv[1].encode(),
                                             llama_cpp.llama_model_default_params())

def new_context():
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 64, 16, 4
    cp.n_threads = cp.n_threads_batch = 1
    return llama_cpp.llama_init_from_model(model, cp)

def decode(ctx, toks):
    arr = (llama_cpp.llama_token * len(toks))(*toks)
    return llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(toks)))

assert lib.llama_instr_session_begin(None, log.encode(), int(sys.argv[3]), None) == 0
swept, bad = 0, []
for n in range(1, 5000):
    # a new context each time: its first steps allocate what its later ones reuse
    ctx = new_context()
    api.test_fail_alloc(n)
    rcs = [decode(ctx, [1, 2, 3, 4, 5, 6]), decode(ctx, [7])]  # two computes, then one
    failed = api.test_failed_allocs()
    api.test_fail_alloc(0)
    rcs.append(decode(ctx, [8]))
    llama_cpp.llama_free(ctx)
    if any(rcs):
        bad.append(f"n={n}: llama_decode returned {rcs}")
    if lib.llama_instr_get_level() == 0:
        bad.append(f"n={n}: recording went off")
    if failed == 0 or bad:
        break
    swept += 1
ctx = new_context()
decode(ctx, [1, 2])
os.rename(log, log + ".moved")
api.reopen()
decode(ctx, [3])
llama_cpp.llama_free(ctx)
lib.llama_instr_session_end(b"ok")
print(json.dumps({"swept": swept, "bad": bad[:10]}))
"""


@pytest.mark.parametrize("level", [2, 3], ids=["detailed", "verbose"])
def test_a_step_whose_allocation_failed_leaves_the_next_one_whole(
    testing_lib: Path, tiny_llama_f32: Path, tmp_path: Path, level: int
) -> None:
    log = tmp_path / "steps.log"
    out = run_on_lib(DECODES, testing_lib, tiny_llama_f32, log, level, timeout=900)
    assert out["bad"] == [], out
    assert out["swept"] >= 10, out  # the sweep reached a context's steps, not one allocation
    moved, now = read_log(Path(str(log) + ".moved")), read_log(log)
    # after the reopen: the last decode's step, whole, then the session's end
    begins, ends = by_type(now, "step_begin"), by_type(now, "step_end")
    assert len(begins) == len(ends) == 1 and begins[0]["step"] == ends[0]["step"], now
    assert now[-1]["type"] == "session_end"
    # before it, the sweep's steps (a failure may lose a step's records, counted as lost: what
    # may not happen is a step left open, which the reopen above would have waited on for good)
    assert len(by_type(moved, "step_begin")) > out["swept"]
    # every step_end closes a step whose step_begin was written: a step whose begin failed before
    # its record is abandoned, and nothing of it is written
    begun = {(r["ctx"], r["step"]) for r in by_type(moved, "step_begin")}
    ended = [(r["ctx"], r["step"]) for r in by_type(moved, "step_end")]
    assert [e for e in ended if e not in begun] == []
