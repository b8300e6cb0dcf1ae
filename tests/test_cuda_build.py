"""`instr build --cuda`'s parts that run without a GPU or a toolkit: which CUDA sources the patches
touch (what `--check --cuda` compiles), what makes a toolkit complete, the CMake arguments a
toolkit gives (the driver library ggml's virtual-memory pool links, ggml's flash-attention kernels
left on), the arguments bench/gpu_check.sh takes from them, that `--no-install` installs nothing,
and which backends a build's library folder holds (`instr doctor`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llamacpp_instr.cli import main
from llamacpp_instr.native import backends, build, cuda_check, cuda_toolkit, libraries, wheel
from llamacpp_instr.native.paths import PATCHES_DIR

pytestmark = pytest.mark.fast


def test_the_check_compiles_the_cuda_sources_the_patches_and_the_overlay_touch() -> None:
    touched = cuda_check.touched_cuda_sources(build.read_series(), build.read_overlay())
    # read here from the patch files' own headers (every ggml-cuda .cu a diff names) and from the
    # overlay's folder of ggml-cuda
    want = sorted(
        {
            line.split(" b/", 1)[1].strip()
            for p in build.read_series()
            for line in p.read_text(errors="replace").splitlines()
            if line.startswith("+++ b/ggml/src/ggml-cuda/") and line.endswith(".cu")
        }
        | {
            "ggml/src/ggml-cuda/" + p.name
            for p in (PATCHES_DIR / "overlay" / "ggml" / "src" / "ggml-cuda").glob("*.cu")
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
    # the toolkit's own stub, which CMake finds: ggml's virtual-memory pool links it
    assert tk.driver == root / "lib" / "stubs" / "libcuda.so"
    assert tk.cmake_args("90") == (
        "-DGGML_CUDA=ON",
        f"-DCUDAToolkit_ROOT={root}",
        f"-DCMAKE_CUDA_COMPILER={root / 'bin' / 'nvcc'}",
        "-DCMAKE_CUDA_ARCHITECTURES=90",
    )
    # no driver library to link (PyPI's toolkit on a machine without a GPU): the pool is left out
    bare = cuda_toolkit.Toolkit(root=root, source="pypi", driver=None)
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
    (the build itself, 38 CPU-minutes here, is not run in the tests)."""
    tk = cuda_toolkit.Toolkit(root=_toolkit(tmp_path / "cu"), source="pypi", driver=None)
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


def test_the_machine_s_driver_is_linked_where_the_toolkit_has_no_stub(tmp_path: Path) -> None:
    """PyPI's toolkit on a GPU machine: the driver's own library (a container that mounts it in
    /usr/local/nvidia/lib64 has only libcuda.so.1) is named to CMake, which looks for it only in
    the toolkit; ggml's virtual-memory pool is built, as a user's own build there builds it."""
    root = _toolkit(tmp_path / "cu")
    drivers = tmp_path / "nvidia" / "lib64"
    drivers.mkdir(parents=True)
    nothing: list[Path] = []
    assert cuda_toolkit.driver_library(root, [str(drivers)], lambda: nothing) is None
    (drivers / "libcuda.so.1").write_text("")
    found = cuda_toolkit.driver_library(
        root, [str(tmp_path / "none"), str(drivers)], lambda: nothing
    )
    assert found == drivers / "libcuda.so.1"
    args = cuda_toolkit.Toolkit(root=root, source="pypi", driver=found).cmake_args("90")
    assert f"-DCUDA_cuda_driver_LIBRARY={found}" in args
    assert not any("NO_VMM" in a for a in args)
    # the unversioned name first, where the driver has it too
    (drivers / "libcuda.so").write_text("")
    assert (
        cuda_toolkit.driver_library(root, [str(drivers)], lambda: nothing) == drivers / "libcuda.so"
    )
    # none in the usual folders: the loader's cache
    cached = tmp_path / "elsewhere" / "libcuda.so.1"
    cached.parent.mkdir()
    cached.write_text("")
    assert cuda_toolkit.driver_library(root, [str(tmp_path / "none")], lambda: [cached]) == cached
    # the toolkit's stub before any of them
    stub = _toolkit(tmp_path / "full", driver=True)
    assert cuda_toolkit.driver_library(stub, [str(drivers)], lambda: [cached]) == (
        stub / "lib" / "stubs" / "libcuda.so"
    )


