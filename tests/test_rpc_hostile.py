"""A lying RPC peer never kills the run (issue 35): a proxy between the patched client and a
patched server rewrites the block of op times the server sends in front of a reply (a huge
n_fused, a 1 GiB size, one graph too many, a truncated block). The client drops those times, says
so once, turns remote timing off for that server, and generates the same tokens as a local run.
Before the fix every one of these aborted the client (RPC_STATUS_ASSERT) or grew it without bound.

The proxy follows the protocol (| cmd | size | payload | from the client; | size | payload | per
reply), so that it knows which of the server's messages is a block: the first one in front of a
reply, when graphs were computed with timing on since the last reply."""

from __future__ import annotations

import json
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import netsim
from helpers.support import by_type, free_port, loopback_server, read_log

pytestmark = pytest.mark.native

PROMPT = "The capital of France is"
N_PREDICT = 8

# the pin's commands that the server answers (ggml-rpc.cpp's rpc_serve_client), and the patch's
REPLIED = {0, 1, 2, 3, 7, 8, 9, 11, 13, 14, 15, 31}
GRAPH_COMPUTE, GRAPH_RECOMPUTE, INSTR_TIMING = 10, 16, 30
BLOCK, GRAPH, OP = 16, 56, 16  # rpc_instr_block, rpc_instr_graph, rpc_instr_op (packed)


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def graph_entries(b: bytes | bytearray) -> Iterator[tuple[int, int]]:
    """Where each graph's entry of a block is, and its op count."""
    at = BLOCK
    for _ in range(struct.unpack_from("<I", b, 0)[0]):
        n_ops = struct.unpack_from("<I", b, at + 8)[0]
        yield at, n_ops
        at += GRAPH + n_ops * OP


def lie(mode: str, payload: bytes, out: socket.socket) -> None:
    """Send the block ``payload`` to the client, rewritten as ``mode`` says."""
    b = bytearray(payload)
    n_ops = struct.unpack_from("<I", b, BLOCK + 8)[0]
    if mode == "n_fused" and n_ops > 0:
        struct.pack_into("<i", b, BLOCK + GRAPH + 4, 2**31 - 1)
    elif mode == "overlap":
        # every op fused with the nodes up to the last op's: each in the graph, all overlapping
        # (N ops print about N^2/2 node indices)
        for at, n in graph_entries(b):
            ops = [at + GRAPH + i * OP for i in range(n)]
            if ops:
                last = struct.unpack_from("<i", b, ops[-1])[0]
                for o in ops:
                    struct.pack_into("<i", b, o + 4, last - struct.unpack_from("<i", b, o)[0])
    elif mode == "late":
        # every op 2^62 ns late on the server's clock (well formed otherwise)
        for at, n in graph_entries(b):
            for field in [at + 48] + [at + GRAPH + i * OP + 8 for i in range(n)]:
                struct.pack_into("<q", b, field, struct.unpack_from("<q", b, field)[0] + 2**62)
    elif mode == "graphs":
        struct.pack_into("<I", b, 0, struct.unpack_from("<I", b, 0)[0] + 1)
    elif mode == "truncated":
        del b[-8:]
    if mode == "size":
        size = 1 << 30
        out.sendall(struct.pack("<Q", size) + bytes(b))
        zeros = bytes(1 << 20)
        for left in range(size - len(b), 0, -len(zeros)):
            out.sendall(zeros[: min(left, len(zeros))])
    else:
        out.sendall(struct.pack("<Q", len(b)) + bytes(b))


