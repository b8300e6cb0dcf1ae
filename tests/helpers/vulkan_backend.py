"""The Vulkan build on Mesa's lavapipe (a real Vulkan driver that runs on the CPU): GPU code paths
(device buffers, the scheduler's splits, copies between host and device, command buffers with
timestamp queries) on a machine without a GPU.

The Vulkan build's libraries run under the installed CPU build through LLAMA_CPP_LIB_PATH, in a
child process (this process has loaded the CPU libraries already): ``run_offloaded`` runs
``offload_run`` there. Tests skip with the reason when there is no Vulkan build of the current
patches (`instr build --vulkan --no-install` makes it; ``INSTR_VULKAN_LIB`` names another folder,
e.g. a pin tree's build/bin) or no Vulkan device.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llamacpp_instr.native import build
from llamacpp_instr.running.vulkan_env import lavapipe_env

# the child: load `model` with n_gpu_layers, then per level ("off" = no session) reset, decode the
# prompt and greedy tokens, and keep the logits of every position (.npy) and the log
OFFLOAD_CHILD = r"""
import contextlib, json, sys
import numpy as np, llama_cpp, llamacpp_instr
model, out, ngl, levels, prompt, n_gen = sys.argv[1:7]
prompt = [int(t) for t in prompt.split(",")]
llm = llama_cpp.Llama(model, n_ctx=128, n_batch=64, n_threads=2, n_threads_batch=2,
                      logits_all=True, verbose=False, n_gpu_layers=int(ngl))
devices = []
for level in levels.split(","):
    llm.reset()
    log = f"{out}/{level}.log"
    with (contextlib.nullcontext() if level == "off" else llamacpp_instr.session(llm, log, level=level)):
        llm.eval(prompt)
        for _ in range(int(n_gen)):
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
    np.save(f"{out}/{level}.npy", llm.scores[: llm.n_tokens].copy())
llm.close()
"""

# ggml's devices as this build sees them (name, type)
_DEVICES = r"""
import json, llama_cpp
from llamacpp_instr.native import bindings
print(json.dumps(bindings.load().machine_info()["devices"]))
"""


@functools.cache
def vulkan_lib() -> Path:
    """The Vulkan build's libraries, or a skip saying how to get them."""
    named = os.environ.get("INSTR_VULKAN_LIB")
    lib = Path(named) if named else build.vulkan_lib_dir(lambda _: None, build_it=False)
    if lib is None:
        pytest.skip(
            "no Vulkan build of the current patches: build it with "
            "`instr build --vulkan --no-install` (needs libvulkan-dev, glslc, spirv-headers)"
        )
    if not (lib / "libggml-vulkan.so").is_file():
        pytest.skip(f"{lib} holds no Vulkan build (libggml-vulkan.so)")
    return lib


def vulkan_env() -> dict[str, str]:
    return lavapipe_env(vulkan_lib())


@functools.cache
def vulkan_device() -> str:
    """The name of the Vulkan device the runs use, or a skip when there is none."""
    r = subprocess.run(
        [sys.executable, "-c", _DEVICES],
        capture_output=True,
        text=True,
        env=vulkan_env(),
        timeout=120,
    )
    if r.returncode != 0:
        pytest.skip(f"the Vulkan build does not load: {r.stderr.strip()[-300:]}")
    names = [d["name"] for d in json.loads(r.stdout) if d["name"].startswith("Vulkan")]
    if not names:
        pytest.skip(
            "no Vulkan device: install mesa-vulkan-drivers (lavapipe runs Vulkan on the CPU)"
        )
    return str(names[0])


def offload_run(
    model: Path,
    out: Path,
    n_gpu_layers: int,
    levels: tuple[str, ...],
    prompt: tuple[int, ...] = (1, 40, 41, 42, 43, 44),
    n_gen: int = 3,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the child on the Vulkan build: per level, the log (``out/<level>.log``, none for "off")
    and the logits (``out/<level>.npy``)."""
    vulkan_device()
    return run_child(model, out, n_gpu_layers, levels, prompt, n_gen, env or vulkan_env())


def run_child(
    model: Path,
    out: Path,
    n_gpu_layers: int,
    levels: tuple[str, ...],
    prompt: tuple[int, ...],
    n_gen: int,
    env: dict[str, str],
) -> dict[str, Any]:
    """``offload_run`` in ``env`` (the Vulkan build's, see llamacpp_instr.running.vulkan_env)."""
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    args = [str(model), str(out), str(n_gpu_layers), ",".join(levels)]
    args += [",".join(map(str, prompt)), str(n_gen)]
    # a cold shader cache compiles every shader once (minutes on lavapipe); later runs take seconds
    r = subprocess.run(
        [sys.executable, "-c", OFFLOAD_CHILD, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    if r.returncode != 0:
        raise AssertionError(f"the Vulkan run failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return {level: np.load(out / f"{level}.npy") for level in levels}
