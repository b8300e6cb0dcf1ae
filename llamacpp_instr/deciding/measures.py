"""What the planners ask of the machine they run on, handed in by their caller
(``running.measuring.ThisMachine``): deciding decides from what is measured and never measures.

A planner (``fit``, ``plan``, ``moe_plan``, ``prediction``) is given a ``Machine``: its devices
(by name, with their free memory, and those a placement's layers would go to), llama.cpp's
projection of a setting's memory (``Meter``, a model loaded without its weights), the graphs it
would compute (``Meter.graph``), a real run's buffers, llama-fit-params' projection, a projector's
buffers, the file of each quantization, and the probes that time this machine where it is the
logs' (None elsewhere)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from llamacpp_instr.running.offload import Offload
from llamacpp_instr.running.run_config import MediaInputs, RunConfig
from llamacpp_instr.running.tensor_overrides import TensorOverrides

Footprint = dict[str, dict[str, int]]  # {device: {purpose: bytes}}


class Meter(Protocol):
    """One model file loaded with no weights at one placement (``running.footprint.Prober``)."""

    n_layer: int
    n_ctx_train: int

    def footprint(self, cfg: RunConfig) -> Footprint:
        """llama.cpp's projection of a context of ``cfg``."""
        ...

    def unlisted(self, cfg: RunConfig) -> Footprint:
        """What a context of ``cfg`` allocates that the projection leaves out."""
        ...

    def architecture(self) -> str:
        """The model's general.architecture."""
        ...

    def graph(self, cfg: RunConfig, n_tokens: int) -> dict[str, Any]:
        """The graph record of a compute of ``n_tokens`` in a context of ``cfg``."""
        ...

    def close(self) -> None: ...


class Projector(Protocol):
    """A projector file as a run would place it (``running.projector_memory.Projector``)."""

    path: Path
    offload: bool  # whether its encoder may go to a GPU (off: --no-mmproj-offload, the CPU)

    def footprint(self, flash_attn: bool | None) -> Footprint:
        """Its weights and compute buffers per device at the text model's flash attention."""
        ...


class Machine(Protocol):
    """This machine, as the planners ask it (module doc)."""

    def load(self, quiet: bool = False) -> None:
        """The patched library loaded (a one-line error where it cannot be); ``quiet``: first
        llama.cpp's own log lines turned off for the rest of the process (a line per tensor, per
        reservation, per context made)."""
        ...

    def devices(self, rpc: tuple[str, ...]) -> list[str]:
        """ggml's devices by name, in its order, with the RPC servers ``rpc`` added first (each
        checked to answer, then registered, as ``--rpc`` adds them)."""
        ...

    def free_memory(self) -> dict[str, int]:
        """Each device's free memory in bytes as ggml reports it (a memory budget lowers it)."""
        ...

    def offload_devices(self, placed: Offload) -> list[str]:
        """The devices ``placed``'s layers go to (its ``--device``, else llama.cpp's default), its
        RPC servers added first; a one-line error for a name that is no device."""
        ...

    def meter(self, path: Path, placed: Offload, tensors: TensorOverrides | None = None) -> Meter:
        """``path`` loaded with no weights at the placement ``placed`` (``tensors``' rules)."""
        ...

    def stand_ins(self, placed: Offload, servers: int) -> Offload:
        """``placed`` with ``servers`` RPC servers stood in for on loopback where it names none."""
        ...

    def file_type(self, path: Path) -> str:
        """The GGUF's own type as instr quantize names it (``running.quant.files``)."""
        ...

    def quantized(
        self, path: Path, quants: tuple[str, ...], say: Callable[[str], None]
    ) -> list[tuple[str, Path]]:
        """(quantization, file) for each of ``quants`` (``running.quant.files``)."""
        ...

    def projector(
        self, path: Path, offload: bool, device_names: tuple[str, ...] | None
    ) -> Projector:
        """The projector ``path`` checked, to be measured where a run would place it."""
        ...

    def fit_params_program(self, required: bool) -> Path | None:
        """llama-fit-params where built (required: a one-line error where not)."""
        ...

    def llama_fit_params(self, exe: Path, cfg: RunConfig, budget: dict[str, int]) -> Any:
        """llama-fit-params' projection of ``cfg`` under ``budget`` (MiB per device, purpose)."""
        ...

    def measured_run(self, cfg: RunConfig, budget: dict[str, int], media: MediaInputs) -> Footprint:
        """The live buffers of a real run of ``cfg`` (two tokens, ``media``'s projector loaded
        where it places it) when its last step ended, under a memory budget of ``budget``."""
        ...

    def attention(
        self, logged: list[Any], threads: int, n_ctx: int, weights: int, n_layer: int
    ) -> Any | None:
        """The attention probe (``running.probes.kv_probe.Probe``), None where this machine is
        not the one the logs (their ``session_start.machine``) name."""
        ...

    def matmuls(self, logged: list[Any], source: int, target: int) -> Any | None:
        """The one-column matmul probe (``running.probes.gemv_probe.GemvProbe``) between two
        thread counts, None where this machine is not the logs'."""
        ...
