"""bench/cupti_join.py, the GPU script's check of the CUDA op timer against CUPTI, on records made
up here in the tracer's format (no GPU here): the join by the marks' order, each op type's totals
and the coverage, computed by hand; device copies as ops' work, host copies matched to the log's,
all streams' totals (GGML_CUDA_GRAPH_OPT); a trace whose marks do not line up with the log, and a
line that is no record, are errors. gpu_check.py's concurrent regions and headline, and
gpu_verdict.py's judgement of the figures against their targets."""

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


def copy_row(start: int, end: int, kind: str, n: int, stream: int = 7, graph: int = 3) -> str:
    return f"{start} {end} {stream} {graph} 0 [memcpy {kind} {n}]"


def test_a_device_copy_inside_an_op_is_its_work_a_host_copy_is_not() -> None:
    """CONT's cudaMemcpyAsync between two places on the device (a memcpy record, no kernel) is
    the op's work; a copy between host and device between the same marks is not (the log times
    those as copies); a copy's first run is no kernel loaded (not cold)."""
    trace = "\n".join(
        [
            line(1000, 1001, MARK),
            line(1002, 1040, "mul_mat_vec_q<...>"),
            line(1041, 1050, "quantize_q8_1"),
            line(1052, 1053, MARK),
            copy_row(1054, 1060, "DtoD", 4096),  # CONT, by cudaMemcpyAsync
            copy_row(1060, 1070, "DtoH", 512),  # no op's
            line(1071, 1072, MARK),
            line(2000, 2001, MARK),
            line(2002, 2100, "mul_mat_vec_q<...>"),
            line(2101, 2102, MARK),
        ]
    )
    kernels = cj.read_kernels(trace)
    assert [k.bytes for k in kernels if not k.is_kernel] == [4096, 512]
    ops, _ = cj.join(kernels, [[("MUL_MAT", 52), ("CONT", 7)], [("MUL_MAT", 101)]])
    assert [(o.op, o.cupti_ns, o.cold) for o in ops] == [
        ("MUL_MAT", (1040 - 1002) + (1050 - 1041), True),
        ("CONT", 1060 - 1054, False),
        ("MUL_MAT", 2100 - 2002, False),
    ]


# GGML_CUDA_GRAPH_OPT=1: ops on streams 7 (main), 8 and 9; the marks on each; a host copy and a
# kernel before the session (no mark yet), which the totals leave out
STREAMS = "\n".join(
    [
        line(10, 90, "upload", stream=5),
        copy_row(20, 80, "HtoD", 1 << 20, stream=5, graph=0),
        line(1000, 1001, MARK),
        line(1002, 1010, "rms_norm"),
        line(1011, 1012, MARK),  # the fork
        line(1013, 1014, MARK, stream=8),
        line(1015, 1045, "mul_mat_vec_q<Q>", stream=8),
        line(1013, 1014, MARK, stream=9),
        line(1016, 1036, "mul_mat_vec_q<K>", stream=9),
        copy_row(1037, 1039, "DtoD", 256, stream=9),
        line(1046, 1047, MARK, stream=8),  # joins
        line(1040, 1041, MARK, stream=9),
        line(1048, 1049, MARK),
        line(1050, 1070, "flash_attn"),
        line(1071, 1072, MARK),  # the end
    ]
)


def test_all_streams_op_work_is_summed_inside_the_session() -> None:
    kernels = cj.read_kernels(STREAMS)
    assert cj.session_window(kernels) == (1000, 1072)
    want = (1010 - 1002) + (1045 - 1015) + (1036 - 1016) + (1039 - 1037) + (1070 - 1050)
    assert cj.op_work_all_streams(kernels) == want
    r = cj.all_streams_report(kernels, 2 * want)
    assert r["all_ops_ratio"] == pytest.approx(2.0) and r["streams_marked"] == 3
    with pytest.raises(ValueError, match="no mark"):
        cj.session_window(cj.read_kernels(line(1, 2, "k")))


