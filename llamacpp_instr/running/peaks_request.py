"""``instr peaks``' request: which devices to measure at which thread counts, checked before
anything is measured, then measured (``peak_probe.obtain``) or read from the machine's cache."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.session.machine_peaks import Peaks
from llamacpp_instr.running.offload import Offload


def default_threads() -> int:
    """The thread count of `instr run` without --threads: all cores, at most 8."""
    return max(1, min(os.cpu_count() or 1, 8))


@dataclass(frozen=True)
class PeaksRequest:
    """Measure the matmul peak of each of ``types`` (ggml's names) and the memory bandwidth
    (three buffers of ``size_mib`` MiB) on the CPU at each of ``counts`` threads (default: the
    runs' count) and on each device of the build, or those ``offload`` names (its RPC servers
    added, not measured); ``force``: measure even where the cache holds them."""

    types: tuple[str, ...]
    counts: tuple[int, ...] = ()
    size_mib: int = 256
    force: bool = False
    offload: Offload = field(default_factory=Offload)


def measure_peaks(request: PeaksRequest, cache: Path, say: Callable[[str], None]) -> list[Peaks]:
    """This machine's peaks, one per thread count, saved in ``cache``; a type the probe cannot
    measure fails before anything is measured. ``say`` hears what is done."""
    from llamacpp_instr.native import bindings
    from llamacpp_instr.running import devices
    from llamacpp_instr.running import peak_probe as measure

    for t in request.types:
        measure.type_id(t)  # a bad name fails before anything runs
    lib = bindings.load()
    for t in request.types:  # a type the probe cannot hold fails before anything is measured
        why = measure.refusal(lib, t)
        if why is not None:
            raise UserError(f"cannot measure {why}")  # (it begins with the type's name)
    try:  # ggml's own log lines (the CPU repacking a weight) would break up the progress lines
        from llama_cpp import _logger

        _logger.set_verbose(False)
    except (ImportError, AttributeError):
        pass
    devices.add_rpc_servers(request.offload.rpc)
    only: set[str] | None = None
    if request.offload.devices is not None:
        only = {d.name for d in devices.registry() if d.type == "cpu"}
        for d in devices.by_names(request.offload.devices):
            if d.backend == "RPC":
                say(f"  {d.name}: {measure.RPC_NOT_MEASURED}")
            else:
                only.add(d.name)
    counts = request.counts or (default_threads(),)
    plan = measure.Plan(
        n_threads=counts[0], types=request.types, bandwidth_elements=request.size_mib << 18
    )
    force = request.force or len(counts) > 1
    return measure.obtain(counts, plan, cache, lib, force=force, only=only, say=say)
