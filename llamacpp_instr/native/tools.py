"""llama.cpp's own programs (llama-server, llama-cli, llama-bench, llama-perplexity, llama-mtmd-cli,
ggml's RPC server ggml-rpc-server, and llama-fit-params, llama.cpp's own projection that ``instr
fit`` shows beside its own), built from the same patched tree as the wheel and cached beside it.

``instr build --tools`` extracts the pinned sdist, copies the overlay in and applies the patches
exactly as the wheel build does (``build_plan.prepare_source``), then runs CMake as the wheel build does,
through llama-cpp-python's CMakeLists in a build folder beside the sdist, with llama.cpp's common
library and tools on, building only the programs asked for. Their libraries (libllama, libggml*)
are thus compiled with the wheel's own flags and paths, and ccache serves every object the wheel
build compiled: a cold tools build compiles only what the programs add. The shared libraries are
copied beside the binaries under ``cache_dir()/tools/<key>/bin/``, which find them there through
an RPATH of ``$ORIGIN`` that LD_LIBRARY_PATH cannot override (another build's libllama on that
path would otherwise be loaded in their place), so the binaries run on their own. ``key`` is the
wheel's key scheme (pin, patches, overlay, CMake arguments) over the tools' CMake arguments, so GPU
builds (extra CMake arguments) get their own key. ``stock=True`` builds the pin without the
instrumentation, for baselines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import build_plan, progress, wheel
from llamacpp_instr.native.paths import cache_dir

PROGRAMS = (
    "llama-server",
    "llama-cli",
    "llama-bench",
    "llama-perplexity",
    "llama-mtmd-cli",
    "ggml-rpc-server",
    "llama-fit-params",
)

# The programs that link libllama, so that LLAMA_INSTR_LOG opens a session in them (`instr exec`).
# llama-mtmd-cli is mtmd's own: an image or audio file encoded by a projector (--mmproj), then a
# generation from it. ggml-rpc-server serves a host's devices to an RPC client and writes no log:
# a patched one times the graphs it computes and sends the times to a patched client, whose log
# holds them. llama-fit-params only projects (no weights loaded, nothing decoded): nothing to log.
LOGGED_PROGRAMS = PROGRAMS[:5]

# llama.cpp's own options: its common library and tools (which the wheel leaves out), no network
# (curl, OpenSSL), nothing else. Its libraries are shared, as llama-cpp-python's CMakeLists makes
# them; the programs and those libraries find theirs beside themselves (a build RPATH relative to
# $ORIGIN, kept when they are copied out), as DT_RPATH, which is searched before LD_LIBRARY_PATH.
# The programs' own libraries (common, the server's) are unity builds (patches/python/0002): a
# third less CPU for the same code; libllama, ggml and mtmd are compiled as the wheel's (mtmd: a
# unity build in both, patches/python/0003).
TOOLS_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",
    "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags",
    "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--disable-new-dtags",
    "-DLLAMACPP_INSTR_UNITY_PROGRAMS=ON",
)

BUILD_COMMAND = "instr build --tools"

# `instr build --tools --sanitize=KIND`: llama-server alone (its HTTP threads and slots calling
# into the library are what ThreadSanitizer is for here), with the sanitized libraries: the wheel's
# sanitized build compiled them alike, so ccache serves them and only the server's code compiles.
SANITIZED_PROGRAMS = ("llama-server",)


def tools_plan(
    extra_cmake_args: Sequence[str] = (), stock: bool = False, sanitize: str | None = None
) -> build_plan.BuildPlan:
    """The build plan of the tools: the wheel's, over the tools' CMake arguments.

    ``extra_cmake_args`` is where a GPU build adds its backend (``--cuda`` passes
    ``-DGGML_CUDA=ON`` here), so each backend is cached under its own key; a sanitizer too."""
    return build_plan.make_plan(
        TOOLS_CMAKE_ARGS + tuple(extra_cmake_args), stock=stock, sanitize=sanitize
    )


def bin_dir(plan: build_plan.BuildPlan) -> Path:
    return cache_dir() / "tools" / plan.key / "bin"


def find(program: str, extra_cmake_args: Sequence[str] = (), sanitize: str | None = None) -> Path:
    """The built ``program`` of the current patches (with ``sanitize``, its sanitized build), or a
    one-line error naming the command that builds it."""
    if program not in PROGRAMS:
        raise UserError(f"unknown program {program!r}: choose one of {', '.join(PROGRAMS)}")
    if sanitize and program not in SANITIZED_PROGRAMS:
        raise UserError(f"only {', '.join(SANITIZED_PROGRAMS)} is built with a sanitizer")
    plan = tools_plan(extra_cmake_args, sanitize=sanitize)
    exe = bin_dir(plan) / program
    if not exe.is_file():
        command = BUILD_COMMAND + (" --vulkan" if plan.vulkan else "")
        command += f" --sanitize={sanitize}" if sanitize else ""
        raise UserError(f"{program} is not built for the current patches: run `{command}`")
    return exe


def find_logged(
    program: str, extra_cmake_args: Sequence[str] = (), sanitize: str | None = None
) -> Path:
    """``find``, for a program that writes a session log (`instr exec`): a one-line error for one
    that runs no libllama session."""
    if program == "llama-fit-params":
        raise UserError(
            "llama-fit-params writes no log (it projects memory and runs no model): "
            "`instr fit --compare-llama` runs it beside instr fit's own projection"
        )
    if program in PROGRAMS and program not in LOGGED_PROGRAMS:
        raise UserError(
            f"{program} writes no log (it does not run libllama): start it as it is (`instr "
            "doctor --tools` says where); the log of the client that uses it holds its times"
        )
    return find(program, extra_cmake_args, sanitize)


def build_tools(
    echo: progress.Echo,
    extra_cmake_args: Sequence[str] = (),
    programs: Sequence[str] = PROGRAMS,
    stock: bool = False,
    rebuild: bool = False,
    jobs: int | None = None,
    sanitize: str | None = None,
) -> Path:
    """Build ``programs`` (cached) and return the folder holding them; with ``sanitize``, only
    those of SANITIZED_PROGRAMS.

    One build of a key at a time: a second process (two test runs, two CI jobs) waits for the
    first, then finds what it built, instead of building into the same tree beside it."""
    plan = tools_plan(extra_cmake_args, stock=stock, sanitize=sanitize)
    if sanitize:
        programs = [p for p in programs if p in SANITIZED_PROGRAMS]
    out = bin_dir(plan)
    with wheel.build_lock(out.parent / "build.lock"):
        missing = [p for p in programs if rebuild or not (out / p).is_file()]
        if not missing:
            echo(f"using cached tools in {out}")
            return out
        return _build(plan, missing, echo, jobs)


def _build(
    plan: build_plan.BuildPlan, missing: list[str], echo: progress.Echo, jobs: int | None
) -> Path:
    out = bin_dir(plan)
    work = cache_dir() / "tools" / plan.key / "src"
    root = build_plan.prepare_source(plan, work, echo)
    cmake_args, env = build_plan.compile_env(plan, work)
    # the wheel's layout (wheel.build_wheel): the build folder beside the sdist, configured from
    # its CMakeLists, so that every compile command of a library is the wheel's own
    bdir = work / "build"
    if shutil.which("ninja"):
        cmake_args += ["-G", "Ninja"]
    log = cache_dir() / "logs" / f"tools-{plan.key}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    jobs = jobs or os.cpu_count() or 2
    echo(
        f"building {', '.join(missing)} ({'stock' if plan.stock else 'patched'}, key {plan.key}; "
        f"about 3 minutes on 2 cores without ccache; log: {log})"
    )
    t0 = time.monotonic()
    steps = (
        ["cmake", "-S", str(root), "-B", str(bdir), *cmake_args],
        ["cmake", "--build", str(bdir), "-j", str(jobs), "--target", *missing],
    )
    with log.open("w") as lf, progress.Progress(echo, log):
        for cmd in steps:
            lf.write("$ " + " ".join(cmd) + "\n")
            lf.flush()
            r = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env)
            if r.returncode != 0:
                break
    if r.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        errors = [ln for ln in tail if "error" in ln.lower()] or tail[-3:]
        raise UserError(f"tools build failed ({errors[-1].strip()}); full log: {log}")
    out.mkdir(parents=True, exist_ok=True)
    # the libraries first, then the programs that need them; each file replaced by a rename, so
    # that a program already running from `out` keeps the library it mapped
    libs = sorted(f.name for f in (bdir / "bin").iterdir() if ".so" in f.name)
    for name in libs + missing:
        tmp = out / (name + ".partial")
        tmp.unlink(missing_ok=True)
        shutil.copy2(bdir / "bin" / name, tmp, follow_symlinks=False)
        tmp.rename(out / name)
    # the source and build trees are large; ccache keeps what matters for rebuilds
    shutil.rmtree(work, ignore_errors=True)
    echo(f"built {', '.join(missing)} in {time.monotonic() - t0:.0f}s: {out}")
    return out