def test_the_log_s_copies_meet_cupti_s_memcpy_records() -> None:
    """Matched by direction, bytes and order inside the session; CUPTI's copies the log does not
    list (the logits read after a compute) and those before the session are passed over; the
    busy time is CUPTI's union of everything in the session's window."""
    trace = "\n".join(
        [
            copy_row(50, 60, "HtoD", 4096, graph=0),  # before the session (the model's upload)
            line(100, 101, MARK),
            copy_row(102, 112, "HtoD", 4096, graph=0),
            line(113, 114, MARK),
            line(115, 160, "mul_mat"),
            line(120, 150, "other stream", stream=9),  # inside mul_mat's time: no more busy
            line(161, 162, MARK),
            copy_row(170, 172, "DtoH", 512000, graph=0),  # the logits: not a log copy
            copy_row(180, 200, "DtoH", 8192, graph=0),
            line(201, 202, MARK),
        ]
    )
    kernels = cj.read_kernels(trace)
    log = [cj.LogCopy(True, 4096, 12), cj.LogCopy(False, 8192, 21), cj.LogCopy(True, 77, 5)]
    pairs = cj.match_copies(log, kernels)
    assert [(c.bytes, k.start) for c, k in pairs] == [(4096, 102), (8192, 180)]
    assert cj.busy_union(kernels, (100, 202)) == (
        1 + 10 + 1 + 45 + 1 + 2 + 20 + 1  # marks, copies and mul_mat; the other stream within it
    )
    r = cj.copies_report(log, kernels, cj.LogSteps(n_steps=2, window_ns=200, busy_ns=70))
    assert r["matched"] == 2 and r["copy_ratio"] == pytest.approx((12 + 21) / (10 + 20))
    assert r["cupti_busy_ns_per_step"] == pytest.approx(81 / 2)
    assert r["log_idle_ns_per_step"] == pytest.approx((200 - 70) / 2)
    assert r["cupti_idle_ns_per_step"] == pytest.approx((200 - 81) / 2)


def test_an_op_spanning_a_concurrent_region_is_found() -> None:
    """gpu_check.py regions: a compute's ops that overlap in time make a region; an op whose
    interval covers all the others of its region was timed through it (the attention norm
    before GRAPH_OPT's fork was, its interval ending at the attention's mark after the join)."""
    import gpu_check

    # node, start, end: the norm (0), Q (1) and its rope (4) on one stream, K (2), V (3), the
    # attention (5)
    fixed = [
        (0, 100, 130),
        (1, 141, 170),
        (2, 142, 160),
        (3, 143, 190),
        (4, 171, 200),
        (5, 206, 230),
    ]
    assert gpu_check.concurrent_regions(fixed) == (1, [])
    timed_through = [(0, 100, 205)] + fixed[1:]
    assert gpu_check.concurrent_regions(timed_through) == (1, [0])
    assert gpu_check.concurrent_regions([(0, 0, 10), (1, 10, 20)]) == (0, [])  # one stream


def test_the_verdicts_judge_each_target_and_say_what_was_not_measured() -> None:
    import gpu_verdict

    figures = {
        "cost": {
            "c_api": {"minimal": 0.995, "detailed": 0.94},
            "c_api_off_tok_s": 700.0,
            "llama_cpp_python": {"minimal": 0.985, "detailed": 0.93},
            "py_minus_c": {"minimal": -0.01, "detailed": -0.01},
            "text_identical": True,
            "logits_bit_identical": True,
        },
        "faults": {f"s{i}": {"runs": 10, "failed": 0} for i in range(6)},
        "graph-opt-regions": {
            "computes": 4,
            "regions": 16,
            "spanning_ops": 2,
            "spanning_examples": ["MUL#12", "MUL#40"],
        },
    }
    by = {c["check"]: c for c in gpu_verdict.verdicts(figures, dry=False)}
    assert by["cost, C API loop, graphs on"]["met"] is False  # DETAILED 0.94 < 0.95
    assert by["cost, llama-cpp-python's loop"]["met"] is True
    assert by["no fault, 10 runs of each setting"]["met"] is True
    assert by["GRAPH_OPT: ops spanning a concurrent region"]["met"] is False
    assert "MUL#12" in by["GRAPH_OPT: ops spanning a concurrent region"]["measured"]
    assert by["op types against CUPTI"] == {
        "check": "op types against CUPTI",
        "target": "each within 10 %",
        "measured": "not measured",
        "met": None,
    }
    nine = {"faults": {f"s{i}": {"runs": 9, "failed": 0} for i in range(6)}}
    assert gpu_verdict.verdicts(nine, dry=False)[0]["met"] is False  # fewer than 10 runs
    assert all(c["met"] is None for c in gpu_verdict.verdicts(figures, dry=True))
