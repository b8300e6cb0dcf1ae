"""The environment that runs the Vulkan build (`instr build --vulkan`) on this machine's Vulkan
device, and Mesa's lavapipe (a Vulkan driver running on the CPU) where there is no GPU.

- ggml-vulkan skips devices of the CPU type, so lavapipe is used only when
  ``GGML_VK_VISIBLE_DEVICES`` names it: with a real GPU, leave the variable unset.
- Mesa compiles each shader the first time it is used (10-20 s for a matmul on lavapipe) and keeps
  the result in ``MESA_SHADER_CACHE_DIR``: kept under the cache, later runs start warm.
- lavapipe starts a worker thread per core: ``LP_NUM_THREADS`` sets how many.
- ``lib`` runs the Vulkan build's libraries under the installed (CPU) llama-cpp-python through
  ``LLAMA_CPP_LIB_PATH`` (``build.vulkan_lib_dir``), so a CPU install runs Vulkan tests too.
"""

from __future__ import annotations

import os
from pathlib import Path

from llamacpp_instr.native.paths import cache_dir


def shader_cache_dir() -> Path:
    return cache_dir() / "mesa-shader-cache"


def lavapipe_env(
    lib: Path | None = None, threads: int = 2, base: dict[str, str] | None = None
) -> dict[str, str]:
    """``base`` (the process's environment) with what a run on lavapipe needs."""
    env = dict(os.environ if base is None else base)
    env["GGML_VK_VISIBLE_DEVICES"] = "0"
    env["MESA_SHADER_CACHE_DIR"] = str(shader_cache_dir())
    env["LP_NUM_THREADS"] = str(threads)
    # Mesa and the Vulkan loader warn on every start without one
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    if lib is not None:
        env["LLAMA_CPP_LIB_PATH"] = str(lib)
    return env
