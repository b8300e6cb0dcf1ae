"""A network on this machine, for ggml's RPC backend: servers on hosts of their own, reached over
links of a known rate and delay.

Each RPC server runs in a network namespace of its own (a "host"), joined to the client's namespace
by a veth pair whose both ends shape their egress with ``tc tbf`` (the link's rate). This kernel has
no ``netem``, so the delay is a TCP proxy on the host (``python netsim.py proxy``): it reads what
arrives on the link and forwards each chunk a fixed time after it arrived, both ways; the server
itself listens on the host's loopback only. The client runs in its own namespace too, so that its
TCP send buffer can be bounded (``net.ipv4.tcp_wmem`` is per namespace): the host time of a command
without a reply ends when its last byte entered that buffer, so a small buffer keeps it near the
link's real transfer time. Nothing touches the machine's own namespace: every interface, address
and setting lives in namespaces made here and deleted on exit, whatever happens.

Where namespaces cannot be made (not root, no ``ip``), ``loopback=True`` gives the same servers and
proxies on 127.0.0.1: the delay holds, the rate does not (tests that need it skip and say so).

Every wait here is bounded in time, and every process started is killed on exit.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamacpp_instr.running import rpc_standin

HERE = Path(__file__).resolve()


# the client's TCP send buffer (min, default, max): well above the links' bandwidth-delay products
CLIENT_WMEM = "4096 65536 262144"


def lib_file(lib_dir: Path, name: str) -> Path:
    """``name`` as libllama loads it, by its soname (a wheel's libggml.so is another copy)."""
    for cand in (f"{name}.so.0", f"{name}.so"):
        if (lib_dir / cand).is_file():
            return lib_dir / cand
    raise RuntimeError(f"no {name}.so in {lib_dir}: the build has no RPC backend")


def binary_server_command(exe: Path, threads: int = 1) -> list[str]:
    """ggml-rpc-server (as `instr build --tools` builds it) serving this machine's CPU, for
    Network: {host} and {port} are filled in."""
    return [str(exe), "-H", "{host}", "-p", "{port}", "-t", str(threads)]


def server_command(lib_dir: Path, endpoint: str, threads: int = 1) -> list[str]:
    """Serve this machine's CPU over RPC at endpoint with the ggml libraries of lib_dir."""
    libs = [str(lib_file(lib_dir, n)) for n in ("libggml-base", "libggml", "libggml-rpc")]
    return rpc_standin.server_command(libs, endpoint, threads)


# A client of the hosts: registers each endpoint as an RPC device (with the ggml libraries llama_cpp
# loaded: LLAMA_CPP_LIB_PATH or the installed wheel's), loads the model with every layer offloaded
# (none without endpoints), and generates greedily; prints {"tokens": [...], "gen_s": seconds of the
# whole generation, "decode_s": seconds from the first token to the last (the prompt excluded)}.
# With a log, the patched build's session records it (the model's upload included).
CLIENT = r"""
import ctypes, json, sys, time
from pathlib import Path
import llama_cpp
from llama_cpp import llama_cpp as L
sys.path.insert(0, {tests!r})
from helpers.netsim import lib_file
endpoints, model, log, level = {endpoints!r}, {model!r}, {log!r}, {level!r}
lib = Path(L._base_path)
if endpoints:
    ggml = ctypes.CDLL(str(lib_file(lib, "libggml")), mode=ctypes.RTLD_GLOBAL)
    rpc = ctypes.CDLL(str(lib_file(lib, "libggml-rpc")), mode=ctypes.RTLD_GLOBAL)
    rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
    for ep in endpoints:
        reg = rpc.ggml_backend_rpc_add_server(ep.encode())
        assert reg, ep
        ggml.ggml_backend_register(reg)
if log:
    import llamacpp_instr
    llamacpp_instr.record_transfers()
llm = llama_cpp.Llama(model, n_ctx=256, n_batch=64, n_threads={threads}, n_threads_batch={threads},
                      verbose=False, n_gpu_layers=99 if endpoints else 0)
prompt = llm.tokenize({prompt!r}.encode(), add_bos=True)

def generate():
    out, times = [], []
    t0 = time.perf_counter()
    for tok in llm.generate(prompt, temp=0.0, reset=True):
        out.append(int(tok))
        times.append(time.perf_counter())
        if len(out) >= {n_predict}:
            break
    return out, times[-1] - t0, times[-1] - times[0]

if log:
    with llamacpp_instr.session(llm, log, level=level):
        tokens, gen_s, decode_s = generate()
else:
    tokens, gen_s, decode_s = generate()
llm.close()
print(json.dumps({{"tokens": tokens, "gen_s": gen_s, "decode_s": decode_s}}))
"""


def client_script(
    model: Path,
    endpoints: Sequence[str],
    n_predict: int,
    prompt: str,
    log: Path | None = None,
    level: str = "detailed",
    threads: int = 1,
) -> str:
    return CLIENT.format(
        tests=str(HERE.parent.parent),
        endpoints=list(endpoints),
        model=str(model),
        log=str(log) if log else None,
        level=level,
        threads=threads,
        n_predict=n_predict,
        prompt=prompt,
    )


def local_tokens(model: Path, n_predict: int, prompt: str) -> list[int]:
    """The greedy tokens of a local CPU run (no RPC): what a run over RPC must generate."""
    out = run_python(client_script(model, [], n_predict, prompt))
    tokens: list[int] = out["tokens"]
    assert len(tokens) == n_predict
    return tokens


def namespaces_available() -> str | None:
    """None when network namespaces can be made here, else why not."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "no `ip` or `tc` (iproute2)"
    return None


@dataclass
class Host:
    """One RPC server and its link: ``endpoint`` is what the client connects to (the proxy)."""

    index: int
    rate_mbit: float | None  # None: unshaped (loopback)
    delay_ms: float
    server: list[str]  # the server's command: {endpoint}, or {host} and {port}, for its address
    netns: str | None = None
    endpoint: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def rate_bytes_per_s(self) -> float:
        assert self.rate_mbit is not None
        return self.rate_mbit * 1e6 / 8


class Network:
    """``with Network([(rate_mbit, delay_ms, server_cmd), ...]) as net:`` the hosts' endpoints are
    ``net.endpoints``; ``net.run_client(code)`` runs Python in the client's namespace."""

    def __init__(
        self, hosts: Sequence[tuple[float | None, float, list[str]]], loopback: bool = False
    ) -> None:
        self.loopback = loopback
        tag = f"{os.getpid() % 100000}"
        self.client_ns = None if loopback else f"n28c{tag}"
        self.hosts = [
            Host(i, None if loopback else r, d, cmd, None if loopback else f"n28h{i}x{tag}")
            for i, (r, d, cmd) in enumerate(hosts)
        ]
        self._made: list[str] = []  # namespaces to delete

    @property
    def endpoints(self) -> list[str]:
        return [h.endpoint for h in self.hosts]

    def __enter__(self) -> Network:
        try:
            if not self.loopback:
                self._make_links()
            for h in self.hosts:
                self._start_host(h)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ip(self, *args: str, ns: str | None = None) -> None:
        cmd = ["ip", *(["-n", ns] if ns else []), *args]
        subprocess.run(cmd, check=True, capture_output=True, timeout=10)

    def _tc(self, ns: str, *args: str) -> None:
        subprocess.run(["tc", "-n", ns, *args], check=True, capture_output=True, timeout=10)

    def _make_links(self) -> None:
        assert self.client_ns
        subprocess.run(
            ["ip", "netns", "add", self.client_ns], check=True, capture_output=True, timeout=10
        )
        self._made.append(self.client_ns)
        self._ip("link", "set", "lo", "up", ns=self.client_ns)
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                self.client_ns,
                "sysctl",
                "-q",
                f"net.ipv4.tcp_wmem={CLIENT_WMEM}",
            ],
            check=True,
            capture_output=True,
            timeout=10,
        )
        for h in self.hosts:
            assert h.netns and h.rate_mbit
            subprocess.run(
                ["ip", "netns", "add", h.netns], check=True, capture_output=True, timeout=10
            )
            self._made.append(h.netns)
            # the veth pair is made in the client's namespace, its far end moved to the host's
            near, far = f"{h.netns}a", f"{h.netns}b"
            self._ip("link", "add", near, "type", "veth", "peer", "name", far, ns=self.client_ns)
            self._ip("link", "set", far, "netns", h.netns, ns=self.client_ns)
            net = f"10.228.{h.index + 1}"
            self._ip("addr", "add", f"{net}.1/24", "dev", near, ns=self.client_ns)
            self._ip("addr", "add", f"{net}.2/24", "dev", far, ns=h.netns)
            for ns, dev in ((self.client_ns, near), (h.netns, far)):
                self._ip("link", "set", dev, "up", ns=ns)
                # the link's rate, each way; a burst of a few packets, a queue of 100 ms
                self._tc(
                    ns,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    f"{h.rate_mbit}mbit",
                    "burst",
                    "16kb",
                    "latency",
                    "100ms",
                )
            self._ip("link", "set", "lo", "up", ns=h.netns)
            h.endpoint = f"{net}.2:{7000 + h.index}"

    def _exec(self, ns: str | None, cmd: list[str]) -> list[str]:
        return (["ip", "netns", "exec", ns] if ns else []) + cmd

    def _start_host(self, h: Host) -> None:
        server_port = 7100 + h.index if h.netns else free_port()
        upstream = f"127.0.0.1:{server_port}"
        host, port = upstream.rsplit(":", 1)
        fill = {"{endpoint}": upstream, "{host}": host, "{port}": port}
        cmd = [fill.get(a, a) for a in h.server]
        h.procs.append(
            subprocess.Popen(
                self._exec(h.netns, cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
        )
        if h.netns is None and h.delay_ms == 0:
            h.endpoint = upstream  # loopback without a delay: no proxy
            _wait_accepting(upstream, 60)
            return
        listen = h.endpoint if h.netns else f"127.0.0.1:{free_port()}"
        proxy = [sys.executable, str(HERE), "proxy", listen, upstream, str(h.delay_ms / 1000)]
        p = subprocess.Popen(
            self._exec(h.netns, proxy), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        h.procs.append(p)
        h.endpoint = listen
        # the proxy says "ready" once the server accepts connections (bounded: 60 s)
        assert p.stdout is not None
        line = _readline(p.stdout, 60)
        if line.strip() != b"ready":
            err = b"".join(
                x.stderr.read() or b"" for x in h.procs if x.poll() is not None and x.stderr
            )
            raise RuntimeError(
                f"host {h.index} did not start: {line!r} {err.decode(errors='replace')[-800:]}"
            )

    def run_client(self, code: str, timeout: float = 300, env: dict[str, str] | None = None) -> Any:
        """Run Python ``code`` in the client's namespace (see run_python)."""
        return run_python(code, self.client_ns, timeout, env)

    def close(self) -> None:
        for h in self.hosts:
            for p in h.procs:
                if p.poll() is None:
                    p.kill()
            for p in h.procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            h.procs.clear()
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        self._made.clear()


def run_python(
    code: str, netns: str | None = None, timeout: float = 300, env: dict[str, str] | None = None
) -> Any:
    """Run Python ``code`` (in ``netns``, if given); the JSON its last line of output prints, or an
    AssertionError with its output when it fails."""
    cmd = [sys.executable, "-c", code]
    r = subprocess.run(
        ["ip", "netns", "exec", netns, *cmd] if netns else cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if r.returncode != 0:
        raise AssertionError(
            f"the client failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
        )
    return json.loads(r.stdout.strip().splitlines()[-1])


def _wait_accepting(endpoint: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(_addr(endpoint), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing accepts connections at {endpoint}") from None
            time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _readline(stream: object, timeout: float) -> bytes:
    out: list[bytes] = []
    t = threading.Thread(target=lambda: out.append(stream.readline()), daemon=True)  # type: ignore[attr-defined]
    t.start()
    t.join(timeout)
    return out[0] if out else b""


#
# the delay proxy (run as `python netsim.py proxy LISTEN UPSTREAM DELAY_S`)
#

PROXY_LIFETIME_S = 1800  # a proxy left behind exits on its own
CHUNK = 1 << 16


def _pump(src: socket.socket, dst: socket.socket, delay: float, done: threading.Event) -> None:
    """Forward what src receives to dst, each chunk `delay` seconds after it arrived."""
    q: deque[tuple[float, bytes]] = deque()
    cv = threading.Condition()
    eof = False

    def reader() -> None:
        nonlocal eof
        try:
            while not done.is_set():
                data = src.recv(CHUNK)
                if not data:
                    break
                with cv:
                    q.append((time.monotonic() + delay, data))
                    cv.notify()
        except OSError:
            pass
        with cv:
            eof = True
            cv.notify()

    threading.Thread(target=reader, daemon=True).start()
    try:
        while not done.is_set():
            with cv:
                while not q and not eof:
                    cv.wait(1.0)
                if not q and eof:
                    break
                due, data = q.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        done.set()
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _addr(s: str) -> tuple[str, int]:
    host, port = s.rsplit(":", 1)
    return host, int(port)


def proxy_main(listen: str, upstream: str, delay: float) -> None:
    try:  # the server is up when it accepts a connection
        _wait_accepting(upstream, 60)
    except RuntimeError:
        print("upstream never answered", flush=True)
        return
    srv = socket.create_server(_addr(listen))
    srv.settimeout(1.0)
    print("ready", flush=True)
    end = time.monotonic() + PROXY_LIFETIME_S
    while time.monotonic() < end:
        try:
            client, _ = srv.accept()
        except TimeoutError:
            continue
        up = socket.create_connection(_addr(upstream), timeout=10)
        up.settimeout(None)
        for s in (client, up):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        done = threading.Event()
        threading.Thread(target=_pump, args=(client, up, delay, done), daemon=True).start()
        threading.Thread(target=_pump, args=(up, client, delay, done), daemon=True).start()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "proxy":
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        proxy_main(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        sys.exit("usage: netsim.py proxy LISTEN_HOST:PORT UPSTREAM_HOST:PORT DELAY_S")
