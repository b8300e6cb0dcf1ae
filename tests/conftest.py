"""Shared fixtures: the real patched build, real models, and real session logs made once per run.
Helpers shared by test modules live in the ``helpers`` package (pytest puts tests/ on the path,
as it does for every conftest outside a package).

Tests that need the native build use the ``instr_api`` fixture (directly or through the log
fixtures). They fail, not skip, when the patched llama-cpp-python is missing: CI installs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import environment
from helpers.support import RunLog, make_run

TESTS_DIR = Path(__file__).resolve().parent

# The fast tier, for the edit loop (`python -m pytest -m fast`): the tests marked fast where they
# live (a module's `pytestmark = pytest.mark.fast`, or a test's own `@pytest.mark.fast` in a module
# that also runs the build). They neither run the patched build nor start a browser: they read
# committed fixtures and logs written by hand. Everything else (marked native, vulkan, or
# unmarked) runs in the whole suite only. A fast test that asks for one of NATIVE_FIXTURES is
# refused at collection, and under `-m fast` the build cannot be loaded at all.
NATIVE_FIXTURES = frozenset(
    {"instr_api", "smollm2_path", "tiny_dir", "moe_dir", "tools_bin", "browser"}
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fast: the fast tier (no native build, no browser)")
    config.addinivalue_line("markers", "native: runs the patched build (kept out of the fast tier)")
    if config.option.markexpr == "fast":
        # a test filed in the fast tier by mistake fails at once instead of running the build
        os.environ["LLAMA_CPP_LIB_PATH"] = str(TESTS_DIR / "no-native-build-in-the-fast-tier")


# Modules whose tests wait for a build that `.ci/run` makes beside the tests come last, whole (a
# module split in two would set its module fixtures up twice): the Vulkan libraries' tests, then
# those of llama.cpp's programs (after the Vulkan build in `.ci/run`). The builds then run while the
# other modules do, instead of holding a test up. A module here builds the programs without asking
# for `tools_bin` (its RPC server is one of them).
TOOLS_MODULES = frozenset({"test_rpc_network"})


def _late_rank(item: pytest.Item) -> int:
    module = getattr(item, "module", None)
    if "tools_bin" in getattr(item, "fixturenames", ()) or (
        module is not None and module.__name__ in TOOLS_MODULES
    ):
        return 2
    return 1 if item.get_closest_marker("vulkan") else 0


def _put_late_modules_last(items: list[pytest.Item]) -> None:
    rank: dict[str, int] = {}
    for item in items:
        key = item.nodeid.split("::")[0]
        rank[key] = max(rank.get(key, 0), _late_rank(item))
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable: order kept within


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _put_late_modules_last(items)
    wrong = [
        item.nodeid
        for item in items
        if item.get_closest_marker("fast")
        and not NATIVE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
    ]
    if wrong:
        raise pytest.UsageError(
            "marked fast but runs the build (a fixture of NATIVE_FIXTURES): " + ", ".join(wrong)
        )


_REPORTED: set[str] = set()  # the distributions a module's check has failed on already


def _leaves_the_environment_as_it_found_it(what: str) -> Iterator[None]:
    before = environment.installed()
    yield
    changed = environment.changes(before, environment.installed())
    changed = [line for line in changed if line.split(":")[0] not in _REPORTED]
    if changed:
        _REPORTED.update(line.split(":")[0] for line in changed)
        pytest.fail(
            f"the packages installed where the suite runs changed while {what} ran (a test that "
            f"builds or installs does it in a throwaway environment): {'; '.join(changed)}",
            pytrace=False,
        )


@pytest.fixture(scope="session", autouse=True)
def _environment_kept_by_the_session() -> Iterator[None]:
    """The session fixtures leave the interpreter's installed packages as they were too."""
    yield from _leaves_the_environment_as_it_found_it("the session")


@pytest.fixture(scope="module", autouse=True)
def _environment_kept_by_each_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each module leaves the interpreter's installed packages (the patched llama-cpp-python,
    llamacpp-instr's editable install, the model's package) as it found them: a suite run from a
    branch must not replace the build everyone else on the machine runs."""
    yield from _leaves_the_environment_as_it_found_it(request.module.__name__)


@pytest.fixture(scope="session")
def instr_api() -> Any:
    from llamacpp_instr.native import bindings

    return bindings.load()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from llamacpp_instr.native import models

    return models.default_model()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny_models")


@pytest.fixture(scope="session")
def tiny_llama_f32(tiny_dir: Path) -> Path:
    from helpers.tiny_gguf import write_tiny_model

    return write_tiny_model(tiny_dir / "tiny-llama-f32.gguf", arch="llama", dtype="f32", seed=1)


@pytest.fixture(scope="session")
def big_vocab(tiny_dir: Path) -> Path:
    """A tiny llama with a vocabulary of 131072 tokens: sampling costs what it costs on a real
    model's vocabulary while its steps stay cheap."""
    from helpers.tiny_gguf import write_big_vocab_model

    return write_big_vocab_model(tiny_dir / "big-vocab.gguf")


