"""Which ggml backends a build has: the backend libraries beside the libllama the bindings loaded
(``libggml-cuda.so``, ``libggml-vulkan.so``, ...), whether or not a device of theirs is present."""

from __future__ import annotations

import re
from pathlib import Path

# the library's name -> ggml's name for the backend (its registry's)
NAMES = {
    "cpu": "CPU",
    "cuda": "CUDA",
    "vulkan": "Vulkan",
    "rpc": "RPC",
    "metal": "Metal",
    "blas": "BLAS",
    "hip": "HIP",
    "sycl": "SYCL",
    "opencl": "OpenCL",
}


def in_folder(lib_dir: Path) -> list[str]:
    """The backends whose libraries are in ``lib_dir``, in ``NAMES``' order (others by name)."""
    try:
        files = [p.name for p in lib_dir.iterdir()]
    except OSError:
        return []
    found = {
        m.group(1) for f in files if (m := re.match(r"libggml-([a-z0-9]+)\.(so|dylib|dll)", f))
    }
    found.discard("base")
    order = list(NAMES)
    return [
        NAMES.get(k, k)
        for k in sorted(found, key=lambda k: (order.index(k) if k in order else 99, k))
    ]


def loaded() -> list[str]:
    """The backends of the build the bindings loaded (LLAMA_CPP_LIB_PATH, or the installed wheel's)."""
    from llama_cpp import llama_cpp

    return in_folder(Path(llama_cpp._base_path))
