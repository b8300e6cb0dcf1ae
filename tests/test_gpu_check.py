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
    assert [(o.op, o.log_ns, o.cupti_ns) for o in ops] == [
        ("MUL_MAT", 52, (1040 - 1002) + (1050 - 1041)),
        ("ADD", 9, 1060 - 1054),
        ("MUL_MAT", 101, 2100 - 2002),
    ]
    assert [(g.log_op_ns, g.cupti_span_ns) for g in graphs] == [
        (61, 1061 - 1000),
        (101, 2101 - 2000),
    ]
    types = cj.per_type(ops)
    assert types["MUL_MAT"]["log_ns"] == 153 and types["MUL_MAT"]["cupti_ns"] == 47 + 98
    assert types["MUL_MAT"]["ratio"] == pytest.approx(153 / 145)
    assert types["ADD"]["ratio"] == pytest.approx(9 / 6)
    r = cj.report(ops, graphs)
    assert r["op_types_within_10pct"] == 1 and r["op_types_total"] == 2  # MUL_MAT 1.055, ADD 1.5
    assert r["coverage_min"] == pytest.approx(61 / 61) and r["graph_computes"] == 2
    assert cj.coverage(graphs) == pytest.approx([1.0, 1.0])


def test_a_trace_whose_marks_do_not_line_up_is_refused() -> None:
    kernels = cj.read_kernels(TRACE)
    with pytest.raises(ValueError, match="5 marks"):
        cj.join(kernels, [[("MUL_MAT", 52), ("ADD", 9)], [("MUL_MAT", 101), ("ADD", 3)]])
    with pytest.raises(ValueError, match="line 2"):
        cj.read_kernels(line(1, 2, MARK) + "\nnot a record\n")


def test_no_marks_is_no_stream() -> None:
    assert cj.mark_stream(cj.read_kernels(line(1, 2, "some_kernel"))) == []


def test_the_computes_of_a_cuda_log_come_in_busy_order() -> None:
    """On the SYNTHETIC CUDA log: one entry per busy stretch of the device, each holding at most
    that stretch's op count, the ops in the log's order."""
    from helpers.support import FIXTURES, read_log

    log = FIXTURES / "tiny-llama-cuda-full-detailed.SYNTHETIC.log.gz"
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

    log = FIXTURES / "tiny-llama-cuda-full-detailed.SYNTHETIC.log.gz"
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
    # the prompt step's tokens over its time until its outputs were ready (its compute's end)
    recs = read_log(log)
    begin = next(b for b in recs if b["type"] == "step_begin" and b["kind"] == "prompt")
    end = next(e for e in recs if e["type"] == "step_end" and e["step"] == begin["step"])
    ready = max(
        [end["t_start"] + end["dur"]]
        + [
            c["t_start"] + c["dur"]
            for c in recs
            if c["type"] == "compute" and c["step"] == begin["step"]
        ]
    )
    assert r["summary_prompt_tok_s"] == pytest.approx(
        begin["n_tokens"] / ((ready - end["t_start"]) / 1e9)
    )
