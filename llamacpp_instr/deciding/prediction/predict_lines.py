"""The lines beside a prediction's report: what was not covered and the ``instr run`` that
measures it, what was extrapolated, and what each op is at a thread count no log ran."""

from __future__ import annotations

from typing import Any

from llamacpp_instr.deciding.prediction import op_threads
from llamacpp_instr.deciding.prediction.kv_costs import KV_EXTRAPOLATION, KV_PAD
from llamacpp_instr.deciding.prediction.op_costs import CostModel, Where
from llamacpp_instr.deciding.prediction.target import Target
from llamacpp_instr.running import context_choices


def advice(t: Target, where: str) -> str:
    if where.startswith("RPC"):
        # a stock server times nothing (the log's remote_timing: false): no run of it can help
        return (
            "an RPC server's ops are timed only by the patched ggml-rpc-server (`instr build "
            "--tools`, then `instr doctor --tools` says where it is): run the hosts on it (detailed) and "
            "add that log"
        )
    threads = f" --threads {t.threads}" if "threads" in where else ""
    return f"run `instr run {t.model}{threads}` (detailed) and add its log"


def bounds_line(bounds: dict[str, dict[str, dict[str, float]]], shown: int = 4) -> str:
    """What each op is at the target's thread count, per kind, with its share of the CPU's
    time (``Prediction.op_bounds``; the ``shown`` largest of each)."""
    parts = []
    for kind in ("prompt", "gen"):
        by = bounds.get(kind)
        if not by:
            continue
        what = "; ".join(
            f"{name} " + ", ".join(f"{op} {v:.0%}" for op, v in list(ops.items())[:shown])
            for name, ops in sorted(by.items(), key=lambda kv: -sum(kv[1].values()))
        )
        parts.append(f"{'generation' if kind == 'gen' else 'prompt'}: {what}")
    return "; ".join(parts)


