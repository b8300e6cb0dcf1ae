"""`instr build`: patch checks, cache keys, and the cached wheel being reused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from converters.errors import UserError
from llamacpp_instr import build, pin
from llamacpp_instr.cli import main
from llamacpp_instr.paths import PATCHES_DIR


def test_check_passes_on_the_repo_patches() -> None:
    r = CliRunner().invoke(main, ["build", "--check"])
    assert r.exit_code == 0, r.output
    assert "applies cleanly" in r.output and f"llama.cpp {pin.LLAMA_CPP_COMMIT}" in r.output


def _copy_patches(tmp_path: Path) -> Path:
    dest = tmp_path / "patches"
    shutil.copytree(PATCHES_DIR, dest)
    return dest


def test_check_names_the_patch_that_fails(tmp_path: Path) -> None:
    patches = _copy_patches(tmp_path)
    second = sorted(patches.glob("0002-*.patch"))[0]
    text = second.read_text()
    # change a context line of the first hunk so it no longer matches the pinned source
    lines = text.splitlines(keepends=True)
    i = next(k for k, ln in enumerate(lines) if ln.startswith("@@"))
    j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith(" ") and lines[k].strip())
    lines[j] = " this line is not in llama.cpp\n"
    second.write_text("".join(lines))
    with pytest.raises(UserError, match=second.name):
        build.check(lambda _: None, patches_dir=patches)


def test_missing_patch_in_series(tmp_path: Path) -> None:
    patches = _copy_patches(tmp_path)
    (patches / "series").write_text("0009-does-not-exist.patch\n")
    with pytest.raises(UserError, match="missing: 0009-does-not-exist.patch"):
        build.read_series(patches)


def test_cache_key_follows_patches_and_options(tmp_path: Path) -> None:
    series = build.read_series()
    base = build.patch_hash(series)
    assert build.patch_hash(series) == base  # deterministic
    assert build.patch_hash(series, ["-DGGML_NATIVE=OFF"]) != base
    patches = _copy_patches(tmp_path)
    first = sorted(patches.glob("0001-*.patch"))[0]
    first.write_text(first.read_text() + "\n")
    assert build.patch_hash(build.read_series(patches)) != base
    assert build.make_plan(stock=True).local_version.startswith(
        pin.LLAMA_CPP_PYTHON_VERSION + "+stock."
    )


def test_second_build_reuses_the_cached_wheel() -> None:
    r = CliRunner().invoke(main, ["build", "--no-model"])
    assert r.exit_code == 0, r.output
    assert "using cached wheel" in r.output
    assert build.installed_llama_cpp_version() == build.make_plan().local_version
