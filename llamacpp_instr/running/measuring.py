"""This machine, as the planners ask it (``deciding.measures.Machine``): the measures ``instr fit``,
``plan`` and ``predict`` decide from, each taken here, in ``running/``, where the code that acts
on a model or times the machine lives. The commands hand a ``ThisMachine`` to the planners."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from llamacpp_instr.running import devices, footprint_checks, offload, placement
from llamacpp_instr.running.footprint import Footprint, Prober
from llamacpp_instr.running.projector_memory import Projector
from llamacpp_instr.running.run_config import MediaInputs, RunConfig
from llamacpp_instr.running.tensor_overrides import TensorOverrides


class ThisMachine:
    """The measures of this process's machine (``deciding.measures.Machine``)."""

    def load(self, quiet: bool = False) -> None:
        from llamacpp_instr.native import bindings

        if quiet:
            from llama_cpp import _logger

            _logger.set_verbose(False)
        bindings.load()

    def devices(self, rpc: tuple[str, ...]) -> list[str]:
        devices.add_rpc_servers(rpc)
        return [d.name for d in devices.registry()]

    def free_memory(self) -> dict[str, int]:
        return {d.name: devices.memory(d)[0] for d in devices.registry()}

    def offload_devices(self, placed: offload.Offload) -> list[str]:
        devices.add_rpc_servers(placed.rpc)
        if placed.devices is None:
            return [d.name for d in devices.default_offload()]
        return [d.name for d in devices.by_names(placed.devices)]

    def meter(
        self, path: Path, placed: offload.Offload, tensors: TensorOverrides | None = None
    ) -> Prober:
        prepared = placement.prepare(placed)  # (its RPC servers among the devices named)
        names = [d.name for d in devices.registry()]
        return Prober(path, prepared, names, tensors)

    def stand_ins(self, placed: offload.Offload, servers: int) -> offload.Offload:
        if not servers or placed.rpc:
            return placed
        from llamacpp_instr.running import rpc_standin

        return replace(placed, rpc=rpc_standin.endpoints(servers))

    def file_type(self, path: Path) -> str:
        from llamacpp_instr.running.quant.files import file_type

        return file_type(path)

    def quantized(
        self, path: Path, quants: tuple[str, ...], say: Callable[[str], None]
    ) -> list[tuple[str, Path]]:
        from llamacpp_instr.running.quant.files import quantized_files

        return quantized_files(path, quants, say)

    def projector(
        self, path: Path, offload: bool, device_names: tuple[str, ...] | None
    ) -> Projector:
        from llamacpp_instr.running import projector_memory

        projector_memory.check(path)
        return Projector(path, offload, device_names)

    def fit_params_program(self, required: bool) -> Path | None:
        return footprint_checks.fit_params_program(required)

    def llama_fit_params(self, exe: Path, cfg: RunConfig, budget: dict[str, int]) -> Any:
        return footprint_checks.llama_fit_params(exe, cfg, budget)

    def measured_run(self, cfg: RunConfig, budget: dict[str, int], media: MediaInputs) -> Footprint:
        return footprint_checks.measured_run(cfg, budget, media)

    def attention(
        self, logged: list[Any], threads: int, n_ctx: int, weights: int, n_layer: int
    ) -> Any | None:
        from llamacpp_instr.running.probes import kv_probe

        found = kv_probe.this_machine(logged)
        if found is None:
            return None
        lib, here = found
        names = {str(d["name"]): int(d["index"]) for d in here if d.get("backend") != "RPC"}
        return kv_probe.Probe(lib, names, threads, n_ctx, weights, n_layer)

    def matmuls(self, logged: list[Any], source: int, target: int) -> Any | None:
        from llamacpp_instr.running.probes import gemv_probe

        return gemv_probe.for_logs(logged, source, target)
