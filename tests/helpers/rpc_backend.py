"""A second ggml backend on a machine without a GPU: ggml's RPC backend, served on loopback.

`instr build` builds ggml with GGML_RPC=ON. A child process serves its CPU backend with
``ggml_backend_rpc_start_server``; this process registers that server as a device, and llama.cpp
then offloads layers to it as it would to a GPU: the graph is split between the CPU and RPC
backends, and ggml's scheduler copies tensors between them. The offload code paths (splits,
cross-backend copies, computes with no op on the CPU backend) are exercised for real.

A registered device stays registered for the life of the process, and llama.cpp would then offload
ops of every later model to it: ``run_offloaded`` runs the code that needs it in a child process.
"""

from __future__ import annotations

import ctypes
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers.support import free_port
from llamacpp_instr.running import rpc_standin


def lib_dir() -> Path:
    """The native libraries the bindings loaded (LLAMA_CPP_LIB_PATH, or the installed wheel's)."""
    from llama_cpp import llama_cpp

    return Path(llama_cpp._base_path)


def _lib(name: str) -> Path:
    """``name`` as libllama loads it: by its soname (``libggml.so.0``). A wheel holds no symbolic
    links, so ``libggml.so`` is another copy of the file, and loading it would give this process a
    second ggml with a device registry of its own, which libllama never sees."""
    for cand in (f"{name}.so.0", f"{name}.so"):
        if (lib_dir() / cand).is_file():
            return lib_dir() / cand
    raise RuntimeError(f"no {name}.so in {lib_dir()}: the build has no RPC backend")


@contextmanager
def rpc_server() -> Iterator[str]:
    """Serve a CPU backend over RPC on loopback (a child process, as rpc-server would); yields its
    endpoint, ``127.0.0.1:PORT``. It serves one client at a time, as rpc-server does."""
    base, ggml_lib, rpc_lib = _lib("libggml-base"), _lib("libggml"), _lib("libggml-rpc")
    endpoint = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        rpc_standin.server_command([str(base), str(ggml_lib), str(rpc_lib)], endpoint),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        host, port = endpoint.split(":")
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                assert proc.stderr is not None
                raise RuntimeError(f"the RPC server exited: {proc.stderr.read().decode()[-500:]}")
            # connect only: the server takes the connection as a client and drops it at once
            # (no HELLO), then waits for the next
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the RPC server did not start in 30 s") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.kill()
        proc.wait()


@contextmanager
def rpc_device() -> Iterator[str]:
    """Serve a CPU backend over RPC on loopback and register it here as a device; yields its
    endpoint. llama.cpp models loaded with n_gpu_layers > 0 inside the block offload to it."""
    ggml_lib, rpc_lib = _lib("libggml"), _lib("libggml-rpc")
    with rpc_server() as endpoint:
        ggml = ctypes.CDLL(str(ggml_lib), mode=ctypes.RTLD_GLOBAL)
        rpc = ctypes.CDLL(str(rpc_lib), mode=ctypes.RTLD_GLOBAL)
        rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
        rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
        reg = rpc.ggml_backend_rpc_add_server(endpoint.encode())
        if not reg:
            raise RuntimeError(f"the RPC server at {endpoint} has no device")
        ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
        ggml.ggml_backend_register(reg)
        yield endpoint


def run_offloaded(code: str, timeout: float = 300) -> None:
    """Run ``code`` (Python) in a child process with an RPC device registered (``endpoint`` is
    bound to its address); raise with the child's output if it fails."""
    prelude = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})\n"
        "from helpers.rpc_backend import rpc_device\n"
        "with rpc_device() as endpoint:\n"
    )
    body = "".join(f"    {line}\n" for line in code.strip().splitlines())
    r = subprocess.run(
        [sys.executable, "-c", prelude + body], capture_output=True, text=True, timeout=timeout
    )
    if r.returncode != 0:
        raise AssertionError(f"offloaded run failed ({r.returncode}):\n{r.stderr[-3000:]}")
