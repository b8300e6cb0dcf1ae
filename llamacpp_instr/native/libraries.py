"""The native libraries of builds that are used in place, never installed: the testing,
sanitized, Vulkan, stock and installable builds' wheels, their libraries extracted once under the
cache for the installed package to run through LLAMA_CPP_LIB_PATH (``lib_env``), and what a
sanitized run needs besides (``sanitized_run_env``: the runtime preloaded, the options, the
pin's suppressions).
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native.build_plan import BuildPlan, make_plan
from llamacpp_instr.native.paths import PATCHES_DIR, cache_dir
from llamacpp_instr.native.progress import Echo
from llamacpp_instr.native.wheel import cached_or_built, wait_for_build


def _lib_dir(plan: BuildPlan, wheel: Path, name: str) -> Path:
    """The wheel's native libraries, extracted once under the cache (for LLAMA_CPP_LIB_PATH)."""
    import zipfile

    dest = cache_dir() / name / plan.key
    if not (dest / "lib").is_dir():
        # a folder of this process's own: another may extract the same wheel at the same time
        # (a test beside `.ci/run`'s build of it); the first rename wins, the second is dropped
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=plan.key + ".", suffix=".partial", dir=dest.parent))
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.namelist() if m.startswith("llama_cpp/lib/")]
            zf.extractall(tmp, members)
        (tmp / "llama_cpp" / "lib").rename(tmp / "lib")
        try:
            tmp.rename(dest)
        except OSError:  # the other process's rename came first (a folder not empty)
            pass
        shutil.rmtree(tmp, ignore_errors=True)
    return dest / "lib"


def lib_env(lib: Path) -> str:
    """The variables that run a build's libraries under the installed package: libllama and ggml
    (llama_cpp reads LLAMA_CPP_LIB_PATH), libmtmd (llama_cpp.mtmd_cpp reads MTMD_CPP_LIB)."""
    return f"LLAMA_CPP_LIB_PATH={lib} MTMD_CPP_LIB={lib}"


def sanitized_lib_dir(
    sanitize: str, echo: Echo, extra_cmake_args: Sequence[str] = (), rebuild: bool = False
) -> Path:
    """Native libraries of the patched build with a sanitizer, built and cached beside the normal
    wheel (never installed: they run under the installed package through LLAMA_CPP_LIB_PATH)."""
    plan = make_plan(extra_cmake_args, sanitize=sanitize)
    return _lib_dir(plan, cached_or_built(plan, echo, rebuild), "sanitized-lib")


def testing_lib_dir(
    echo: Echo, extra_cmake_args: Sequence[str] = (), rebuild: bool = False
) -> Path:
    """Native libraries of the patched build with the test-only entry points (llama-instr-testing.h,
    llama-instr-bench.h), built and cached beside the normal wheel, never installed: tests and
    benchmarks run them under the installed package through LLAMA_CPP_LIB_PATH."""
    plan = make_plan(extra_cmake_args, testing=True)
    return _lib_dir(plan, cached_or_built(plan, echo, rebuild), "testing-lib")


def installable_lib_dir(
    echo: Echo, extra_cmake_args: Sequence[str] = (), rebuild: bool = False, vulkan: bool = False
) -> Path:
    """The native libraries of the wheel `instr build` installs (with ``vulkan``, `instr build
    --vulkan`'s), built and cached, extracted for LLAMA_CPP_LIB_PATH instead of installed."""
    plan = make_plan(extra_cmake_args, vulkan=vulkan)
    return _lib_dir(plan, cached_or_built(plan, echo, rebuild), "lib")


def vulkan_lib_dir(
    echo: Echo, extra_cmake_args: Sequence[str] = (), build_it: bool = True
) -> Path | None:
    """Native libraries of the patched build with ggml's Vulkan backend, cached beside the normal
    wheel: tests and benchmarks run them under the installed (CPU) package through
    LLAMA_CPP_LIB_PATH (`instr build --vulkan --no-install` builds them). Without ``build_it``,
    None when they are not built for the current patches (after waiting for a build of them in
    another process)."""
    plan = make_plan(extra_cmake_args, vulkan=True)
    if not build_it and wait_for_build(plan, echo) is None:
        return None
    return _lib_dir(plan, cached_or_built(plan, echo), "lib")