def measuring_run(t: Target) -> str:
    """The ``instr run`` that measures ``t``'s own sizes: its prompt (after its depth, which a
    longer prompt reaches) in its ubatches, and its generation at the KV sizes it reaches."""
    tokens = t.depth + t.n_prompt
    n_ctx = -(-(tokens + t.n_gen + 1) // KV_PAD) * KV_PAD
    args = [f"instr run {t.model} -t {t.threads}"]
    args.append(f"--batch {t.n_batch} --ubatch {t.n_ubatch} --ctx {n_ctx} -n {t.n_gen}")
    if t.offload.gpu_layers:
        args.append(f"-ngl {t.offload.gpu_layers}")
    args += [f"-ot '{x}'" for x in t.tensors.command_line()[1:]]
    args += context_choices.flash_attn_args(t.flash_attn)
    if (t.type_k, t.type_v) != ("f16", "f16"):
        args.append(f"-ctk {t.type_k} -ctv {t.type_v}")
    args.append(f"--ignore-eos -p <a prompt of {tokens} tokens>")
    return " ".join(args)


def beyond_line(kind: str, classes: dict[tuple[str, str, str, str], float], t: Target) -> str:
    """What is not covered where a kind's ops go beyond the work the logs measured, and the run
    that measures it."""
    (where, op, typ, tokens), far = max(classes.items(), key=lambda kv: kv[1])
    of = f" of {typ}" if typ else ""
    times = (
        "work where the logs' ops of it did none"
        if far == float("inf")
        else f"{far:.3g}x the most work the logs measured of it"
    )
    name = "the prompt" if kind == "prompt" else "generation"
    # (what comes before the first "; " is the line plan lists once for all its settings)
    return (
        f"{name}'s ops beyond the sizes the logs measured; not extrapolated: {len(classes)} op "
        f"class(es), up to {times} ({op}{of} in ubatches of {tokens} token(s) on {where}); run "
        f"`{measuring_run(t)}` (detailed) and add its log"
    )


def deeper_line(
    kind: str, classes: dict[tuple[str, str, str, str], float], far: float, max_kv: int
) -> str:
    """What was extrapolated where a kind's attention ops read more KV cells than the logs'."""
    ops = sorted({f"{op} {typ}".strip() for (_w, op, typ, _n) in classes})
    name = "the prompt" if kind == "prompt" else "generation"
    return (
        f"{name}'s attention ({', '.join(ops)}) reads up to {far:.3g}x the {max_kv} KV cells the "
        "logs' computes read: priced by its measured cost per KV cell, an extrapolation "
        f"(bench/predict.py --depth-grid checks it to {KV_EXTRAPOLATION:g}x; beyond, not predicted)"
    )


def too_deep_line(kind: str, far: float, max_kv: int, t: Target) -> str:
    """What is not covered where a kind's attention goes beyond what the bench checks."""
    name = "the prompt" if kind == "prompt" else "generation"
    return (
        f"{name}'s attention reads {far:.3g}x the {max_kv} KV cells the logs' computes read, "
        f"beyond the {KV_EXTRAPOLATION:g}x its cost per cell is extrapolated to; run "
        f"`{measuring_run(t)}` (detailed) and add its log"
    )


def missing_line(m: tuple[str, str, str, str], t: Target) -> str:
    where, op, typ, tokens = m
    steps = f"ubatches of {tokens} token(s)"
    of = f" of {typ}" if typ else ""
    return f"{op}{of} in {steps} on {where}: no log has it; {advice(t, where)}"


def too_many_threads_line(t: Target, cores: int | None, have: list[int]) -> str:
    """Not covered: more threads than the logs' machine has CPUs (or says it has)."""
    why = (
        f"the logs' machine has {cores} CPUs, so threads would take turns on them"
        if cores
        else "the logs do not say how many CPUs their machine has"
    )
    return (
        f"the CPU at {t.threads} threads: {why} (the logs ran {', '.join(map(str, have))}); "
        f"run `instr run {t.model} --threads {t.threads}` (detailed) on the machine it is for "
        "and add its log"
    )


def no_peaks_line(t: Target, src: int, have: list[int], peaks: dict[int, Any]) -> str:
    """Not covered: a thread count no log ran, without the peaks that price it from ``src``."""
    lacking = [n for n in (src, t.threads) if n not in peaks]
    return (
        f"the CPU at {t.threads} threads: no log ran it (the logs ran "
        f"{', '.join(map(str, have))}), and instr peaks has not measured this machine's bandwidth "
        f"and the cost of starting the threads at {' and '.join(map(str, lacking))} thread(s), "
        f"which price it from the logs' {src}: run {op_threads.peaks_command([src, t.threads])} "
        f"on it (both counts, in turns: their ratio prices one from the other), then predict "
        f"again (or run `instr run {t.model} --threads {t.threads}` (detailed) and add its log)"
    )


def threads_line(
    t: Target, src: int, scaled: CostModel, peaks: dict[int, Any], probed: bool
) -> str:
    """How a thread count no log ran is priced from the logs' ``src`` (``scaled``, with the peaks
    of both; ``probed``: a generated token's matmuls by the probe)."""
    at, to = peaks[src], peaks[t.threads]
    command = op_threads.peaks_command([src, t.threads])
    types = op_threads.unmeasured_types(scaled, t.threads, peaks)
    unmeasured = (
        f"; no matmul peak of {', '.join(types)} at both counts (a peaks file measured without "
        f"it), its compute priced by the threads: run {command} to measure it"
        if types
        else ""
    )
    cpu = scaled.scaled[Where("CPU", t.threads)]
    no_gemv = sorted(
        w for w in {k for k in cpu.streams if k and ":" not in k} if cpu.gemv_rates(w) is None
    )
    gemv = (
        f" (not measured for {', '.join(no_gemv)}: as the other matmuls; {command} measures it)"
        if no_gemv
        else ""
    )
    if probed:
        how = (
            "a generated token's matmuls by graphs of their own weights' shapes run on this "
            f"machine at both counts in turns (the shapes holding most of their bytes; the others "
            f"as their type's, else as the one-column matmul instr peaks measured{gemv})"
        )
    else:
        how = (
            "a generated token's matmuls by the one-column matmul instr peaks measured for their "
            f"weight type at each count{gemv}"
        )
    return (
        f"{t.threads} threads priced from the logs' {src}: {how}, "
        f"other memory-bound ops at the bandwidth "
        f"instr peaks measured at {t.threads} ({to.bandwidth:.1f} GB/s; at {src}, "
        f"{at.bandwidth:.1f} GB/s), compute-bound matmuls at the matmul throughput it measured "
        f"for their weight type at each, other compute-bound ops by the threads (an op of one "
        f"row on one thread at both), each compute's start of the threads at its measured cost "
        f"({to.sync_ns / 1e3:.2f} us at {t.threads}, {at.sync_ns / 1e3:.2f} at {src}){unmeasured}"
    )
