"""The CPU at a thread count no log ran (``instr predict --threads``): its ops priced from the
nearest thread count the logs ran, by the roofline the cost model already uses.

An op's time in its class is ``fixed + slope * work`` (``op_costs``). At ``T'`` threads from
logs of ``T`` each op keeps its class (its fit, its fusion, the device's fixed cost per op: a
barrier's and a dispatch's, not spread over the threads), and its time beyond the fixed cost is
split in two:

- memory: its bytes at the memory's bandwidth (at most all of it): the most a whole step of the
  logs streamed (its ops' bytes over their time: a generation step reads every weight once),
  which saturates, the same at ``T'``; or, where ``instr peaks`` measured this machine's at both
  thread counts, those two;
- compute: the rest, which ggml splits between its threads: ``T/T'`` times it.

So a matmul of a prompt (thousands of FLOPs a byte) takes ``T/T'`` its time; a generation's
matrix-vector product, which the logs show streaming its weights at the bandwidth, about its
time; an op between, between. (The roofline's max of the two, with the logs' best GFLOP/s as the
compute roof, called a generation's matrix-vector products compute-bound: the logs' best rate is
a floor on what the CPU can do, and one thread did them nearly as fast as two.) The host's time
per compute outside the ops is the source's. Beyond the CPUs the logs' machine has, threads
would take turns on them: not predicted (``predict``).

Two others bound it (``MODES``): ``linear`` (the memory part too ``T/T'`` times: every op's
time beyond its fixed cost) and ``flat`` (no part moves: the source's price). A prediction at a
scaled thread count is between them where the bandwidth measured moves less than the threads;
where no log can be held out across thread counts (``CostModel.held_out_threads``), they are its
interval (``intervals``).
"""

from __future__ import annotations

from dataclasses import replace

from .op_costs import CostModel, ThreadScale, Where

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
    ``bandwidth``: this machine's (bytes/ns) at the source's thread count and at ``threads``,
    where ``instr peaks`` measured both (default: the logs' streaming bandwidth, saturated);
    ``mode``: the prediction or a bound."""
    src = source(model, threads)
    if src is None or src == threads or mode not in MODES:
        return model
    at = Where("CPU", src)
    k = threads / src
    before = bandwidth[0] if bandwidth else model.stream.get(at, model.roofs[at].bandwidth)
    after = {"model": bandwidth[1] if bandwidth else before, "linear": before * k}.get(mode, before)
    compute = 1.0 if mode == "flat" else 1 / k
    scaled = {**model.scaled, Where("CPU", threads): ThreadScale(at, (before, after), compute)}
    return replace(model, scaled=scaled)