@pytest.fixture(scope="session")
def tiny_llama_f16(tiny_dir: Path) -> Path:
    from helpers.tiny_gguf import write_tiny_model

    return write_tiny_model(tiny_dir / "tiny-llama-f16.gguf", arch="llama", dtype="f16", seed=2)


@pytest.fixture(scope="session")
def tiny_llama_q8(tiny_dir: Path, tiny_llama_f32: Path, instr_api: Any) -> Path:
    """A quantized tiny model, made with the pinned llama.cpp's own quantizer."""
    import llama_cpp

    out = tiny_dir / "tiny-llama-q8_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    rc = llama_cpp.llama_model_quantize(
        str(tiny_llama_f32).encode(), str(out).encode(), llama_cpp.byref(params)
    )
    assert rc == 0
    return out


@pytest.fixture(scope="session")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("moe_models")


@pytest.fixture(scope="session")
def moe_small(moe_dir: Path, smollm2_path: Path) -> Path:
    """SmolLM2's first 4 layers as a MoE of 8 distinct experts, top-2, routed unevenly."""
    from helpers.moe_gguf import write_moe_model

    return write_moe_model(smollm2_path, moe_dir / "moe-small.gguf", n_layer=4, distinct=True)


@pytest.fixture(scope="session")
def moe_identical(moe_dir: Path, smollm2_path: Path) -> Path:
    """SmolLM2 whole, each layer's FFN as 8 identical experts: computes the dense model."""
    from helpers.moe_gguf import write_moe_model

    return write_moe_model(smollm2_path, moe_dir / "moe-identical.gguf")


@pytest.fixture(scope="session")
def moe_distinct(moe_dir: Path, smollm2_path: Path) -> Path:
    """SmolLM2 whole, expert e of layer l the FFN of layer (l + e) mod 30, routed unevenly."""
    from helpers.moe_gguf import write_moe_model

    return write_moe_model(smollm2_path, moe_dir / "moe-distinct.gguf", distinct=True)


@pytest.fixture(scope="session")
def smollm2_draft6(moe_dir: Path, smollm2_path: Path) -> Path:
    """SmolLM2's first 6 of its 30 layers: a draft for speculative decoding (its vocabulary)."""
    from helpers.draft_gguf import write_draft_model

    return write_draft_model(smollm2_path, moe_dir / "smollm2-draft6.gguf", 6)


@pytest.fixture(scope="session")
def tiny_second_arch(tiny_dir: Path) -> Path:
    from helpers.tiny_gguf import SECOND_ARCH, write_tiny_model

    return write_tiny_model(
        tiny_dir / f"tiny-{SECOND_ARCH}.gguf", arch=SECOND_ARCH, dtype="f32", seed=3
    )


