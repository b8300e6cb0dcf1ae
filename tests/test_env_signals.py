"""A session LLAMA_INSTR_LOG opened in a Python process ends as "interrupted" when SIGTERM, whose
default action the wrapper keeps, ends the process: the watcher ends the session, then the process
dies of the signal. The handlers are wrapped before the watcher thread starts, and by the watcher
only after that (see docs/internals.md, "Sanitizers")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import read_log

pytestmark = pytest.mark.native


def test_sigterm_ends_the_environments_session_as_interrupted(
    tiny_llama_f32: Path, tmp_path: Path
) -> None:
    signo = signal.SIGTERM
    script = (
        "import os, llama_cpp; "
        f"llm = llama_cpp.Llama({str(tiny_llama_f32)!r}, n_ctx=64, n_threads=1, verbose=False); "
        f"llm.eval([1, 5, 6]); print('ok', flush=True); os.kill(os.getpid(), {int(signo)})"
    )
    log = tmp_path / "sig.log"
    r = subprocess.run(
        [sys.executable, "-c", script],
        env=dict(os.environ, LLAMA_INSTR_LOG=str(log)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "ok" in r.stdout, r.stderr[-2000:]
    assert r.returncode == -signal.SIGTERM, r.stderr[-2000:]
    recs = read_log(log)
    assert [x["type"] for x in recs].count("step_end") == 1
    assert recs[-1]["type"] == "session_end" and recs[-1]["status"] == "interrupted"
