"""Every op of a trace against its roof: ``roof_fraction`` and ``bound`` in the op args.

A real DETAILED run of the bundled model, with a peaks file for the machine that made it. The
peaks are made up (round figures), so that each op's roof is worked out here from its own args
(estimated FLOPs and bytes, op, weight type) and its duration, independently of the converters'
roofline code. Chrome JSON is checked value by value and against the reference writer; the fast
Perfetto encoder against the reference Perfetto writer, and its op args against the JSON's.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import assert_same_trace, resolved
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from reference.chrome_json import reference_write_chrome_json
from reference.layout import layout

from llamacpp_instr.cli import main
from llamacpp_instr.converters.formats.convert import to_perfetto
from llamacpp_instr.converters.session import machine_peaks
from llamacpp_instr.converters.session.fold import iter_events
from llamacpp_instr.converters.traces.items import LayoutStats, Selection

pytestmark = pytest.mark.native

BANDWIDTH = 8.0  # GB/s
MATMUL = {"f32": 20.0, "f16": 16.0, "q4_1": 40.0, "q8_0": 30.0}  # GFLOP/s


def peaks_file(log: Path, tmp: Path, *, other_machine: bool = False) -> Path:
    info = next(ev.session for ev in iter_events(log) if hasattr(ev, "session"))
    machine, n_threads = machine_peaks.session_machine(info)
    assert machine, "the log names its machine (session_start.machine)"
    if other_machine:
        machine = {**machine, "cpu": "another CPU"}
    dev = machine_peaks.DevicePeaks("CPU", "cpu", "made up", BANDWIDTH, MATMUL)
    p = machine_peaks.Peaks(machine, n_threads, "2026-01-01T00:00:00Z", [dev])
    out = tmp / ("other.json" if other_machine else "peaks.json")
    out.write_text(json.dumps(p.to_json()))
    return out


def expected(args: dict[str, Any], dur_ns: int, kv_type: str) -> tuple[float, str]:
    """The roof fraction and bound of one op, from its args, by hand."""
    if args["op"] in ("MUL_MAT", "MUL_MAT_ID"):
        t = (args.get("weight_type") or kv_type).lower()
        compute = MATMUL.get(t) or max(MATMUL.values())
    else:
        compute = MATMUL["f32"]
    mem = args["est_bytes_moved"] / BANDWIDTH
    comp = args["est_flops"] / compute
    ideal = max(mem, comp)
    return (round(ideal / dur_ns, 3) if dur_ns > 0 else 0.0), (
        "compute" if comp > mem else "memory"
    )


def op_events(trace: bytes) -> list[dict[str, Any]]:
    doc = json.loads(trace)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if e.get("cat") == "op"]


def perfetto_op_args(trace: bytes) -> list[dict[str, Any]]:
    """Each op begin's args, in order, as ``support.resolved`` decodes them (doubles back from
    their bit-exact hex)."""
    return [
        {k: float.fromhex(v) if kind == "double_value" else v for k, (kind, v) in r[6]}
        for r in resolved(trace)
        if r[0] == "event" and r[2] == pb.TrackEvent.TYPE_SLICE_BEGIN and r[5] == ("op",)
    ]


@pytest.fixture(scope="module")
def roofed(smollm2_detailed: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("roofline")
    log = smollm2_detailed.path
    pf = peaks_file(log, tmp)
    js = to_perfetto(log, tmp / "t.json", fmt="json", peaks=pf).read_bytes()
    pt = to_perfetto(log, tmp / "t.pftrace", peaks=pf).read_bytes()
    kv = str(smollm2_detailed.of("session_start")[0]["context"].get("type_k") or "f16")
    return log, pf, js, pt, kv


def test_each_op_against_its_roof(roofed: Any) -> None:
    _, _, js, _, kv = roofed
    ops = op_events(js)
    assert len(ops) > 1000
    bounds = set()
    for e in ops:
        a = e["args"]
        dur_ns = round(e["dur"] * 1000)
        frac, bound = expected(a, dur_ns, kv)
        assert a["roof_fraction"] == frac, e
        assert a["bound"] == bound, e
        bounds.add(bound)
    # decoding at these peaks: the weight matmuls are memory-bound; something is compute-bound
    # only if an op does more than 2.5 FLOPs per byte (20 GFLOP/s over 8 GB/s) outside matmuls
    assert "memory" in bounds


def test_writers_agree(roofed: Any) -> None:
    log, pf, js, pt, _ = roofed
    roofs = machine_peaks.session_roofs(pf)
    # the Chrome JSON as the reference writer writes it, from the per-op layout
    ref = io.BytesIO()
    reference_write_chrome_json(
        layout(iter_events(log), Selection(), LayoutStats(), roofs=roofs), ref
    )
    assert js == ref.getvalue()
    # the fast Perfetto encoder (templates, compression, flushes) as the reference Perfetto writer
    assert_same_trace(log, roofs=roofs)
    # the Perfetto trace's op args are the JSON's, in the same order
    want = [e["args"] for e in op_events(js)]
    got = perfetto_op_args(pt)
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        assert list(g) == list(w)
        assert g["roof_fraction"] == w["roof_fraction"] and g["bound"] == w["bound"]


def test_without_peaks_no_roof_args(roofed: Any, tmp_path: Path) -> None:
    log = roofed[0]
    ops = op_events(to_perfetto(log, tmp_path / "t.json", fmt="json", roofline=False).read_bytes())
    assert ops and all("roof_fraction" not in e["args"] and "bound" not in e["args"] for e in ops)
    assert all("intensity" in e["args"] for e in ops)


def test_peaks_of_another_machine_refused(roofed: Any, tmp_path: Path) -> None:
    log = roofed[0]
    other = peaks_file(log, tmp_path, other_machine=True)
    out = tmp_path / "t.pftrace"
    r = CliRunner().invoke(main, ["to-perfetto", str(log), "-o", str(out), "--peaks", str(other)])
    assert r.exit_code != 0
    assert "another CPU" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not out.exists() and not list(tmp_path.glob("*.partial"))