def serve_connection(
    client: socket.socket, upstream: str, mode: str, lies: list[str], hello: int | None = None
) -> None:
    """Relay one client's connection to ``upstream``; the first block of times is rewritten as
    ``mode`` says, and the HELLO reply's padding byte is replaced by ``hello`` unless it is None."""
    host, port = upstream.split(":")
    server = socket.create_connection((host, int(port)))
    # per reply: is a block in front of it? None: the client went away (the other thread ends too,
    # so that no thread outlives the test: a process with threads is never forked, test_prefetch)
    expect: queue.Queue[bool | None] = queue.Queue()

    def client_to_server() -> None:
        timing, pending = False, 0
        try:
            while True:
                cmd = recv_exact(client, 1)[0]
                size_b = recv_exact(client, 8)
                payload = recv_exact(client, struct.unpack("<Q", size_b)[0])
                if cmd == INSTR_TIMING:
                    timing = payload[:1] == b"\x01"
                    lies.append(f"timing {timing}")
                elif cmd in (GRAPH_COMPUTE, GRAPH_RECOMPUTE) and timing:
                    pending += 1
                if cmd in REPLIED:
                    expect.put(pending > 0)
                    pending = 0
                server.sendall(bytes([cmd]) + size_b + payload)
        except (EOFError, OSError):
            expect.put(None)
            server.close()

    def server_to_client() -> None:
        try:
            if (
                hello is not None
            ):  # the first reply is HELLO's: | major minor patch padding | caps |
                rsp = bytearray(recv_exact(server, struct.unpack("<Q", recv_exact(server, 8))[0]))
                if expect.get() is None:
                    raise EOFError
                lies.append(f"hello 0x{rsp[3]:02x} -> 0x{hello:02x}")
                rsp[3] = hello
                client.sendall(struct.pack("<Q", len(rsp)) + bytes(rsp))
            while True:
                block = expect.get()
                if block is None:
                    break
                if block:
                    payload = recv_exact(server, struct.unpack("<Q", recv_exact(server, 8))[0])
                    if mode not in lies:
                        lies.append(mode)
                        lie(mode, payload, client)
                    else:
                        client.sendall(struct.pack("<Q", len(payload)) + payload)
                size_b = recv_exact(server, 8)
                client.sendall(size_b + recv_exact(server, struct.unpack("<Q", size_b)[0]))
        except (EOFError, OSError):
            pass
        client.close()

    for fn in (client_to_server, server_to_client):
        threading.Thread(target=fn, daemon=True).start()


@contextmanager
def liar(upstream: str, mode: str, hello: int | None = None) -> Iterator[tuple[str, list[str]]]:
    """A proxy at a free loopback port; yields its endpoint and the list of what it saw and told."""
    lies: list[str] = []
    with loopback_server(
        lambda conn: serve_connection(conn, upstream, mode, lies, hello)
    ) as endpoint:
        yield endpoint, lies


@contextmanager
def patched_server() -> Iterator[str]:
    """A patched RPC server (the libraries the bindings loaded) at a free loopback port."""
    from helpers.rpc_backend import lib_dir

    upstream = f"127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        netsim.server_command(lib_dir(), upstream),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        netsim._wait_accepting(upstream, 30)
        yield upstream
    finally:
        server.kill()
        server.wait()


def run_client(model: Path, endpoint: str, log: Path) -> subprocess.CompletedProcess[str]:
    code = netsim.client_script(model, [endpoint], N_PREDICT, PROMPT, log=log)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )


def tokens_of(r: subprocess.CompletedProcess[str]) -> list[int]:
    assert r.returncode == 0, f"the client died ({r.returncode}): {r.stderr[-3000:]}"
    return list(json.loads(r.stdout.strip().splitlines()[-1])["tokens"])


@pytest.fixture(scope="module")
def local_tokens(tiny_llama_f32: Path) -> list[int]:
    return netsim.local_tokens(tiny_llama_f32, N_PREDICT, PROMPT)