def test_no_argument_turns_ggml_s_flash_attention_kernels_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flash-attention kernels are ggml's default (GGML_CUDA_FA, the pin's own default: read in
    tests/test_native_units.py): no argument of the wheel's, the check's or the GPU script's build
    names them."""
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    for driver in (None, tmp_path / "libcuda.so.1"):
        tk = cuda_toolkit.Toolkit(
            root=_toolkit(tmp_path / str(driver is None)), source="pypi", driver=driver
        )
        plan = build.make_plan(tk.cmake_args("90"))
        assert not [a for a in plan.cmake_args if "GGML_CUDA_FA" in a], plan.cmake_args
    script = (Path(__file__).resolve().parent.parent / "bench" / "gpu_check.sh").read_text()
    assert "GGML_CUDA_FA" not in script


def test_the_gpu_script_builds_with_the_wheel_s_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m llamacpp_instr.native.cuda_toolkit ARCH` prints the CMake arguments `instr build
    --cuda` builds the wheel with (ggml's default ones, then the toolkit's), which
    bench/gpu_check.sh builds the backend with on the GPU machine."""
    driver = tmp_path / "libcuda.so.1"
    tk = cuda_toolkit.Toolkit(root=_toolkit(tmp_path / "cu"), source="system", driver=driver)
    monkeypatch.setattr(cuda_toolkit, "toolkit", lambda echo: tk)
    assert cuda_toolkit.main(["90"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [*build.DEFAULT_CMAKE_ARGS, *tk.cmake_args("90")]
    assert cuda_toolkit.main(["90", "80"]) == 2
    script = (Path(__file__).resolve().parent.parent / "bench" / "gpu_check.sh").read_text()
    assert "python3 -m llamacpp_instr.native.cuda_toolkit" in script


def test_build_cuda_no_install_installs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`instr build --cuda --no-install` builds (here: a made-up wheel) into the cache and prints
    its libraries' folder; nothing is installed, neither the wheel nor the default model."""
    tk = cuda_toolkit.Toolkit(root=_toolkit(tmp_path / "cu"), source="pypi", driver=None)
    monkeypatch.setattr(cuda_toolkit, "toolkit", lambda echo: tk)
    monkeypatch.setenv("LLAMACPP_INSTR_CACHE", str(tmp_path / "cache"))
    seen: list[build.BuildPlan] = []

    def built(plan: build.BuildPlan, echo: object, rebuild: bool = False) -> Path:
        seen.append(plan)
        return tmp_path / "w.whl"

    def refused(*a: object, **kw: object) -> None:
        raise AssertionError("installed")

    monkeypatch.setattr(libraries, "cached_or_built", built)
    monkeypatch.setattr(libraries, "_lib_dir", lambda plan, whl, name: tmp_path / "lib")
    for name in ("install_wheel", "install_default_model", "_pip"):
        monkeypatch.setattr(wheel, name, refused)
    for name in ("install_wheel", "install_default_model"):  # (as build.build calls them)
        monkeypatch.setattr(build, name, refused)
    r = CliRunner().invoke(main, ["build", "--cuda", "--cuda-arch", "90", "--no-install"])
    assert r.exit_code == 0, r.output
    assert f"LLAMA_CPP_LIB_PATH={tmp_path / 'lib'}" in r.output
    [plan] = seen
    assert plan.cuda and set(tk.cmake_args("90")) <= set(plan.cmake_args)
