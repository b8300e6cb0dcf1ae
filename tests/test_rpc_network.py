"""ggml's RPC backend across a real network on this machine: one client, two patched RPC servers on
hosts of their own (network namespaces, tests/helpers/netsim.py), each behind a link of a known rate (tc
tbf) and delay (a TCP proxy), every layer of a tiny model offloaded to them. The client's log alone
holds the run: every command sent (the model's upload included), and each host's ops as that host
timed them, placed on the client's clock.

What is checked against what was set up, independently of the log's own arithmetic: transfer times
against bytes / rate (+ the delay both ways for a command with a reply), within 25 %; the network's
share of each graph's round trip against twice the delay; remote ops for every offloaded layer,
inside the window the client saw; the same greedy tokens as a local CPU run; the log validates and
converts. A stock server still serves the patched client (which then says so in the log), and a
stock client still uses a patched server.

Without network namespaces (not root, no iproute2), the servers and proxies run on loopback: the
delay holds, the rate does not, and the checks that need it skip saying so.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import netsim
from helpers.support import by_type, converts_cleanly, read_log

pytestmark = pytest.mark.native

PROMPT = "The capital of France is"
N_PREDICT = 10
RATES_MBIT = (100.0, 50.0)  # host 0, host 1
DELAY_MS = 5.0  # one way, each link
BIG = 1 << 20  # set_tensor commands at least this big are timed against the rate
TOLERANCE = 0.25


@pytest.fixture(scope="module")
def rpc_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Weights of 0.5 to 2 MiB (40 MB in all): their upload takes long enough to measure a link."""
    from helpers.tiny_gguf import write_tiny_model

    return write_tiny_model(
        tmp_path_factory.mktemp("rpc") / "tiny-rpc.gguf",
        n_layer=4,
        n_embd=512,
        n_head=8,
        n_head_kv=4,
        n_ff=1024,
        seed=3,
    )


def patched_lib() -> Path:
    from helpers.rpc_backend import lib_dir

    return lib_dir()


@pytest.fixture(scope="module")
def local_tokens(rpc_model: Path) -> list[int]:
    return netsim.local_tokens(rpc_model, N_PREDICT, PROMPT)


@dataclass
class TwoHosts:
    log: Path
    tokens: list[int]
    loopback: str | None  # why the run is on loopback, or None
    records: list[dict[str, Any]]
    endpoints: list[str]

    def of(self, type_: str) -> list[dict[str, Any]]:
        return by_type(self.records, type_)

    @property
    def start(self) -> dict[str, Any]:
        return self.of("session_start")[0]

    @property
    def devices(self) -> list[dict[str, Any]]:
        return list(self.start["machine"]["devices"])

    def rpc_devices(self) -> dict[int, int]:
        """device index -> host index (its endpoint's position), for the RPC devices"""
        out = {}
        for d in self.devices:
            if d["backend"] == "RPC":
                out[d["index"]] = self.endpoints.index(d["description"])
        return out


@pytest.fixture(scope="module")
def two_hosts(rpc_model: Path, tmp_path_factory: pytest.TempPathFactory) -> TwoHosts:
    why = netsim.namespaces_available()
    server = netsim.server_command(patched_lib(), "{endpoint}")
    log = tmp_path_factory.mktemp("rpc-run") / "two-hosts.log"
    hosts = [(rate, DELAY_MS, server) for rate in RATES_MBIT]
    with netsim.Network(hosts, loopback=why is not None) as net:
        code = netsim.client_script(rpc_model, net.endpoints, N_PREDICT, PROMPT, log=log)
        out = net.run_client(code, timeout=600)
        endpoints = net.endpoints
    return TwoHosts(log, out["tokens"], why, read_log(log), endpoints)


def needs_rate(run: TwoHosts) -> None:
    if run.loopback:
        pytest.skip(f"ran on loopback without a rate limit: {run.loopback}")


def test_the_same_greedy_tokens_as_a_local_cpu_run(
    two_hosts: TwoHosts, local_tokens: list[int]
) -> None:
    assert two_hosts.tokens == local_tokens


def test_the_log_validates_and_converts(
    two_hosts: TwoHosts, schema_validator: Any, tmp_path: Path
) -> None:
    for r in two_hosts.records:
        schema_validator.validate(r)
    converts_cleanly(two_hosts.log, tmp_path / "trace.pftrace")
    assert two_hosts.of("session_end")[0]["status"] == "ok"


