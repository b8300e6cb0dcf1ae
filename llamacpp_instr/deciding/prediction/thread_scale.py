"""One op's time at a CPU thread count no log ran, from its time at one the logs ran
(``op_threads`` says where the figures come from and why the model is what it is).

An op's time beyond its class's fixed cost at the source's ``S`` threads is split in three:

- the cost of splitting it among the threads (``sync``: ``instr peaks``' figure at ``S``; none
  on one thread, or for an op with a single part);
- memory: its bytes at the rate its weight matrix (or, for an op reading none, any op) streamed
  at in the logs' steps, at most what is left;
- compute: the rest.

At ``T`` threads it is the sync at ``T``, the memory part at ``T``'s bandwidth over ``S``'s (the
bandwidth ``instr peaks`` measured at each), and the compute part at ``T``'s share of its parts
over ``S``'s (``ceil(parts / T) / ceil(parts / S)``: ``S / T`` for a matmul, 1 for an op of one
row, which ggml runs on one thread whatever the count). An op is memory-bound where the memory
part is the larger, compute-bound otherwise, and on one thread at both counts where it has a
single part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    what an op split among the threads costs (ns)."""

    threads: int
    bandwidth: float
    sync_ns: float


@dataclass(frozen=True)
class ThreadScale:
    """The CPU at ``target``'s thread count priced from ``source``'s (module doc): ``streams``,
    the rate (bytes/ns) each weight type (``TYPE``, ``TYPE:ROLE``) and any op (``""``) streamed at
    in the logs at the source's count."""

    source: CpuPeaks
    target: CpuPeaks
    streams: dict[str, float]

    def rate(self, weight: str, role: str) -> float:
        """The rate an op's bytes stream at: its weight matrix's (this role and type, else this
        type), else any op's."""
        found = weight and (self.streams.get(f"{weight}:{role}") or self.streams.get(weight))
        return float(found or self.streams.get("", 0.0))

    def time(
        self, beyond_fixed: float, n_bytes: float, weight: str, role: str, units: int
    ) -> tuple[float, str]:
        """An op's time beyond its class's fixed cost at the target's count, from the source's
        (``beyond_fixed``), its bytes, its weight's type for a matmul reading one (else ""), its
        role and its parts (``split_units``); and what it is (``MEMORY``, ``COMPUTE``,
        ``ONE_THREAD``)."""
        s, t = self.source.threads, self.target.threads
        on_s, on_t = min(units, s), min(units, t)
        if on_s == on_t == 1:
            return beyond_fixed, ONE_THREAD
        sync_s = self.source.sync_ns if on_s > 1 else 0.0
        sync_t = self.target.sync_ns if on_t > 1 else 0.0
        rest = max(beyond_fixed - sync_s, 0.0)
        rate = self.rate(weight, role)
        memory = min(rest, n_bytes / rate) if rate > 0 else 0.0
        compute = rest - memory
        bandwidth = self.target.bandwidth / self.source.bandwidth if on_s != on_t else 1.0
        parts = math.ceil(units / t) / math.ceil(units / s)
        time = sync_t + memory / bandwidth + compute * parts
        return time, MEMORY if memory >= compute else COMPUTE
