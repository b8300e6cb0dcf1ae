"""The RPC client's parser of a server's op times, fuzzed (issue 35): tests/fuzz/rpc_times_fuzz.cpp
is built with libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer against the patched
ggml-rpc.cpp (the pin extracted and patched as `instr build` does) and runs for a bounded time.
Needs clang (Debian's `clang`, which .ci/run installs)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SECONDS = 60


def test_the_rpc_times_parser_survives_a_fuzzer(tmp_path: Path) -> None:
    from rpc_backend import lib_dir

    from llamacpp_instr import build, pin

    clang = shutil.which("clang++")
    if clang is None:
        if os.environ.get("CI"):
            pytest.fail("clang++ is missing: .ci/run installs Debian's clang for this test")
        pytest.skip("clang++ is not installed (apt-get install clang)")
    plan = build.make_plan()
    root = build.prepare_source(plan, tmp_path / "src", lambda m: print(m, file=sys.stderr))
    vendor = root / pin.VENDOR_DIR
    libs = lib_dir()
    exe = tmp_path / "rpc_times_fuzz"
    cmd = [
        clang,
        "-std=c++17",
        "-g",
        "-O1",
        "-fsanitize=fuzzer,address,undefined",
        "-fno-sanitize-recover=undefined",
        f"-I{vendor / 'ggml' / 'include'}",
        f"-I{vendor / 'ggml' / 'src'}",
        f"-I{vendor / 'ggml' / 'src' / 'ggml-rpc'}",
        str(HERE / "fuzz" / "rpc_times_fuzz.cpp"),
        # the rest of ggml (tensors, backends) from the build the tests run on
        *[str(libs / f"{n}.so") for n in ("libggml-base", "libggml", "libggml-rpc")],
        f"-Wl,-rpath,{libs}",
        "-o",
        str(exe),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    r = subprocess.run(
        [str(exe), f"-max_total_time={SECONDS}", "-rss_limit_mb=2048", "-timeout=10", str(corpus)],
        capture_output=True,
        text=True,
        timeout=SECONDS * 5,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-5000:]
    done = re.search(r"Done (\d+) runs in", r.stderr)
    assert done and int(done.group(1)) > 1000, r.stderr[-2000:]
    # it explored: inputs that reached new code were kept
    assert len(list(corpus.iterdir())) > 10
