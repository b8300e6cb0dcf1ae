"""The model file of each quantization asked (``--quant``: fit, plan, predict): the file itself
for its own type (``file_type``), else the file quantized into the cache (``sweep.quantized``)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import bindings, models


def file_type(path: Path) -> str:
    """The GGUF's own type (its general.file_type) as instr quantize names it (q4_k_m, f16...),
    read by llama.cpp from the model's vocabulary-only load (gguf-py's reader parses the whole
    vocabulary in Python: a minute on a 2-core machine)."""
    from gguf import LlamaFileType
    from llama_cpp import _logger

    _logger.set_verbose(False)
    ll = bindings.import_llama_cpp()
    params = ll.llama_model_default_params()
    params.vocab_only = True
    model = ll.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise UserError(models.explain_load_failure(path))
    try:
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_model_meta_val_str(model, b"general.file_type", buf, len(buf))
        name = LlamaFileType(int(buf.value)).name if n > 0 else "unknown"
    except ValueError:
        name = "unknown"
    finally:
        ll.llama_model_free(model)
    return name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()


def quantized_files(
    path: Path, quants: tuple[str, ...], say: Callable[[str], None] = lambda _: None
) -> list[tuple[str, Path]]:
    """(quantization, file) for each of ``quants`` (--quant: fit, plan, predict): the file itself
    for its own type, else the file quantized into the cache (``say`` hears the quantizer)."""
    from llamacpp_instr.running.quant.quantize import TYPES
    from llamacpp_instr.running.quant.sweep import quantized

    own = file_type(path)
    asked = [q.lower() for q in quants] or [own]
    for q in asked:
        if q not in TYPES and q != own:
            raise UserError(f"unknown --quant {q!r}: choose one of {', '.join(TYPES)}")
    return [(q, path if q == own else quantized(path, q, 0, say)) for q in dict.fromkeys(asked)]