def test_both_servers_time_their_graphs(two_hosts: TwoHosts) -> None:
    rpc = two_hosts.rpc_devices()
    assert sorted(rpc.values()) == [0, 1]
    assert all(two_hosts.devices[i]["remote_timing"] is True for i in rpc)


def rows(run: TwoHosts, phase: str | None = None) -> list[tuple[dict[str, Any], list[Any]]]:
    return [
        (r, row) for r in run.of("transfers") if phase in (None, r["phase"]) for row in r["rows"]
    ]


def test_the_model_upload_is_in_the_log(two_hosts: TwoHosts) -> None:
    """Every weight on an RPC device was sent to its device before the session, whole."""
    weights = two_hosts.start["weights"]
    # an RPC buffer is named after its server: RPC<device on that server>[host:port]
    by_endpoint = {d["description"]: d["index"] for d in two_hosts.devices if d["backend"] == "RPC"}
    sent: dict[str, tuple[int, int]] = {}
    for _, row in rows(two_hosts, "load"):
        if row[1] == "set_tensor" and row[2]:
            sent[row[2]] = (row[0], sent.get(row[2], (row[0], 0))[1] + row[3])
    offloaded = [w for w in weights if w["buffer"].startswith("RPC")]
    assert len(offloaded) > 4 * 7, "the layers were not offloaded"
    for w in offloaded:
        device = by_endpoint[w["buffer"].split("[")[1].rstrip("]")]
        assert sent.get(w["name"]) == (device, w["bytes"]), w["name"]
    # load rows happened before the first step
    t0 = min(s["t_start"] for s in two_hosts.of("step_end"))
    for r, row in rows(two_hosts, "load"):
        assert r["t_start"] + row[9] <= t0


def test_every_step_sends_its_graphs_and_reads_its_outputs(two_hosts: TwoHosts) -> None:
    rpc = set(two_hosts.rpc_devices())
    steps = {(s["ctx"], s["step"]): s for s in two_hosts.of("step_end")}
    seen: dict[tuple[int, int], list[list[Any]]] = {}
    for r, row in rows(two_hosts, "step"):
        seen.setdefault((r["ctx"], r["step"]), []).append(row)
        s = steps[(r["ctx"], r["step"])]
        # issued within the step
        assert s["t_start"] <= r["t_start"] + row[6] <= s["t_start"] + s["dur"]
    assert set(seen) == set(steps)
    for key, rs in seen.items():
        graphs = {row[0] for row in rs if row[1] in ("graph_compute", "graph_recompute")}
        assert graphs == rpc, key
        assert any(row[1] == "get_tensor" and row[5] > 0 for row in rs), key
        for row in rs:
            queue, start, sent_, end = row[6:10]
            assert queue <= start <= sent_ <= end


# commands the server answers at once (no allocation, no compute): their round trip is the link's
QUICK_REPLIES = ("get_alloc_size", "get_alignment", "get_max_size", "get_device_memory")


def test_transfer_times_match_the_links(two_hosts: TwoHosts) -> None:
    """A command's host time against what its link allows, per host: a big set_tensor (no reply)
    takes its bytes / rate (the median); a small command with a reply, answered at once, its bytes
    / rate plus the delay both ways (the lower quartile: each of those passes through five
    processes' wake-ups (client, proxy, server, proxy, client), and on a busy machine any of them
    can be a scheduler tick late, which says nothing of the link). Each figure is printed."""
    needs_rate(two_hosts)
    host_of = two_hosts.rpc_devices()
    ratios: dict[tuple[int, str], list[float]] = {}
    for _, row in rows(two_hosts, "load"):
        device, cmd, _, nbytes, sent, recv, _, start, _, end = row
        if device not in host_of:
            continue
        rate = RATES_MBIT[host_of[device]] * 1e6 / 8
        if cmd == "set_tensor" and nbytes >= BIG:
            kind, expected = "big set_tensor", sent / rate
        elif cmd in QUICK_REPLIES:
            kind, expected = "quick reply", (sent + recv) / rate + 2 * DELAY_MS / 1000
        else:
            continue
        ratios.setdefault((host_of[device], kind), []).append((end - start) / 1e9 / expected)
    assert sorted(ratios) == [(h, k) for h in (0, 1) for k in ("big set_tensor", "quick reply")]
    for (host, kind), rs in sorted(ratios.items()):
        q = statistics.median(rs) if kind == "big set_tensor" else statistics.quantiles(rs, n=4)[0]
        which = "median" if kind == "big set_tensor" else "lower quartile"
        print(
            f"host {host} ({RATES_MBIT[host]:g} Mbit/s, {DELAY_MS:g} ms): {kind} x{len(rs)}: "
            f"measured / expected, {which} {q:.3f}, range {min(rs):.3f}..{max(rs):.3f}"
        )
        assert abs(q - 1) <= TOLERANCE, (host, kind, q)


