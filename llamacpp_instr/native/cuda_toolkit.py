"""The CUDA toolkit `instr build --cuda` compiles ggml's CUDA backend with: the system's where it
has everything the build needs, else NVIDIA's own toolkit packages from PyPI, installed with
``--no-deps`` into the cache (never into the user's environment).

The PyPI parts (CUDA 13.5: nvcc, NVVM, the runtime, CCCL, the C runtime headers, cuBLAS) land in
``<cache>/cuda/<key>/nvidia/cu13/{bin,include,lib,nvvm}``; cuBLAS and the runtime ship only their
versioned ``.so.13`` files, so the unversioned names the linker looks for are added as links. They
compile code for any architecture without a GPU or a driver on the machine.

The backend built is the one llama.cpp's own CMake options give on a user's GPU machine: its
flash-attention kernels (``GGML_CUDA_FA``, on by default, for llama.cpp's default K/V types:
``GGML_CUDA_FA_ALL_QUANTS`` off), and ggml's virtual-memory pool, which links the driver library
(``libcuda``): the toolkit's stub where it has one, else the driver installed on the machine. PyPI's
packages have no stub, so on a machine without a driver the pool is left out
(``GGML_CUDA_NO_VMM``) and its legacy pool serves the same allocations.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native.paths import cache_dir

# NVIDIA's toolkit packages on PyPI, pinned: what ggml-cuda's CMake and compile need.
PYPI_PACKAGES = (
    "nvidia-cuda-nvcc==13.5.37",
    "nvidia-nvvm==13.5.37",
    "nvidia-cuda-runtime==13.5.37",
    "nvidia-cuda-cccl==13.3.5.0.6",
    "nvidia-cuda-crt==13.5.37",
    "nvidia-cublas==13.10.0.20",
)
# what a CUDA build needs at run time beside NVIDIA's driver (the Docker image installs these)
RUNTIME_PACKAGES = tuple(
    p for p in PYPI_PACKAGES if p.startswith(("nvidia-cuda-runtime==", "nvidia-cublas=="))
)
# where the packages put the toolkit, under the folder they are installed into
PYPI_ROOT = Path("nvidia") / "cu13"
# the libraries the link needs by their unversioned names (the packages ship *.so.13)
LINKED_LIBS = ("libcudart", "libcublas", "libcublasLt")

# where a system toolkit is looked for, after $CUDA_HOME / $CUDA_PATH and nvcc on PATH
SYSTEM_ROOTS = ("/usr/local/cuda", "/opt/cuda", "/usr")

# where NVIDIA's driver installs libcuda (Debian/Ubuntu, Red Hat, containers that mount the driver
# at /usr/local/nvidia, WSL), looked in before the loader's cache (ldconfig -p)
DRIVER_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/local/nvidia/lib64",
    "/usr/lib/wsl/lib",
)

Echo = Callable[[str], None]


@dataclass(frozen=True)
class Toolkit:
    root: Path  # bin/nvcc, include/, lib (or lib64)
    source: str  # "system" or "pypi"
    # the driver library (or its stub) the virtual-memory pool links against; None: none found
    driver: Path | None

    @property
    def nvcc(self) -> Path:
        return self.root / "bin" / "nvcc"

    @property
    def has_driver(self) -> bool:
        return self.driver is not None

    def cmake_args(self, arch: str | None) -> tuple[str, ...]:
        """The CMake arguments of a build with ggml's CUDA backend from this toolkit. ggml's own
        defaults stand for the rest: its flash-attention kernels are compiled (GGML_CUDA_FA)."""
        args = [
            "-DGGML_CUDA=ON",
            f"-DCUDAToolkit_ROOT={self.root}",
            f"-DCMAKE_CUDA_COMPILER={self.nvcc}",
        ]
        if arch:
            args.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
        if self.driver is None:
            args.append("-DGGML_CUDA_NO_VMM=ON")
        elif not self.driver.is_relative_to(self.root):
            # the machine's driver, where CMake's FindCUDAToolkit looks only in the toolkit
            args.append(f"-DCUDA_cuda_driver_LIBRARY={self.driver}")
        return tuple(args)


def _lib_dirs(root: Path) -> list[Path]:
    return [root / "lib64", root / "lib", *sorted(root.glob("targets/*/lib"))]


def _has_lib(root: Path, name: str) -> bool:
    return any(next(d.glob(f"{name}.so*"), None) is not None for d in _lib_dirs(root))


def missing_parts(root: Path) -> list[str]:
    """What a toolkit at ``root`` lacks for ggml's CUDA backend (empty: complete)."""
    inc = [root / "include", *sorted(root.glob("targets/*/include"))]
    missing = []
    if not (root / "bin" / "nvcc").is_file():
        missing.append("nvcc")
    if not any((d / "cuda_runtime.h").is_file() for d in inc):
        missing.append("the runtime's headers")
    if not any((d / "cublas_v2.h").is_file() for d in inc) or not _has_lib(root, "libcublas"):
        missing.append("cuBLAS")
    if not _has_lib(root, "libcudart"):
        missing.append("the runtime library")
    return missing


