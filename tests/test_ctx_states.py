"""A context's state in the registry is made only where something must be kept for it: a lookup
that only reads (a request's end, the outputs captured) finds the state, never makes one, so that a
context the program has freed gets no state again (it would hold a state under a dangling pointer
until another context took that address). In the testing build, which counts the states
(llama_instr_test_ctx_states)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.native

# A context that decoded, freed; then what the C API does with its pointer: each call's states
# after it, one JSON object.
CHILD = """
import json, sys
import llama_cpp
from llamacpp_instr.native import bindings
lib = bindings.load()
lib.session_begin(None, sys.argv[2], "minimal", {})
llm = llama_cpp.Llama(sys.argv[1], n_ctx=64, n_threads=1, verbose=False)
llm.eval(llm.tokenize(b"hello"))
freed = llm._ctx.ctx
out = {"decoded": lib.test_ctx_states()}
llm.close()
out["freed"] = lib.test_ctx_states()
lib.request_end(freed, 0)
out["request_end"] = lib.test_ctx_states()
lib.request_end(freed, -1)
out["request_end_whole"] = lib.test_ctx_states()
out["captured"] = lib.captured(freed)
out["captured_get"] = lib.test_ctx_states()
lib.set_request(freed, "r")  # keeps the tag for the context's next step: made
out["set_request"] = lib.test_ctx_states()
lib.session_end()
print(json.dumps(out))
"""


def test_lookups_that_only_read_make_no_state_for_a_freed_context(
    instr_api: Any, testing_lib: Path, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(tiny_llama_f32), str(tmp_path / "s.log")],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, LLAMA_CPP_LIB_PATH=str(testing_lib)),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    n = json.loads(r.stdout.strip().splitlines()[-1])
    # the context's state goes with it
    assert n["freed"] == n["decoded"] - 1, n
    # ending a request on it, and reading what it captured, make none
    for call in ("request_end", "request_end_whole", "captured_get"):
        assert n[call] == n["freed"], (call, n)
    assert n["captured"] == {}
    # a call that must keep something for the context makes one (the count sees a state made)
    assert n["set_request"] == n["freed"] + 1, n
