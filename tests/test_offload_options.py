"""The offload options: -ngl/--gpu-layers, --device, --rpc and --tensor-split, one meaning in every
command that opens a model (run, serve, quant-eval, quant-sweep; peaks and doctor take --device
and --rpc where they apply), with real processes.

Offloading goes to real ggml RPC servers on loopback (rpc_backend.rpc_server: the wheel's own
libggml-rpc serving a CPU backend, as rpc-server does): the log's weights say which device holds
each layer, its compute records which devices ran each split. A registered RPC device stays in
its process for good, so every command that registers one runs in a child process. Bad values
end in exit 2 and one line, before any log exists; a server that does not answer, within a few
seconds.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.rpc_backend import rpc_server
from helpers.support import (
    by_type,
    free_port,
    instr,
    loopback_server,
    read_log,
    signal_server,
    wait_ready,
)

from llamacpp_instr.cli import main
from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.contract.units import fmt_bytes
from llamacpp_instr.running.offload import Offload

# a hang guard, not a speed target: the check of an endpoint is bounded by 5 s
NO_ANSWER_BOUND_S = 30.0


# support.instr, with this file's hang guard
_instr = functools.partial(instr, timeout=300)


@pytest.fixture(scope="module")
def servers() -> Iterator[list[str]]:
    """Two RPC servers on loopback; each serves one client at a time, as rpc-server does."""
    with rpc_server() as a, rpc_server() as b:
        yield [a, b]


def _start(records: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in records if r["type"] == "session_start")


def _holders(start: dict[str, Any]) -> dict[str, set[str]]:
    """Layer (blk.N, output, token_embd...) -> the buffers holding its weights."""
    out: dict[str, set[str]] = {}
    for w in start["weights"]:
        parts = w["name"].split(".")
        layer = ".".join(parts[:2]) if parts[0] == "blk" else parts[0]
        out.setdefault(layer, set()).add(w["buffer"])
    return out


def _on(endpoint: str) -> str:
    """The suffix of the buffers an RPC server holds: ``RPC<remote device>[endpoint]``."""
    return f"[{endpoint}]"


def _split_devices(records: list[dict[str, Any]]) -> set[str]:
    devices = _start(records)["machine"]["devices"]
    computes = by_type(records, "compute")
    assert computes
    return {devices[s[0]]["name"] for c in computes for s in c["splits"]}


# --- the Python API's values ------------------------------------------------------------------


@pytest.mark.fast
def test_offload_values_are_parsed_and_checked_as_the_cli_does() -> None:
    o = Offload(gpu_layers="ALL", devices="RPC0, Vulkan0", rpc="a:1,b:2", tensor_split="3/1")
    assert o.gpu_layers == "all" and o.devices == ("RPC0", "Vulkan0")
    assert o.rpc == ("a:1", "b:2") and o.tensor_split == (3.0, 1.0)
    assert Offload(devices="none").devices == () and Offload().offloads is False
    assert Offload(gpu_layers="7").gpu_layers == 7 and Offload(gpu_layers=7).offloads
    for kwargs, message in [
        ({"gpu_layers": -1}, "--gpu-layers must be >= 0"),
        ({"gpu_layers": "1.5"}, "--gpu-layers takes a number of layers or 'all'"),
        ({"devices": "a,,b"}, "--device takes comma-separated device names"),
        ({"devices": "none,RPC0"}, "--device none means no device"),
        ({"devices": "RPC0,rpc0"}, "--device names RPC0 twice"),
        ({"rpc": "localhost"}, "--rpc takes HOST:PORT"),
        ({"rpc": "h:0"}, "--rpc takes HOST:PORT"),
        ({"rpc": "h:1,h:1"}, "--rpc names h:1 twice"),
        ({"tensor_split": "1,-1"}, "--tensor-split proportions must be finite, >= 0"),
        ({"tensor_split": "0,0"}, "not all 0"),
        ({"tensor_split": ",".join(["1"] * 17)}, "llama.cpp takes at most 16"),
        ({"devices": "none", "rpc": "h:1"}, "--device none uses no device"),
        ({"devices": "none", "tensor_split": "1"}, "nothing to --tensor-split"),
    ]:
        with pytest.raises(UserError, match=message):
            Offload(**kwargs)  # type: ignore[arg-type]


# --- bad values: exit 2, one line, no log -------------------------------------------------------

BAD_VALUES = [
    (["-ngl", "-1"], "must be >= 0 (or 'all'), got -1"),
    (["--gpu-layers", "many"], "takes a number of layers or 'all'"),
    (["--device", "Nope9"], "unknown device 'Nope9' for --device"),
    (["--device", "a,,b"], "comma-separated device names"),
    (["--rpc", "127.0.0.1"], "takes HOST:PORT endpoints"),
    (["--rpc", "127.0.0.1:70000"], "takes HOST:PORT endpoints"),
    (["--rpc", "127.0.0.1:9,127.0.0.1:9"], "names 127.0.0.1:9 twice"),
    (["--device", "none", "--rpc", "127.0.0.1:9"], "--device none uses no device"),
    (["--device", "none", "--tensor-split", "1"], "nothing to --tensor-split"),
    (["--tensor-split", "0,0"], "not all 0"),
    (["--tensor-split", "3,x"], "comma-separated proportions such as 3,1"),
    # more proportions than devices: none here (no GPU), or fewer than 16 anywhere
    (["--tensor-split", ",".join(["1"] * 16)], "--tensor-split has 16 proportions for"),
    (["--rpc", "127.0.0.1:REFUSED"], "connection refused (is rpc-server running there?)"),
]


def _refused_port() -> str:
    return str(free_port())  # bound and closed again: nobody listens there


def _bad(args: list[str]) -> list[str]:
    return [a.replace("REFUSED", _refused_port()) for a in args]


def _assert_one_line_error(r: Any, fragment: str) -> None:
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in r.output


def _ids(cases: list[tuple[list[str], str]]) -> list[str]:
    return [" ".join(args) for args, _ in cases]


@pytest.mark.parametrize(("args", "fragment"), BAD_VALUES, ids=_ids(BAD_VALUES))
def test_a_bad_value_to_run_is_one_line_and_leaves_no_log(
    args: list[str],
    fragment: str,
    tiny_llama_f32: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    instr_api: Any,
) -> None:
    monkeypatch.chdir(tmp_path)  # a default-named log would land here
    log = tmp_path / "never.log"
    r = CliRunner().invoke(
        main, ["run", str(tiny_llama_f32), "-p", "Hello", "-n", "2", "-o", str(log), *_bad(args)]
    )
    _assert_one_line_error(r, fragment)
    assert list(tmp_path.iterdir()) == []


COMMANDS = {
    "serve": ["serve", "MODEL", "--port", "PORT", "-o", "OUT"],
    "quant-eval": ["quant-eval", "MODEL", "QUANT", "--chunks", "2", "--chunk-size", "32", "-o", "OUT"],
    "quant-sweep": ["quant-sweep", "MODEL", "--types", "q8_0", "--reps", "1", "-o", "OUT"],
    "peaks": ["peaks", "--types", "f32", "--size-mib", "1", "-o", "OUT"],
}  # fmt: skip
SOME_BAD = [BAD_VALUES[0], BAD_VALUES[2], BAD_VALUES[4], BAD_VALUES[-1]]


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(("args", "fragment"), SOME_BAD, ids=_ids(SOME_BAD))
def test_a_bad_value_to_each_command_is_one_line_and_leaves_nothing(
    command: str,
    args: list[str],
    fragment: str,
    tiny_llama_f32: Path,
    tiny_llama_q8: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if command == "peaks" and args[0] in ("-ngl", "--gpu-layers"):
        # peaks loads no model: it has no --gpu-layers at all
        r = CliRunner().invoke(main, ["peaks", *args])
        assert r.exit_code == 2 and "No such option" in r.stderr
        return
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLAMACPP_INSTR_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    subst = {"MODEL": str(tiny_llama_f32), "QUANT": str(tiny_llama_q8), "OUT": str(out)}
    subst["PORT"] = str(free_port())
    cmd = [subst.get(a, a) for a in COMMANDS[command]] + _bad(args)
    r = CliRunner().invoke(main, cmd)
    _assert_one_line_error(r, fragment)
    assert list(tmp_path.iterdir()) == []


# --- servers that do not answer: exit 2 within a few seconds -------------------------------------


def _no_answer(endpoint: str, tmp_path: Path, model: Path, prefix: list[str] | None = None) -> str:
    log = tmp_path / "never.log"
    cmd = [sys.executable, "-m", "llamacpp_instr.cli", "run", str(model), "-p", "Hello"]
    cmd += ["-o", str(log), "-ngl", "all", "--rpc", endpoint]
    t0 = time.monotonic()
    r = subprocess.run(
        (prefix or []) + cmd, capture_output=True, text=True, timeout=NO_ANSWER_BOUND_S
    )
    elapsed = time.monotonic() - t0
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --rpc {endpoint}: "), r.stderr
    assert elapsed < NO_ANSWER_BOUND_S and not log.exists()
    return lines[0]


def test_a_refused_endpoint_fails_at_once(tiny_llama_f32: Path, tmp_path: Path) -> None:
    line = _no_answer(f"127.0.0.1:{free_port()}", tmp_path, tiny_llama_f32)
    assert "connection refused" in line


def test_a_listener_that_never_speaks_ggml_rpc_fails_within_the_bound(
    tiny_llama_f32: Path, tmp_path: Path
) -> None:
    with socket.socket() as s:  # the kernel accepts connections into the backlog; nobody reads
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        line = _no_answer(f"127.0.0.1:{s.getsockname()[1]}", tmp_path, tiny_llama_f32)
    assert "no reply to ggml-rpc's HELLO within 5 s" in line


def _answering(reply: Callable[[socket.socket], None]) -> AbstractContextManager[str]:
    """A loopback listener that answers each connection with ``reply`` (a server that is not
    the RPC server --rpc expects); yields its endpoint."""

    def handle(conn: socket.socket) -> None:
        with conn:
            reply(conn)

    return loopback_server(handle)


def _hello_reply(major: int, minor: int, patch: int) -> Callable[[socket.socket], None]:
    def reply(conn: socket.socket) -> None:
        conn.settimeout(5)
        got = b""
        while len(got) < 1 + 8 + 24:  # RPC_CMD_HELLO, its size, conn_caps
            chunk = conn.recv(64)
            if not chunk:
                return
            got += chunk
        assert got[0] == 14 and struct.unpack("<Q", got[1:9])[0] == 24
        conn.sendall(struct.pack("<Q", 28) + bytes([major, minor, patch, 0]) + bytes(24))

    return reply


def test_a_server_of_another_protocol_version_is_refused(
    tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """ggml's client would abort the process on it (negotiate_hello): refused before."""
    with _answering(_hello_reply(6, 1, 0)) as ep:
        line = _no_answer(ep, tmp_path, tiny_llama_f32)
    assert "the server speaks RPC protocol 6.1.0; this build's client speaks 7.0.x" in line


