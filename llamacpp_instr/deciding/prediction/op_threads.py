"""The CPU at a thread count no log ran (``instr predict --threads``): its ops priced from the
nearest thread count the logs ran, by the roofline the cost model already uses.

An op's time in its class is ``fixed + slope * work`` (``op_costs``). At ``T'`` threads from
logs of ``T`` each op keeps its class (its fit, its fusion, the device's fixed cost per op: a
barrier's and a dispatch's), and its time beyond the fixed cost is split in two:

- memory: its bytes at the rate its weight matrix streams at (at most all of it): for a matmul
  reading a weight, the best rate a whole step of the logs read that matrix at (its matmuls'
  bytes over their time in the step, for the same role and type in every layer: ``ffn_up`` of
  Q4_1; a generation step reads every weight once, at the rate its kernel dequantizes and the
  memory delivers it), for another op the best any whole step's ops reached; a rate that
  saturates: the same at ``T'``, or, where ``instr peaks`` measured this machine's bandwidth at
  both thread counts, in their ratio;
- compute: the rest, which ggml splits between its threads: ``T/T'`` times it.

So a prompt's matmul (thousands of FLOPs a byte) takes ``T/T'`` its time; a generation's
matrix-vector product, which streams its weights at that rate, its time; an op between,
between. Measured on bench/predict.py's grid: with one bandwidth for every matmul (the fastest
any step reached: an F16 model's, 34 GB/s), a Q4_1 model's matrix-vector products (read at 17-21
GB/s) looked half compute and generation at 1 thread was priced 26 % slower than at 2, where it
is within 4 %; with one per weight type, a Q8_0 model's took the rate of a Q4_1 model's Q8_0
output matrix, 49,152 rows long. An F16 model's generation does get faster with threads (22 %
from 1 to 2 here): more than this model says. The host's time per compute outside the ops is
the source's. Beyond the CPUs the logs' machine has, threads would take turns on them: not
predicted (``predict``).

Two others bound it (``MODES``): ``linear`` (the memory part too ``T/T'`` times: every op's
time beyond its fixed cost) and ``flat`` (no part moves: the source's price). A prediction at a
scaled thread count is between them where the bandwidth measured moves less than the threads;
where no log can be held out across thread counts (``CostModel.held_out_threads``), they are its
interval (``intervals``).
"""

from __future__ import annotations

from dataclasses import replace

from llamacpp_instr.deciding.prediction.op_costs import CostModel, ThreadScale, Where

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
    where ``instr peaks`` measured both (default: saturated, the same); ``mode``: the
    prediction or a bound."""
    src = source(model, threads)
    if src is None or src == threads or mode not in MODES:
        return model
    at = Where("CPU", src)
    k = threads / src
    streams = {t: v for (w, t), v in model.stream.items() if w == at}
    streams.setdefault("", model.roofs[at].bandwidth)
    ratio = bandwidth[1] / bandwidth[0] if bandwidth else 1.0
    bw = {"model": ratio, "linear": k}.get(mode, 1.0)
    compute = 1.0 if mode == "flat" else 1 / k
    scaled = {**model.scaled, Where("CPU", threads): ThreadScale(at, streams, bw, compute)}
    return replace(model, scaled=scaled)