def test_the_whole_upload_matches_the_rates(two_hosts: TwoHosts) -> None:
    """Each host's weights, first byte to last: their bytes / rate."""
    needs_rate(two_hosts)
    host_of = two_hosts.rpc_devices()
    per_host: dict[int, list[list[Any]]] = {}
    for r, row in rows(two_hosts, "load"):
        if row[1] == "set_tensor" and row[0] in host_of:
            per_host.setdefault(host_of[row[0]], []).append([r["t_start"], *row])
    assert sorted(per_host) == [0, 1]
    for host, rs in per_host.items():
        first = min(t0 + row[7] for t0, *row in rs)
        last = max(t0 + row[9] for t0, *row in rs)
        nbytes = sum(row[4] for _, *row in rs)
        expected = nbytes / (RATES_MBIT[host] * 1e6 / 8)
        # between two weights the client reads and serializes the next: time the link idles, which
        # a slower or busier CPU stretches (1.28x on two cores at half speed); no faster than the
        # link, and an upload timed from the wrong records would be far off either way
        measured = (last - first) / 1e9
        assert (1 - TOLERANCE) * expected <= measured <= (1 + 2 * TOLERANCE) * expected, host


def echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def stock_lib() -> Path:
    """The stock pin's libraries (the benchmarks' baseline wheel, built once and cached)."""
    from llamacpp_instr.native import build

    return build.stock_lib_dir(echo)


def rpc_server_exe() -> Path:
    """ggml-rpc-server as `instr build --tools` builds it (patched; cached)."""
    from llamacpp_instr.native import tools

    return tools.build_tools(echo, programs=("ggml-rpc-server",)) / "ggml-rpc-server"


def stock_server() -> list[str]:
    """A stock server: the stock pin's libggml-rpc serving this machine's CPU. Its server is the
    code the stock ggml-rpc-server program runs (ggml_backend_rpc_start_server), from the one stock
    build the suite makes (the stock client below needs its libraries too)."""
    return netsim.server_command(stock_lib(), "{endpoint}")


def hello_padding(server: list[str]) -> int:
    """The byte of a server's HELLO reply that a patched server sets (RPC_INSTR_HELLO)."""
    import socket
    import struct

    with netsim.Network([(None, 0.0, server)], loopback=True) as net:
        host, port = net.endpoints[0].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(bytes([14]) + struct.pack("<Q", 24) + bytes(24))  # RPC_CMD_HELLO, no caps
            size = struct.unpack("<Q", s.recv(8, socket.MSG_WAITALL))[0]
            rsp = s.recv(size, socket.MSG_WAITALL)
    assert rsp[:2] == bytes([7, 0]), rsp  # protocol 7.0: the version is the pin's, untouched
    return rsp[3]


def test_the_tools_build_a_patched_rpc_server_and_a_stock_one_offers_no_timing() -> None:
    """`instr build --tools` builds ggml-rpc-server; the patched one offers graph timing in its
    HELLO reply's spare byte (a magic value and the version of the timing extension), the stock
    one does not, and both speak the pin's protocol 7.0."""
    assert hello_padding(netsim.binary_server_command(rpc_server_exe())) == 0x2A
    assert hello_padding(stock_server()) == 0


@pytest.fixture(scope="module")
def stock_server_run(rpc_model: Path, tmp_path_factory: pytest.TempPathFactory) -> TwoHosts:
    server = stock_server()
    log = tmp_path_factory.mktemp("rpc-stock") / "stock-server.log"
    with netsim.Network([(None, 1.0, server)], loopback=True) as net:
        code = netsim.client_script(rpc_model, net.endpoints, N_PREDICT, PROMPT, log=log)
        out = net.run_client(code)
        endpoints = net.endpoints
    return TwoHosts(log, out["tokens"], "loopback", read_log(log), endpoints)


