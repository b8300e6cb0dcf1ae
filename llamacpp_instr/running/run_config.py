"""What a run is given (``RunConfig``: ``instr run``'s options, and every context this package
makes for a model, run or projected; ``MediaInputs``: its projector, images and sounds) and the
thread count it uses by default.

Data alone: the planners build a setting's ``RunConfig`` to ask llama.cpp what it would take, and
``runner`` runs one."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.contract.schema import SESSION_LEVELS
from llamacpp_instr.running import context_choices
from llamacpp_instr.running import memory_budget as memory
from llamacpp_instr.running.always_on import AlwaysOn
from llamacpp_instr.running.media_files import AUDIO, IMAGE, check_file, check_projector
from llamacpp_instr.running.offload import Offload
from llamacpp_instr.running.tensor_overrides import TensorOverrides


@dataclass(frozen=True)
class MediaInputs:
    """A run's projector and the media it reads, in the prompt's order: the images, then the
    sounds; and whether its encoder may go to a GPU (``offload``, off with --no-mmproj-offload:
    the CPU)."""

    mmproj: Path | None = None
    images: tuple[Path, ...] = ()
    audio: tuple[Path, ...] = ()
    offload: bool = True

    def files(self) -> list[tuple[str, Path]]:
        return [(IMAGE, p) for p in self.images] + [(AUDIO, p) for p in self.audio]

    def __bool__(self) -> bool:
        return self.mmproj is not None

    def validate(self) -> None:
        """One line for the first thing wrong, from the files alone, before the model loads
        (that this build has libmtmd is the runner's to check: ``media.import_mtmd``)."""
        if self.mmproj is None:
            if self.images or self.audio:
                raise UserError("--image and --audio need --mmproj (the model's projector file)")
            return
        check_projector(self.mmproj)
        for kind, path in self.files():
            check_file(kind, path)

    def metadata(self) -> dict[str, Any]:
        if self.mmproj is None:
            return {}
        return {
            "mmproj": str(self.mmproj),
            "media": [{"kind": kind, "path": str(path)} for kind, path in self.files()],
            **({} if self.offload else {"mmproj_offload": False}),
        }


@dataclass
class RunConfig:
    model: Path
    prompt: str
    n_predict: int = 32
    threads: int | None = None
    n_ctx: int = 2048
    n_batch: int = 512
    n_ubatch: int | None = None
    level: str = "detailed"
    out: Path | None = None
    seed: int = 0
    temp: float = 0.0
    # flash attention: on, off, or None for llama.cpp's default, auto (context_choices)
    flash_attn: bool | None = None
    # before the session: decode BOS and EOS once and forget them (common's warm-up: warm_up)
    warmup: bool = True
    type_k: str = "f16"  # the KV cache's types (-ctk/-ctv), by ggml's names
    type_v: str = "f16"
    top_k_logits: int = 10
    value_stats: bool = False  # at verbose, each CPU op's output statistics (tensor_stats)
    ignore_eos: bool = False
    chat: bool = False
    system: str | None = None
    always_on: AlwaysOn = field(default_factory=AlwaysOn)  # sampling and bounded files
    append: bool = False  # add the session to an existing log (default: keep_old replaces it)
    # where the layers run (-ngl/--gpu-layers, --device, --rpc, --tensor-split)
    offload: Offload = field(default_factory=Offload)
    # --memory-budget, as the bytes spec the library reads (llamacpp_instr.running.memory_budget)
    memory_budget: str | None = None
    # which weight tensors go to which buffer type (-ot/--override-tensor, --n-cpu-moe, --cpu-moe)
    tensors: TensorOverrides = field(default_factory=TensorOverrides)
    # a projector and the images and sounds it reads into the prompt (--mmproj, --image, --audio)
    media: MediaInputs = field(default_factory=MediaInputs)

    def memory_setting(self) -> memory.Setting:
        """What the run asked of memory, for the out-of-memory message."""
        ngl = self.offload.gpu_layers
        n_layer, q4k_saving = memory.model_facts(str(self.model))
        return memory.Setting(
            n_ctx=self.n_ctx,
            n_ubatch=self.n_ubatch or self.n_batch,
            gpu_layers=ngl if isinstance(ngl, int) and ngl >= 0 else None,
            n_layer=n_layer,
            type_k=self.type_k,
            type_v=self.type_v,
            q4k_saving=q4k_saving,
            ctx_flag="--ctx",
            ubatch_flag="--ubatch",
        )

    def validate(self) -> None:
        """Reject bad values before the model loads and before any file is created."""
        checks = [
            (self.n_predict >= 0, f"-n/--n-predict must be >= 0, got {self.n_predict}"),
            (
                self.threads is None or self.threads >= 1,
                f"--threads must be >= 1, got {self.threads}",
            ),
            (self.n_ctx >= 1, f"--ctx must be >= 1, got {self.n_ctx}"),
            (self.n_batch >= 1, f"--batch must be >= 1, got {self.n_batch}"),
            (
                self.n_ubatch is None or 1 <= self.n_ubatch <= self.n_batch,
                f"--ubatch must be between 1 and --batch ({self.n_batch}), got {self.n_ubatch}",
            ),
            (self.level in SESSION_LEVELS, f"level must be one of {', '.join(SESSION_LEVELS)}"),
            (self.temp >= 0, f"--temp must be >= 0, got {self.temp}"),
            (
                1 <= self.top_k_logits <= 1000,
                f"--top-k-logits must be between 1 and 1000, got {self.top_k_logits}",
            ),
        ]
        checks.append((self.system is None or self.chat, "--system needs --chat"))
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        context_choices.check_kv(self.type_k, self.type_v, self.flash_attn)
        self.media.validate()


def resolve_threads(threads: int | None) -> int:
    """The CPU threads to use: ``threads``, or by default all cores, at most 8 (past that, more
    threads mostly wait at the barrier between ops). The one default of every command's
    -t/--threads."""
    return threads or max(1, min(os.cpu_count() or 1, 8))