@pytest.fixture(scope="session")
def smollm2_detailed(
    instr_api: Any, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> RunLog:
    """SmolLM2 with attention as separate KQ, soft_max and KQV ops (--no-flash-attn), which the
    tests of those ops (their graph tables, KV cache flows) read; test_defaults runs the
    defaults."""
    out = tmp_path_factory.mktemp("logs") / "smollm2-detailed.log"
    return RunLog(make_run(smollm2_path, out, "detailed", n_predict=16, flash_attn=False))


@pytest.fixture(scope="session")
def smollm2_verbose(
    instr_api: Any, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> RunLog:
    out = tmp_path_factory.mktemp("logs") / "smollm2-verbose.log"
    return RunLog(make_run(smollm2_path, out, "verbose", n_predict=8, value_stats=True))


@pytest.fixture(scope="session")
def tiny_detailed(
    instr_api: Any, tiny_llama_f32: Path, tmp_path_factory: pytest.TempPathFactory
) -> RunLog:
    out = tmp_path_factory.mktemp("logs") / "tiny-detailed.log"
    return RunLog(make_run(tiny_llama_f32, out, "detailed", n_predict=6))


class _Validator:
    """Records checked against the JSON Schema of their log's version: the current one, and the
    versions before it for the session_start of an older log (the fixtures'); a record of an
    older version is a record of the current one otherwise (each version only adds)."""

    def __init__(self) -> None:
        import jsonschema

        from llamacpp_instr.contract.schema import SCHEMA_VERSIONS

        self.by_version = {}
        for v in SCHEMA_VERSIONS:
            path = TESTS_DIR.parent / "llamacpp_instr" / "contract" / f"schema_v{v}.json"
            schema = json.loads(path.read_text())
            jsonschema.Draft202012Validator.check_schema(schema)
            self.by_version[v] = jsonschema.Draft202012Validator(schema)
        self.current = self.by_version[max(self.by_version)]

    def validate(self, rec: Any) -> None:
        version = rec.get("schema_version") if rec.get("type") == "session_start" else None
        self.by_version.get(version, self.current).validate(rec)


@pytest.fixture(scope="session")
def schema_validator() -> Iterator[Any]:
    yield _Validator()


# headless Debian Chromium for the browser tests (test_reports_browser, test_roofline_browser)
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).is_file():
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        yield b
        b.close()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, mounted for the test (as root), else the test is skipped."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {(r.stderr or r.stdout).strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture(scope="session")
def tools_bin() -> Path:
    """The patched llama.cpp programs of the current patches (`instr build --tools`, cached)."""
    from llamacpp_instr.native import tools

    return tools.build_tools(lambda msg: print(msg, file=sys.stderr, flush=True))


@pytest.fixture(scope="session")
def testing_lib() -> Path:
    """The testing build's libraries (`instr build --testing`: its test-only entry points), built
    once and cached; run them through LLAMA_CPP_LIB_PATH. LLAMA_INSTR_TESTING_LIB names another
    folder of them instead: a devtree's incremental build with -DLLAMA_INSTR_TESTING=ON
    (patches/devtree.py), while the native code is being changed. A suite run on libraries that
    carry them already (LLAMA_CPP_LIB_PATH at a sanitized build's, `.ci/sanitize`) runs on those."""
    from llamacpp_instr.native import bindings, build

    if os.environ.get("LLAMA_INSTR_TESTING_LIB"):
        return Path(os.environ["LLAMA_INSTR_TESTING_LIB"])
    lib = os.environ.get("LLAMA_CPP_LIB_PATH")
    if lib and hasattr(bindings.load().lib, "llama_instr_test_fail_alloc"):
        return Path(lib)
    return build.testing_lib_dir(lambda m: print(m, file=sys.stderr))


@pytest.fixture(scope="session")
def vendor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pin's llama.cpp tree extracted and patched as `instr build` does, once a session (the
    native units and the fuzz harnesses build against it)."""
    from llamacpp_instr.native import build, pin

    work = tmp_path_factory.mktemp("src")
    root = build.prepare_source(build.make_plan(), work, lambda m: print(m, file=sys.stderr))
    return root / pin.VENDOR_DIR


@pytest.fixture(scope="session")
def moe_small_detailed(
    moe_small: Path, instr_api: Any, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A DETAILED run of the small MoE (4 tokens of the default prompt), shared by the modules
    that read its routing (test_moe_traffic makes its own, of another prompt)."""
    out = tmp_path_factory.mktemp("moe_small") / "small.log"
    make_run(moe_small, out, "detailed", n_predict=4)
    return out


# Images and sounds (tools/mtmd): projectors tests/helpers/mmproj_gguf.py writes for the bundled
# SmolLM2, and mtmd's own test media, shared by tests/test_mm_build.py and test_media_run.py.

MM_MEDIA = ("test-1.jpeg", "test-2.mp3")


@pytest.fixture(scope="session")
def mm_lib() -> Path:
    """The native libraries of the wheel `instr build` installs for the current patches (built
    once and cached), extracted: libmtmd among them."""
    from llamacpp_instr.native import build

    return build.installable_lib_dir(lambda m: print(m, file=sys.stderr))


@pytest.fixture(scope="session")
def mm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of the multimodal tests' projectors, models and media."""
    return tmp_path_factory.mktemp("mm")


@pytest.fixture(scope="session")
def projectors(mm_dir: Path) -> dict[str, Path]:
    """Each projector type of the writer at its defaults (576 wide), and one 512 wide."""
    from helpers.mmproj_gguf import (
        AUDIO_PROJECTORS,
        VISION_PROJECTORS,
        write_audio_mmproj,
        write_vision_mmproj,
    )

    out = {p: write_vision_mmproj(mm_dir / f"{p}.gguf", projector=p) for p in VISION_PROJECTORS}
    out |= {p: write_audio_mmproj(mm_dir / f"{p}.gguf", projector=p) for p in AUDIO_PROJECTORS}
    out["idefics3-512"] = write_vision_mmproj(mm_dir / "idefics3-512.gguf", n_embd_text=512)
    return out


@pytest.fixture(scope="session")
def vlm_text(mm_dir: Path, smollm2_path: Path) -> Path:
    """SmolLM2 with SmolVLM's image tokens, which mtmd wraps an idefics3 image in."""
    from helpers.mmproj_gguf import write_vlm_text_model

    return write_vlm_text_model(smollm2_path, mm_dir / "smollm2-vlm.gguf")


@pytest.fixture(scope="session")
def media(mm_dir: Path) -> dict[str, Path]:
    """tools/mtmd's test image and audio file, read from the pinned sdist."""
    from llamacpp_instr.native import build, pin

    folder = f"llama_cpp_python-{pin.LLAMA_CPP_PYTHON_VERSION}/{pin.VENDOR_DIR}/tools/mtmd/"
    out = {}
    with tarfile.open(build.fetch_sdist(lambda m: None)) as tf:
        for name in MM_MEDIA:
            member = tf.extractfile(folder + name)
            assert member is not None
            out[name] = mm_dir / name
            out[name].write_bytes(member.read())
    return out