# overlap: ops that overlap (issue 55 §1; before the fix they were accepted, and the log grew
# quadratically with the graph's nodes)
@pytest.mark.parametrize("mode", ["n_fused", "size", "graphs", "truncated", "overlap"])
def test_a_lying_peer_never_kills_the_run(
    mode: str, tiny_llama_f32: Path, local_tokens: list[int], tmp_path: Path
) -> None:
    log = tmp_path / f"{mode}.log"
    with patched_server() as upstream, liar(upstream, mode) as (endpoint, lies):
        r = run_client(tiny_llama_f32, endpoint, log)
    assert tokens_of(r) == local_tokens
    assert mode in lies, "the proxy never saw a block of times to rewrite"
    warnings = [ln for ln in r.stderr.splitlines() if "malformed block of op times" in ln]
    assert len(warnings) == 1, r.stderr[-3000:]
    assert endpoint in warnings[0] and "remote op timing is off for this server" in warnings[0]
    # the session ended well, and after the lie no remote op time reached the log
    recs = read_log(log)
    assert by_type(recs, "session_end")[0]["status"] == "ok"
    computes = by_type(recs, "compute")
    assert computes
    remote = [i for i, c in enumerate(computes) if c.get("remote")]
    assert all(i < len(computes) // 2 for i in remote), remote


# A HELLO byte that is not exactly this build's (a magic value in the low nibble, the version in the
# high one: 0x2a): the bare bit of builds before the magic, a later version's layout, a byte that a
# future upstream may set. Before the magic, the client timed any server whose byte had bit 0 set.
@pytest.mark.parametrize("byte", [0x01, 0x3A, 0x25])
def test_a_server_of_another_timing_version_runs_untimed(
    byte: int, tiny_llama_f32: Path, local_tokens: list[int], tmp_path: Path
) -> None:
    log = tmp_path / "foreign-hello.log"
    with patched_server() as upstream, liar(upstream, "none", hello=byte) as (endpoint, lies):
        r = run_client(tiny_llama_f32, endpoint, log)
    assert tokens_of(r) == local_tokens
    assert lies and lies[0] == f"hello 0x2a -> 0x{byte:02x}", lies
    # the client never asked that server to time its graphs, and said why once
    assert "timing True" not in lies, lies
    warnings = [ln for ln in r.stderr.splitlines() if "offers op timing this build" in ln]
    assert len(warnings) == 1, r.stderr[-3000:]
    assert endpoint in warnings[0] and f"0x{byte:02x}" in warnings[0]
    recs = read_log(log)
    assert by_type(recs, "session_end")[0]["status"] == "ok"
    (rpc,) = [
        d for d in by_type(recs, "session_start")[0]["machine"]["devices"] if d["backend"] == "RPC"
    ]
    assert rpc["remote_timing"] is False
    computes = by_type(recs, "compute")
    assert computes and not [c for c in computes if c.get("remote")]


def test_the_proxy_keeps_this_builds_hello(
    tiny_llama_f32: Path, local_tokens: list[int], tmp_path: Path
) -> None:
    """The same proxy writing back the byte this build sends: the server is timed (so that the
    test above fails for the byte, not for the proxy)."""
    log = tmp_path / "own-hello.log"
    with patched_server() as upstream, liar(upstream, "none", hello=0x2A) as (endpoint, lies):
        r = run_client(tiny_llama_f32, endpoint, log)
    assert tokens_of(r) == local_tokens
    assert "timing True" in lies, lies
    assert "offers op timing" not in r.stderr
    computes = by_type(read_log(log), "compute")
    assert [c for c in computes if c.get("remote")]


def test_a_peers_clock_cannot_place_ops_outside_the_round_trip(
    tiny_llama_f32: Path, local_tokens: list[int], tmp_path: Path
) -> None:
    """A server reporting every op 2^62 ns late (issue 55 §1): its times are clamped to the
    interval the client measured, from sending the graph to the reply that carried them, so every
    remote op lies within its graph's send and reply, and each compute's duration stays that of
    the step. Before the fix they were placed 2^62 ns away, and the summary's op-time coverage
    overflowed to -122,600,700,014,604 %."""
    log = tmp_path / "late.log"
    with patched_server() as upstream, liar(upstream, "late") as (endpoint, lies):
        r = run_client(tiny_llama_f32, endpoint, log)
    assert tokens_of(r) == local_tokens
    assert "late" in lies, "the proxy never saw a block of times to rewrite"
    assert "malformed" not in r.stderr
    recs = read_log(log)
    steps = {s["step"]: s for s in by_type(recs, "step_end")}
    n_checked = 0
    for c in by_type(recs, "compute"):
        if not c.get("remote"):
            continue
        rpc = {rem[1] for rem in c["remote"]}
        owner = {i: sp[0] for sp in c["splits"] for i in range(sp[1], sp[2])}
        lo = min(rem[2] for rem in c["remote"])
        hi = max(rem[3] for rem in c["remote"])
        for rem in c["remote"]:
            assert rem[2] <= rem[4] <= rem[5] <= rem[3], rem
        for op in c.get("ops", []):
            if owner.get(op[0]) in rpc:
                assert lo <= op[1] and op[1] + op[2] <= hi, (op, lo, hi)
                n_checked += 1
        s = steps[c["step"]]
        assert c["t_start"] + c["dur"] <= s["t_start"] + s["dur"] + 10**9, (c, s)
    assert n_checked > 0


# ggml's RPC server with two devices on one connection (this machine's CPU, served twice)
TWO_DEVICES = r"""
import ctypes, sys
base, ggml, rpc = sys.argv[1:4]
ctypes.CDLL(base, mode=ctypes.RTLD_GLOBAL)
ggml = ctypes.CDLL(ggml, mode=ctypes.RTLD_GLOBAL)
rpc = ctypes.CDLL(rpc, mode=ctypes.RTLD_GLOBAL)
ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
cpu = ggml.ggml_backend_dev_by_type(0)
devs = (ctypes.c_void_p * 2)(cpu, cpu)
rpc.ggml_backend_rpc_start_server.argtypes = [
    ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
rpc.ggml_backend_rpc_start_server(sys.argv[4].encode(), None, 1, 2, devs)
"""

# a client's first lines: the build's ggml with the RPC server at {endpoint} registered as a
# backend (a format template, as the clients below)
RPC_CLIENT_HEAD = r"""
import ctypes, json, sys
from pathlib import Path
import llama_cpp
from llama_cpp import llama_cpp as L
sys.path.insert(0, {tests!r})
from helpers.netsim import lib_file
import llamacpp_instr
lib = Path(L._base_path)
ggml = ctypes.CDLL(str(lib_file(lib, "libggml")), mode=ctypes.RTLD_GLOBAL)
rpc = ctypes.CDLL(str(lib_file(lib, "libggml-rpc")), mode=ctypes.RTLD_GLOBAL)
rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
ggml.ggml_backend_register(rpc.ggml_backend_rpc_add_server({endpoint!r}.encode()))
"""

# the client: the model split 3:1 over the server's two devices, generating greedily
SPLIT_CLIENT = RPC_CLIENT_HEAD + r"""
llm = llama_cpp.Llama({model!r}, n_ctx=256, n_batch=64, n_threads=1, verbose=False,
                      n_gpu_layers=99, tensor_split=[3.0, 1.0])
prompt = llm.tokenize(b"The capital of France is", add_bos=True)
out = []
with llamacpp_instr.session(llm, {log!r}, level="detailed"):
    for tok in llm.generate(prompt, temp=0.0, reset=True):
        out.append(int(tok))
        if len(out) >= 8:
            break
llm.close()
print(json.dumps({{"tokens": out}}))
"""


def test_a_server_with_two_devices_is_timed_on_both(tiny_dir: Path, tmp_path: Path) -> None:
    """An honest server with two devices on one connection, the model split 3:1 between them
    (issue 55 §1): the graphs it computes again (a recompute names only its device) are bounded by
    that device's last graph, so every step keeps its remote times on both devices. Before the
    fix the bound was the connection's last graph (the smaller device's): the larger device's
    recompute brought more ops than that, its block was refused as malformed, and timing stayed
    off for the server."""
    from helpers.rpc_backend import lib_dir
    from helpers.tiny_gguf import write_tiny_model

    model = write_tiny_model(tiny_dir / "split-4.gguf", arch="llama", n_layer=4, seed=21)
    libs = [str(netsim.lib_file(lib_dir(), n)) for n in ("libggml-base", "libggml", "libggml-rpc")]
    upstream = f"127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [sys.executable, "-c", TWO_DEVICES, *libs, upstream],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log = tmp_path / "split.log"
    try:
        netsim._wait_accepting(upstream, 30)
        code = SPLIT_CLIENT.format(
            tests=str(Path(__file__).resolve().parent),
            endpoint=upstream,
            model=str(model),
            log=str(log),
        )
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
        )
    finally:
        server.kill()
        server.wait()
    assert r.returncode == 0, r.stderr[-3000:]
    assert "malformed" not in r.stderr, r.stderr[-3000:]
    recs = read_log(log)
    rpc = [
        d["index"]
        for d in by_type(recs, "session_start")[0]["machine"]["devices"]
        if d["backend"] == "RPC"
    ]
    assert len(rpc) == 2, rpc
    computes = by_type(recs, "compute")
    # the generation steps (graphs recomputed): each compute's remote times on both devices
    late = computes[len(computes) // 2 :]
    assert late and all({rem[1] for rem in c.get("remote", [])} == set(rpc) for c in late), [
        sorted({rem[1] for rem in c.get("remote", [])}) for c in computes
    ]


# the client: the graph built and sent before the session, then reused in it (a recompute)
LATE_CLIENT = RPC_CLIENT_HEAD + r"""
llm = llama_cpp.Llama({model!r}, n_ctx=128, n_batch=16, n_threads=1, verbose=False,
                      n_gpu_layers=99)
llm.eval([1, 2, 3, 4])
llm.eval([5])
with llamacpp_instr.session(llm, {log!r}, level="detailed"):
    for t in range(6, 12):
        llm.eval([t])
llm.close()
"""


def test_a_session_begun_on_a_sent_graph_keeps_remote_timing(
    tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """The generation graph sent to the server before the session, and reused in it: the first
    graph of the session is a recompute (issue 55 §1). It is bounded by that device's last graph,
    whenever it was sent, so the session keeps its remote times. Before the fix the bound was
    noted only while timing was on: the first recompute's times were refused as malformed and
    remote timing turned off for an honest server."""
    log = tmp_path / "late.log"
    with patched_server() as upstream:
        code = LATE_CLIENT.format(
            tests=str(Path(__file__).resolve().parent),
            endpoint=upstream,
            model=str(tiny_llama_f32),
            log=str(log),
        )
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
        )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "malformed" not in r.stderr, r.stderr[-3000:]
    computes = by_type(read_log(log), "compute")
    assert len(computes) == 6 and all(c.get("remote") for c in computes[1:]), [
        len(c.get("remote", [])) for c in computes
    ]
