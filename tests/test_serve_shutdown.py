"""`instr serve` at shutdown frees the model only once no worker thread is using it (issue 21,
bug 7): a generation the server cannot cancel goes on, and the process exits cleanly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.native

# Run in a child process: freeing the model under the generating thread crashes the process.
CHILD = r"""
import sys, threading, time
import llama_cpp
from llamacpp_instr.native import bindings
from llamacpp_instr.running import serve

llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=512, n_threads=1, verbose=False)
use = serve.instrument(llm, bindings.load())
done = {}

def worker():
    out = llm.create_completion("Once upon a time", max_tokens=96, temperature=0)
    done["tokens"] = out["usage"]["completion_tokens"]

t = threading.Thread(target=worker)
t.start()
while "tokens" not in done and not llm.n_tokens:  # until the worker decoded something
    time.sleep(0.001)
t0 = time.monotonic()
closed_busy = serve.close_when_idle(llm, use, timeout=0.05)
waited = time.monotonic() - t0
busy_at_timeout = t.is_alive()
t.join()
closed_idle = serve.close_when_idle(llm, use, timeout=5)
print(closed_busy, busy_at_timeout, done.get("tokens"), closed_idle, f"{waited:.3f}")
"""


def test_shutdown_waits_for_the_generating_worker(instr_api: Any, smollm2_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(smollm2_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    closed_busy, busy_at_timeout, tokens, closed_idle, waited = r.stdout.split()
    # the worker was still generating when the timeout ran out: the model was left alone ...
    assert busy_at_timeout == "True", "the generation ended too soon to test anything"
    assert closed_busy == "False"
    assert float(waited) >= 0.05
    assert "exiting without freeing it" in r.stderr
    # ... so the generation completed, and the model was freed once it was idle
    assert int(tokens) > 0
    assert closed_idle == "True"
