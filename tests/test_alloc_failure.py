"""No exception crosses the C API (issue 21): in the testing build (`instr build --testing`), the
n-th allocation made on behalf of llama_instr code throws std::bad_alloc, for n = 1, 2, 3, ...
until a whole scenario runs without reaching it. The scenario calls every C API function and
decodes at the verbose level on a new context; each call must return one of its documented codes, llama_decode must
succeed, the process must never abort, and no session may be left open."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.native

CHILD = r"""
import ctypes, json, sys, time
import llama_cpp
from llamacpp_instr.native import bindings

OK, BUSY, NO_SESSION, INVALID, IO, INTERNAL = 0, -1, -2, -3, -4, -5
api = bindings.load()
lib = api.lib
log = sys.argv[2].encode()
bad = []

def check(what, rc, allowed):
    if rc not in allowed and not (rc >= 0 and ">=0" in allowed):
        bad.append(f"{what} returned {rc}: {lib.llama_instr_last_error()!r}")

def scenario(level, named):
    # a new context each time: its state's buffers are allocated again, in every hook. One thread
    # for the batches too (llama-cpp-python's default is every core): the same 558 allocation
    # sites, and no OpenMP barrier spinning for a core the other scenario's process holds (on two
    # busy cores the test took 530 s instead of 44)
    llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=128, n_batch=16, n_ubatch=8,
                          n_threads=1, n_threads_batch=1, verbose=False)
    ctx = llm.ctx
    check("set_topk", lib.llama_instr_set_topk(5), {OK, INTERNAL})
    # named: session_start describes ctx (its state is made there); else its first hook makes it
    rc = lib.llama_instr_session_begin(ctx if named else None, log, level,
                                       b'{"k":"v","n":[1,{"a":null}]}')
    check("session_begin", rc, {OK, INTERNAL})
    if rc != OK and lib.llama_instr_get_level() != 0:
        bad.append("a failed session_begin left the level on")
    check("get_level", lib.llama_instr_get_level(), {">=0"})
    if not named:
        llm.eval([1, 2, 3])
    check("set_request", lib.llama_instr_set_request(ctx, b"req-1"), {OK, NO_SESSION, INTERNAL})
    pats = (ctypes.c_char_p * 2)(b"l_out-*", b"result_norm")
    check("capture", lib.llama_instr_capture(ctx, pats, 2), {OK, NO_SESSION, INTERNAL})
    check("write_record", lib.llama_instr_write_record(b"mine", b'{"a":"b"}'),
          {OK, NO_SESSION, INTERNAL})
    llm.reset()
    llm.eval([1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41])  # raises if llama_decode fails
    llm.eval([7])
    n = lib.llama_instr_captured_count(ctx)
    check("captured_count", n, {">=0"})
    name = ctypes.create_string_buffer(64)
    ne = (ctypes.c_int64 * 4)()
    for i in range(n):
        k = lib.llama_instr_captured_get(ctx, i, name, 64, ne, None, 0)
        check("captured_get", k, {">=0", INVALID})
        if k > 0:
            buf = (ctypes.c_float * k)()
            check("captured_get", lib.llama_instr_captured_get(ctx, i, name, 64, ne, buf, k),
                  {">=0", INVALID})
    check("captured_get", lib.llama_instr_captured_get(ctx, 999, None, 0, None, None, 0), {INVALID})
    check("set_level", lib.llama_instr_set_level(0), {">=0", NO_SESSION, INTERNAL})
    llm.eval([8])
    check("set_level", lib.llama_instr_set_level(level), {">=0", NO_SESSION, INTERNAL})
    llm.eval([9])
    check("flush", lib.llama_instr_flush(), {OK, NO_SESSION, INTERNAL})
    check("session_path", lib.llama_instr_session_path(name, 64), {">=0", NO_SESSION, INTERNAL})
    t = bindings.Totals()
    check("session_totals", lib.llama_instr_session_totals(ctypes.byref(t)),
          {OK, NO_SESSION, INTERNAL})
    check("set_request", lib.llama_instr_set_request(ctx, None), {OK, NO_SESSION, INTERNAL})
    check("session_end", lib.llama_instr_session_end(b"ok"), {OK, NO_SESSION, INTERNAL})
    lib.llama_instr_last_error()
    lib.llama_instr_build_info()
    lib.llama_instr_api_version()
    llm.close()  # llama_instr_context_free

n_fail = n = 0
t0 = time.monotonic()
for named in (sys.argv[3] == "named",):  # at the verbose level: every hook and buffer
    level = 3
    n = 0
    while True:
        n += 1
        api.test_fail_alloc(n)
        scenario(level, named)
        failed = api.test_failed_allocs()
        api.test_fail_alloc(0)
        # nothing left behind: no session open, recording off, and a new session works
        if lib.llama_instr_get_level() != 0:
            bad.append(f"named={named}, n={n}: the level was left on")
        if lib.llama_instr_session_end(None) != NO_SESSION:
            bad.append(f"named={named}, n={n}: a session was left open")
        if lib.llama_instr_session_begin(None, log, 1, None) != OK:
            bad.append(f"named={named}, n={n}: the next session_begin failed: "
                       f"{lib.llama_instr_last_error()!r}")
        lib.llama_instr_session_end(None)
        n_fail += failed
        if not failed or bad or n > 20000:
            break
    print(json.dumps({"named": named, "n": n, "bad": bad[:20]}))
    if bad:
        break
print(json.dumps({"injected": n_fail, "seconds": time.monotonic() - t0}))
"""


def test_no_exception_crosses_the_c_api(
    instr_api: Any, testing_lib: Path, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(testing_lib))
    # a session named by its context, and one begun before any: each in a process of its own, side
    # by side (each makes hundreds of contexts, one per allocation failed)
    hows = ("named", "unnamed")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tiny_llama_f32), str(tmp_path / f"{how}.log"), how],
            stdout=(tmp_path / f"{how}.out").open("w"),
            stderr=(tmp_path / f"{how}.err").open("w"),
            env=env,
        )
        for how in hows
    ]
    per_level: list[dict[str, Any]] = []
    injected = 0
    for how, proc in zip(hows, procs, strict=True):
        rc = proc.wait(timeout=1800)
        err = (tmp_path / f"{how}.err").read_text(errors="replace")
        assert rc == 0, f"the process died ({rc}): {err[-3000:]}"
        out = (tmp_path / f"{how}.out").read_text()
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        per_level += rows[:-1]
        injected += rows[-1]["injected"]
    assert [row["named"] for row in per_level] == [True, False]
    for row in per_level:
        assert row["bad"] == [], row
        # every allocation site was reached: the last run went through without a failure, after
        # many that failed one
        assert row["n"] > 50, row
    assert injected > 100
