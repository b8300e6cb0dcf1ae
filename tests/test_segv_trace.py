"""bench/segv_trace.c, the crash tracer every run of bench/gpu_check.sh preloads (the GPU machine has
no gdb): a process that dies of SIGSEGV or SIGABRT prints the faulting thread's native frames,
each library and symbol named, after Python's own frames (``python -X faulthandler``), and still
dies of its signal. Deliberate faults here: a store to an unmapped page and abort(), in a small
library of named functions called through ctypes, on the main thread and on another."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent

FAULTS = """
#include <stdlib.h>
void instr_fault_here(void) { *(volatile int *) 8 = 1; }
void instr_abort_here(void) { abort(); }
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("segv")
    tracer, faults = d / "segv_trace.so", d / "libfaults.so"
    (d / "faults.c").write_text(FAULTS)
    for src, out in ((ROOT / "bench" / "segv_trace.c", tracer), (d / "faults.c", faults)):
        subprocess.run([cc, "-shared", "-fPIC", "-O1", str(src), "-o", str(out)], check=True)
    return tracer, faults


def crash(tracer: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code],
        env={"LD_PRELOAD": str(tracer), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("function", "sig"),
    [("instr_fault_here", signal.SIGSEGV), ("instr_abort_here", signal.SIGABRT)],
)
@pytest.mark.parametrize("thread", [False, True])
def test_a_fault_prints_the_faulting_thread_s_native_frames(
    built: tuple[Path, Path], function: str, sig: signal.Signals, thread: bool
) -> None:
    tracer, faults = built
    call = f"ctypes.CDLL({str(faults)!r}).{function}"
    code = (
        f"import ctypes, threading; t = threading.Thread(target={call}); t.start(); t.join()"
        if thread
        else f"import ctypes\n{call}()"
    )
    r = crash(tracer, code)
    assert r.returncode == -sig, (r.returncode, r.stderr[-2000:])
    err = r.stderr
    # Python's frames first (faulthandler), then the native ones of the thread that faulted
    assert "Fatal Python error" in err and err.index("Fatal Python error") < err.index("### native")
    assert f"### native crash: signal {int(sig)}, thread " in err
    frames = [ln for ln in err.splitlines() if ln.startswith("###   #")]
    ours = [ln for ln in frames if "libfaults.so+0x" in ln and f"({function}+0x" in ln]
    assert len(ours) == 1, frames
    below = frames[frames.index(ours[0]) + 1 :]
    assert any("ffi_call" in ln for ln in below), frames  # the call that led there
    if sig == signal.SIGABRT:
        above = frames[: frames.index(ours[0])]
        assert any("(abort+0x" in ln for ln in above), frames
    if thread:
        assert "threading.py" in err and "<string>" in err  # both threads' Python frames


def test_the_gpu_check_s_deliberate_fault_is_traced(built: tuple[Path, Path]) -> None:
    """`gpu_check.py crash`, the fault the GPU script injects to check the tracer on the machine
    it runs on: SIGSEGV in libc, its frames and the Python function that called it."""
    tracer, _ = built
    r = subprocess.run(
        [sys.executable, "-X", "faulthandler", str(ROOT / "bench" / "gpu_check.py"), "crash"],
        env={"LD_PRELOAD": str(tracer), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == -signal.SIGSEGV, r.stderr[-2000:]
    assert "in cmd_crash" in r.stderr and "### native crash: signal 11" in r.stderr
    assert any("libc.so" in ln for ln in r.stderr.splitlines() if ln.startswith("###   #"))
