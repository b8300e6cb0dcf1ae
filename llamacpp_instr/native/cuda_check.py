"""`instr build --check --cuda`: compile the CUDA sources the patches and the overlay touch, with
the CUDA toolkit `instr build --cuda` would use (the system's, else PyPI's), without a GPU and
without building the whole backend (38 to 70 CPU-minutes): the patched tree is configured as the
CUDA wheel is, then only the objects of the ``.cu`` files a patch edits or the overlay adds
(``ggml-cuda/instr.cu``) are compiled. A change to ggml-cuda that does not compile fails here, on
any machine. The op timer's own sources (``src/llama-instr-ops-cuda.cpp``,
``llama-instr-gpu-marks.cpp``) are plain C++, compiled by every build.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import build_plan, cuda_toolkit, patching, pin, progress
from llamacpp_instr.native.paths import cache_dir

CUDA_DIR = "ggml/src/ggml-cuda/"

# the architecture checked when none is named: the lent GPUs' (H100, H200)
DEFAULT_ARCH = "90"


def touched_cuda_sources(
    patches: Sequence[Path], overlay: Sequence[tuple[str, Path]] = ()
) -> list[str]:
    """The ``.cu`` files of ggml-cuda that the (llama.cpp) patches add or edit, in order, then
    those of the overlay (``patching.read_overlay``'s pairs)."""
    found: list[str] = []
    for p in patches:
        if p.parent.name == patching.PYTHON_PATCH_DIR:
            continue
        for m in re.finditer(r"^\+\+\+ b/(\S+)$", p.read_text(errors="replace"), re.M):
            path = m.group(1)
            if path.startswith(CUDA_DIR) and path.endswith(".cu") and path not in found:
                found.append(path)
    for rel, _ in overlay:
        if rel.startswith(CUDA_DIR) and rel.endswith(".cu") and rel not in found:
            found.append(rel)
    return found


def object_target(source: str) -> str:
    """The Ninja target of a ggml-cuda source's object, in the build folder."""
    name = source[len(CUDA_DIR) :]
    return f"{CUDA_DIR}CMakeFiles/ggml-cuda.dir/{name}.o"


def check(echo: progress.Echo, arch: str | None = None) -> list[str]:
    """Compile the CUDA sources the patches and the overlay touch for ``arch``; returns them."""
    if shutil.which("ninja") is None:
        raise UserError("the CUDA check needs ninja (apt-get install ninja-build)")
    arch = arch or DEFAULT_ARCH
    tk = cuda_toolkit.toolkit(echo)
    plan = build_plan.make_plan(tk.cmake_args(arch))
    sources = touched_cuda_sources(plan.patches, plan.overlay)
    if not sources:
        echo("neither a patch nor the overlay touches ggml's CUDA sources: nothing to compile")
        return []
    work = cache_dir() / "cuda-check" / plan.key
    t0 = time.monotonic()
    build_plan.prepare_source(plan, work / "src", lambda m: None)
    tree = work / "src" / f"llama_cpp_python-{pin.LLAMA_CPP_PYTHON_VERSION}" / pin.VENDOR_DIR
    args, env = build_plan.compile_env(plan, work)
    args += [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        "-DGGML_NATIVE=OFF",
        "-DLLAMA_BUILD_COMMON=OFF",
        "-DLLAMA_BUILD_TOOLS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
    ]
    bdir = work / "build"
    log = cache_dir() / "logs" / f"cuda-check-{plan.key}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    echo(f"compiling {len(sources)} CUDA sources for sm_{arch} (log: {log})")
    with log.open("w") as lf:
        steps = [
            ["cmake", "-S", str(tree), "-B", str(bdir), "-G", "Ninja", *args],
            ["ninja", "-C", str(bdir), *[object_target(s) for s in sources]],
        ]
        for cmd in steps:
            r = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env)
            if r.returncode != 0:
                lines = log.read_text(errors="replace").splitlines()
                errors = [ln for ln in lines if "error" in ln.lower()] or lines[-3:] or ["?"]
                raise UserError(f"the CUDA check failed: {errors[0].strip()}; full log: {log}")
    shutil.rmtree(work, ignore_errors=True)  # ccache keeps the objects
    echo(
        f"compiled {', '.join(s[len(CUDA_DIR) :] for s in sources)} for sm_{arch} with "
        f"{tk.source} CUDA ({tk.root}) in {time.monotonic() - t0:.0f}s"
    )
    return sources
