"""Stand-ins for a log's RPC servers, so that ``instr predict`` can build the graphs of a setting
that ran over RPC once the servers are gone (or out of reach: in another network namespace).

llama.cpp places layers on an RPC device only once the device exists, and ggml-rpc makes one only
by connecting to a server. Graph building loads no weights and computes nothing, so a server on
this machine's loopback serving its CPU, as ``rpc-server`` would, gives the same devices (RPC0,
RPC1... in the order added), the same layer placement (split by the devices' memory, which a server
on the same machine reports alike) and the same graphs. The servers are child processes with the
ggml libraries llama_cpp loaded, started once per process and killed when it exits.
"""

from __future__ import annotations

import atexit
import socket
import subprocess
import sys
import time
from pathlib import Path

from llamacpp_instr.contract.errors import UserError

# ggml's RPC server on the ggml libraries of argv[1:4] (base, ggml, rpc): this machine's CPU device
# served at argv[4] with argv[5] threads. The tests' RPC hosts (tests/helpers/netsim.py, rpc_backend.py) run
# the same script.
SERVE_SCRIPT = r"""
import ctypes, sys
base, ggml, rpc = sys.argv[1:4]
ctypes.CDLL(base, mode=ctypes.RTLD_GLOBAL)
ggml = ctypes.CDLL(ggml, mode=ctypes.RTLD_GLOBAL)
rpc = ctypes.CDLL(rpc, mode=ctypes.RTLD_GLOBAL)
ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
cpu = ggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
devs = (ctypes.c_void_p * 1)(cpu)
rpc.ggml_backend_rpc_start_server.argtypes = [
    ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
rpc.ggml_backend_rpc_start_server(sys.argv[4].encode(), None, int(sys.argv[5]), 1, devs)
"""


def server_command(libs: list[str], endpoint: str, threads: int = 1) -> list[str]:
    """The command serving this machine's CPU over RPC at ``endpoint`` with ``threads`` threads,
    on the ggml libraries ``libs`` (libggml-base, libggml, libggml-rpc)."""
    return [sys.executable, "-c", SERVE_SCRIPT, *libs, endpoint, str(threads)]


START_TIMEOUT_S = 30.0

_running: list[tuple[str, subprocess.Popen[bytes]]] = []


def _lib(lib_dir: Path, name: str) -> Path:
    """``name`` as libllama loads it, by its soname (a wheel's ``libggml.so`` is another copy)."""
    for cand in (f"{name}.so.0", f"{name}.so"):
        if (lib_dir / cand).is_file():
            return lib_dir / cand
    raise UserError(f"no {name}.so in {lib_dir}: this build has no RPC backend to stand in with")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start() -> str:
    from llama_cpp import llama_cpp

    lib_dir = Path(llama_cpp._base_path)
    libs = [str(_lib(lib_dir, n)) for n in ("libggml-base", "libggml", "libggml-rpc")]
    endpoint = f"127.0.0.1:{_free_port()}"
    proc = subprocess.Popen(
        server_command(libs, endpoint),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _running.append((endpoint, proc))
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise UserError(f"a stand-in RPC server did not start: {err.strip()[-300:]}")
        try:
            # connect only: the server drops a connection without HELLO and waits for the next
            socket.create_connection(("127.0.0.1", int(endpoint.rsplit(":", 1)[1])), 1).close()
            return endpoint
        except OSError:
            if time.monotonic() > deadline:
                raise UserError("a stand-in RPC server did not start in 30 s") from None
            time.sleep(0.05)


def endpoints(n: int) -> tuple[str, ...]:
    """The endpoints of ``n`` stand-in servers (the first ``n`` started in this process: a device
    stays registered for the process's life, so the same ones serve every later prediction)."""
    while len(_running) < n:
        _start()
    return tuple(ep for ep, _ in _running[:n])


@atexit.register
def _stop() -> None:
    for _, proc in _running:
        if proc.poll() is None:
            proc.kill()
    for _, proc in _running:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    _running.clear()
