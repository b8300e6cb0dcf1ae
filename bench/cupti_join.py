"""CUPTI's kernels against the CUDA op timer's ops (bench/gpu_check.sh, issue §3): each op type's
GPU time within 10 %, and the ops' times covering at least 0.90 of each graph compute's GPU time.

    python bench/cupti_join.py KERNELS.txt SESSION.log [--device CUDA0]

KERNELS.txt is bench/cupti_trace.cpp's record of the same process (one line per kernel: start,
end, stream, graph id, graph node id, name). CUPTI's graph node ids are not the captured nodes
(exec graph id << 32 | node index), so kernels are joined to ggml's ops by order instead, with
the op timer's own mark kernels (``ggml_cuda_instr_stamp``) as the separators the capture laid
down: on the stream that ran them, each graph compute is its ops' marks in order then its end
mark (its ``busy`` stretch in the log names how many ops), and an op's kernels are those between
its mark and the next. An op's CUPTI time is the sum of its kernels' durations (the marks and the
gaps between kernels left out); the log's is the interval between marks. A graph compute's GPU
time is its first mark's start to its end mark's start.
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
    log_ns: int  # the op timer's interval
    cupti_ns: int  # the sum of CUPTI's kernels between its mark and the next


@dataclass(frozen=True)
class GraphCompute:
    log_op_ns: int  # the sum of its ops' intervals in the log
    cupti_span_ns: int  # CUPTI: its first mark's start to its end mark's start


def join(
    kernels: list[Kernel], computes: list[list[tuple[str, int]]]
) -> tuple[list[JoinedOp], list[GraphCompute]]:
    """``computes``: each graph compute's ops (type, log ns) in order, as the log has them. Raises
    ValueError when CUPTI's marks do not match them (a mark more or less: the join would shift)."""
    stream = mark_stream(kernels)
    marks = [i for i, k in enumerate(stream) if k.is_mark]
    need = sum(len(c) + 1 for c in computes)
    if len(marks) != need:
        raise ValueError(
            f"CUPTI saw {len(marks)} marks on the main stream, the log's graph computes make "
            f"{need} (ops + an end mark each): the join would not line up"
        )
    ops: list[JoinedOp] = []
    graphs: list[GraphCompute] = []
    m = 0
    for c in computes:
        first = stream[marks[m]].start
        for op, log_ns in c:
            a, b = marks[m], marks[m + 1]
            cupti = sum(k.end - k.start for k in stream[a + 1 : b])
            ops.append(JoinedOp(op, log_ns, cupti))
            m += 1
        end = stream[marks[m]].start  # the end mark
        m += 1
        graphs.append(GraphCompute(sum(n for _, n in c), end - first))
    return ops, graphs


def per_type(ops: list[JoinedOp]) -> dict[str, dict[str, float]]:
    """Per op type: the log's and CUPTI's totals (ns) and their ratio."""
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for o in ops:
        a = acc[o.op]
        a[0] += o.log_ns
        a[1] += o.cupti_ns
        a[2] += 1
    return {
        op: {"n": n, "log_ns": lg, "cupti_ns": cu, "ratio": lg / cu if cu else float("inf")}
        for op, (lg, cu, n) in sorted(acc.items(), key=lambda kv: -kv[1][1])
    }


def coverage(graphs: list[GraphCompute]) -> list[float]:
    """Per graph compute: its ops' time in the log over its GPU time by CUPTI."""
    return [g.log_op_ns / g.cupti_span_ns for g in graphs if g.cupti_span_ns > 0]


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
    within = [t for t, v in types.items() if 0.9 <= v["ratio"] <= 1.1]
    return {
        "op_types": types,
        "op_types_within_10pct": len(within),
        "op_types_total": len(types),
        "coverage_min": cov[0] if cov else None,
        "coverage_median": cov[len(cov) // 2] if cov else None,
        "graph_computes": len(graphs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("kernels", type=Path)
    ap.add_argument("log", type=Path)
    ap.add_argument("--device", default="CUDA0")
    a = ap.parse_args()
    try:
        ops, graphs = join(read_kernels(a.kernels.read_text()), computes_of_log(a.log, a.device))
    except (OSError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    r = report(ops, graphs)
    for op, v in r["op_types"].items():
        print(
            f"{op:>14}  n={v['n']:>6}  log {v['log_ns'] / 1e6:9.3f} ms  "
            f"CUPTI {v['cupti_ns'] / 1e6:9.3f} ms  ratio {v['ratio']:.3f}"
        )
    print(
        f"op types within 10 %: {r['op_types_within_10pct']}/{r['op_types_total']}; "
        f"coverage of each graph compute's GPU time: min {r['coverage_min']}, "
        f"median {r['coverage_median']} ({r['graph_computes']} graph computes)"
    )
    print(json.dumps({k: v for k, v in r.items() if k != "op_types"}))


if __name__ == "__main__":
    main()
