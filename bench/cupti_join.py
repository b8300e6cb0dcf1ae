"""CUPTI's records against the CUDA op timer's (bench/gpu_check.sh): each op type's GPU time
within 10 %, the ops' times covering 0.95-1.02 of each graph compute's GPU time, the copies
between host and GPU against CUPTI's memcpy records, and, where ggml runs ops on several streams
(GGML_CUDA_GRAPH_OPT=1), all ops' time against all streams' kernels.

    python bench/cupti_join.py KERNELS.txt SESSION.log [--device CUDA0]
    python bench/cupti_join.py KERNELS.txt SESSION.log --all-streams   (GGML_CUDA_GRAPH_OPT=1)
    python bench/cupti_join.py KERNELS.txt SESSION.log --copies        (layers or experts on the CPU)

KERNELS.txt is bench/cupti_trace.cpp's record of the same process (one line per kernel, memcpy or
memset: start, end, stream, graph id, graph node id, name). A copy inside a graph compute between
two places on the device (CONT's cudaMemcpyAsync) or a memset is an op's work; a copy between
host and device is not (the log times those as copies). CUPTI's graph node ids are not the captured nodes
(exec graph id << 32 | node index), so kernels are joined to ggml's ops by order instead, with
the op timer's own mark kernels (``ggml_cuda_instr_stamp``) as the separators the capture laid
down: on the stream that ran them, each graph compute is its ops' marks in order then its end
mark (its ``busy`` stretch in the log names how many ops), and an op's kernels are those between
its mark and the next. An op's CUPTI time is the sum of its kernels' durations (the marks and the
gaps between kernels left out), and its span the first kernel's start to the last one's end; the
log's is its interval between marks less what a mark takes (the op timer's calibration mark
after each compute's end mark). An
op with a kernel run for the first time in the process is cold (CUDA loads a kernel's code at its
first launch, the GPU idle meanwhile): cold ops are counted apart. A graph compute's GPU time is
its first op mark's start to its end mark's start, less its marks' own time (each op mark's start
to the next kernel's start): the ops' cover of it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STAMP = "ggml_cuda_instr_stamp"


@dataclass(frozen=True)
class Kernel:
    start: int
    end: int
    stream: int
    name: str

    @property
    def is_mark(self) -> bool:
        return STAMP in self.name

    @property
    def is_kernel(self) -> bool:
        return not self.name.startswith("[")

    @property
    def is_host_copy(self) -> bool:
        """A memcpy between host and device (the log's copies), not an op's work."""
        return self.name.startswith(("[memcpy HtoD ", "[memcpy DtoH "))

    @property
    def is_op_work(self) -> bool:
        return not self.is_mark and not self.is_host_copy

    @property
    def bytes(self) -> int:
        """A memcpy's or memset's bytes (0 for a kernel)."""
        return 0 if self.is_kernel else int(self.name.rstrip("]").rsplit(" ", 1)[-1])


def read_kernels(text: str) -> list[Kernel]:
    """The tracer's lines; a line that is not one is an error naming it."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(" ", 5)
        try:
            start, end, stream = int(parts[0]), int(parts[1]), int(parts[2])
            name = parts[5]
        except (IndexError, ValueError):
            raise ValueError(f"line {n}: not a kernel record: {line[:80]!r}") from None
        out.append(Kernel(start, end, stream, name))
    return out


def mark_stream(kernels: list[Kernel]) -> list[Kernel]:
    """The kernels of the stream that ran the most marks (the backend's main stream), by start."""
    count: dict[int, int] = defaultdict(int)
    for k in kernels:
        count[k.stream] += k.is_mark
    if not count or max(count.values()) == 0:
        return []
    main = max(count, key=lambda s: count[s])
    return sorted((k for k in kernels if k.stream == main), key=lambda k: k.start)


@dataclass(frozen=True)
class JoinedOp:
    op: str
    log_ns: int  # the op timer's time of the op
    cupti_ns: int  # the sum of CUPTI's kernels between its mark and the next
    span_ns: int  # CUPTI: its first kernel's start to its last kernel's end
    cold: bool  # one of its kernels ran for the first time in the process (its code loaded then)


@dataclass(frozen=True)
class GraphCompute:
    log_op_ns: int  # the sum of its ops' times in the log
    cupti_span_ns: int  # CUPTI: its first op mark's start to its end mark's start
    cupti_marks_ns: int  # CUPTI: within that, each op mark's start to the next kernel's start


def join(
    kernels: list[Kernel], computes: list[list[tuple[str, int]]]
) -> tuple[list[JoinedOp], list[GraphCompute]]:
    """``computes``: each graph compute's ops (type, log ns) in order, as the log has them. Each
    compute's marks on the stream are its ops' marks, an end mark and a calibration mark (a build
    that has one). Raises ValueError when CUPTI's marks do not match them (a mark more or less:
    the join would shift)."""
    stream = mark_stream(kernels)
    marks = [i for i, k in enumerate(stream) if k.is_mark]
    n_ops = sum(len(c) for c in computes)
    if len(marks) == n_ops + 2 * len(computes):
        calib = 1
    elif len(marks) == n_ops + len(computes):
        calib = 0
    else:
        raise ValueError(
            f"CUPTI saw {len(marks)} marks on the main stream, the log's graph computes make "
            f"{n_ops + len(computes)} (ops + an end mark each) or {n_ops + 2 * len(computes)} "
            "(and a calibration mark each): the join would not line up"
        )
    seen: set[str] = set()
    ops: list[JoinedOp] = []
    graphs: list[GraphCompute] = []
    m = 0
    for c in computes:
        first = stream[marks[m]].start
        marks_ns = 0
        for op, log_ns in c:
            a, b = marks[m], marks[m + 1]
            marks_ns += stream[a + 1].start - stream[a].start
            ks = [k for k in stream[a + 1 : b] if k.is_op_work]
            cold = any(k.name not in seen for k in ks if k.is_kernel)
            seen.update(k.name for k in ks)
            cupti = sum(k.end - k.start for k in ks)
            span = max(k.end for k in ks) - min(k.start for k in ks) if ks else 0
            ops.append(JoinedOp(op, log_ns, cupti, span, cold))
            m += 1
        end = stream[marks[m]].start  # the end mark
        m += 1 + calib
        graphs.append(GraphCompute(sum(n for _, n in c), end - first, marks_ns))
    return ops, graphs


def per_type(ops: list[JoinedOp]) -> dict[str, dict[str, float]]:
    """Per op type, of the ops whose kernels had all run before (warm): the log's total (ns),
    CUPTI's sum of kernel times and of kernel spans, and the log's over each; the cold ops
    (a kernel's first run: its code loaded meanwhile, the GPU idle) counted apart."""
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    for o in ops:
        a = acc[o.op]
        if o.cold:
            a[4] += 1
            a[5] += o.log_ns
            continue
        a[0] += o.log_ns
        a[1] += o.cupti_ns
        a[2] += o.span_ns
        a[3] += 1
    return {
        op: {
            "n": n,
            "log_ns": lg,
            "cupti_ns": cu,
            "span_ns": sp,
            "ratio": lg / cu if cu else float("inf"),
            "ratio_span": lg / sp if sp else float("inf"),
            "n_cold": n_cold,
            "cold_log_ns": cold_ns,
        }
        for op, (lg, cu, sp, n, n_cold, cold_ns) in sorted(acc.items(), key=lambda kv: -kv[1][1])
    }


def coverage(graphs: list[GraphCompute]) -> list[float]:
    """Per graph compute: its ops' time in the log over its GPU time by CUPTI, the marks' own
    time (each op mark's start to the next kernel's) left out of both."""
    return [
        g.log_op_ns / (g.cupti_span_ns - g.cupti_marks_ns)
        for g in graphs
        if g.cupti_span_ns - g.cupti_marks_ns > 0
    ]


def computes_of_log(path: Path, device: str) -> list[list[tuple[str, int]]]:
    """Each graph compute on ``device`` (a ``busy`` stretch) with its ops (type, ns), in order."""
    from llamacpp_instr.converters import load_session

    f = load_session(str(path))
    ops = f.ops[f.ops["device"].astype(str) == device]
    busy = f.busy[f.busy["device"].astype(str) == device]
    by_compute: dict[tuple[int, int], list[tuple[str, int]]] = defaultdict(list)
    for step, ub, op, dur in zip(ops["step"], ops["ubatch"], ops["op"], ops["dur_ns"], strict=True):
        by_compute[(int(step), int(ub))].append((str(op), int(dur)))
    out: list[list[tuple[str, int]]] = []
    for step, ub, n in zip(busy["step"], busy["ubatch"], busy["n_ops"], strict=True):
        rest = by_compute[(int(step), int(ub))]
        out.append(rest[: int(n)])
        del rest[: int(n)]
    return out


def report(ops: list[JoinedOp], graphs: list[GraphCompute]) -> dict[str, Any]:
    types = per_type(ops)
    cov = sorted(coverage(graphs))
    warm = {t: v for t, v in types.items() if v["n"] > 0}
    within = [t for t, v in warm.items() if 0.9 <= v["ratio"] <= 1.1]
    within_span = [t for t, v in warm.items() if 0.9 <= v["ratio_span"] <= 1.1]
    log_all = sum(v["log_ns"] for v in warm.values())
    return {
        "op_types": types,
        "op_types_within_10pct": len(within),
        "op_types_within_10pct_of_span": len(within_span),
        "op_types_total": len(warm),
        "all_ops_ratio": log_all / max(1, sum(v["cupti_ns"] for v in warm.values())),
        "all_ops_ratio_span": log_all / max(1, sum(v["span_ns"] for v in warm.values())),
        "cold_ops": sum(int(v["n_cold"]) for v in types.values()),
        "coverage_min": cov[0] if cov else None,
        "coverage_median": cov[len(cov) // 2] if cov else None,
        "coverage_max": cov[-1] if cov else None,
        "graph_computes": len(graphs),
    }


def session_window(kernels: list[Kernel]) -> tuple[int, int]:
    """CUPTI's time from the session's first mark to its last (the op timer marks nothing outside
    a session): what ran before it (the model's upload, a run before the session) is left out."""
    marks = [k for k in kernels if k.is_mark]
    if not marks:
        raise ValueError("CUPTI saw no mark: the run had no session on a CUDA device")
    return min(k.start for k in marks), max(k.end for k in marks)


def op_work_all_streams(kernels: list[Kernel]) -> int:
    """The op work (kernels, device copies and memsets; no mark, no host copy) of every stream the
    op timer marked, inside the session's window (ns): with ops on several streams there is no
    order to join by, so the check is the totals'."""
    a, b = session_window(kernels)
    marked = {k.stream for k in kernels if k.is_mark}
    return sum(
        k.end - k.start
        for k in kernels
        if k.stream in marked and k.is_op_work and a <= k.start and k.end <= b
    )


def all_streams_report(kernels: list[Kernel], log_ops_ns: int) -> dict[str, Any]:
    cupti = op_work_all_streams(kernels)
    return {
        "log_ops_ns": log_ops_ns,
        "cupti_op_work_ns": cupti,
        "all_ops_ratio": log_ops_ns / cupti if cupti else None,
        "streams_marked": len({k.stream for k in kernels if k.is_mark}),
    }


def busy_union(kernels: list[Kernel], window: tuple[int, int]) -> int:
    """The time inside ``window`` when the device ran anything CUPTI saw (ns)."""
    spans = sorted((max(k.start, window[0]), min(k.end, window[1])) for k in kernels)
    total, end = 0, window[0]
    for s, e in spans:
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


@dataclass(frozen=True)
class LogCopy:
    to_device: bool
    bytes: int
    dur_ns: int


def match_copies(log: list[LogCopy], kernels: list[Kernel]) -> list[tuple[LogCopy, Kernel]]:
    """Each of the log's copies (in time order) with CUPTI's next memcpy of its direction and
    bytes inside the session's window, in order; a copy of the log CUPTI has no record of (or
    CUPTI's copies the log does not list, e.g. the logits read after a compute) goes unmatched."""
    a, b = session_window(kernels)
    rows = sorted(
        (k for k in kernels if k.is_host_copy and a <= k.start <= b), key=lambda k: k.start
    )
    out: list[tuple[LogCopy, Kernel]] = []
    i = 0
    for c in log:
        want = "[memcpy HtoD " if c.to_device else "[memcpy DtoH "
        j = next(
            (
                j
                for j in range(i, len(rows))
                if rows[j].name.startswith(want) and rows[j].bytes == c.bytes
            ),
            None,
        )
        if j is not None:
            out.append((c, rows[j]))
            i = j + 1
    return out


@dataclass(frozen=True)
class LogSteps:
    n_steps: int
    window_ns: int  # the steps' own time, summed
    busy_ns: int  # the device's graph computes and copies in them (the log's union per step)


def copies_report(log: list[LogCopy], kernels: list[Kernel], steps: LogSteps) -> dict[str, Any]:
    """The log's copies against CUPTI's memcpy records (matched by direction, bytes and order),
    and the GPU's busy and idle time per step: the log's graph computes and copies against CUPTI's
    union of everything it ran in the session's window, each idle time being the steps' time less
    it."""
    pairs = match_copies(log, kernels)
    log_ns = sum(c.dur_ns for c, _ in pairs)
    cupti_ns = sum(k.end - k.start for _, k in pairs)
    cupti_busy = busy_union(kernels, session_window(kernels))
    n = max(1, steps.n_steps)
    return {
        "log_copies": len(log),
        "log_copy_bytes": sum(c.bytes for c in log),
        "matched": len(pairs),
        "matched_bytes": sum(c.bytes for c, _ in pairs),
        "matched_log_ns": log_ns,
        "matched_cupti_ns": cupti_ns,
        "copy_ratio": log_ns / cupti_ns if cupti_ns else None,
        "steps": steps.n_steps,
        "log_busy_ns_per_step": steps.busy_ns / n,
        "cupti_busy_ns_per_step": cupti_busy / n,
        "busy_ratio": steps.busy_ns / cupti_busy if cupti_busy else None,
        "log_idle_ns_per_step": (steps.window_ns - steps.busy_ns) / n,
        "cupti_idle_ns_per_step": (steps.window_ns - cupti_busy) / n,
    }


def log_copies(path: Path, device: str) -> tuple[list[LogCopy], LogSteps]:
    """The log's copies into and out of ``device`` in time order, and its steps: their time and
    the device's busy time in them (device_steps' compute and copy time)."""
    from llamacpp_instr.converters import load_session

    f = load_session(str(path))
    c = f.copies
    c = c[(c["src"].astype(str) == device) | (c["dst"].astype(str) == device)].sort_values(
        "t_start"
    )
    copies = [
        LogCopy(str(dst) == device, int(n), int(d))
        for dst, n, d in zip(c["dst"], c["bytes"], c["dur_ns"], strict=True)
    ]
    d = f.device_steps[f.device_steps["device"].astype(str) == device]
    busy = int(d["compute_ns"].sum() + d["copy_ns"].sum())
    return copies, LogSteps(len(f.steps), int(f.steps["dur_ns"].sum()), busy)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("kernels", type=Path)
    ap.add_argument("log", type=Path)
    ap.add_argument("--device", default="CUDA0")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--all-streams", action="store_true", help="totals over every stream")
    mode.add_argument("--copies", action="store_true", help="copies and busy time per token")
    a = ap.parse_args()
    try:
        kernels = read_kernels(a.kernels.read_text())
        if a.all_streams:
            log_ns = sum(d for c in computes_of_log(a.log, a.device) for _, d in c)
            print(json.dumps(all_streams_report(kernels, log_ns)))
            return
        if a.copies:
            copies, steps = log_copies(a.log, a.device)
            print(json.dumps(copies_report(copies, kernels, steps)))
            return
        ops, graphs = join(kernels, computes_of_log(a.log, a.device))
    except (OSError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    r = report(ops, graphs)
    for op, v in r["op_types"].items():
        print(
            f"{op:>14}  n={v['n']:>6}  log {v['log_ns'] / 1e6:9.3f} ms  "
            f"CUPTI kernels {v['cupti_ns'] / 1e6:9.3f} ms (ratio {v['ratio']:.3f}), "
            f"spans {v['span_ns'] / 1e6:9.3f} ms (ratio {v['ratio_span']:.3f}); "
            f"cold n={v['n_cold']} {v['cold_log_ns'] / 1e6:.3f} ms"
        )
    print(
        f"op types within 10 % of CUPTI's kernel times: {r['op_types_within_10pct']}/"
        f"{r['op_types_total']}, of their spans: {r['op_types_within_10pct_of_span']}; "
        f"all warm ops {r['all_ops_ratio']:.3f}x kernel time, {r['all_ops_ratio_span']:.3f}x spans; "
        f"{r['cold_ops']} cold ops apart; "
        f"coverage of each graph compute's GPU time: min {r['coverage_min']}, "
        f"median {r['coverage_median']} ({r['graph_computes']} graph computes)"
    )
    print(json.dumps({k: v for k, v in r.items() if k != "op_types"}))


if __name__ == "__main__":
    main()
