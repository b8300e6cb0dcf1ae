"""The CPU at a thread count no log ran (``instr predict --threads``): its ops priced from the
nearest thread count the logs ran, by the roofline the cost model already uses.

An op's time in its class is ``fixed + slope * work``, ``work`` its time at the device's roofs:
``max(bytes / bandwidth, FLOPs / compute)`` (``op_costs``). At ``T'`` threads from logs of ``T``,
each op keeps its class (its fit, its fusion, the device's fixed cost per op: a barrier's and a
dispatch's, not spread over the threads) and its work is taken at the roofs of ``T'``:

- the compute roofs (GFLOP/s per matmul type, and any op's) scale with the threads, ``T'/T``:
  ggml splits an op's rows between its threads;
- the bandwidth saturates: it stays the bandwidth the logs measured at ``T``, unless ``instr
  peaks`` measured this machine's at both thread counts (their ratio, ``bandwidth_ratio``).

So a compute-bound op (a prompt's matmul) takes ``T/T'`` its time, a memory-bound one (a
generation's matrix-vector product on a machine whose bandwidth one thread nearly fills) its
time, and one between moves from one roof to the other. The host's time per compute outside the
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
    model: CostModel, threads: int, bandwidth_ratio: float | None = None, mode: str = "model"
) -> CostModel:
    """``model`` with the CPU at ``threads`` priced from its ``source`` (module doc);
    ``bandwidth_ratio``: this machine's bandwidth at ``threads`` over the source's, where
    measured (default: saturated, 1); ``mode``: the roofs of the prediction or a bound."""
    src = source(model, threads)
    if src is None or src == threads or mode not in MODES:
        return model
    r = model.roofs[Where("CPU", src)]
    k = threads / src
    compute = 1.0 if mode == "flat" else k
    bandwidth = {"model": bandwidth_ratio or 1.0, "linear": k, "flat": 1.0}[mode]
    roofs = Roofs(
        bandwidth=r.bandwidth * bandwidth,
        compute={t: v * compute for t, v in r.compute.items()},
        compute_any=r.compute_any * compute,
        fixed=r.fixed,
    )
    scaled = {**model.scaled, Where("CPU", threads): ThreadScale(Where("CPU", src), roofs)}
    return replace(model, scaled=scaled)
