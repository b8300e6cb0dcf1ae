"""The native parsers of foreign bytes, fuzzed: each harness of tests/fuzz/ is built with
libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer against the patched tree (the pin
extracted and patched as `instr build` does) and runs for a bounded time.

- rpc_times_fuzz.cpp: the RPC client's parser of a server's op times, the overlay's
  ggml-rpc/instr.cpp included whole;
- request_text_fuzz.cpp: what an HTTP client's bytes become in llama-server's `request` record:
  the text of a prompt's tokens and the `traceparent` header;
- request_body_fuzz.cpp: what a client's body becomes in that record for a replay: the body's
  recorded form, and an image in it as its marker.

Needs clang (Debian's `clang`, which .ci/run installs)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.native

HERE = Path(__file__).resolve().parent
# each harness's bounded run; libFuzzer makes tens of thousands of runs a second on these parsers,
# and what each test asserts (over 1,000 runs, the corpus grown) holds well within it
SECONDS = 10


HARNESSES: dict[str, tuple[list[str], list[str]]] = {
    # harness: (its include folders under the patched tree, the libraries of the build the tests
    # run on that it links)
    "rpc_times_fuzz": (
        ["ggml/include", "ggml/src", "ggml/src/ggml-rpc"],
        # the rest of ggml (tensors, backends)
        ["libggml-base", "libggml", "libggml-rpc"],
    ),
    "request_text_fuzz": (
        ["src", "include", "tools", "ggml/include"],
        # json_object_check, the checker of llama_instr_write_record, from the build's libllama
        ["libllama", "libggml-base", "libggml"],
    ),
    "request_body_fuzz": (
        # nlohmann's JSON from the pin's vendor/, as llama-server has it
        ["src", "include", "tools", "ggml/include", "vendor"],
        # json_object_check and llama_instr_hash_bytes, from the build's libllama
        ["libllama", "libggml-base", "libggml"],
    ),
}


@pytest.fixture(scope="module")
def fuzzed(
    vendor: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[int, str, Path]]:
    """Every harness built with clang and run for SECONDS, the harnesses side by side (one core
    each: the builds and the bounded runs take half the time they took one after the other):
    each one's exit code, its libFuzzer output and its corpus folder."""
    from helpers.rpc_backend import lib_dir

    clang = shutil.which("clang++")
    if clang is None:
        if os.environ.get("CI"):
            pytest.fail("clang++ is missing: .ci/run installs Debian's clang for this test")
        pytest.skip("clang++ is not installed (apt-get install clang)")
    lib = lib_dir()
    work = tmp_path_factory.mktemp("fuzz")
    builds = {}
    for harness, (includes, libs) in HARNESSES.items():
        cmd = [
            clang,
            "-std=c++17",
            "-g",
            "-O1",
            "-fsanitize=fuzzer,address,undefined",
            "-fno-sanitize-recover=undefined",
            *[f"-I{vendor / d}" for d in includes],
            str(HERE / "fuzz" / f"{harness}.cpp"),
            *[str(lib / f"{n}.so") for n in libs],
            f"-Wl,-rpath,{lib}",
            "-o",
            str(work / harness),
        ]
        builds[harness] = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    runs = {}
    for proc in builds.values():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    for harness in HARNESSES:
        (work / f"{harness}.corpus").mkdir()
        runs[harness] = subprocess.Popen(
            [
                str(work / harness),
                f"-max_total_time={SECONDS}",
                "-rss_limit_mb=2048",
                "-timeout=10",
                str(work / f"{harness}.corpus"),
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            cwd=work,
        )
    out = {}
    for harness, proc in runs.items():
        _, err = proc.communicate(timeout=SECONDS * 5)
        out[harness] = (proc.returncode, err, work / f"{harness}.corpus")
    return out


def check(run: tuple[int, str, Path]) -> None:
    """No finding, and it explored: over 1,000 runs, and inputs that reached new code kept."""
    rc, err, corpus = run
    assert rc == 0, err[-5000:]
    done = re.search(r"Done (\d+) runs in", err)
    assert done and int(done.group(1)) > 1000, err[-2000:]
    assert len(list(corpus.iterdir())) > 10


def test_the_rpc_times_parser_survives_a_fuzzer(fuzzed: dict[str, tuple[int, str, Path]]) -> None:
    check(fuzzed["rpc_times_fuzz"])


def test_a_clients_bytes_always_make_a_record_the_log_accepts(
    fuzzed: dict[str, tuple[int, str, Path]],
) -> None:
    """Token bytes through the request text path, and any `traceparent` value: what reaches the
    record is what the record's checker accepts (a refused record is a request lost), well-formed
    text passes unchanged, and a traceparent only as the W3C format allows. Before the fix the text
    path let overlong forms, surrogates and code points past U+10FFFF through (the fuzzer found
    one in its first seconds)."""
    check(fuzzed["request_text_fuzz"])


def test_a_clients_body_is_recorded_as_json_the_log_accepts_and_its_images_as_markers(
    fuzzed: dict[str, tuple[int, str, Path]],
) -> None:
    """Any bytes as a request's body: its recorded form is one JSON object the record's checker
    accepts, at most 1 MiB, or nothing with a reason; any bytes as an image in a chat body: the
    image is its marker (size and the hash computed from the bytes) and none of its base64 is
    kept."""
    check(fuzzed["request_body_fuzz"])
