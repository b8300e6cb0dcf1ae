"""One op's time at a CPU thread count no log ran, from its time at one the logs ran
(``op_threads`` says where the figures come from and why the model is what it is).

An op's time beyond its class's fixed cost at the source's ``S`` threads is split in two:

- memory: its bytes at the rate its weight matrix (or, for an op reading none, any op) streamed
  at in the logs' steps, at most its time;
- compute: the rest.

At ``T`` threads the memory part takes ``T``'s bandwidth over ``S``'s (the bandwidth ``instr
peaks`` measured at each). The compute part of a matmul of a weight type ``instr peaks``
measured at both counts takes the matmul throughput of that type at ``T`` over ``S``'s (ggml's
kernel for the type, as split among the threads); of any other op, ``T``'s share of its parts
over ``S``'s (``ceil(parts / T) / ceil(parts / S)``: ``S / T`` for a matmul, 1 for an op of one
row, which ggml runs on one thread whatever the count). An op is memory-bound where the memory
part is the larger, compute-bound otherwise, and on one thread at both counts where it has a
single part.

The threads' meeting at the end of each op is in the op's measured time (a fraction of a
microsecond on a 2-core VM: an op of one row took 0.1 to 0.3 us more at 2 threads than at 1);
what ``instr peaks`` measures as the cost of a split, a graph of one op at the count over one
thread, is the threads' start and their last meeting, which a compute pays once
(``start_ns``), not each op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llamacpp_instr.converters.reading.decode.graphs import Graph, Node

# what each op is, as the prediction says it
MEMORY, COMPUTE, ONE_THREAD = "memory-bound", "compute-bound", "on one thread"


def split_units(node: Node, graph: Graph) -> int:
    """The parts ggml's CPU backend splits a node's work into among its threads: a matmul's
    output elements (its chunks), flash attention's query rows (heads by tokens), SET_ROWS's
    rows written (its index's elements), any other op's output rows."""
    shape = [int(x) for x in node.shape] + [1] * max(4 - len(node.shape), 0)
    if node.op.startswith("MUL_MAT") or node.op == "OUT_PROD":
        return max(int(np.prod(shape)), 1)
    if node.op == "SET_ROWS" and len(node.src) > 1 and "shape" in node.src[1]:
        return max(int(np.prod([int(x) for x in node.src[1]["shape"]])), 1)
    return max(shape[1] * shape[2] * shape[3], 1)


@dataclass(frozen=True)
class CpuPeaks:
    """What ``instr peaks`` measured of the CPU at one thread count: its bandwidth (bytes/ns) and
    what a graph of one op costs on the threads beyond its cost on one (ns): their start and
    their last meeting, which a compute pays once."""

    threads: int
    bandwidth: float
    sync_ns: float
    # GFLOP/s of a matmul per weight type (ggml's name, lower case: "q4_1"), where measured
    matmul: dict[str, float] = field(default_factory=dict)
    date: str = ""  # when measured (ISO-8601 UTC)
    # GFLOP/s of a one-column matmul per weight type, its weight beyond the caches (a generated
    # token's matmul), where measured
    gemv: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ThreadScale:
    """The CPU at ``target``'s thread count priced from ``source``'s (module doc): ``streams``,
    the rate (bytes/ns) each weight type (``TYPE``, ``TYPE:ROLE``) and any op (``""``) streamed at
    in the logs at the source's count."""

    source: CpuPeaks
    target: CpuPeaks
    streams: dict[str, float]
    # the one-column matmuls of the target's weight shapes, measured at both counts on this
    # machine (``gemv_probe.GemvProbe``), where the logs' machine is this one
    probe: Any = field(default=None, compare=False)

    def rate(self, weight: str, role: str) -> float:
        """The rate an op's bytes stream at: its weight matrix's (this role and type, else this
        type), else any op's."""
        found = weight and (self.streams.get(f"{weight}:{role}") or self.streams.get(weight))
        return float(found or self.streams.get("", 0.0))

    def time(
        self,
        beyond_fixed: float,
        n_bytes: float,
        weight: str,
        role: str,
        units: int,
        columns: int = 0,
        shape: tuple[str, int, int] | None = None,
    ) -> tuple[float, str]:
        """An op's time beyond its class's fixed cost at the target's count, from the source's
        (``beyond_fixed``), its bytes, its weight's type for a matmul reading one (else ""), its
        role, its parts (``split_units``) and, for a matmul, its columns (the tokens it
        multiplies) and its weight's shape (``probe_shapes.weight_shape``); and what it is
        (``MEMORY``, ``COMPUTE``, ``ONE_THREAD``). A matmul of one column moves by the speed-up
        the probe measured of its shape (``probe``), else by the one-column matmul ``instr
        peaks`` measured of its type at both counts, and is memory-bound where it streams its
        bytes at half the bandwidth or more at the target's count."""
        s, t = self.source.threads, self.target.threads
        on_s, on_t = min(units, s), min(units, t)
        if on_s == on_t == 1:
            return beyond_fixed, ONE_THREAD
        rest = max(beyond_fixed, 0.0)
        faster: float | None = None
        if columns == 1 and shape is not None and self.probe is not None:
            faster = self.probe.speedup(shape)
        gemv = self.gemv_rates(weight) if columns == 1 else None
        if faster is None and gemv is not None:
            faster = gemv[1] / gemv[0]
        if faster is not None:
            time = rest / self._linear(faster, on_s, on_t)
            streamed = n_bytes / time if time > 0 else 0.0  # (bytes/ns: GB/s)
            return time, MEMORY if streamed >= 0.5 * self.target.bandwidth else COMPUTE
        rate = self.rate(weight, role)
        memory = min(rest, n_bytes / rate) if rate > 0 else 0.0
        compute = rest - memory
        if on_s == on_t:  # (the same threads do its work at both counts)
            return rest, MEMORY if memory >= compute else COMPUTE
        rates = self.matmul_rates(weight)
        faster = rates[1] / rates[0] if rates else math.ceil(units / s) / math.ceil(units / t)
        faster = self._linear(faster, on_s, on_t)
        bandwidth = self.target.bandwidth / self.source.bandwidth
        time = memory / bandwidth + compute / faster
        return time, MEMORY if memory >= compute else COMPUTE

    @staticmethod
    def _linear(faster: float, on_s: int, on_t: int) -> float:
        """A speed-up measured (by ``instr peaks`` or the probe: the target's rate over the
        source's), bounded by the threads' own: work on ``on_t`` threads instead of ``on_s`` runs
        at most that much faster, or slower, and more threads do not slow a matmul split among
        them, nor do fewer speed it (two measurements of one machine minutes apart read 1 -> 2
        threads as 2.26x in one and 1.75x in the other; a neighbour's burst during one count's
        runs can read it below 1)."""
        bound = on_t / on_s
        return min(max(faster, 1.0), bound) if on_t > on_s else max(min(faster, 1.0), bound)

    def gemv_rates(self, weight: str) -> tuple[float, float] | None:
        """The one-column matmul throughput ``instr peaks`` measured for weights of type
        ``weight`` at the source's count and at the target's, None where either lacks it."""
        a, b = self.source.gemv.get(weight), self.target.gemv.get(weight)
        return (a, b) if weight and a and b else None

    def matmul_rates(self, weight: str) -> tuple[float, float] | None:
        """The matmul throughput ``instr peaks`` measured for weights of type ``weight`` at the
        source's count and at the target's, None where either lacks it (or ``weight`` is "")."""
        a, b = self.source.matmul.get(weight), self.target.matmul.get(weight)
        return (a, b) if weight and a and b else None

    def start_ns(self) -> float:
        """What a compute's start of the threads and their last meeting cost at the target's
        count beyond the source's (``instr peaks``' figures: a graph of one op at each)."""
        return self.target.sync_ns - self.source.sync_ns
