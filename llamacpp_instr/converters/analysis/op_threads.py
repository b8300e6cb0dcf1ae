"""The CPU at a thread count no log ran (``instr predict --threads``): its ops priced from the
nearest thread count the logs ran, by the roofline the cost model already uses.

An op's time in its class is ``fixed + slope * work``, ``work`` its time at the device's roofs
(``op_costs``). At ``T'`` threads from logs of ``T``, each op keeps its class (its fit, its
fusion, the device's fixed cost per op: a barrier's and a dispatch's, not spread over the
threads) and its work is scaled by its roofline time ``max(bytes / bandwidth, FLOPs / compute)``
at ``T'`` over that at ``T``:

- the compute roofs (GFLOP/s per matmul type, and any op's: the logs' own) scale with the
  threads, ``T'/T``: ggml splits an op's rows between its threads;
- the bandwidth is the memory's: the most a whole step of the logs' streamed (its ops' bytes
  over their time: a generation step reads every weight once), which saturates, the same at
  ``T'``; or, where ``instr peaks`` measured this machine's at both thread counts, those two.

So a compute-bound op (a prompt's matmul) takes ``T/T'`` its time, a memory-bound one (a
generation's matrix-vector product, which streams its weights from memory) its time, and one
between moves from one roof to the other. The host's time per compute outside the
ops is the source's. Beyond the cores the logs' machine has, threads would take turns on them:
not predicted (``predict``).

Two other sets of roofs bound it (``MODES``): ``linear`` (the bandwidth scales with the threads
too: every op's work ``T/T'`` times) and ``flat`` (no roof moves: the source's price). A
prediction at a scaled thread count is between them; where no log can be held out across thread
counts (``CostModel.held_out_threads``), they are its interval (``predict``).
"""

from __future__ import annotations

from dataclasses import replace

from .op_costs import CostModel, Roofs, ThreadScale, Where

MODES = ("model", "linear", "flat")


def cpu_threads(model: CostModel) -> list[int]:
    """The CPU thread counts the logs ran."""
    return sorted({w.threads for w in model.roofs if w.device == "CPU"})


def source(model: CostModel, threads: int) -> int | None:
    """The thread count the logs ran nearest ``threads`` (of two as near, the larger), None
    where the logs ran no op on the CPU."""
    have = cpu_threads(model)
    return min(have, key=lambda t: (abs(t - threads), -t)) if have else None


def scale(
    model: CostModel,
    threads: int,
    bandwidth: tuple[float, float] | None = None,
    mode: str = "model",
) -> CostModel:
    """``model`` with the CPU at ``threads`` priced from its ``source`` (module doc);
    ``bandwidth``: this machine's bandwidth at the source's thread count and at ``threads``, where
    ``instr peaks`` measured both (default: the logs' streaming bandwidth, saturated); ``mode``:
    the roofs of the prediction or a bound."""
    src = source(model, threads)
    if src is None or src == threads or mode not in MODES:
        return model
    at = Where("CPU", src)
    r = model.roofs[at]
    before_bw = bandwidth[0] if bandwidth else model.stream.get(at, r.bandwidth)
    ratio = bandwidth[1] / bandwidth[0] if bandwidth else 1.0
    k = threads / src
    compute = 1.0 if mode == "flat" else k
    bw = {"model": ratio, "linear": k, "flat": 1.0}[mode]
    before = replace(r, bandwidth=before_bw)
    after = Roofs(
        bandwidth=before_bw * bw,
        compute={t: v * compute for t, v in r.compute.items()},
        compute_any=r.compute_any * compute,
        fixed=r.fixed,
    )
    scaled = {**model.scaled, Where("CPU", threads): ThreadScale(at, before, after)}
    return replace(model, scaled=scaled)
