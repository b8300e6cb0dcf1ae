"""What a build is: the CMake arguments of each kind (the default, sanitized, testing, Vulkan and
stock builds), the plan that names them with the patches and its cache key, the plan's source
tree (the sdist extracted, the overlay copied in, the patches applied: ``prepare_source``; and
``check``, the same without a build) and the environment it compiles in (``compile_env``), shared
by the wheel, the libraries used in place and the tools.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import pin
from llamacpp_instr.native.patching import (
    PYTHON_PATCH_DIR,
    apply_patches,
    check_overlay_listed,
    copy_overlay,
    patch_hash,
    read_overlay,
    read_series,
    source_patch_hash,
)
from llamacpp_instr.native.paths import PATCHES_DIR, cache_dir
from llamacpp_instr.native.progress import Echo
from llamacpp_instr.native.sdist import extract_sdist, fetch_sdist

# LLAVA: libmtmd, which llama-cpp-python's multimodal chat handlers load (llama_cpp/mtmd_cpp.py),
# compiled as the tools build compiles it (patches/python/0003). RPC: ggml's RPC backend (one
# file) is a second backend on any machine, GPU or not: the tests offload layers to it over
# loopback to exercise graph splits and copies between backends where CI has no GPU.
DEFAULT_CMAKE_ARGS = ("-DLLAVA_BUILD=ON", "-DGGML_RPC=ON")


# `instr build --sanitize=KIND`: llama.cpp's and ggml's own sanitizer options; `address` is
# AddressSanitizer with UndefinedBehaviorSanitizer. OpenMP is off for the thread sanitizer, whose
# runtime cannot see libgomp's synchronization. A sanitized build carries the testing build's
# entry points too (TESTING_CMAKE_ARGS), so that the allocation-failure tests run under it. It is
# compiled by clang without optimization (the release flags less -O3): optimizing the sanitizers'
# checks is what takes the time, and clang adds them faster than GCC (llama-kv-cache.cpp with
# ASan and UBSan: GCC 28.1 CPU-s at -O3, 13.8 at -O1, 5.1 at -O0, clang 2.1 at -O0; 4.4
# unsanitized at -O3), and the tests' models are tiny.
SANITIZED_BUILD = (
    "-DCMAKE_C_COMPILER=clang",
    "-DCMAKE_CXX_COMPILER=clang++",
    "-DCMAKE_C_FLAGS_RELEASE=-DNDEBUG",
    "-DCMAKE_CXX_FLAGS_RELEASE=-DNDEBUG",
)


SANITIZERS: dict[str, tuple[str, ...]] = {
    "address": (
        "-DLLAMA_SANITIZE_ADDRESS=ON",
        "-DGGML_SANITIZE_ADDRESS=ON",
        "-DLLAMA_SANITIZE_UNDEFINED=ON",
        "-DGGML_SANITIZE_UNDEFINED=ON",
        *SANITIZED_BUILD,
    ),
    "thread": (
        "-DLLAMA_SANITIZE_THREAD=ON",
        "-DGGML_SANITIZE_THREAD=ON",
        "-DGGML_OPENMP=OFF",
        *SANITIZED_BUILD,
    ),
}


# `instr build --testing`: the entry points for tests and benchmarks only (allocation-failure
# injection, the overhead benchmark's eval callback), never in the installed library.
TESTING_CMAKE_ARGS = ("-DLLAMA_INSTR_TESTING=ON",)


# `instr build --vulkan`: ggml's Vulkan backend beside the CPU's (any vendor's GPU, or Mesa's
# lavapipe on the CPU). Its shaders are compiled with glslc at build time.
VULKAN_CMAKE_ARGS = ("-DGGML_VULKAN=ON",)


# What the Vulkan build needs from the system, and the Debian packages that have it.
VULKAN_BUILD_PACKAGES = "libvulkan-dev glslc spirv-headers"


@dataclass(frozen=True)
class BuildPlan:
    patches: tuple[Path, ...]
    overlay: tuple[tuple[str, Path], ...]  # (path in llama.cpp, file)
    cmake_args: tuple[str, ...]
    key: str
    sanitize: str | None = None
    testing: bool = False
    # the pin without the instrumentation: its patches are only the sdist's build set (python/)
    stock: bool = False

    @property
    def vulkan(self) -> bool:
        return any(a in VULKAN_CMAKE_ARGS for a in self.cmake_args)

    @property
    def cuda(self) -> bool:
        return "-DGGML_CUDA=ON" in self.cmake_args

    @property
    def local_version(self) -> str:
        kind = "stock" if self.stock else "instr"
        if self.sanitize:
            kind += f"{self.sanitize[0]}san"
        if self.testing:
            kind += "test"
        if self.vulkan:
            kind += "vk"
        if self.cuda:
            kind += "cu"
        return f"{pin.LLAMA_CPP_PYTHON_VERSION}+{kind}.{self.key}"

    @property
    def wheel_dir(self) -> Path:
        return cache_dir() / "wheels" / self.key


# Upstream's own defects the stock build needs fixed to run at all: without this one, llama.cpp
# faults at the first batch of a Q4_0/Q4_1/Q8_0 model on a CPU with AMX (the benchmarks' machines)
STOCK_FIXES = frozenset({"0010-ggml-cpu-AMX-s-tile-config-as-constant-data.patch"})


def make_plan(
    extra_cmake_args: Sequence[str] = (),
    stock: bool = False,
    patches_dir: Path = PATCHES_DIR,
    sanitize: str | None = None,
    testing: bool = False,
    vulkan: bool = False,
) -> BuildPlan:
    """What to build; ``stock`` builds the pin without the instrumentation (the benchmarks'
    baseline): no overlay, and of the patches only those of the sdist's CMakeLists (python/),
    which choose what is built, not how, and the fixes it needs to run (STOCK_FIXES), so that its
    libraries are llama.cpp's own, compiled as the patched build compiles its own; ``vulkan`` adds
    ggml's Vulkan backend."""
    patches = read_series(patches_dir)
    if stock:
        patches = tuple(
            p for p in patches if p.parent.name == PYTHON_PATCH_DIR or p.name in STOCK_FIXES
        )
    overlay = () if stock else read_overlay(patches_dir)
    if sanitize is not None and sanitize not in SANITIZERS:
        raise UserError(f"unknown sanitizer {sanitize!r}: choose {' or '.join(SANITIZERS)}")
    testing = testing or sanitize is not None
    env_args = tuple(os.environ.get("CMAKE_ARGS", "").split())
    cmake_args = DEFAULT_CMAKE_ARGS + env_args + tuple(extra_cmake_args)
    if sanitize:
        cmake_args += SANITIZERS[sanitize]
    if testing:
        cmake_args += TESTING_CMAKE_ARGS
    if vulkan:
        cmake_args += VULKAN_CMAKE_ARGS
    # The patch hash (what `instr doctor` compares) covers only pin + patches + overlay; the cache
    # key adds the build options so that a GGML_NATIVE=OFF wheel is not mistaken for a native one.
    return BuildPlan(
        patches=patches,
        overlay=overlay,
        cmake_args=cmake_args,
        key=patch_hash(patches, cmake_args, overlay),
        sanitize=sanitize,
        testing=testing,
        stock=stock,
    )


