"""The CPU at a thread count no log ran (``instr predict --threads``): its ops priced from the
nearest thread count the logs ran, with what ``instr peaks`` measured of this machine at both.

An op's time in its class is ``fixed + slope * work`` (``op_costs``). At ``T`` threads from logs
of ``S`` each op keeps its class (its fit, its fusion, the device's fixed cost per op), and its
time beyond the fixed cost is split into its bytes at the rate its weight matrix streamed at in
the logs, and the rest, compute (``thread_scale.ThreadScale``). Each part moves by what was
measured at the two counts:

- the memory part by the bandwidth ``instr peaks`` measured at ``T`` over the one at ``S`` (the
  rate one thread streams at is not two threads' rate: on a 2-core VM, 13 against 25 GB/s, and
  a Q4_1 model's generation 1.8 to 2 times faster on two threads);
- a matmul of one column (a generated token's: ggml streams the weight and dequantizes it on
  the threads at once, neither bound alone) by what a graph of weights of its own shape and type
  took at each count, run on this machine in turn (``gemv_probe``; where the logs' machine is
  this one), else by the one-column matmul ``instr peaks`` measured for its weight type at each
  count, on one weight beyond the caches: its whole time beyond the fixed cost (on a 2-core VM a
  12-layer F16 model's generation sped up 1.52x from one thread to two, a graph of its weights'
  shapes 1.57x, the one large weight 1.89x; a Q4_1 model's generation matmuls 1.64x, the large
  weight 1.62x, where the ADD's bandwidth moved between 1.2x and 1.6x from one measurement to
  the next);
- the compute part of another matmul by the matmul throughput ``instr peaks`` measured for its
  weight type at each count (ggml's kernel of that type on the threads: on that VM a Q4_1 matmul of
  2048 x 2048 by 512 ran 1.8 times faster on two threads, an F32 one 2.0), of another op (or a
  weight type not measured) by the threads (ggml splits an op's rows or chunks between them: an
  op of one row, the norm of one token, runs on one thread whatever the count);
- the host's time per compute by what ``instr peaks`` measured a graph of one op to cost at
  each count beyond one thread: the threads' start and their last meeting, paid once a compute
  (about 2 to 3 us at 2 threads there). The threads' meeting after every op is in its measured
  time: a fraction of a microsecond, where an op of one row there takes 0.1 to 0.3 us longer at 2
  threads than at 1 (each op at the one-op graph's figure would put a fifth more on a small
  model's generation step at 2 threads than it takes).

Without the peaks of both counts nothing says how fast ``T`` threads stream, so the count is
not covered and the prediction names the ``instr peaks`` to run (``--thread-counts S,T``: the
counts measured in turns, as their ratio is what prices one from the other; peaks of the two
measured minutes apart are said to be); a weight type whose matmul the
peaks of either count lack (a file measured with ``--types`` that leave it out) is priced by
the threads, said with the command that measures it. Beyond the CPUs the logs' machine has,
threads would take turns on them: not predicted (``predict``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from llamacpp_instr.deciding.prediction.op_costs import CostModel, Where
from llamacpp_instr.deciding.prediction.thread_scale import CpuPeaks, ThreadScale

# per thread count, what instr peaks measured of the logs' machine there
PeaksAt = dict[int, CpuPeaks]


def cpu_threads(model: CostModel) -> list[int]:
    """The CPU thread counts the logs ran."""
    return sorted({w.threads for w in model.roofs if w.device == "CPU"})


def source(model: CostModel, threads: int) -> int | None:
    """The thread count the logs ran nearest ``threads`` (of two as near, the larger), None
    where the logs ran no op on the CPU."""
    have = cpu_threads(model)
    return min(have, key=lambda t: (abs(t - threads), -t)) if have else None


def cpu_peaks(machine: dict[str, Any] | None, counts: list[int], cache: Path) -> PeaksAt:
    """The CPU peaks ``instr peaks`` cached for ``machine`` at each of ``counts`` that has
    them, with its bandwidth and the cost of a split (an older file without the latter is left
    out: measure again)."""
    from llamacpp_instr.converters.session import machine_peaks as mp

    out: PeaksAt = {}
    if not machine:
        return out
    for n in counts:
        p = mp.cached(machine, n, cache)
        if p is None:
            continue
        cpu = next((d for d in p.devices if d.type == "cpu"), None)
        if cpu is not None and cpu.bandwidth_gbs > 0 and cpu.sync_ns is not None:
            out[n] = CpuPeaks(
                n, cpu.bandwidth_gbs, cpu.sync_ns, dict(cpu.matmul_gflops), p.date,
                dict(cpu.gemv_gflops),
            )  # fmt: skip
    return out


def scale(model: CostModel, threads: int, peaks: PeaksAt) -> CostModel | None:
    """``model`` with the CPU at ``threads`` priced from its ``source`` (module doc), None where
    ``peaks`` lacks either count; ``model`` itself where the logs ran ``threads``."""
    src = source(model, threads)
    if src is None or src == threads:
        return model
    if src not in peaks or threads not in peaks:
        return None
    at = Where("CPU", src)
    streams = {t: v for (w, t), v in model.stream.items() if w == at}
    streams.setdefault("", model.roofs[at].bandwidth)
    scaled = ThreadScale(peaks[src], peaks[threads], streams)
    return replace(model, scaled={**model.scaled, Where("CPU", threads): scaled})


def with_probe(model: CostModel, threads: int, probe: Any) -> CostModel:
    """``model`` (scaled to ``threads``) with its generated token's matmuls there measured by
    ``probe`` (``gemv_probe.GemvProbe``; None: as ``instr peaks`` measured)."""
    where = Where("CPU", threads)
    if probe is None or where not in model.scaled:
        return model
    return replace(model, scaled={**model.scaled, where: replace(model.scaled[where], probe=probe)})


def peaks_command(counts: list[int]) -> str:
    """The ``instr peaks`` run that measures ``counts`` (in turns, where several: their ratios
    are what prices one from another)."""
    if len(counts) == 1:
        return f"`instr peaks --threads {counts[0]} --force`"
    return f"`instr peaks --thread-counts {','.join(map(str, counts))} --force`"


def apart_s(peaks: PeaksAt, counts: list[int]) -> float:
    """How far apart in time (s) the peaks of ``counts`` were measured (0 where a date is
    missing): measured minutes apart, a shared machine may have run them at other speeds."""
    import datetime as dt

    when = []
    for n in counts:
        try:
            when.append(dt.datetime.fromisoformat(peaks[n].date.replace("Z", "+00:00")))
        except (KeyError, ValueError):
            return 0.0
    return (max(when) - min(when)).total_seconds() if when else 0.0


def unmeasured_types(model: CostModel, threads: int, peaks: PeaksAt) -> list[str]:
    """The weight types of the logs' matmuls whose throughput the peaks at the source's count or
    at ``threads`` lack (their compute priced by the threads instead)."""
    scaled = model.scaled.get(Where("CPU", threads))
    if scaled is None:
        return []
    # (the logs' matmuls reading a weight, by type: the streams' keys without a role)
    ran = {t for t in scaled.streams if t and ":" not in t}
    return sorted(t for t in ran if scaled.matmul_rates(t) is None)