def test_a_stock_server_serves_the_patched_client(
    stock_server_run: TwoHosts, local_tokens: list[int], schema_validator: Any
) -> None:
    run = stock_server_run
    assert run.tokens == local_tokens
    for r in run.records:
        schema_validator.validate(r)
    (rpc,) = run.rpc_devices()
    # the log says the server does not time its graphs: its splits are timed on this host only
    assert run.devices[rpc]["remote_timing"] is False
    computes = run.of("compute")
    assert computes and all(any(s[0] == rpc for s in c["splits"]) for c in computes)
    assert not [r for c in computes for r in c.get("remote", [])]
    # and every command sent is there all the same
    assert {row[1] for _, row in rows(run, "step")} >= {"set_tensor", "get_tensor"}


def test_a_stock_client_uses_a_patched_server(rpc_model: Path, local_tokens: list[int]) -> None:
    server = netsim.server_command(patched_lib(), "{endpoint}")
    with netsim.Network([(None, 1.0, server)], loopback=True) as net:
        code = netsim.client_script(rpc_model, net.endpoints, N_PREDICT, PROMPT)
        out = net.run_client(code, env={"LLAMA_CPP_LIB_PATH": str(stock_lib())})
    assert out["tokens"] == local_tokens


def remote_rows(run: TwoHosts) -> list[tuple[dict[str, Any], list[Any]]]:
    return [(c, r) for c in run.of("compute") for r in c.get("remote", [])]


def test_every_offloaded_layer_has_ops_timed_on_its_host(two_hosts: TwoHosts) -> None:
    """Every compute: each RPC device's graph came back with its ops, the ops of a layer on the
    device of the split that holds them, and every layer of the model has a span on its host."""
    rpc = two_hosts.rpc_devices()
    graphs = {g["graph"]: g for g in two_hosts.of("graph")}
    n_layer = two_hosts.start["model"]["n_layer"]
    computes = two_hosts.of("compute")
    assert len(computes) == len(two_hosts.of("step_end"))
    for c in computes:
        nodes = graphs[c["graph"]]["nodes"]
        splits = c["splits"]
        owner = {i: s[0] for s in splits for i in range(s[1], s[2])}
        remote = c["remote"]
        assert sorted(r[1] for r in remote) == sorted(rpc), c["step"]
        for r in remote:
            split, device, n_ops = r[0], r[1], r[10]
            assert splits[split][0] == device and n_ops > 0
        # ops: every node a remote split holds was timed once, on its host
        timed = {op[0] for op in c["ops"]} | {j for op in c["ops"] if len(op) == 4 for j in op[3]}
        for i, node in enumerate(nodes):
            if owner.get(i) in rpc and "noop" not in node["flags"]:
                assert i in timed, (c["step"], i, node["name"])
        # layer spans on the RPC devices (a fifth element names the device)
        spans = {(lay[0], lay[4]) for lay in c["layers"] if len(lay) == 5}
        on_host = {nodes[i]["layer"]: owner[i] for i in owner if nodes[i]["layer"] is not None}
        assert set(on_host) == set(range(n_layer)) and set(on_host.values()) <= set(rpc)
        assert spans == set(on_host.items()), c["step"]


def test_remote_ops_are_placed_inside_what_the_client_saw(two_hosts: TwoHosts) -> None:
    """A remote graph ran after the client began sending it and before its times came back; its
    ops lie within its compute; and since both hosts are this machine (one CLOCK_MONOTONIC), the
    true clock offset, 0, lies within the estimate's uncertainty."""
    rows_ = remote_rows(two_hosts)
    assert rows_
    for _, r in rows_:
        _, _, send, reply, start, end, one_way, err, offset, nbytes, _ = r
        assert send <= start <= end <= reply, r
        assert abs(offset) <= err, r
        assert one_way >= 0 and nbytes > 0
    for c in two_hosts.of("compute"):
        # the ops of each remote graph (in `ops`, after the CPU's) within that graph's compute
        spans = {r[1]: (r[4], r[5]) for r in c["remote"]}
        owner = {i: s[0] for s in c["splits"] for i in range(s[1], s[2])}
        for op in c["ops"]:
            dev = owner[op[0]]
            if dev in spans:
                lo, hi = spans[dev]
                assert lo <= op[1] and op[1] + op[2] <= hi, (c["step"], op)


