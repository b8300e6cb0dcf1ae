"""The native parsers of foreign bytes, fuzzed: each harness of tests/fuzz/ is built with
libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer against the patched tree (the pin
extracted and patched as `instr build` does) and runs for a bounded time.

- rpc_times_fuzz.cpp: the RPC client's parser of a server's op times (issue 35), the patched
  ggml-rpc.cpp included whole;
- request_text_fuzz.cpp: what an HTTP client's bytes become in llama-server's `request` record
  (issue 55 §3): the text of a prompt's tokens and the `traceparent` header.

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
# each harness's bounded run; libFuzzer makes tens of thousands of runs a second on these parsers,
# and what each test asserts (over 1,000 runs, the corpus grown) holds well within it
SECONDS = 20


@pytest.fixture(scope="module")
def vendor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llamacpp_instr.native import build, pin

    work = tmp_path_factory.mktemp("src")
    root = build.prepare_source(build.make_plan(), work, lambda m: print(m, file=sys.stderr))
    return root / pin.VENDOR_DIR


def fuzz(harness: str, includes: list[Path], libs: list[str], tmp_path: Path) -> None:
    """Build tests/fuzz/<harness>.cpp with the include folders, linked to the named libraries of
    the build the tests run on, and run it for SECONDS: no finding, and it explored."""
    from rpc_backend import lib_dir

    clang = shutil.which("clang++")
    if clang is None:
        if os.environ.get("CI"):
            pytest.fail("clang++ is missing: .ci/run installs Debian's clang for this test")
        pytest.skip("clang++ is not installed (apt-get install clang)")
    lib = lib_dir()
    exe = tmp_path / harness
    cmd = [
        clang,
        "-std=c++17",
        "-g",
        "-O1",
        "-fsanitize=fuzzer,address,undefined",
        "-fno-sanitize-recover=undefined",
        *[f"-I{d}" for d in includes],
        str(HERE / "fuzz" / f"{harness}.cpp"),
        *[str(lib / f"{n}.so") for n in libs],
        f"-Wl,-rpath,{lib}",
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


def test_the_rpc_times_parser_survives_a_fuzzer(vendor: Path, tmp_path: Path) -> None:
    ggml = vendor / "ggml"
    fuzz(
        "rpc_times_fuzz",
        [ggml / "include", ggml / "src", ggml / "src" / "ggml-rpc"],
        # the rest of ggml (tensors, backends) from the build the tests run on
        ["libggml-base", "libggml", "libggml-rpc"],
        tmp_path,
    )


def test_a_clients_bytes_always_make_a_record_the_log_accepts(vendor: Path, tmp_path: Path) -> None:
    """Token bytes through the request text path, and any `traceparent` value: what reaches the
    record is what the record's checker accepts (a refused record is a request lost), well-formed
    text passes unchanged, and a traceparent only as the W3C format allows. Before the fix the text
    path let overlong forms, surrogates and code points past U+10FFFF through (the fuzzer found
    one in its first seconds)."""
    fuzz(
        "request_text_fuzz",
        [vendor / "src", vendor / "include", vendor / "tools", vendor / "ggml" / "include"],
        # json_object_check, the checker of llama_instr_write_record, from the build's libllama
        ["libllama", "libggml-base", "libggml"],
        tmp_path,
    )