def check(echo: Echo, patches_dir: Path = PATCHES_DIR) -> None:
    """Verify that the overlay adds only new files and every patch applies, in order (no build)."""
    plan = make_plan(patches_dir=patches_dir)
    sdist = fetch_sdist(echo)
    with tempfile.TemporaryDirectory(prefix="instr-check-") as tmp:
        root = extract_sdist(sdist, Path(tmp) / "src")
        copy_overlay(root, plan.overlay, echo)
        apply_patches(root, plan.patches, echo)
        check_overlay_listed(root, plan.overlay)
    echo(
        f"all {len(plan.patches)} patches and {len(plan.overlay)} overlay files apply to "
        f"llama.cpp {pin.LLAMA_CPP_COMMIT} (patch hash {source_patch_hash(patches_dir)})"
    )


def missing_vulkan_prerequisites(prefixes: Sequence[Path] | None = None) -> list[str]:
    """What the Vulkan build lacks: its headers and loader library, the shader compiler and SPIR-V's
    headers, looked for where CMake finds them (``$VULKAN_SDK``, ``/usr``, ``/usr/local``, or
    ``prefixes``); glslc on PATH too."""
    if prefixes is None:
        sdk = os.environ.get("VULKAN_SDK")
        prefixes = ([Path(sdk)] if sdk else []) + [Path("/usr"), Path("/usr/local")]
        path_glslc = shutil.which("glslc") is not None
    else:
        path_glslc = False

    def anywhere(*patterns: str) -> bool:
        return any(next(pre.glob(p), None) is not None for pre in prefixes for p in patterns)

    missing = []
    if not anywhere("include/vulkan/vulkan.hpp") or not anywhere(
        "lib/libvulkan.so", "lib64/libvulkan.so", "lib/*/libvulkan.so"
    ):
        missing.append("the Vulkan headers and loader")
    if not path_glslc and not anywhere("bin/glslc"):
        missing.append("glslc")
    if not anywhere("*/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake"):
        missing.append("the SPIR-V headers")
    return missing


