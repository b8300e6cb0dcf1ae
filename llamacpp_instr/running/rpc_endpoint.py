"""Whether a ggml RPC server (``--rpc``'s ``HOST:PORT``, ``offload.parse_endpoint``) answers.

ggml-rpc's own client cannot be trusted with a server that is not there: it connects without a
timeout (a host that drops SYNs blocks it for the kernel's ~2 minutes of retries), and on any
failure, a refused connection or a protocol version it does not speak, it calls ``GGML_ABORT``
and the process dies. So every endpoint is checked here first, with a bounded TCP connect and
ggml-rpc's own HELLO (the first command every server expects), and a one-line error says which
endpoint failed and how. Pure Python: importable without llama_cpp.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from llamacpp_instr.contract.errors import UserError

# The pin's ggml-rpc protocol (ggml/include/ggml-rpc.h): its client refuses a server whose major
# differs or whose minor is greater than its own (negotiate_hello), and aborts.
RPC_PROTO_MAJOR = 7
RPC_PROTO_MINOR = 0
_CMD_HELLO = 14  # RPC_CMD_HELLO, "must be always 14"
_CONN_CAPS_SIZE = 24  # RPC_CONN_CAPS_SIZE (transport.h): zeros ask for plain TCP
_HELLO_REPLY = 4 + _CONN_CAPS_SIZE  # rpc_msg_hello_rsp: major, minor, patch, padding, conn_caps

# The whole check of one endpoint (name lookup, connect, HELLO) ends within this many seconds;
# all endpoints are checked at once, so a list of them takes no longer.
PROBE_TIMEOUT_S = 5.0


def _resolve(host: str, port: int, deadline: float) -> tuple[int, tuple[str, int]]:
    """The first IPv4 address of ``host`` (ggml-rpc connects over IPv4), within the deadline: a
    name lookup can block on an unreachable DNS server, so it runs on a thread of its own."""
    out: list[object] = []

    def lookup() -> None:
        try:
            out.append(socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM))
        except OSError as exc:
            out.append(exc)

    t = threading.Thread(target=lookup, daemon=True)
    t.start()
    t.join(max(0.0, deadline - time.monotonic()))
    if not out:
        raise TimeoutError
    if isinstance(out[0], OSError):
        raise out[0]
    infos = out[0]
    assert isinstance(infos, list) and infos
    family, _, _, _, addr = infos[0]
    return family, addr


def _recv_exactly(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = b""
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionResetError
        buf += chunk
    return buf


def hello(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> tuple[int, int, int]:
    """Connect to ``endpoint`` and exchange ggml-rpc's HELLO; the server's protocol version, or a
    one-line UserError (no answer, refused, not an RPC server...). Closes the connection: the
    server then waits for its next client (it serves one at a time)."""
    host, _, port_s = endpoint.partition(":")
    port = int(port_s)
    deadline = time.monotonic() + timeout
    try:
        family, addr = _resolve(host, port, deadline)
    except TimeoutError:
        raise UserError(f"--rpc {endpoint}: looking up {host} took over {timeout:g} s") from None
    except OSError as exc:
        raise UserError(f"--rpc {endpoint}: cannot resolve {host} ({exc.strerror})") from None
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            sock.connect(addr)
        except TimeoutError:
            raise UserError(
                f"--rpc {endpoint}: no answer within {timeout:g} s (is the host up and the port "
                "open?)"
            ) from None
        except ConnectionRefusedError:
            raise UserError(
                f"--rpc {endpoint}: connection refused (is rpc-server running there?)"
            ) from None
        except OSError as exc:
            raise UserError(f"--rpc {endpoint}: cannot connect ({exc.strerror})") from None
        request = bytes([_CMD_HELLO]) + struct.pack("<Q", _CONN_CAPS_SIZE) + bytes(_CONN_CAPS_SIZE)
        try:
            sock.sendall(request)
            size = struct.unpack("<Q", _recv_exactly(sock, 8, deadline))[0]
            if size != _HELLO_REPLY:
                raise UserError(
                    f"--rpc {endpoint}: not a ggml RPC server (its reply to HELLO has {size} "
                    f"bytes, not {_HELLO_REPLY})"
                )
            major, minor, patch = _recv_exactly(sock, _HELLO_REPLY, deadline)[:3]
        except TimeoutError:
            raise UserError(
                f"--rpc {endpoint}: connected, but no reply to ggml-rpc's HELLO within "
                f"{timeout:g} s (not an RPC server, or one busy with another client)"
            ) from None
        except OSError:
            raise UserError(
                f"--rpc {endpoint}: the connection closed during ggml-rpc's HELLO (not an RPC "
                "server of this protocol?)"
            ) from None
    if major != RPC_PROTO_MAJOR or minor > RPC_PROTO_MINOR:
        raise UserError(
            f"--rpc {endpoint}: the server speaks RPC protocol {major}.{minor}.{patch}; this "
            f"build's client speaks {RPC_PROTO_MAJOR}.{RPC_PROTO_MINOR}.x"
        )
    return major, minor, patch


def check_all(endpoints: tuple[str, ...], timeout: float = PROBE_TIMEOUT_S) -> None:
    """HELLO every endpoint at once; the first failure (in the list's order) as a UserError."""
    if not endpoints:
        return
    with ThreadPoolExecutor(max_workers=len(endpoints)) as pool:
        futures = [pool.submit(hello, ep, timeout) for ep in endpoints]
        errors = [f.exception() for f in futures]
    for exc in errors:
        if exc is not None:
            raise exc
