"""Helpers shared by the test modules, defined once (``from helpers.support import ...``;
conftest.py holds the fixtures)."""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from hypothesis import strategies as st
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from reference.layout import layout
from reference.perfetto_writer import write_perfetto

from llamacpp_instr.converters.formats.convert import kv_flows_for
from llamacpp_instr.converters.formats.perfetto import writer as perfetto_writer
from llamacpp_instr.converters.session.fold import iter_events, iter_events_packed
from llamacpp_instr.converters.traces.items import LayoutStats, Selection
from llamacpp_instr.converters.traces.layout import layout_bulk
from llamacpp_instr.running import peak_probe as measure

TESTS_DIR = Path(__file__).resolve().parent.parent
FIXTURES = TESTS_DIR / "fixtures"
REAL_FIXTURES = sorted(FIXTURES.glob("*.log.gz"))
PROMPT = "The capital of France is"
# CI runs a fixed, reproducible set of examples; `FUZZ_EXAMPLES=20000 pytest -k fuzz` explores more
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "300"))
FUZZ_DERANDOMIZE = "FUZZ_EXAMPLES" not in os.environ

# fuzzed JSON values, for the fields of records the converters must pass through or reject:
# integers past 64 bits (what no C side writes, and Python's json reads), lists and objects
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


def subst_nodes(nodes: list[Any], triples: list[list[int]], at: list[list[int]]) -> list[Any]:
    """A node table (as JSON) with the numbers of its nodes' and leaf sources' ``shape`` and
    ``bytes`` replaced as a graph record's ``subst`` says (docs/schema.md: [where, old, new],
    where a shape's dimension 0 to 3, or 4 for bytes), then those its ``subst_at`` names set by
    their position ([position, value], the numbers counted in the order the record writes them),
    independently of converters/."""
    m = {(where, old): new for where, old, new in triples}
    numbers: list[tuple[dict[str, Any], str, int]] = []  # (object, key, index or -1): in order

    def sub(x: dict[str, Any]) -> dict[str, Any]:
        x = dict(x)
        if "node" in x:
            return x
        x["shape"] = [m.get((d, v), v) for d, v in enumerate(x["shape"])]
        x["bytes"] = m.get((4, x["bytes"]), x["bytes"])
        numbers.extend((x, "shape", d) for d in range(len(x["shape"])))
        numbers.append((x, "bytes", -1))
        return x

    out = []
    for n in nodes:
        node = sub({k: v for k, v in n.items() if k != "src"})
        node["src"] = [sub(x) for x in n["src"]]
        out.append(node)
    for pos, value in at:
        x, key, d = numbers[pos]
        if d < 0:
            x[key] = value
        else:
            x[key][d] = value
    return [{k: node[k] for k in n} for node, n in zip(out, nodes, strict=True)]  # keys in order


def record_edits(recs: list[dict[str, Any]]) -> Any:
    """A strategy of one to four edits of ``recs``: (record, a key's pick, a fuzzed JSON value),
    each setting one of the record's own fields (``with_edits``)."""
    return st.lists(
        st.tuples(st.integers(0, len(recs) - 1), st.text(max_size=12), JSON),
        min_size=1,
        max_size=4,
    )


def with_edits(
    recs: list[dict[str, Any]], edits: list[tuple[int, str, Any]]
) -> list[dict[str, Any]]:
    """A copy of ``recs`` with each edit made: the record's field picked by the key's length (of
    its sorted fields) holds the value."""
    out = json.loads(json.dumps(recs))
    for i, key, value in edits:
        r = out[i]
        r[sorted(r)[len(key) % len(r)]] = value
    return out