def test_the_network_estimate_matches_the_delay(two_hosts: TwoHosts) -> None:
    """One-way network time estimated per graph (half the round trip less the server's time)
    against the links' delay: never below it; over the steps after the first (a small graph
    command, the server idle), within 25 % of it plus the step's inputs queued ahead on the link
    (half of their bytes / rate: the estimate splits the round trip evenly). The lower quartile, as
    for the quick replies above: a late wake-up anywhere on the way adds to a round trip."""
    host_of = two_hosts.rpc_devices()
    step_bytes: dict[tuple[int, int], int] = {}
    for r, row in rows(two_hosts, "step"):
        if row[1] == "set_tensor":
            key = (r["step"], row[0])
            step_bytes[key] = step_bytes.get(key, 0) + row[4]
    ratios: dict[int, list[float]] = {}
    for c, r in remote_rows(two_hosts):
        device, one_way = r[1], r[6]
        assert one_way >= 0.98 * DELAY_MS * 1e6, r
        if c["step"] == 0:
            continue
        rate = RATES_MBIT[host_of[device]] * 1e6 / 8 if not two_hosts.loopback else float("inf")
        queued = step_bytes.get((c["step"], device), 0) / rate / 2
        ratios.setdefault(host_of[device], []).append(one_way / 1e9 / (DELAY_MS / 1000 + queued))
    assert sorted(ratios) == [0, 1]
    for host, rs in sorted(ratios.items()):
        q = statistics.quantiles(rs, n=4)[0]
        print(
            f"host {host}: one-way estimate / (delay + queued inputs), lower quartile {q:.3f} of {len(rs)}"
        )
        assert abs(q - 1) <= TOLERANCE, (host, rs)


def test_llama_cli_over_rpc_logs_the_upload_and_the_remote_ops(
    rpc_model: Path, tmp_path: Path, schema_validator: Any
) -> None:
    """llama.cpp's own llama-cli with `--rpc` and LLAMA_INSTR_LOG (`instr exec`): the session opens
    at its first context, after the model loaded, and still holds the model's upload (the variable
    turns the recording on when the model begins to load); the patched server's ops are there."""
    import subprocess

    from llamacpp_instr.native import tools

    tools.build_tools(echo)  # the patched llama-cli (cached: test_tools builds the same)
    server = netsim.binary_server_command(rpc_server_exe())
    log = tmp_path / "cli.log"
    with netsim.Network([(None, 1.0, server)], loopback=True) as net:
        cmd = [sys.executable, "-m", "llamacpp_instr.cli", "exec", "-o", str(log), "llama-cli"]
        cmd += ["-m", str(rpc_model), "--rpc", net.endpoints[0], "-ngl", "99", "-p", PROMPT]
        cmd += ["-n", "4", "-st", "-t", "1", "--temp", "0"]
        r = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300
        )
    assert r.returncode == 0, r.stderr[-2000:]
    run = TwoHosts(log, [], "loopback", read_log(log), net.endpoints)
    for rec in run.records:
        schema_validator.validate(rec)
    assert run.start["metadata"]["program"] == "llama-cli"
    (rpc,) = run.rpc_devices()
    assert run.devices[rpc]["remote_timing"] is True
    uploaded = {row[2] for _, row in rows(run, "load") if row[1] == "set_tensor"}
    offloaded = {w["name"] for w in run.start["weights"] if w["buffer"].startswith("RPC")}
    assert offloaded and offloaded <= uploaded
    remote = remote_rows(run)
    assert remote and all(r[1] == rpc and r[10] > 0 for _, r in remote)


def test_instr_exec_refuses_the_rpc_server(tmp_path: Path) -> None:
    """ggml-rpc-server runs no libllama, so no session: `instr exec` says so, exit 2, no log."""
    from click.testing import CliRunner

    from llamacpp_instr.cli import main

    log = tmp_path / "server.log"
    r = CliRunner().invoke(main, ["exec", "-o", str(log), "ggml-rpc-server", "-p", "50052"])
    assert r.exit_code == 2, r.output
    assert "writes no log" in r.output and "Traceback" not in r.output
    assert not log.exists()


def test_instr_tools_names_the_rpc_server() -> None:
    from click.testing import CliRunner

    from llamacpp_instr.cli import main

    r = CliRunner().invoke(main, ["doctor", "--tools"])
    assert r.exit_code == 0 and "ggml-rpc-server" in r.output
