"""Measure this machine's peaks with the native probe (``llama_instr_probe_run``), per device.

Each device of the installed build gets a bandwidth figure (a large F32 ``ADD`` over buffers far
larger than the last-level cache: it reads two and writes one) and a matmul figure per weight type
(``MUL_MAT`` of a ``size x size`` weight by ``size x n`` F32 activations: ggml's own kernels for
that type, with the CPU's repacking buffer type where a run would use it). The CPU runs with the
thread count of the runs. The best of ``n_runs`` timed runs counts (after one warm-up run): a peak
is what the machine can do.

The CPU also gets what a graph costs on its threads beyond one (``sync_ns``): a graph of one
matmul too small to gain from threads (``SYNC_SIZE``, one column) timed at the thread count and
on one thread, the best of ``SYNC_RUNS`` each; the difference is the start of the other threads
and their meeting at the graph's end, which a model's compute pays once at that count (its ops
meet at a barrier after each, in the ops' own measured times: ``instr predict`` prices a thread
count no log ran with it, ``deciding/prediction/op_threads.py``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

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


def type_id(name: str) -> int:
    import gguf

    try:
        return int(gguf.GGMLQuantizationType[name.upper()].value)
    except KeyError:
        raise UserError(f"unknown ggml type {name!r}") from None


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