def _ldconfig_libcuda() -> list[Path]:
    """libcuda as the loader's cache lists it (``ldconfig -p``), or nothing."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        r = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in r.stdout.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.split(" ", 1)[0] in ("libcuda.so", "libcuda.so.1") and path:
            found.append(Path(path))
    return found


def driver_library(
    root: Path,
    dirs: Sequence[str] = DRIVER_DIRS,
    cached: Callable[[], list[Path]] = _ldconfig_libcuda,
) -> Path | None:
    """The driver library a build with the toolkit at ``root`` links ggml's virtual-memory pool
    against: the toolkit's stub, else the machine's driver (``libcuda.so``, else ``libcuda.so.1``
    in ``dirs``, else as the loader's cache finds it); None when there is none."""
    for lib in [*(d / "stubs" for d in _lib_dirs(root)), *_lib_dirs(root)]:
        if (lib / "libcuda.so").is_file():
            return lib / "libcuda.so"
    for name in ("libcuda.so", "libcuda.so.1"):
        for folder in dirs:
            if (Path(folder) / name).is_file():
                return Path(folder) / name
    return next((p for p in cached() if p.is_file()), None)


def _candidate_roots() -> list[Path]:
    roots = [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(Path(nvcc).resolve().parent.parent)
    roots += [Path(r) for r in SYSTEM_ROOTS]
    roots += sorted(Path("/usr/local").glob("cuda-*"), reverse=True)
    return roots


def system_toolkit() -> Toolkit | None:
    """The first complete toolkit installed on the system, or None."""
    for root in _candidate_roots():
        if root.is_dir() and not missing_parts(root):
            return Toolkit(root=root, source="system", driver=driver_library(root))
    return None


def pypi_key(packages: Sequence[str] = PYPI_PACKAGES) -> str:
    return hashlib.sha256("\0".join(packages).encode()).hexdigest()[:12]


def pypi_toolkit(echo: Echo, packages: Sequence[str] = PYPI_PACKAGES) -> Toolkit:
    """NVIDIA's toolkit packages, installed once into the cache (about 570 MB to download, 930 MB
    installed, mostly cuBLAS's libraries)."""
    target = cache_dir() / "cuda" / pypi_key(packages)
    root = target / PYPI_ROOT
    done = target / ".complete"
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / (target.name + ".lock")).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time; a second finds it done
        if not done.is_file():
            _install(target, packages, echo)
    missing = missing_parts(root)
    if missing:
        raise UserError(f"the CUDA toolkit in {target} lacks {', '.join(missing)}")
    return Toolkit(root=root, source="pypi", driver=driver_library(root))


def _install(target: Path, packages: Sequence[str], echo: Echo) -> None:
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    echo(f"installing the CUDA toolkit from PyPI into {target} ({', '.join(packages)})")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--no-deps",
        "--target",
        str(partial),
        *packages,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise UserError(f"could not install the CUDA toolkit from PyPI: {last}")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    link_versioned_libs(target / PYPI_ROOT / "lib")
    (target / ".complete").write_text("\n".join(packages) + "\n")


def link_versioned_libs(lib: Path) -> None:
    """``libX.so`` -> the newest ``libX.so.N`` for each library the link names."""
    for name in LINKED_LIBS:
        plain = lib / f"{name}.so"
        versioned = sorted(lib.glob(f"{name}.so.*"))
        if versioned and not plain.exists():
            plain.symlink_to(versioned[-1].name)


def toolkit(echo: Echo) -> Toolkit:
    """The system's toolkit if it is complete, else PyPI's (installed into the cache)."""
    tk = system_toolkit()
    if tk is not None:
        echo(f"CUDA toolkit: {tk.root} (the system's)")
    else:
        tk = pypi_toolkit(echo)
        echo(f"CUDA toolkit: {tk.root} (PyPI's; no complete toolkit on the system)")
    if tk.driver is None:
        echo(
            "  no CUDA driver library here: ggml's virtual-memory pool is left out (GGML_CUDA_NO_VMM)"
        )
    else:
        echo(f"  ggml's virtual-memory pool links {tk.driver}")
    return tk


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m llamacpp_instr.native.cuda_toolkit [ARCH]``: the CMake arguments `instr build
    --cuda` builds the wheel with here (the default ones, then the toolkit's), one a line, so that
    bench/gpu_check.sh builds the backend with the same options on a GPU machine."""
    from llamacpp_instr.native import build_plan

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) > 1:
        print("usage: python -m llamacpp_instr.native.cuda_toolkit [ARCH]", file=sys.stderr)
        return 2
    try:
        tk = toolkit(lambda m: print(m, file=sys.stderr))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("\n".join(build_plan.DEFAULT_CMAKE_ARGS + tk.cmake_args(args[0] if args else None)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