def run_on_lib(script: str, lib: Path, *args: object, timeout: float = 300) -> Any:
    """Run ``script`` (python -c) with ``args`` on the libraries in ``lib`` (LLAMA_CPP_LIB_PATH: a
    testing or sanitized build's) and return its last line of stdout, read as JSON; a child that
    fails fails the test with its stderr's end."""
    r = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        env=dict(os.environ, LLAMA_CPP_LIB_PATH=str(lib)),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def read_log(path: Path) -> list[dict[str, Any]]:
    """Every line of a log, plain or .gz, parsed with the standard library (independent of
    converters/): a blank or damaged line fails. A graph record naming an earlier graph's node
    table (``same_as``, with its ``subst`` if any) gets that table's ``nodes`` too, as tests read
    every graph's nodes."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        recs = [json.loads(line) for line in f]
    tables: dict[tuple[str, int, int], list[Any]] = {}
    for r in recs:
        if r.get("type") != "graph":
            continue
        if "same_as" in r:
            r["nodes"] = tables[(r["sid"], r["ctx"], r["same_as"])]
            if "subst" in r:
                r["nodes"] = subst_nodes(r["nodes"], r["subst"], r.get("subst_at", []))
                tables[(r["sid"], r["ctx"], r["graph"])] = r["nodes"]
        else:
            tables[(r["sid"], r["ctx"], r["graph"])] = r["nodes"]
    return recs


def instr(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``instr ARGS`` in a child process (the CLI as a user runs it), with ``env`` added to this
    process's environment: its exit status, stdout and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "llamacpp_instr.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def assert_one_line_error(r: subprocess.CompletedProcess[str], words: str, code: int = 2) -> None:
    """A command refused bad input as users must see it: exit ``code``, one line on stderr that
    says ``words``, no traceback."""
    assert r.returncode == code, (r.args, r.stdout, r.stderr)
    assert words in r.stderr, (r.args, r.stderr)
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def converts_cleanly(log: Path, out: Path) -> None:
    """The log converts to a Perfetto trace with nothing skipped, unknown or replaced."""
    from llamacpp_instr.converters.formats.convert import convert

    stats, report = convert(log, out)
    assert report.skipped == [] and not report.unknown_types and not report.replaced_utf8
    assert stats.steps > 0 and out.stat().st_size > 0


def by_type(records: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == type_]


def write_log(path: Path, recs: list[Any]) -> Path:
    """``recs`` as a plain log at ``path``, one JSON line each."""
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def plain_copy(src: Path, tmp_path: Path) -> Path:
    """A .gz fixture as a plain log in ``tmp_path``."""
    dest = tmp_path / src.name.removesuffix(".gz")
    dest.write_text("".join(json.dumps(r) + "\n" for r in read_log(src)))
    return dest


def make_run(model: Path, out: Path, level: str, **kw: Any) -> Any:
    """A real run through ``runner.run``: fixed length (tiny random models hit EOS early)."""
    from llamacpp_instr.running import runner

    cfg = runner.RunConfig(
        model=model,
        prompt=kw.pop("prompt", PROMPT),
        n_predict=kw.pop("n_predict", 12),
        threads=kw.pop("threads", 2),
        n_ctx=kw.pop("n_ctx", 512),
        ignore_eos=kw.pop("ignore_eos", True),
        level=level,
        out=out,
        **kw,
    )
    return runner.run(cfg)


class RunLog:
    """A real run and its parsed log."""

    def __init__(self, result: Any) -> None:
        self.result = result
        self.path: Path = result.log_path
        self.records = read_log(self.path)

    def of(self, type_: str) -> list[dict[str, Any]]:
        return by_type(self.records, type_)

    @property
    def start(self) -> dict[str, Any]:
        return self.records[0]


def hand_bytes(path: Path) -> int:
    """A GGUF's tensor bytes from each tensor's element count and its type's block size."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

    total = 0
    for t in GGUFReader(path).tensors:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(int(t.tensor_type))]
        total += int(t.n_elements) // block * size
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def loopback_server(handle: Callable[[socket.socket], None]) -> Iterator[str]:
    """A listener on a free loopback port that hands each connection it accepts to ``handle`` (on
    its accepting thread: a handler that serves one for long starts a thread of its own); yields
    its endpoint, ``127.0.0.1:PORT``."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.settimeout(None)
            handle(conn)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(timeout=5)
        srv.close()


def wait_ready(
    port: int, proc: subprocess.Popen[str], timeout: float = 120, path: str = "/v1/models"
) -> None:
    """Until the server ``proc`` (instr serve, llama-server) answers ``path`` on ``port``; fails
    if it exits first."""
    import urllib.request

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"the server did not answer {path}")


def realtime(*, children: bool = True) -> list[str]:
    """A command prefix that runs a program at a real-time priority (SCHED_FIFO) where this
    process may set one (root, chrt), else nothing. A figure of the program's own and the log's
    time the same work from clocks read a few instructions apart; on a shared machine another
    process can take the CPU in between (5-17 ms gaps seen under a load of 5 on 2 cores, none at
    this priority, the kernel's real-time throttling leaving the rest 5 % of the time). With
    ``children=False`` the processes it starts run at the normal policy (SCHED_RESET_ON_FORK): a
    client timed at that priority, not the server it starts."""
    import shutil

    if shutil.which("chrt") is None:
        return []
    prefix = ["chrt", "-f", "1"] if children else ["chrt", "-R", "-f", "1"]
    ok = subprocess.run([*prefix, "true"], capture_output=True).returncode == 0
    return prefix if ok else []


def exec_server(
    log: Path,
    model: Path,
    *server_args: str,
    instr_args: tuple[str, ...] = (),
    stdout: int = subprocess.DEVNULL,
) -> tuple[subprocess.Popen[str], int]:
    """The patched llama-server on ``model``, run by ``instr exec -o log`` on a free port, once it
    answers /health (killed if it never does): the process and its port."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llamacpp_instr.cli", "exec", "-o", str(log), *instr_args]
        + ["llama-server", "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
        + ["--no-webui", *server_args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(port, proc, timeout=180, path="/health")
    except BaseException:
        proc.kill()
        proc.wait(60)
        raise
    return proc, port


# llama-server's SIGINT and SIGTERM handler takes its task queue's lock (server_queue::terminate,
# called in the handler), and its main thread holds that lock for a moment after a response, taking
# the cancel task the response leaves. A signal delivered to that thread then deadlocks the server:
# gdb showed terminate() waiting, inside the handler, on the lock its own thread held. The pin's
# server does this with or without the patches (the patched library calls the server's handler
# where the signal arrived); a test that stops a server after a request lets it settle first.
SERVER_SETTLE_S = 0.5


def signal_server(proc: subprocess.Popen[str], sig: int = signal.SIGINT) -> None:
    """``sig`` to ``proc`` (``instr exec llama-server``, which passes it on) once the server has
    finished with its last request."""
    time.sleep(SERVER_SETTLE_S)
    proc.send_signal(sig)


def post_json(port: int, endpoint: str, body: dict[str, Any], timeout: float = 120) -> Any:
    """llama-server's answer to ``body`` POSTed to ``endpoint`` (a status other than 200
    raises)."""
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{endpoint}",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def post_completion(port: int, body: dict[str, Any], timeout: float = 120) -> Any:
    """llama-server's /completion answer to ``body`` (a status other than 200 raises)."""
    return post_json(port, "/completion", body, timeout)


def data_url(image: Path) -> str:
    """``image``'s bytes as a chat request's ``data:`` URL (PNG by its suffix, else JPEG)."""
    import base64

    kind = "png" if image.suffix == ".png" else "jpeg"
    return f"data:image/{kind};base64," + base64.b64encode(image.read_bytes()).decode()


def request_records(log: Path) -> list[dict[str, Any]]:
    """The ``request`` records of a server's log as written so far."""
    recs = []
    for line in log.read_text(encoding="utf-8").splitlines():
        if '"type":"request"' in line:
            rec = json.loads(line)
            if rec.get("type") == "request":
                recs.append(rec)
    return recs


def wait_requests(log: Path, n: int, timeout: float = 60) -> list[dict[str, Any]]:
    """The log's request records once there are ``n`` (a request's record is written after its
    answer is sent), or those there are after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while len(recs := request_records(log)) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    return recs


# --- logs made from the fixtures ---------------------------------------------------------


def synthetic_log(tmp_path: Path, n_steps: int) -> Path:
    """A bigger log: the detailed fixture's last generation step repeated, two sessions, a few
    odd values (an op of a node outside the graph, fused nodes out of range)."""
    recs = read_log(FIXTURES / "tiny-llama-detailed.log.gz")
    head = [r for r in recs if r["type"] in ("session_start", "graph")]
    last = max(r["step"] for r in recs if r["type"] == "step_begin")
    group = [r for r in recs if r.get("step") == last and r["type"] != "graph"]
    span = max(r["ts"] for r in group) - min(r["ts"] for r in group) + 1000
    t_end = max(r["ts"] for r in recs)
    out: list[dict[str, Any]] = []
    for sid in ("00000000000000a1", "00000000000000b2"):
        out += [dict(r, sid=sid) for r in head]
        for k in range(n_steps):
            for r in group:
                r2 = dict(r, sid=sid, step=k, ts=r["ts"] + (k + 1) * span)
                if "t_start" in r2:
                    r2["t_start"] = r["t_start"] + (k + 1) * span
                if r["type"] == "compute" and k % 7 == 3:
                    ops = [list(e) for e in r["ops"]]
                    ops[1] = [10_000, *ops[1][1:]]  # outside the graph: not an op
                    ops[2] = ops[2][:3] + [[-1, 1, 99_999]]  # fused, partly out of range
                    r2["ops"] = ops
                out.append(r2)
        out.append(dict(recs[-1], sid=sid, ts=t_end + (n_steps + 2) * span))
    return write_log(tmp_path / "synthetic.log", out)


def edit_ops(recs: list[dict[str, Any]], k: int, fn: Any) -> list[dict[str, Any]]:
    """The records with compute record ``k`` changed by ``fn(record)``."""
    out = [json.loads(json.dumps(r)) for r in recs]
    comp = [r for r in out if r["type"] == "compute"][k % 3]
    fn(comp)
    return out


# odd values in one compute record: what the per-op decoder skips, converts or rejects
ODD_OPS: dict[str, Any] = {
    "negative offset": lambda c: c["ops"][5].__setitem__(1, -3),
    "negative duration": lambda c: c["ops"][0].__setitem__(2, -1),
    "float offset": lambda c: c["ops"][5].__setitem__(1, 12.75),
    "float node": lambda c: c["ops"][5].__setitem__(0, 3.0),
    "string values": lambda c: c["ops"].__setitem__(4, ["3", "17", "5"]),
    "string entry": lambda c: c["ops"].__setitem__(4, "123"),
    "dict entry": lambda c: c["ops"].__setitem__(4, {"0": 1, "1": 2, "2": 3}),
    "short entry": lambda c: c["ops"].__setitem__(4, [1, 2]),
    "long entry": lambda c: c["ops"].__setitem__(4, [1, 2, 3, [4], [5]]),
    "all fused": lambda c: c.__setitem__("ops", [e[:3] + [[0]] for e in c["ops"]]),
    "fused not a list": lambda c: c["ops"].__setitem__(4, [1, 2, 3, 4]),
    "fused strings": lambda c: c["ops"].__setitem__(4, [1, 2, 3, ["2", "x"]]),
    "fused floats": lambda c: c["ops"].__setitem__(4, [1, 2, 3, [2.0, 1.5]]),
    "node out of range": lambda c: c["ops"].__setitem__(0, [99_999, 0, 5]),
    "node negative": lambda c: c["ops"].__setitem__(0, [-2, 0, 5]),
    "bool values": lambda c: c["ops"].__setitem__(0, [True, False, True]),
    "no ops": lambda c: c.pop("ops"),
    "ops null": lambda c: c.__setitem__("ops", None),
    "ops empty": lambda c: c.__setitem__("ops", []),
    "ops a dict": lambda c: c.__setitem__("ops", {"a": 1}),
    "unknown graph": lambda c: c.__setitem__("graph", 77),
    "threads short": lambda c: c.__setitem__("threads", c.get("threads", [[1]])[:2]),
    "threads ragged": lambda c: c.__setitem__("threads", [[1], [2, 3]] * 100),
    "threads bad row": lambda c: c.__setitem__("threads", [None] * len(c["ops"])),
    "threads strings": lambda c: c.__setitem__("threads", [["1", "2"]] * len(c["ops"])),
    "threads a number": lambda c: c.__setitem__("threads", 5),
    "layers float": lambda c: c["layers"][0].__setitem__(1, 2.5),
    "layers negative": lambda c: c["layers"][0].__setitem__(2, -7),
    "layers short": lambda c: c["layers"].__setitem__(0, [1, 2, 3]),
    "layers empty": lambda c: c.__setitem__("layers", []),
    "layers start overflows": lambda c: c["layers"][0].__setitem__(1, 2**63 - 10),
    "layers with t_start a float": lambda c: c.__setitem__("t_start", float(c["t_start"])),
    "nothing timed": lambda c: c.update(layers=[], ops=[]),
    "nothing timed, junk ubatch": lambda c: c.update(layers=[], ops=[], ubatch="x"),
    "no layers": lambda c: c.pop("layers"),
    "huge offset": lambda c: c["ops"][3].__setitem__(1, 2**63 + 5),
    "offset overflows t_start": lambda c: c["ops"][3].__setitem__(1, 2**63 - 10),
    "huge dropped op": lambda c: c["ops"].__setitem__(3, [99_999, 2**63 + 5, 2**64 - 1]),
    "ubatch null": lambda c: c.__setitem__("ubatch", None),
    "ubatch string": lambda c: c.__setitem__("ubatch", "0"),
    "ubatch junk": lambda c: c.__setitem__("ubatch", "x"),
    "no dur": lambda c: c.pop("dur"),
    "status junk": lambda c: c.__setitem__("status", "x"),
}


# --- Perfetto traces, decoded --------------------------------------------------------------


def packets(data: bytes) -> list[Any]:
    """The trace's packets, compressed bundles inflated in place."""
    trace = pb.Trace()
    trace.ParseFromString(data)
    out: list[Any] = []
    for p in trace.packet:
        if p.HasField("compressed_packets"):
            assert len(p.ListFields()) == 1
            out.extend(packets(zlib.decompress(p.compressed_packets)))
        else:
            out.append(p)
    return out


def _value(a: Any, strings: dict[int, str]) -> Any:
    kind = a.WhichOneof("value")
    v = getattr(a, kind)
    if kind == "string_value_iid":  # an interned string value
        return "string_value", strings[v]
    if isinstance(v, float):
        return kind, v.hex() if not math.isnan(v) else "nan"  # bit-exact, NaN equal to NaN
    return kind, v


def resolved(data: bytes) -> list[tuple[Any, ...]]:
    """Every packet as what it says, interning resolved; checks the sequence's invariants."""
    pk = packets(data)
    assert pk, "empty trace"
    seq = pk[0].trusted_packet_sequence_id
    assert pk[0].sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    names: dict[int, str] = {}
    arg_names: dict[int, str] = {}
    strings: dict[int, str] = {}
    categories: dict[int, str] = {}
    out: list[tuple[Any, ...]] = []
    for k, p in enumerate(pk):
        assert p.trusted_packet_sequence_id == seq
        assert k == 0 or not p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        idata = p.interned_data
        for table, entries in (
            (names, [(e.iid, e.name) for e in idata.event_names]),
            (arg_names, [(e.iid, e.name) for e in idata.debug_annotation_names]),
            (strings, [(e.iid, e.str.decode()) for e in idata.debug_annotation_string_values]),
            (categories, [(e.iid, e.name) for e in idata.event_categories]),
        ):
            for iid, s in entries:
                assert iid not in table, "an interned string defined twice"
                table[iid] = s
        if p.HasField("track_descriptor"):
            assert not p.HasField("track_event")
            out.append(("track", MessageToDict(p.track_descriptor)))
            continue
        assert p.HasField("track_event") and p.HasField("timestamp")
        assert p.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        e = p.track_event
        args = [(arg_names[a.name_iid], _value(a, strings)) for a in e.debug_annotations]
        cats = tuple(categories[c] for c in e.category_iids) + tuple(e.categories)
        assert len(dict(args)) == len(args), "an arg given twice"
        out.append(
            (
                "event",
                e.track_uuid,
                e.type,
                p.timestamp,
                names[e.name_iid] if e.HasField("name_iid") else None,
                cats,
                tuple(args),  # in order: the UI lists args as written
                e.double_counter_value if e.HasField("double_counter_value") else None,
                tuple(e.flow_ids),
                tuple(e.terminating_flow_ids),
            )
        )
    return out


def reference_trace(log: Path, sel: Selection | None = None, roofs: Any = None) -> bytes:
    buf = io.BytesIO()
    sel = sel or Selection()
    items = layout(iter_events(log), sel, LayoutStats(), flows=kv_flows_for(log, sel), roofs=roofs)
    write_perfetto(items, buf)
    return buf.getvalue()


def fast_trace(
    log: Path,
    sel: Selection | None = None,
    compress: bool | None = None,
    flush_rows: int | None = None,
    roofs: Any = None,
) -> tuple[bytes, int]:
    """The fast trace, and how many computes came from a template (``roofs``: the sessions'
    roofs, ``machine_peaks.session_roofs``)."""
    buf = io.BytesIO()
    sel = sel or Selection()
    flows = kv_flows_for(log, sel)
    items = layout_bulk(iter_events_packed(log), sel, LayoutStats(), flows=flows, roofs=roofs)
    w = perfetto_writer.Writer(buf, compress)
    saved = perfetto_writer.FLUSH_ROWS
    perfetto_writer.FLUSH_ROWS = flush_rows or saved
    try:
        w.write(items)
    finally:
        perfetto_writer.FLUSH_ROWS = saved
    return buf.getvalue(), w.flushes.templates.templated


def assert_same_trace(
    log: Path, sel: Selection | None = None, roofs: Any = None
) -> list[tuple[Any, ...]]:
    """The fast traces (plain and compressed, flushed at each step so that computes come from
    templates, or in big flushes) decode to the reference's."""
    want = resolved(reference_trace(log, sel, roofs))
    for compress, flush_rows in ((False, 1), (True, 1), (False, 300), (False, None)):
        data, _ = fast_trace(log, sel, compress, flush_rows, roofs)
        got = resolved(data)
        assert len(got) == len(want)
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g == w, f"packet {k} differs ({compress=}, {flush_rows=})"
    return want


def rewrite_log(src: Path, dest: Path, edit: Any) -> Path:
    recs = [json.loads(line) for line in gzip.open(src, "rt", encoding="utf-8")]
    dest.write_text("".join(json.dumps(r) + "\n" for r in edit(recs)))
    return dest


# a quick peak measurement (small sizes, two runs): enough for a sane shape, not for figures
QUICK = measure.Plan(
    n_threads=2, types=("f32", "q8_0"), bandwidth_elements=1 << 20, matmul_size=256, matmul_n=16,
    n_runs=2, gemv_bytes=1 << 20,
)  # fmt: skip


class Page:
    """A report opened in the browser, with every console error and uncaught exception kept."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page = browser.new_page()
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.on(
            "console",
            lambda m: self.errors.append(m.text) if m.type in ("error", "warning") else None,
        )
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(path.as_uri())
        self.page.wait_for_load_state("load")

    def rows(self, table: str) -> int:
        return int(self.page.locator(f'table[data-table="{table}"] tbody tr').count())

    def marks(self, chart: str) -> int:
        return int(self.page.locator(f'figure[data-chart="{chart}"] .mark').count())

    def declared_marks(self, chart: str) -> int:
        return int(self.page.locator(f'figure[data-chart="{chart}"]').get_attribute("data-marks"))

    def column(self, table: str, i: int) -> list[str]:
        cells = self.page.locator(f'table[data-table="{table}"] tbody tr td:nth-child({i + 1})')
        return [str(v) for v in cells.evaluate_all("els => els.map(e => e.dataset.v)")]

    def sort_by(self, table: str, i: int) -> None:
        self.page.locator(f'table[data-table="{table}"] thead th').nth(i).click()

    def close(self) -> None:
        # only the page itself was loaded: nothing from a network
        assert all(u.startswith("file://") for u in self.requests), self.requests
        assert not self.errors, self.errors
        self.page.close()


def _plain(kind: str, v: Any) -> Any:
    """A resolved arg's value as written (doubles are kept as hex there)."""
    if kind == "double_value":
        return float("nan") if v == "nan" else float.fromhex(v)
    return v


def trace_slices(data: bytes) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
    """A Perfetto trace's slices (begin and end paired per track): track (its name), name, ts,
    dur, depth, args (values as written), cats, flows_out, flows_in; and the tracks by uuid
    (``name``, ``parent``)."""
    tracks: dict[int, dict[str, Any]] = {}
    stacks: dict[int, list[tuple[Any, ...]]] = {}
    out: list[dict[str, Any]] = []
    for r in resolved(data):
        if r[0] == "track":
            d = r[1]
            tracks[int(d["uuid"])] = {"name": d["name"], "parent": int(d.get("parentUuid", 0))}
            continue
        _, track, kind, ts, name, cats, args, _, flows, ends = r
        if kind == pb.TrackEvent.TYPE_SLICE_BEGIN:
            stacks.setdefault(track, []).append((name, ts, args, cats, flows, ends))
        elif kind == pb.TrackEvent.TYPE_SLICE_END:
            name, t0, args, cats, flows, ends = stacks[track].pop()
            out.append(
                {
                    "track": tracks[track]["name"],
                    "track_uuid": track,
                    "name": name,
                    "ts": t0,
                    "dur": ts - t0,
                    "depth": len(stacks[track]),
                    "args": {k: _plain(kind, v) for k, (kind, v) in args},
                    "cats": cats,
                    "flows_out": flows,
                    "flows_in": ends,
                }
            )
    assert all(not s for s in stacks.values()), "unclosed slices"
    return out, tracks


def fill(path: Path) -> None:
    """Fill the file system of ``path`` up: a file that takes every free byte."""
    with path.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass


def whole_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a file, strictly: whole, newline-terminated JSON objects."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), f"{path}: last line is not whole"
    return [json.loads(line) for line in data.split(b"\n")[:-1]]


def series(log: Path) -> list[Path]:
    """LOG.k .. LOG.1, LOG: oldest first (named independently of the reader's ordering)."""
    rotated = sorted(
        (p for p in log.parent.glob(log.name + ".*") if p.name[len(log.name) + 1 :].isdigit()),
        key=lambda p: -int(p.name[len(log.name) + 1 :]),
    )
    return rotated + [log]


# llama_get_memory_breakdown's columns (session_start.memory.buffers) and the purposes of
# memory_alloc records each one counts
LLAMA_PURPOSES = {
    "weights": ("weights",),
    "kv_cache": ("kv_cache", "recurrent"),
    "compute": ("compute",),
}


def live_buffers(records: list[dict[str, Any]], until_type: str = "step_begin") -> dict[int, dict]:
    """The buffers live when the first ``until_type`` record was written."""
    live: dict[int, dict] = {}
    for r in records:
        if r["type"] == until_type:
            break
        if r["type"] == "memory_alloc":
            live[r["id"]] = r
        elif r["type"] == "memory_free":
            live.pop(r["id"], None)
    return live


def assert_buffers_sum_to_breakdown(records: list[dict[str, Any]], live: dict[int, dict]) -> None:
    """The live buffers' bytes per buffer type and purpose equal llama.cpp's own breakdown
    (session_start.memory.buffers, from llama_get_memory_breakdown) in every row and column."""
    breakdown = by_type(records, "session_start")[0]["memory"]["buffers"]
    assert breakdown
    for row in breakdown:
        for key, purposes in LLAMA_PURPOSES.items():
            ours = sum(
                b["bytes"]
                for b in live.values()
                if b["buffer_type"] == row["buffer"] and b["purpose"] in purposes
            )
            assert ours == row[key], (row["buffer"], key, ours, row[key])


def gguf_kv_shape(model: Path) -> tuple[int, int]:
    """A model's layer count and the K (or V) elements each KV cell holds per layer, from its own
    hyperparameters (no llama.cpp involved)."""
    from gguf import GGUFReader

    reader = GGUFReader(model)

    def value(key: str) -> int:
        f = reader.fields[key]
        return int(f.parts[f.data[0]][0])

    arch_field = reader.fields["general.architecture"]
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    n_layer = value(f"{arch}.block_count")
    n_embd = value(f"{arch}.embedding_length")
    n_head = value(f"{arch}.attention.head_count")
    n_head_kv = value(f"{arch}.attention.head_count_kv")
    return n_layer, n_embd // n_head * n_head_kv


def gguf_kv_bytes(model: Path, n_ctx: int) -> int:
    """An f16 KV cache's bytes from the model's own hyperparameters (no llama.cpp involved)."""
    n_layer, n_embd_kv = gguf_kv_shape(model)
    return n_layer * n_ctx * 2 * n_embd_kv * 2
