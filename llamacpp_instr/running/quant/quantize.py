"""Quantizing a GGUF with the pinned llama.cpp's own quantizer (``llama_model_quantize``).

Used by ``instr quantize`` and by ``sweep``; library code, so it never imports ``commands``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError

TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s",
         "q4_k_m", "q5_k_s", "q5_k_m", "q6_k", "f16", "bf16", "f32"]  # fmt: skip


def _ftype(llama_cpp: Any, name: str) -> int:
    attr = "LLAMA_FTYPE_ALL_F32" if name == "f32" else f"LLAMA_FTYPE_MOSTLY_{name.upper()}"
    return int(getattr(llama_cpp, attr))


def quantize_file(
    src: Path,
    output: Path,
    qtype: str,
    threads: int = 0,
    progress: Callable[[float], None] | None = None,
) -> None:
    """llama_model_quantize of the pinned build (in a thread, so ``progress`` can report);
    ``threads`` 0 lets llama.cpp use every core."""
    from llamacpp_instr.native import bindings

    llama_cpp = bindings.import_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = _ftype(llama_cpp, qtype)
    params.nthread = threads
    params.allow_requantize = True
    done = threading.Event()
    rc: list[int] = []

    def work() -> None:
        rc.append(
            llama_cpp.llama_model_quantize(
                str(src).encode(), str(output).encode(), llama_cpp.byref(params)
            )
        )
        done.set()

    t0 = time.monotonic()
    threading.Thread(target=work, daemon=True).start()
    while not done.wait(2.0):
        if progress:
            progress(time.monotonic() - t0)
    if rc[0] != 0 or not output.is_file():
        raise UserError(f"llama_model_quantize failed ({rc[0]}) for {src} -> {qtype}")
