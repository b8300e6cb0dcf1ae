"""What ``instr build`` was asked for, done: the patches checked, the wheel built and installed
(cached), llama.cpp's own programs built, or libraries built for the tests, a sanitizer or a run
through ``LLAMA_CPP_LIB_PATH`` without installing them."""

from __future__ import annotations

from dataclasses import dataclass

from llamacpp_instr.native.progress import Echo


@dataclass(frozen=True)
class BuildRequest:
    """One of: ``check`` the patches (and, with ``cuda``, the CUDA toolkit for ``cuda_arch``);
    build llama.cpp's programs (``with_tools``); the ``testing`` or ``sanitize``d libraries; the
    wheel's libraries without installing them (``no_install``); else the wheel, installed (with
    the bundled ``model``). ``vulkan`` and ``cuda`` add those backends; ``rebuild`` ignores the
    cache."""

    check: bool = False
    cmake_args: tuple[str, ...] = ()
    rebuild: bool = False
    model: bool = False
    sanitize: str | None = None
    with_tools: bool = False
    vulkan: bool = False
    cuda: bool = False
    cuda_arch: str | None = None
    no_install: bool = False
    testing: bool = False


def perform(request: BuildRequest, say: Echo) -> str | None:
    """Do what ``request`` asks, ``say`` hearing the progress; returns the line it answers on
    stdout (the programs' folder, or how to load the libraries built), or None."""
    from llamacpp_instr.native import build, build_plan, libraries

    if request.check:
        build_plan.check(say)
        if request.cuda:
            from llamacpp_instr.native import cuda_check

            cuda_check.check(say, request.cuda_arch)
        return None
    cmake_args, rebuild = request.cmake_args, request.rebuild
    if request.cuda:
        from llamacpp_instr.native import cuda_toolkit

        cmake_args += cuda_toolkit.toolkit(say).cmake_args(request.cuda_arch)
    if request.with_tools:
        from llamacpp_instr.native import tools

        if request.vulkan:
            build_plan.check_vulkan_prerequisites()
            cmake_args += build_plan.VULKAN_CMAKE_ARGS
        folder = tools.build_tools(say, cmake_args, rebuild=rebuild, sanitize=request.sanitize)
        # sanitized: llama-server beside its libraries, which Python runs on too
        return (
            libraries.sanitized_run_env(request.sanitize, folder)
            if request.sanitize
            else str(folder)
        )
    if request.testing:
        lib = libraries.testing_lib_dir(say, cmake_args, rebuild=rebuild)
        say(f"testing libraries: {lib}")
        return libraries.lib_env(lib)
    if request.sanitize:
        lib = libraries.sanitized_lib_dir(request.sanitize, say, cmake_args, rebuild=rebuild)
        say(f"{request.sanitize}-sanitized libraries: {lib}")
        return libraries.sanitized_run_env(request.sanitize, lib)
    if request.no_install:
        lib = libraries.installable_lib_dir(say, cmake_args, rebuild=rebuild, vulkan=request.vulkan)
        kind = "CUDA " if request.cuda else "Vulkan " if request.vulkan else ""
        say(f"{kind}libraries (not installed): {lib}")
        return libraries.lib_env(lib)
    build.build(cmake_args, say, rebuild=rebuild, with_model=request.model, vulkan=request.vulkan)
    return None
