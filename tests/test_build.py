"""`instr build`: patch checks, cache keys, and the cached wheel being reused."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from llamacpp_instr.cli import main
from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import build, pin
from llamacpp_instr.native.paths import PATCHES_DIR, REPO_ROOT

pytestmark = pytest.mark.native


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
    stock = build.make_plan(stock=True)
    assert stock.local_version.startswith(pin.LLAMA_CPP_PYTHON_VERSION + "+stock.")
    # the pin without the instrumentation: no overlay, and only the patches that choose what the
    # sdist's CMakeLists builds (the wheel leaves out llama.cpp's common library), and the fix of
    # the AMX fault that stops it at the first batch on a CPU with AMX
    assert stock.overlay == () and stock.patches
    fixes = [p.name for p in stock.patches if p.parent.name != build.PYTHON_PATCH_DIR]
    assert fixes == ["0010-ggml-cpu-AMX-s-tile-config-as-constant-data.patch"]
    assert "amx/mmq.cpp" in (build.PATCHES_DIR / fixes[0]).read_text()


def test_a_source_included_by_its_absolute_path_compiles_alike_in_two_trees(
    tmp_path: Path,
) -> None:
    """libllama's unity sources include each source by its absolute path. The flags of the build
    environment make the object the same in every tree (so ccache serves it to the builds after
    the wheel's): __FILE__ no longer names the tree."""
    objects = []
    for name in ("wheel-tree", "tools-tree"):
        tree = tmp_path / name
        (tree / "src").mkdir(parents=True)
        (tree / "src" / "model.c").write_text("const char *where(void) { return __FILE__; }\n")
        (tree / "unity.c").write_text(f'#include "{tree / "src" / "model.c"}"\n')
        _, env = build.compile_env(build.make_plan(), tree)
        cc = shlex.split(env.get("CC") or "cc")
        flags = shlex.split(env.get("CFLAGS", ""))
        obj = tree / "unity.o"
        subprocess.run(
            [*cc, *flags, "-c", str(tree / "unity.c"), "-o", str(obj)], check=True, env=env
        )
        objects.append(obj.read_bytes())
        assert str(tmp_path).encode() not in objects[-1]
    assert objects[0] == objects[1]


def test_the_patches_leave_llama_cpps_public_headers_as_they_are() -> None:
    """What the patches declare lives in the overlay's headers (ggml-cpu-instr.h and the like): a
    stock header changed would make every source that includes it compile differently from the
    pin's, so a stock build could take none of them from ccache, and a program built against
    llama.cpp's own headers might not run on the patched libraries. No patch adds a file."""
    added, changed = set(), set()
    for patch in build.read_series():
        for part in patch.read_text().split("\ndiff --git ")[1:]:
            path = part.split()[1].removeprefix("b/")
            if "\nnew file mode" in part.split("\n@@", 1)[0]:
                added.add(path)
            elif path.startswith(("include/", "ggml/include/")) and path not in added:
                changed.add(path)
    assert changed == set() and added == set()
    overlay = {rel for rel, _ in build.read_overlay()}
    for backend in ("cpu", "rpc", "vulkan", "cuda"):
        assert f"ggml/include/ggml-{backend}-instr.h" in overlay


def _throwaway_env(tmp_path: Path, shadow: str) -> Path:
    """A virtualenv on this interpreter's packages (pip, click, ... and the installed build) whose
    own llama-cpp-python, found first, is another build (``shadow``): `instr build` run by its
    Python installs the patches' wheel there, never into the environment the suite runs in."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
    )
    (site,) = venv.glob("lib/python*/site-packages")
    info = site / f"llama_cpp_python-{shadow}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: {shadow}\n"
    )
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    return venv / "bin" / "python"


def test_second_build_reuses_the_cached_wheel_and_installs_it(tmp_path: Path) -> None:
    """`instr build` installs the patches' wheel over another build of llama-cpp-python, and a
    second `instr build` with nothing changed takes it from the cache and finds it installed."""
    python = _throwaway_env(tmp_path, "0.3.36+instr.000000000000")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))  # this tree's llamacpp_instr
    version = [str(python), "-c", "from importlib import metadata as m; "]
    version[-1] += "d = m.distribution('llama_cpp_python'); print(d.version, d.locate_file(''))"
    shadowed = subprocess.run(version, capture_output=True, text=True, env=env, check=True)
    assert shadowed.stdout.startswith("0.3.36+instr.000000000000 " + str(tmp_path))
    plan = build.make_plan()
    outputs = []
    for _ in range(2):
        cmd = [str(python), "-m", "llamacpp_instr.cli", "build", "--no-model"]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        outputs.append(r.stderr)
    assert f"installed llama-cpp-python {plan.local_version}" in outputs[0]
    assert "using cached wheel" in outputs[1]
    assert f"llama-cpp-python {plan.local_version} already installed" in outputs[1]
    now = subprocess.run(version, capture_output=True, text=True, env=env, check=True)
    assert now.stdout.startswith(f"{plan.local_version} {tmp_path}"), now.stdout


def test_check_refuses_an_overlay_file_that_replaces_llama_cpp_source(tmp_path: Path) -> None:
    patches = _copy_patches(tmp_path)
    (patches / "overlay" / "src" / "llama.cpp").write_text("// not ours\n")
    with pytest.raises(UserError, match="overlay file src/llama.cpp would replace"):
        build.check(lambda _: None, patches_dir=patches)


def test_check_refuses_an_overlay_source_cmake_does_not_compile(tmp_path: Path) -> None:
    patches = _copy_patches(tmp_path)
    (patches / "overlay" / "src" / "llama-instr-extra.cpp").write_text("// unused\n")
    with pytest.raises(UserError, match="llama-instr-extra.cpp is not listed"):
        build.check(lambda _: None, patches_dir=patches)


def test_overlay_changes_the_patch_hash(tmp_path: Path) -> None:
    patches = _copy_patches(tmp_path)
    base = build.source_patch_hash(patches)
    header = patches / "overlay" / "include" / "llama-instr.h"
    header.write_text(header.read_text() + "\n")
    assert build.source_patch_hash(patches) != base


def test_the_package_ships_what_build_and_doctor_need(tmp_path: Path) -> None:
    """A wheel of llamacpp-instr (what the Docker image installs) carries the patches and overlay,
    so `instr doctor` compares against the same hash there. Built from a copy of the sources, as
    .ci/wheel-check builds it: a build in the checkout leaves build/ and an egg-info there, whose
    metadata then shadows the installed package's for Python run from the checkout."""
    import zipfile

    src = tmp_path / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("pyproject.toml", "setup.py", "README.md", "llamacpp_instr", "patches"):
        path = REPO_ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q"] + ["-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    (wheel,) = tmp_path.glob("llamacpp_instr-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {n.removeprefix("llamacpp_instr/patches/") for n in names if "/patches/" in n}
    expected = {p.relative_to(PATCHES_DIR).as_posix() for p in build.read_series()}
    expected |= {"series"} | {"overlay/" + rel for rel, _ in build.read_overlay()}
    assert expected <= shipped
    assert "llamacpp_instr/contract/schema_v1.json" in names


def test_the_vulkan_build_has_its_own_key_and_version() -> None:
    cpu, vk = build.make_plan(), build.make_plan(vulkan=True)
    assert "-DGGML_VULKAN=ON" in vk.cmake_args and "-DGGML_VULKAN=ON" not in cpu.cmake_args
    assert vk.key != cpu.key and vk.vulkan and not cpu.vulkan
    assert vk.local_version.startswith(pin.LLAMA_CPP_PYTHON_VERSION + "+instrvk.")
    # the default build stays CPU-only
    assert "+instr." in cpu.local_version


def test_missing_vulkan_packages_are_named_in_one_line(tmp_path: Path) -> None:
    assert build.missing_vulkan_prerequisites([tmp_path]) == [
        "the Vulkan headers and loader",
        "glslc",
        "the SPIR-V headers",
    ]
    with pytest.raises(UserError) as e:
        build.check_vulkan_prerequisites([tmp_path])
    msg = str(e.value)
    assert "\n" not in msg and "libvulkan-dev glslc spirv-headers" in msg
    # a prefix that has them (as Debian's packages lay them out) lacks nothing
    for rel in (
        "include/vulkan/vulkan.hpp",
        "lib/x86_64-linux-gnu/libvulkan.so",
        "bin/glslc",
        "share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).touch()
    assert build.missing_vulkan_prerequisites([tmp_path]) == []


def test_vulkan_with_a_sanitizer_is_a_usage_error() -> None:
    r = CliRunner().invoke(main, ["build", "--vulkan", "--sanitize=address"])
    assert r.exit_code == 2 and "--vulkan" in r.output


def test_vulkan_tools_not_built_name_the_command_that_builds_them() -> None:
    from llamacpp_instr.native import tools

    if (tools.bin_dir(tools.tools_plan(build.VULKAN_CMAKE_ARGS)) / "llama-bench").is_file():
        pytest.skip("the Vulkan tools are built here: exec would run one")
    listed = CliRunner().invoke(main, ["doctor", "--tools", "--vulkan"])
    assert listed.exit_code == 0 and "run `instr build --tools --vulkan`" in listed.output
    r = CliRunner().invoke(main, ["exec", "--vulkan", "llama-bench", "-ngl", "99"])
    assert r.exit_code != 0 and "run `instr build --tools --vulkan`" in r.output
    assert len([ln for ln in r.output.splitlines() if ln.strip()]) == 1


def test_a_sanitized_build_has_ubsan_with_asan_and_the_testing_entry_points() -> None:
    """`--sanitize=address` is ASan with UBSan; either sanitizer's build carries the testing
    build's entry points (the allocation-failure tests run on it), compiled by clang unoptimized,
    under a key of its own; Python runs on it with a sanitizer runtime preloaded, a UBSan or TSan
    report halts (the pin's own suppressed), and ASan leaves the testing operator new's frees
    alone."""
    asan, tsan = build.make_plan(sanitize="address"), build.make_plan(sanitize="thread")
    assert {"-DLLAMA_SANITIZE_UNDEFINED=ON", "-DGGML_SANITIZE_UNDEFINED=ON"} <= set(asan.cmake_args)
    assert "-DLLAMA_SANITIZE_UNDEFINED=ON" not in tsan.cmake_args
    for plan in (asan, tsan):
        assert plan.testing and "-DLLAMA_INSTR_TESTING=ON" in plan.cmake_args
        assert {"-DCMAKE_CXX_FLAGS_RELEASE=-DNDEBUG", "-DCMAKE_CXX_COMPILER=clang++"} <= set(
            plan.cmake_args
        )
    keys = {asan.key, tsan.key, build.make_plan(testing=True).key, build.make_plan().key}
    assert len(keys) == 4
    words = dict(w.split("=", 1) for w in build.sanitized_run_env("address", Path("/x")).split())
    assert words["LLAMA_CPP_LIB_PATH"] == "/x"
    runtime = words["LD_PRELOAD"].split(":")[0]
    assert Path(runtime).is_file() and "libclang_rt.asan-" in runtime
    assert "alloc_dealloc_mismatch=0" in words["ASAN_OPTIONS"].split(":")
    ubsan = dict(o.split("=", 1) for o in words["UBSAN_OPTIONS"].split(":"))
    assert ubsan["halt_on_error"] == "1" and Path(ubsan["suppressions"]).is_file()
    words = dict(w.split("=", 1) for w in build.sanitized_run_env("thread", Path("/x")).split())
    assert Path(words["LD_PRELOAD"].split(":")[0]).name == "libtsan.so"
    options = dict(o.split("=", 1) for o in words["TSAN_OPTIONS"].split(":"))
    assert options["halt_on_error"] == "1" and Path(options["suppressions"]).is_file()


def test_a_sanitized_tools_build_is_llama_server_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llamacpp_instr.native import tools

    monkeypatch.setenv("LLAMACPP_INSTR_CACHE", str(tmp_path))
    seen: dict[str, object] = {}

    def fake_build(plan: build.BuildPlan, missing: list[str], echo: object, jobs: object) -> Path:
        seen["plan"], seen["missing"] = plan, missing
        return tmp_path

    monkeypatch.setattr(tools, "_build", fake_build)
    tools.build_tools(lambda _: None, sanitize="thread")
    plan = seen["plan"]
    assert isinstance(plan, build.BuildPlan) and plan.sanitize == "thread" and plan.testing
    assert seen["missing"] == ["llama-server"]
    assert plan.key != tools.tools_plan().key


def test_exec_sanitize_runs_the_sanitized_server_or_names_its_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMACPP_INSTR_CACHE", str(tmp_path))  # nothing built there
    r = CliRunner().invoke(main, ["exec", "--sanitize=thread", "llama-server", "-m", "m.gguf"])
    assert r.exit_code == 2 and "run `instr build --tools --sanitize=thread`" in r.output
    assert len([ln for ln in r.output.splitlines() if ln.strip()]) == 1
    r = CliRunner().invoke(main, ["exec", "--sanitize=address", "llama-cli", "-m", "m.gguf"])
    assert r.exit_code == 2 and "only llama-server is built with a sanitizer" in r.output
    r = CliRunner().invoke(main, ["exec", "--sanitize=thread", "llama-fit-params"])
    assert r.exit_code == 2 and "writes no log" in r.output