def check_vulkan_prerequisites(prefixes: Sequence[Path] | None = None) -> None:
    """A one-line error naming the Debian packages when the Vulkan build can't work here."""
    missing = missing_vulkan_prerequisites(prefixes)
    if missing:
        raise UserError(
            f"the Vulkan build needs {', '.join(missing)}: install the Debian packages "
            f"{VULKAN_BUILD_PACKAGES} (apt-get install {VULKAN_BUILD_PACKAGES}; and "
            "mesa-vulkan-drivers to run it on the CPU with lavapipe)"
        )


def prepare_source(plan: BuildPlan, work: Path, echo: Echo) -> Path:
    """The pinned sdist extracted into ``work``, the overlay copied in and the patches applied."""
    root = extract_sdist(fetch_sdist(echo), work)
    if plan.overlay:
        copy_overlay(root, plan.overlay, echo)
    apply_patches(root, plan.patches, echo)
    return root


def compile_env(plan: BuildPlan, tree: Path) -> tuple[list[str], dict[str, str]]:
    """The CMake arguments (the plan's, the build identity, ccache) and the environment to build
    ``plan`` in ``tree`` (the folder holding the extracted sdist and the build folder) with; shared
    by the wheel and the tools build."""
    env = dict(os.environ)
    # The compilers scikit-build-core gives the wheel build (Python's own, from sysconfig, unless
    # CC or CXX is set), named for the tools build too: ccache hashes the compiler's name, so a
    # library compiled by "cc" in one build and "gcc" in the other is compiled twice.
    for key in ("CC", "CXX"):
        words = (sysconfig.get_config_var(key) or "").split()
        if key not in env and words:
            env[key] = " ".join(itertools.takewhile(lambda w: not w.startswith("-"), words))
    cmake_args = list(plan.cmake_args)
    if not plan.stock:
        cmake_args.append(
            f"-DLLAMA_INSTR_PATCH_HASH={patch_hash(plan.patches, overlay=plan.overlay)}"
        )
        cmake_args.append(f"-DLLAMA_INSTR_LLAMA_COMMIT={pin.LLAMA_CPP_COMMIT}")
    if shutil.which("ccache"):
        cmake_args += [
            "-DCMAKE_C_COMPILER_LAUNCHER=ccache",
            "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
        ]
        if plan.cuda:
            cmake_args.append("-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
        # relative paths, so trees extracted under different keys share cache entries
        env["CCACHE_BASEDIR"] = str(cache_dir())
        env["CCACHE_NOHASHDIR"] = "true"
    # __FILE__ relative to the tree: libllama's unity sources include each source by its absolute
    # path, so without this their objects differ from tree to tree, and every build after the
    # wheel's compiled its 10 unity objects again (the tools and Vulkan builds took 15 and 16 CPU-s
    # more). ccache hashes only the option's name, and the objects are the same in every tree.
    for key in ("CFLAGS", "CXXFLAGS"):
        env[key] = f"{env.get(key, '')} -ffile-prefix-map={tree}=.".strip()
    return cmake_args, env
