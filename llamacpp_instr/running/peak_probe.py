"""Measure this machine's peaks with the native probe (``llama_instr_probe_run``), per device.

Each device of the installed build gets a bandwidth figure (a large F32 ``ADD`` over buffers far
larger than the last-level cache: it reads two and writes one) and a matmul figure per weight type
(``MUL_MAT`` of a ``size x size`` weight by ``size x n`` F32 activations: ggml's own kernels for
that type, with the CPU's repacking buffer type where a run would use it). The CPU runs with the
thread count of the runs. The best of ``n_runs`` timed runs counts (after one warm-up run): a peak
is what the machine can do.

The CPU also gets a one-column matmul per weight type (``gemv``: a generated token's shape),
its weight ``gemv_bytes`` large, far beyond the caches: ggml's kernel for that shape streams the
weight and dequantizes it on the threads at once, and neither the bandwidth nor the matmul figure
says how its time moves with the thread count (on a 2-core VM, Q4_1 at one thread streamed 10 GB/s
where the ADD reached 15 to 22; from one thread to two it sped up 1.62x, as a Q4_1 model's
generation matmuls did, 1.64x, where the ADD's figures moved between 1.2x and 1.6x from one
measurement to the next).

And what a graph costs on its threads beyond one (``sync_ns``): a graph of one
matmul too small to gain from threads (``SYNC_SIZE``, one column) timed at the thread count and
on one thread, the best of ``SYNC_RUNS`` each; the difference is the start of the other threads
and their meeting at the graph's end, which a model's compute pays once at that count (its ops
meet at a barrier after each, in the ops' own measured times: ``instr predict`` prices a thread
count no log ran with it, ``deciding/prediction/op_threads.py``).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.session.machine_peaks import DevicePeaks, Peaks
from llamacpp_instr.native import bindings

# the types the runs use: F32/F16 models and KV caches, the bundled Q4_1, Q4_K_M (Q4_K + Q6_K), Q8_0
DEFAULT_TYPES = ("f32", "f16", "q4_0", "q4_1", "q4_k", "q6_k", "q8_0")
PROBED_DEVICE_TYPES = ("cpu", "gpu", "igpu")
# ggml-rpc sends a graph without waiting for it (GRAPH_COMPUTE has no reply), and its synchronize
# waits only for the send: a probe would time the network send, not the remote compute
RPC_NOT_MEASURED = "not measured (an RPC device: the probe cannot time its compute)"
# the graph whose time on the threads over its time on one is what starting them costs: one F32
# matmul of a SYNC_SIZE x SYNC_SIZE weight by one column (16 KiB: in the cache, a tenth of a
# microsecond of work), the best of SYNC_RUNS
SYNC_SIZE = 64
SYNC_RUNS = 200


@dataclass(frozen=True)
class Plan:
    n_threads: int
    types: tuple[str, ...] = DEFAULT_TYPES
    bandwidth_elements: int = 64 << 20  # per buffer: 3 x 256 MiB of F32, far beyond any LLC
    matmul_size: int = 2048  # k = m
    matmul_n: int = 512  # columns of x: a prompt ubatch
    n_runs: int = 5
    # the weight of the one-column matmul (a generated token's), far beyond any last-level cache
    gemv_bytes: int = 96 << 20


def gemv_size(name: str, weight_bytes: int) -> int:
    """The side of a square weight of type ``name`` holding about ``weight_bytes``: a multiple of
    256 (every type's block, the K-quants' included)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name.upper()]]
    side = math.sqrt(weight_bytes * block / size)
    return max(256, int(side) // 256 * 256)


def type_id(name: str) -> int:
    import gguf

    try:
        return int(gguf.GGMLQuantizationType[name.upper()].value)
    except KeyError:
        raise UserError(f"unknown ggml type {name!r}") from None


def refusal(lib: bindings.InstrLib, name: str) -> str | None:
    """Why the probe refuses weights of type ``name`` (a type ggml quantizes only with an
    importance matrix, or cannot make from F32 values at all), or None when it takes them, as the
    probe itself says it. It checks a matmul's type before its sizes, and both before it makes
    anything: asked with a size of 0, it refuses every probe, for its type or else for its size."""
    try:
        lib.probe(bindings.PROBE_MATMUL, 0, type_id(name), 1, 0, 1, 1)
    except bindings.SessionError as exc:
        return (
            str(exc)
            if exc.code == bindings.ERR_INVALID_ARG and "matmul size" not in str(exc)
            else None
        )
    return None


def _record(p: bindings.Probe, what: str, type_: str) -> dict[str, Any]:
    return {
        "device": p.device_name.decode(errors="replace"),
        "what": what,
        "type": type_,
        "buffer_type": p.buffer_type.decode(errors="replace"),
        "n_threads": int(p.n_threads),
        "tensors": [
            {"type": int(t.type), "ne": [int(x) for x in t.ne], "nbytes": int(t.nbytes)}
            for t in p.tensors[: p.n_tensors]
        ],
        "bytes": int(p.bytes),
        "flops": int(p.flops),
        "n_runs": int(p.n_runs),
        "best_ns": int(p.best_ns),
        "total_ns": int(p.total_ns),
    }


def measure(
    plan: Plan,
    lib: bindings.InstrLib | None = None,
    progress: Callable[[str], None] = lambda _s: None,
    warn: Callable[[str], None] = lambda _s: None,
    only: Collection[str] | None = None,
) -> Peaks:
    """Measure every device the build has (or those named in ``only``); a device that cannot be
    probed is skipped with one line to ``warn`` (the CPU failing is an error)."""
    lib = lib or bindings.load()
    machine = lib.machine_info()
    devices: list[DevicePeaks] = []
    records: list[dict[str, Any]] = []
    for d in machine.get("devices", []):
        if d.get("type") not in PROBED_DEVICE_TYPES:
            continue
        if only is not None and d.get("name") not in only:
            continue
        name = str(d.get("name"))
        if d.get("backend") == "RPC":
            progress(f"{name}: {RPC_NOT_MEASURED}")
            continue
        try:
            rec = _one(lib, int(d["index"]), name, plan, progress, d.get("type") == "cpu")
        except bindings.SessionError as exc:
            if d.get("type") == "cpu":
                raise UserError(f"cannot probe {name}: {exc}") from None
            warn(f"cannot probe {name}: {exc}")
            continue
        records += rec
        bw = [r for r in rec if r["what"] == "bandwidth"][0]
        sync = [r["best_ns"] for r in rec if r["what"] == "sync"]
        devices.append(
            DevicePeaks(
                name=name,
                type=str(d.get("type")),
                description=str(d.get("description", "")),
                bandwidth_gbs=bw["bytes"] / bw["best_ns"],
                matmul_gflops={
                    r["type"]: r["flops"] / r["best_ns"] for r in rec if r["what"] == "matmul"
                },
                sync_ns=max(float(sync[0] - sync[1]), 0.0) if len(sync) == 2 else None,
                gemv_gflops={
                    r["type"]: r["flops"] / r["best_ns"] for r in rec if r["what"] == "gemv"
                },
            )
        )
    if not devices:
        raise UserError("the installed build has no device to probe")
    return Peaks(
        machine=machine,
        n_threads=plan.n_threads,
        date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        devices=devices,
        measurements=records,
    )


# rounds of ``measure_counts``, and the timed runs of each probe in a round
COUNT_ROUNDS = 5
COUNT_RUNS = 2


def measure_counts(
    counts: Sequence[int],
    plan: Plan,
    lib: bindings.InstrLib | None = None,
    progress: Callable[[str], None] = lambda _s: None,
    warn: Callable[[str], None] = lambda _s: None,
    only: Collection[str] | None = None,
) -> list[Peaks]:
    """The peaks at each thread count of ``counts`` (``plan`` at each), the counts taking turns
    over ``COUNT_ROUNDS`` rounds, each figure the median of its rounds' bests (``COUNT_RUNS``
    runs a probe in a round). What ``instr predict --threads`` uses is the ratio of two counts'
    figures; measured minutes apart on a shared machine, a count's bandwidth moved by a quarter
    and the ratio with it, where counts measured in turns share the machine's state. Devices
    other than the CPU do not depend on the count: measured once, in the first round, and given
    to every count."""
    lib = lib or bindings.load()
    cpu_only = {
        str(d.get("name")) for d in lib.machine_info().get("devices", []) if d.get("type") == "cpu"
    }
    rounds: dict[int, list[Peaks]] = {n: [] for n in counts}
    for r in range(COUNT_ROUNDS):
        for i, n in enumerate(counts):
            progress(f"round {r + 1} of {COUNT_ROUNDS}, {n} thread(s)")
            first = r == 0 and i == 0
            got = measure(
                replace(plan, n_threads=n, n_runs=COUNT_RUNS), lib, progress, warn,
                only if first else (cpu_only if only is None else set(only) & cpu_only),
            )  # fmt: skip
            rounds[n].append(got)
    others = [d for d in rounds[counts[0]][0].devices if d.type != "cpu"]
    out = []
    for n in counts:
        cpus = [p.device() for p in rounds[n]]
        mid = cpus[0]
        types = sorted({t for c in cpus for t in c.matmul_gflops})
        gemv = sorted({t for c in cpus for t in c.gemv_gflops})
        syncs = [c.sync_ns for c in cpus if c.sync_ns is not None]
        cpu = replace(
            mid,
            bandwidth_gbs=float(np.median([c.bandwidth_gbs for c in cpus])),
            matmul_gflops={
                t: float(np.median([c.matmul_gflops[t] for c in cpus if t in c.matmul_gflops]))
                for t in types
            },
            sync_ns=float(np.median(syncs)) if syncs else None,
            gemv_gflops={
                t: float(np.median([c.gemv_gflops[t] for c in cpus if t in c.gemv_gflops]))
                for t in gemv
            },
        )
        last = rounds[n][-1]
        out.append(
            replace(
                last,
                devices=[cpu, *others],
                measurements=[m for p in rounds[n] for m in p.measurements],
            )
        )
    return out


def obtain(
    counts: Sequence[int],
    plan: Plan,
    cache: Path,
    lib: bindings.InstrLib,
    force: bool = False,
    only: Collection[str] | None = None,
    say: Callable[[str], None] = lambda _s: None,
) -> list[Peaks]:
    """``instr peaks``: this machine's peaks at each of ``counts`` (``plan`` at each), saved in
    ``cache``. One count: the cached file unless ``force`` (the devices of ``only`` it lacks are
    measured and added to it); several: measured in turns (``measure_counts``). ``say`` hears
    what is done, each step's progress indented."""
    from llamacpp_instr.converters.session import machine_peaks

    machine = lib.machine_info()

    def progress(line: str) -> None:
        say(f"  {line}")

    def warn(line: str) -> None:
        say(f"error: {line}")

    if len(counts) > 1:
        keys = ", ".join(machine_peaks.machine_key(machine, n) for n in counts)
        say(f"measuring {keys}, taking turns ...")
        out = measure_counts(counts, plan, lib, progress, warn, only)
        for one in out:
            say(f"saved {machine_peaks.save(one, cache)}")
        return out
    n_threads = counts[0]
    existing = machine_peaks.cached(machine, n_threads, cache)
    got = None if force else existing
    if got is not None and only is not None and not set(only) <= {d.name for d in got.devices}:
        only = set(only) - {d.name for d in got.devices}  # measure the rest, keep the cached
        got = None
    if got is not None:
        say(
            f"peaks of {got.key}, measured {got.date} (cached: "
            f"{machine_peaks.cache_file(got.key, cache)}; --force measures again)"
        )
        return [got]
    say(f"measuring {machine_peaks.machine_key(machine, n_threads)} ...")
    got = measure(replace(plan, n_threads=n_threads), lib, progress, warn, only)
    if existing is not None and only is not None:
        got = merge(existing, got)
    say(f"saved {machine_peaks.save(got, cache)}")
    return [got]


def merge(old: Peaks, new: Peaks) -> Peaks:
    """``old`` (the same machine's) with the devices ``new`` measured replaced or added."""
    names = {d.name for d in new.devices}
    return Peaks(
        machine=new.machine,
        n_threads=new.n_threads,
        date=new.date,
        devices=[d for d in old.devices if d.name not in names] + list(new.devices),
        measurements=[m for m in old.measurements if m.get("device") not in names]
        + list(new.measurements),
    )


def _one(
    lib: bindings.InstrLib,
    index: int,
    name: str,
    plan: Plan,
    progress: Callable[[str], None],
    cpu: bool = False,
) -> list[dict[str, Any]]:
    out = []
    mib = plan.bandwidth_elements * 4 / (1 << 20)
    progress(f"{name}: bandwidth, ADD over 3 x {mib:.0f} MiB of F32 ...")
    p = lib.probe(
        bindings.PROBE_BANDWIDTH, index, 0, plan.n_threads, plan.bandwidth_elements, 0, plan.n_runs
    )
    out.append(_record(p, "bandwidth", "f32"))
    progress(f"{name}: bandwidth {p.bytes / p.best_ns:.1f} GB/s")
    for t in plan.types:
        progress(f"{name}: matmul {t} {plan.matmul_size}x{plan.matmul_size} by {plan.matmul_n} ...")
        p = lib.probe(
            bindings.PROBE_MATMUL,
            index,
            type_id(t),
            plan.n_threads,
            plan.matmul_size,
            plan.matmul_n,
            plan.n_runs,
        )
        out.append(_record(p, "matmul", t))
        buft = p.buffer_type.decode(errors="replace")
        progress(f"{name}: matmul {t} {p.flops / p.best_ns:.1f} GFLOP/s ({buft})")
        if cpu and plan.gemv_bytes > 0:
            size = gemv_size(t, plan.gemv_bytes)
            p = lib.probe(
                bindings.PROBE_MATMUL, index, type_id(t), plan.n_threads, size, 1, plan.n_runs
            )
            out.append(_record(p, "gemv", t))
            progress(f"{name}: matmul {t} {size}x{size} by 1 {p.flops / p.best_ns:.1f} GFLOP/s")
    if cpu:
        # (at the thread count first, then on one: "sync" records in that order)
        for n in (plan.n_threads, 1):
            p = lib.probe(bindings.PROBE_MATMUL, index, type_id("f32"), n, SYNC_SIZE, 1, SYNC_RUNS)
            out.append(_record(p, "sync", "f32"))
        cost = out[-2]["best_ns"] - out[-1]["best_ns"]
        progress(
            f"{name}: a graph started on {plan.n_threads} threads: {max(cost, 0) / 1e3:.2f} us"
        )
    return out
