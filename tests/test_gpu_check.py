"""bench/cupti_join.py, the GPU script's check of the CUDA op timer against CUPTI, on kernel
records made up here in the tracer's format (no GPU here): the join by the marks' order, each op
type's totals and the coverage, computed by hand; a trace whose marks do not line up with the
log, and a line that is no record, are errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import cupti_join as cj  # noqa: E402

MARK = "void ggml_cuda_instr_stamp(unsigned long *)"


def line(start: int, end: int, name: str, stream: int = 7) -> str:
    return f"{start} {end} {stream} 3 {(3 << 32) | start} {name}"


# two graph computes on stream 7: ops (MUL_MAT, ADD) then (MUL_MAT); a copy's kernel on stream 9
TRACE = "\n".join(
    [
        line(1000, 1001, MARK),
        line(1002, 1040, "mul_mat_vec_q<...>"),
        line(1041, 1050, "quantize_q8_1"),  # (a second kernel of the same op)
        line(1052, 1053, MARK),
        line(1054, 1060, "k_bin_bcast<op_add>"),
        line(1061, 1062, MARK),  # end of the first graph compute
        line(1500, 1600, "copy on another stream", stream=9),
        line(2000, 2001, MARK),
        line(2002, 2100, "mul_mat_vec_q<...>"),
        line(2101, 2102, MARK),  # end
    ]
)
COMPUTES = [[("MUL_MAT", 52), ("ADD", 9)], [("MUL_MAT", 101)]]


def test_kernels_join_to_ops_by_their_marks() -> None:
    ops, graphs = cj.join(cj.read_kernels(TRACE), COMPUTES)
    assert [(o.op, o.log_ns, o.cupti_ns, o.span_ns, o.cold) for o in ops] == [
        ("MUL_MAT", 52, (1040 - 1002) + (1050 - 1041), 1050 - 1002, True),
        ("ADD", 9, 1060 - 1054, 1060 - 1054, True),
        ("MUL_MAT", 101, 2100 - 2002, 2100 - 2002, False),  # its kernel ran before: warm
    ]
    # each op mark's time: its start to the next kernel's
    assert [(g.log_op_ns, g.cupti_span_ns, g.cupti_marks_ns) for g in graphs] == [
        (61, 1061 - 1000, (1002 - 1000) + (1054 - 1052)),
        (101, 2101 - 2000, 2002 - 2000),
    ]
    # the cold ops (a kernel's first run) apart
    types = cj.per_type(ops)
    assert types["MUL_MAT"]["n"] == 1 and types["MUL_MAT"]["n_cold"] == 1
    assert types["MUL_MAT"]["log_ns"] == 101 and types["MUL_MAT"]["cupti_ns"] == 98
    assert types["MUL_MAT"]["cold_log_ns"] == 52
    assert types["MUL_MAT"]["ratio"] == pytest.approx(101 / 98)
    assert types["ADD"]["n"] == 0 and types["ADD"]["n_cold"] == 1
    r = cj.report(ops, graphs)
    assert r["op_types_within_10pct"] == 1 and r["op_types_total"] == 1 and r["cold_ops"] == 2
    assert r["graph_computes"] == 2
    assert cj.coverage(graphs) == pytest.approx([61 / (61 - 4), 101 / (101 - 2)])
    assert r["coverage_min"] == pytest.approx(101 / 99)


def test_a_compute_calibration_mark_is_no_op() -> None:
    """A build that marks each compute's calibration (a mark right after its end mark): the
    join skips it, and a compute's GPU time still ends at its end mark."""
    calibrated = "\n".join(
        [
            *TRACE.splitlines()[:6],
            line(1063, 1064, MARK),  # the calibration mark
            *TRACE.splitlines()[6:],
            line(2103, 2104, MARK),
        ]
    )
    ops, graphs = cj.join(cj.read_kernels(calibrated), COMPUTES)
    assert [(o.op, o.cupti_ns) for o in ops] == [("MUL_MAT", 47), ("ADD", 6), ("MUL_MAT", 98)]
    assert [g.cupti_span_ns for g in graphs] == [1061 - 1000, 2101 - 2000]


def test_a_trace_whose_marks_do_not_line_up_is_refused() -> None:
    kernels = cj.read_kernels(TRACE)
    with pytest.raises(ValueError, match="5 marks"):
        cj.join(kernels, [[("MUL_MAT", 52), ("ADD", 9)], [("MUL_MAT", 101), ("ADD", 3)]])
    with pytest.raises(ValueError, match="line 2"):
        cj.read_kernels(line(1, 2, MARK) + "\nnot a record\n")


def test_no_marks_is_no_stream() -> None:
    assert cj.mark_stream(cj.read_kernels(line(1, 2, "some_kernel"))) == []


def test_the_computes_of_a_cuda_log_come_in_busy_order() -> None:
    """On a CUDA log of the GPU script: one entry per busy stretch of the device, each holding at most
    that stretch's op count, the ops in the log's order."""
    from helpers.support import FIXTURES, read_log

    log = FIXTURES / "l1b-cuda-full-detailed.log.gz"
    computes = cj.computes_of_log(log, "CUDA0")
    recs = read_log(log)
    busy = [b for r in recs if r["type"] == "compute" for b in r.get("busy", [])]
    assert len(computes) == len(busy)
    assert all(len(c) <= b[4] for c, b in zip(computes, busy, strict=True))
    assert computes[0] and all(isinstance(n, int) and n >= 0 for c in computes for _, n in c)


def test_the_headline_is_the_summary_s_over_llama_bench_s(tmp_path: Path) -> None:
    """gpu_check.py headline: the summary's prompt and generation tokens/s of a log over
    llama-bench's (its -o json rows), each computed here from the steps by hand."""
    import json

    import gpu_check
    from helpers.support import FIXTURES, read_log

    log = FIXTURES / "l1b-cuda-full-detailed.log.gz"
    bench = tmp_path / "bench.json"
    bench.write_text(
        json.dumps(
            [
                {"n_prompt": 13, "n_gen": 0, "avg_ts": 100.0},
                {"n_prompt": 0, "n_gen": 2, "avg_ts": 50.0},
            ]
        )
    )
    import argparse

    r = gpu_check.cmd_headline(argparse.Namespace(log=log, bench=bench))
    assert r["bench_prompt_tok_s"] == 100.0 and r["bench_gen_tok_s"] == 50.0
    assert r["prompt_ratio"] == pytest.approx(r["summary_prompt_tok_s"] / 100.0)
    assert r["gen_ratio"] == pytest.approx(r["summary_gen_tok_s"] / 50.0)
    # the prompt steps' tokens over their time until each one's outputs were ready (its last
    # compute's end, past llama_decode's return)
    recs = read_log(log)
    n_tokens = 0
    ns = 0
    for begin in (b for b in recs if b["type"] == "step_begin" and b["kind"] == "prompt"):
        end = next(e for e in recs if e["type"] == "step_end" and e["step"] == begin["step"])
        ready = max(
            [end["t_start"] + end["dur"]]
            + [
                c["t_start"] + c["dur"]
                for c in recs
                if c["type"] == "compute" and c["step"] == begin["step"]
            ]
        )
        n_tokens += begin["n_tokens"]
        ns += ready - end["t_start"]
    assert n_tokens > 0 and r["summary_prompt_tok_s"] == pytest.approx(n_tokens / (ns / 1e9))
