"""A multimodal projector's share of ``instr fit``'s answer (``--mmproj``): its weights and its
compute buffers on the device its encoder runs on, by llama.cpp's own measure
(``native.mtmd_memory``: ``mtmd_get_memory_usage``, which llama-server's fit adds to its margins).

The projector is measured with the parameters ``instr run`` loads it with (``media.context_params``,
one function for both), so its encoder's device is the one a run gives it, as llama.cpp's tools
do: the first device of ``--device`` (a device list that names none: the CPU), else the first GPU
of ggml's registry, else the CPU; ``--no-mmproj-offload`` keeps it on the CPU. It computes with
the text model's flash attention (llama-server and llama-mtmd-cli pass theirs on), so its compute
buffers are measured per flash attention setting the search tries.

llama.cpp counts the weights as their tensors' bytes, where a run's buffer of them pads each
tensor to its buffer type's alignment (32 bytes on the CPU): the two are equal for a projector
whose tensors are multiples of it (those of llama.cpp's converters: widths of multiples of 8),
and a run holds up to 31 bytes a tensor more otherwise. The compute buffers are the same buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import mtmd_memory
from llamacpp_instr.running import devices, media, media_files

Footprint = dict[str, dict[str, int]]  # {device: {purpose: bytes}}

# the purposes of a session's memory_alloc records for an encoder's buffers
WEIGHTS, COMPUTE = "encoder_weights", "encoder_compute"


def check(path: Path) -> None:
    """A one-line UserError unless ``path`` is a projector file (as instr run checks it) and this
    build has libmtmd to measure it with."""
    try:
        media_files.check_projector(path)
    except UserError as exc:
        raise UserError(f"--mmproj: {exc}") from None
    media.import_mtmd()


@dataclass
class Projector:
    """The projector ``path`` as a run would place it: on the GPU unless ``offload`` is off, the
    first of ``device_names`` where given (``()``: none, the CPU)."""

    path: Path
    offload: bool = True
    device_names: tuple[str, ...] | None = None
    _measured: dict[bool | None, Footprint] = field(default_factory=dict, init=False, repr=False)

    def footprint(self, flash_attn: bool | None) -> Footprint:
        """{device: {"encoder_weights": bytes, "encoder_compute": bytes}} (zeros left out) with
        the text model's ``flash_attn`` (None: auto)."""
        if flash_attn not in self._measured:
            self._measured[flash_attn] = self._measure(flash_attn)
        return {dev: dict(p) for dev, p in self._measured[flash_attn].items()}

    def _measure(self, flash_attn: bool | None) -> Footprint:
        mtmd_cpp = media.import_mtmd()
        media.quiet_mtmd(mtmd_cpp)
        registry = devices.registry()
        params = media.context_params(mtmd_cpp, self.offload, self.device_names, flash_attn)
        weights = mtmd_memory.memory_usage(mtmd_cpp, self.path, params, warmup=False)
        whole = mtmd_memory.memory_usage(mtmd_cpp, self.path, params, warmup=True)
        if not weights or not whole:
            raise UserError(
                f"--mmproj {self.path}: llama.cpp's mtmd cannot load it{media.mtmd_said()}"
            )
        names = {d.ptr: d.name for d in registry}
        unknown = (set(weights) | set(whole)) - set(names)
        if unknown:
            raise UserError(
                "--mmproj: libmtmd measured a device this process's ggml does not list (a libmtmd "
                "of another build than libllama's: set MTMD_CPP_LIB to libllama's folder)"
            )
        out: Footprint = {}
        for ptr in sorted(set(weights) | set(whole), key=list(names).index):
            w = weights.get(ptr, 0)
            purposes = {WEIGHTS: w, COMPUTE: whole.get(ptr, 0) - w}
            if any(v < 0 for v in purposes.values()):
                raise UserError("--mmproj: llama.cpp measured less with its compute than without")
            kept = {p: v for p, v in purposes.items() if v}
            if kept:
                out[names[ptr]] = kept
        return out