def test_another_kind_of_server_is_refused(tiny_llama_f32: Path, tmp_path: Path) -> None:
    """--rpc pointed at, say, an SSH server, which greets every client first."""
    with _answering(lambda conn: conn.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")) as ep:
        line = _no_answer(ep, tmp_path, tiny_llama_f32)
    assert "not a ggml RPC server (its reply to HELLO has" in line


def test_a_host_name_that_does_not_resolve_is_one_line(
    tiny_llama_f32: Path, tmp_path: Path
) -> None:
    line = _no_answer("no-such-host.invalid:50052", tmp_path, tiny_llama_f32)
    # the name lookup fails, or (no DNS reachable) takes longer than the bound
    assert "cannot resolve no-such-host.invalid" in line or "looking up" in line


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def dropping_netns() -> Iterator[str]:
    """A network namespace whose route to 10.199.4.0/24 leads into a second namespace that
    drops the packets (not its address, forwarding off): SYNs go unanswered, as to a host that
    is down behind a firewall. Yields the client namespace's name."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2 (ip); not available here")
    a, b = f"instr-ngl-a{os.getpid()}", f"instr-ngl-b{os.getpid()}"
    try:
        _ip("netns", "add", a)
        _ip("netns", "add", b)
        _ip("-n", a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", b)
        _ip("-n", a, "addr", "add", "10.199.3.1/24", "dev", "va")
        _ip("-n", b, "addr", "add", "10.199.3.2/24", "dev", "vb")
        _ip("-n", a, "link", "set", "va", "up")
        _ip("-n", b, "link", "set", "vb", "up")
        _ip("-n", a, "route", "add", "10.199.4.0/24", "via", "10.199.3.2")
    except subprocess.CalledProcessError as exc:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        pytest.skip(f"cannot make network namespaces here: {exc.stderr.decode().strip()}")
    try:
        yield a
    finally:
        for ns in (a, b):  # deleting a namespace deletes its end of the veth pair, and the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def test_a_host_that_drops_syns_fails_within_the_bound(
    dropping_netns: str, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    # plain TCP in that namespace gets no answer either (the fact the bound is about)
    probe = subprocess.run(
        ["ip", "netns", "exec", dropping_netns, sys.executable, "-c",
         "import socket; s = socket.socket(); s.settimeout(1)\n"
         "try:\n    s.connect(('10.199.4.1', 50052)); print('connected')\n"
         "except TimeoutError:\n    print('timeout')"],
        capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    assert probe.stdout.strip() == "timeout", probe
    prefix = ["ip", "netns", "exec", dropping_netns]
    line = _no_answer("10.199.4.1:50052", tmp_path, tiny_llama_f32, prefix)
    assert "no answer within 5 s" in line


# --- offloading to real RPC servers ---------------------------------------------------------------


def test_run_on_rpc_servers_gives_the_cpu_runs_text(
    servers: list[str], smollm2_path: Path, tmp_path: Path, schema_validator: Any
) -> None:
    """Every layer on one server, then split across two: the same greedy text as the CPU alone
    (the servers run the same CPU kernels), and the log says where each layer was."""
    a, b = servers
    common = ["run", str(smollm2_path), "-p", "The capital of France is", "-n", "12", "-t", "2"]
    cpu = _instr(*common, "-o", str(tmp_path / "cpu.log"))
    full = _instr(*common, "-o", str(tmp_path / "full.log"), "--rpc", a, "-ngl", "all")
    split = _instr(*common, "-o", str(tmp_path / "split.log"), "--rpc", f"{a},{b}", "-ngl", "99")
    for r in (cpu, full, split):
        assert r.returncode == 0, r.stderr
        assert "warning" not in r.stderr
    assert cpu.stdout.strip() and full.stdout == cpu.stdout and split.stdout == cpu.stdout

    recs = read_log(tmp_path / "full.log")
    for rec in recs:
        schema_validator.validate(rec)
    start = _start(recs)
    rpc = [d for d in start["machine"]["devices"] if d["backend"] == "RPC"]
    assert [(d["name"], d["description"], d["type"]) for d in rpc] == [("RPC0", a, "gpu")]
    holders = _holders(start)
    n_layer = start["model"]["n_layer"]
    assert {f"blk.{i}" for i in range(n_layer)} <= set(holders)
    for layer in [f"blk.{i}" for i in range(n_layer)] + ["output_norm"]:
        assert all(buf.endswith(_on(a)) for buf in holders[layer]), (layer, holders[layer])
    assert "RPC0" in _split_devices(recs)
    cfg = start["metadata"]["config"]["offload"]
    assert cfg == {
        "gpu_layers": "all", "devices": None, "rpc": [a], "tensor_split": None, "repack": True
    }  # fmt: skip

    both = _holders(_start(read_log(tmp_path / "split.log")))
    on_a = {k for k, v in both.items() if any(x.endswith(_on(a)) for x in v)}
    on_b = {k for k, v in both.items() if any(x.endswith(_on(b)) for x in v)}
    assert on_a and on_b and not on_a & on_b


def test_a_partial_offload_splits_between_cpu_and_the_server(
    servers: list[str], tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """-ngl 2 of a 2-layer model: llama.cpp offloads the last layer and the output."""
    log = tmp_path / "p.log"
    r = _instr("run", str(tiny_llama_f32), "-p", "Hello", "-n", "3", "-t", "1", "-o", str(log),
               "--rpc", servers[0], "-ngl", "2")  # fmt: skip
    assert r.returncode == 0, r.stderr
    recs = read_log(log)
    holders = _holders(_start(recs))
    assert all(not buf.endswith(_on(servers[0])) for buf in holders["blk.0"])
    assert all(buf.endswith(_on(servers[0])) for buf in holders["blk.1"] | holders["output"])
    assert _split_devices(recs) == {"CPU", "RPC0"}
    for c in by_type(recs, "compute"):
        assert c["copies"], "nothing crossed between the CPU and the server"


def test_device_picks_one_of_two_servers(
    servers: list[str], tiny_llama_f32: Path, tmp_path: Path
) -> None:
    a, b = servers
    log = tmp_path / "d.log"
    r = _instr("run", str(tiny_llama_f32), "-p", "Hello", "-n", "3", "-t", "1", "-o", str(log),
               "--rpc", f"{a},{b}", "--device", "rpc1", "-ngl", "all")  # fmt: skip
    assert r.returncode == 0, r.stderr
    recs = read_log(log)
    start = _start(recs)
    names = {d["name"]: d["description"] for d in start["machine"]["devices"]}
    assert names["RPC0"] == a and names["RPC1"] == b  # registered in --rpc's order
    buffers = {buf for bufs in _holders(start).values() for buf in bufs}
    assert any(buf.endswith(_on(b)) for buf in buffers)
    assert not any(buf.endswith(_on(a)) for buf in buffers)
    assert "RPC0" not in _split_devices(recs) and "RPC1" in _split_devices(recs)
    assert start["metadata"]["config"]["offload"]["devices"] == ["rpc1"]


@pytest.mark.parametrize(
    ("split", "on_a", "on_b"),
    [
        ("1,0", {"blk.0", "blk.1", "output"}, set()),
        ("0,1", set(), {"blk.0", "blk.1", "output"}),
        # 3 offloaded layers (2 blocks and the output) at 1/3 and 2/3: llama.cpp's cut points
        ("1,2", {"blk.0"}, {"blk.1", "output"}),
    ],
)
def test_tensor_split_shares_the_layers_between_servers(
    split: str, on_a: set[str], on_b: set[str],
    servers: list[str], tiny_llama_f32: Path, tmp_path: Path,
) -> None:  # fmt: skip
    a, b = servers
    log = tmp_path / "s.log"
    r = _instr("run", str(tiny_llama_f32), "-p", "Hello", "-n", "2", "-t", "1", "-o", str(log),
               "--rpc", f"{a},{b}", "-ngl", "all", "--tensor-split", split)  # fmt: skip
    assert r.returncode == 0, r.stderr
    holders = _holders(_start(read_log(log)))
    layers = {"blk.0", "blk.1", "output"}
    assert {k for k in layers if any(x.endswith(_on(a)) for x in holders[k])} == on_a
    assert {k for k in layers if any(x.endswith(_on(b)) for x in holders[k])} == on_b


def test_layers_without_a_device_run_on_the_cpu_with_one_warning(
    tiny_llama_f32: Path, tmp_path: Path
) -> None:
    log = tmp_path / "w.log"
    r = _instr("run", str(tiny_llama_f32), "-p", "Hello", "-n", "2", "-t", "1", "-o", str(log),
               "-ngl", "99")  # fmt: skip
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning")]
    assert warnings == [
        "warning: --gpu-layers 99 but there is no GPU or RPC device to offload to: every layer "
        "runs on the CPU"
    ]
    recs = read_log(log)
    assert all(not b.startswith("RPC") for bufs in _holders(_start(recs)).values() for b in bufs)
    assert _split_devices(recs) == {"CPU"}


def test_a_server_without_layers_is_a_warning(
    servers: list[str], tiny_llama_f32: Path, tmp_path: Path
) -> None:
    r = _instr("run", str(tiny_llama_f32), "-p", "Hello", "-n", "2", "-t", "1",
               "-o", str(tmp_path / "z.log"), "--rpc", servers[0])  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith("warning")] == [
        "warning: --rpc, --device and --tensor-split place the layers --gpu-layers offloads, and "
        "it is 0: every layer runs on the CPU"
    ]
    assert _split_devices(read_log(tmp_path / "z.log")) == {"CPU"}


def test_serve_offloads_to_the_server(
    servers: list[str], tiny_llama_f32: Path, tmp_path: Path
) -> None:
    log, port = tmp_path / "serve.log", free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llamacpp_instr.cli", "serve", str(tiny_llama_f32), "-t", "1",
         "--port", str(port), "-o", str(log), "--rpc", servers[0], "-ngl", "all"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_ready(port, proc)
        body = json.dumps({"prompt": "Hello", "max_tokens": 3}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", body, {"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200
        signal_server(proc)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    recs = read_log(log)
    start = _start(recs)
    assert start["metadata"]["offload"]["rpc"] == [servers[0]]
    assert all(b.endswith(_on(servers[0])) for b in _holders(start)["blk.1"])
    assert "RPC0" in _split_devices(recs)


_PLACED_QUANT_EVAL_MODEL = r"""
import json, sys
import llama_cpp
from llamacpp_instr.native import bindings
from llamacpp_instr.running.quant import evaluate as quant_eval
from llamacpp_instr.running.offload import Offload
from llamacpp_instr.running.placement import prepare
model, endpoint, log = sys.argv[1:4]
placement = prepare(Offload(gpu_layers="all", rpc=endpoint))
m = quant_eval._Model(llama_cpp, __import__("pathlib").Path(model), 32, placement)
m.open_context(1)
api = bindings.load()
api.session_begin(m.ctx, log, "minimal", {})
api.session_end("ok")
m.close()
"""


def test_quant_eval_runs_its_models_on_the_server(
    servers: list[str], tiny_llama_f32: Path, tiny_llama_q8: Path, tmp_path: Path
) -> None:
    args = ["quant-eval", str(tiny_llama_f32), str(tiny_llama_q8), "--chunks", "2"]
    # weights as in the file (-nr): where the local CPU would repack them (AMX, CPU_REPACK) its
    # kernels differ from the server's, which keeps what it is sent
    args += ["--chunk-size", "32", "-t", "1", "--format", "json", "--no-repack"]
    cpu = _instr(*args)
    rpc = _instr(*args, "--rpc", servers[0], "-ngl", "all")
    assert cpu.returncode == 0 and rpc.returncode == 0, rpc.stderr
    a, b = json.loads(cpu.stdout), json.loads(rpc.stdout)
    assert a.pop("offload") == {
        "gpu_layers": 0, "devices": None, "rpc": [], "tensor_split": None, "repack": False
    }  # fmt: skip
    assert b.pop("offload") == {
        "gpu_layers": "all", "devices": None, "rpc": [servers[0]], "tensor_split": None,
        "repack": False,
    }  # fmt: skip
    # the server runs the same CPU kernels: the same figures
    assert b["base"] == a["base"] and b["models"] == a["models"]
    # quant-eval's own model loader places the model as asked (its log says where)
    log = tmp_path / "qe.log"
    r = subprocess.run(
        [sys.executable, "-c", _PLACED_QUANT_EVAL_MODEL, str(tiny_llama_f32), servers[0],
         str(log)], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    holders = _holders(_start(read_log(log)))
    assert all(b.endswith(_on(servers[0])) for b in holders["blk.0"] | holders["blk.1"])


def test_quant_eval_layers_refuses_offloaded_layers(
    servers: list[str], tiny_llama_f32: Path, tiny_llama_q8: Path
) -> None:
    r = _instr("quant-eval", str(tiny_llama_f32), str(tiny_llama_q8), "--chunks", "2",
               "--chunk-size", "32", "--layers", "--rpc", servers[0], "-ngl", "all")  # fmt: skip
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: --layers captures layer outputs on the CPU: give it without --gpu-layers (or "
        "with --device none)"
    ]


def test_quant_sweep_offloads_its_runs(
    servers: list[str], tiny_llama_f32: Path, tmp_path: Path
) -> None:
    r = _instr("quant-sweep", str(tiny_llama_f32), "--types", "q8_0", "--reps", "1", "-n", "4",
               "--chunks", "2", "--chunk-size", "32", "-t", "1", "--format", "json",
               "--rpc", servers[0], "-ngl", "all",
               env={"LLAMACPP_INSTR_CACHE": str(tmp_path)})  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["offload"]["rpc"] == [servers[0]] and data["offload"]["gpu_layers"] == "all"
    assert [m["type"] for m in data["models"]][1:] == ["q8_0"]
    assert all(m["gen_tok_s"] > 0 for m in data["models"])


def test_peaks_with_rpc_fit_the_runs_on_it(
    servers: list[str], tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """The RPC device joins the machine, so the peaks fit a log of a run with the same --rpc
    (and a log without them says which --rpc to measure with); it is not probed itself."""
    env = {"LLAMACPP_INSTR_CACHE": str(tmp_path / "cache")}
    log = tmp_path / "r.log"
    r = _instr("run", str(tiny_llama_f32), "-p", "Hello", "-n", "2", "-t", "1", "-o", str(log),
               "--rpc", servers[0], "-ngl", "all", env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = _instr("summary", str(log), "--format", "json", env=env)
    assert r.returncode == 0, r.stderr
    assert f"run `instr peaks --threads 1 --rpc {servers[0]}` on it" in r.stdout + r.stderr
    args = ["peaks", "--threads", "1", "--types", "f32", "--size-mib", "1", "--format", "json"]
    r = _instr(*args, "--rpc", servers[0], env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["key"].endswith(f", {servers[0]}") and [d["name"] for d in doc["devices"]] == ["CPU"]
    assert "RPC0: not measured" in r.stderr
    r = _instr("summary", str(log), "--format", "json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["roofline"]["machine"] == doc["key"]
    # --device none: only the CPU, under the machine without the server
    r = _instr(*args, "--device", "none", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["key"].endswith(", no GPU")


def test_doctor_lists_the_devices(servers: list[str], instr_api: Any) -> None:
    r = CliRunner().invoke(main, ["doctor"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("devices ("))
    cpu = instr_api.machine_info()["devices"][0]
    row = lines[at + 2].split()
    assert row[:3] == [cpu["name"], cpu["backend"], cpu["type"]]
    assert fmt_bytes(cpu["memory_total"]) in lines[at + 2]
    r = _instr("doctor", "--rpc", servers[0])
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("RPC")]
    assert len(rows) == 1 and rows[0][:3] == ["RPC0", "RPC", "gpu"]
    assert rows[0][-1] == servers[0]