# The runtime Python preloads to run each (the libraries leave it to the program): the compiler
# that names it, and its file. ThreadSanitizer's is GCC's: clang 14's shared TSan runtime (Debian
# 12's) crashes at once when preloaded, even into /bin/true, and TSan's instrumentation is calls
# into the runtime, which GCC 12's (an import of LLVM's) answers alike: the tests report the same
# race on either build. A program clang links (llama-server) carries clang's own, statically.
SANITIZER_RUNTIMES = {
    "address": ("clang", f"libclang_rt.asan-{platform.machine()}.so"),
    "thread": ("gcc", "libtsan.so"),
}


# The options a sanitized run needs: no leak check (the Python interpreter keeps its objects to
# the end), and a report that ends the process with a failure status (AddressSanitizer's always
# does; UndefinedBehaviorSanitizer's and ThreadSanitizer's go on without halt_on_error). No
# alloc-dealloc-mismatch check: the testing build's operator delete (llama-instr-testing.cpp, bound
# inside libllama) frees with free() what libstdc++'s own code allocated with the runtime's
# operator new (a static std::string at libllama's load), and the reverse; both are the
# sanitizer's one allocator, only the kind of call differs.
SANITIZER_OPTIONS: dict[str, dict[str, str]] = {
    "address": {
        "ASAN_OPTIONS": "detect_leaks=0:alloc_dealloc_mismatch=0",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    },
    "thread": {"TSAN_OPTIONS": "halt_on_error=1"},
}


# the pin's own defects, which the sanitized runs suppress (each file says which and why)
SANITIZER_SUPPRESSIONS = {
    "TSAN_OPTIONS": PATCHES_DIR / "tsan.supp",
    "UBSAN_OPTIONS": PATCHES_DIR / "ubsan.supp",
}


def sanitized_run_env(sanitize: str, lib: Path) -> str:
    """What `instr build --sanitize` prints: the variables that run Python on the libraries in
    ``lib`` under the sanitizer (``env $(instr build --sanitize=KIND) python ...``)."""
    options = dict(SANITIZER_OPTIONS[sanitize])
    for name, path in SANITIZER_SUPPRESSIONS.items():
        if name in options:
            options[name] += f":suppressions={path}"
    opts = " ".join(f"{k}={v}" for k, v in options.items())
    return f"{lib_env(lib)} LD_PRELOAD={sanitizer_runtime(sanitize)} {opts}"


def sanitizer_runtime(sanitize: str) -> str:
    """The LD_PRELOAD list to run Python on sanitized libraries: the compiler's sanitizer runtime,
    then libstdc++ (preloaded too, so that the runtime's C++ exception interceptor finds it:
    llama.cpp throws and catches internally, e.g. when it refuses a corrupt file)."""
    cc, lib = SANITIZER_RUNTIMES[sanitize]
    try:
        r = subprocess.run([cc, f"-print-file-name={lib}"], capture_output=True, text=True)
        path = r.stdout.strip() if r.returncode == 0 else ""
    except OSError:
        path = ""
    if not Path(path).is_file():
        raise UserError(
            f"the {sanitize} sanitizer runtime {lib} was not found: the {sanitize}-sanitized "
            f"build needs {cc} and its runtime (Debian: apt-get install "
            f"{'clang libclang-rt-14-dev' if cc == 'clang' else 'gcc'})"
        )
    return f"{path}:libstdc++.so.6"


def stock_lib_dir(echo: Echo, extra_cmake_args: Sequence[str] = ()) -> Path:
    """Native libraries of the unpatched pin (built and cached once), for LLAMA_CPP_LIB_PATH.

    The Python part of llama-cpp-python is the same in both builds, so the benchmark runs the stock
    libraries under the installed package by pointing LLAMA_CPP_LIB_PATH here.
    """
    plan = make_plan(extra_cmake_args, stock=True)
    return _lib_dir(plan, cached_or_built(plan, echo), "stock-lib")
