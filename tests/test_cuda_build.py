"""`instr build --cuda`'s parts that run without a GPU or a toolkit: which CUDA sources the patches
touch (what `--check --cuda` compiles), what makes a toolkit complete, the CMake arguments a
toolkit gives, and which backends a build's library folder holds (`instr doctor`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llamacpp_instr.cli import main
from llamacpp_instr.native import backends, build, cuda_check, cuda_toolkit

pytestmark = pytest.mark.fast


def test_the_check_compiles_the_cuda_sources_the_patches_touch() -> None:
    touched = cuda_check.touched_cuda_sources(build.read_series())
    # read here from the patch files' own headers: every ggml-cuda .cu a diff names
    want = sorted(
        {
            line.split(" b/", 1)[1].strip()
            for p in build.read_series()
            for line in p.read_text(errors="replace").splitlines()
            if line.startswith("+++ b/ggml/src/ggml-cuda/") and line.endswith(".cu")
        }
    )
    assert sorted(touched) == want
    assert "ggml/src/ggml-cuda/ggml-cuda.cu" in touched and "ggml/src/ggml-cuda/instr.cu" in touched
    assert cuda_check.object_target("ggml/src/ggml-cuda/instr.cu") == (
        "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/instr.cu.o"
    )


def _toolkit(root: Path, cublas: bool = True, driver: bool = False) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (root / "include").mkdir()
    (root / "include" / "cuda_runtime.h").write_text("")
    (root / "lib").mkdir()
    (root / "lib" / "libcudart.so.13").write_text("")
    if cublas:
        (root / "include" / "cublas_v2.h").write_text("")
        (root / "lib" / "libcublas.so.13").write_text("")
        (root / "lib" / "libcublasLt.so.13").write_text("")
    if driver:
        (root / "lib" / "stubs").mkdir()
        (root / "lib" / "stubs" / "libcuda.so").write_text("")
    return root


def test_a_toolkit_without_cublas_is_not_complete(tmp_path: Path) -> None:
    assert cuda_toolkit.missing_parts(tmp_path / "none") == [
        "nvcc",
        "the runtime's headers",
        "cuBLAS",
        "the runtime library",
    ]
    assert cuda_toolkit.missing_parts(_toolkit(tmp_path / "a", cublas=False)) == ["cuBLAS"]
    assert cuda_toolkit.missing_parts(_toolkit(tmp_path / "b")) == []


def test_a_complete_system_toolkit_is_used_and_says_its_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _toolkit(tmp_path / "cuda", driver=True)
    monkeypatch.setenv("CUDA_HOME", str(root))
    tk = cuda_toolkit.system_toolkit()
    assert tk is not None and tk.root == root and tk.source == "system" and tk.has_driver
    assert tk.cmake_args("90") == (
        "-DGGML_CUDA=ON",
        f"-DCUDAToolkit_ROOT={root}",
        f"-DCMAKE_CUDA_COMPILER={root / 'bin' / 'nvcc'}",
        "-DCMAKE_CUDA_ARCHITECTURES=90",
    )
    # no driver library to link (PyPI's toolkit): ggml's virtual-memory pool is left out
    bare = cuda_toolkit.Toolkit(root=root, source="pypi", has_driver=False)
    assert bare.cmake_args(None)[-1] == "-DGGML_CUDA_NO_VMM=ON"
    plan = build.make_plan(tk.cmake_args("90"))
    assert plan.cuda and "cu." in plan.local_version


def test_the_linker_finds_the_versioned_libraries(tmp_path: Path) -> None:
    lib = _toolkit(tmp_path / "t") / "lib"
    cuda_toolkit.link_versioned_libs(lib)
    for name in cuda_toolkit.LINKED_LIBS:
        assert (lib / f"{name}.so").is_symlink()
        assert (lib / f"{name}.so").resolve() == (lib / f"{name}.so.13").resolve()


def test_the_runtime_packages_are_pinned_with_the_toolkit() -> None:
    assert set(cuda_toolkit.RUNTIME_PACKAGES) <= set(cuda_toolkit.PYPI_PACKAGES)
    assert [p.split("==")[0] for p in cuda_toolkit.RUNTIME_PACKAGES] == [
        "nvidia-cuda-runtime",
        "nvidia-cublas",
    ]


def test_backends_are_the_libraries_beside_libllama(tmp_path: Path) -> None:
    for name in ("libggml-base.so.0", "libggml-cuda.so.0.25.3", "libggml-cpu.so", "libggml-rpc.so"):
        (tmp_path / name).write_text("")
    (tmp_path / "libllama.so").write_text("")
    assert backends.in_folder(tmp_path) == ["CPU", "CUDA", "RPC"]
    assert backends.in_folder(tmp_path / "missing") == []


def test_cuda_arch_without_cuda_is_a_usage_error() -> None:
    r = CliRunner().invoke(main, ["build", "--cuda-arch", "90"])
    assert r.exit_code == 2 and "--cuda-arch goes with --cuda" in r.output


def test_build_cuda_builds_the_wheel_with_the_toolkit_s_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`instr build --cuda --cuda-arch 90` hands the wheel build the toolkit's CMake arguments
    (the build itself, about 70 CPU-minutes, is not run here)."""
    tk = cuda_toolkit.Toolkit(root=_toolkit(tmp_path / "cu"), source="pypi", has_driver=False)
    monkeypatch.setattr(cuda_toolkit, "toolkit", lambda echo: tk)
    seen: dict[str, object] = {}

    def fake_build(cmake_args: tuple[str, ...], echo: object, **kw: object) -> Path:
        seen["args"], seen["kw"] = cmake_args, kw
        return tmp_path / "w.whl"

    monkeypatch.setattr(build, "build", fake_build)
    r = CliRunner().invoke(main, ["build", "--cuda", "--cuda-arch", "90", "--no-model"])
    assert r.exit_code == 0, r.output
    assert seen["args"] == tk.cmake_args("90")
    assert seen["kw"] == {"rebuild": False, "with_model": False, "vulkan": False}
