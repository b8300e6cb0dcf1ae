"""The rules of a ``TensorOverrides`` (-ot, --n-cpu-moe, --cpu-moe) given to the models loaded in
this process: each rule's buffer type found by name in ggml's device registry (``buffer_types``)
and the rules set as ``llama_model_params.tensor_buft_overrides`` (a NULL-terminated array of
``{pattern, buft}``) of every model loaded inside ``loading``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.running.tensor_overrides import TensorOverrides


@contextmanager
def loading(tensors: TensorOverrides) -> Iterator[None]:
    """Inside the block, every model llama-cpp-python loads gets ``tensors``' rules (nothing
    changes without rules). Nest it inside ``Placement.loading`` (which serializes loads); a buffer
    type no device has is a UserError naming those there are, before anything loads."""
    if not tensors.rules:
        yield
        return
    from llama_cpp import llama_cpp

    bufts = buffer_types()
    for _, name in tensors.rules:
        if name not in bufts:
            raise UserError(
                f"-ot/--override-tensor: unknown buffer type {name!r}; this build has "
                f"{', '.join(bufts) or 'none'}"
            )
    patterns = [p.encode() for p, _ in tensors.rules]  # alive until the block ends
    array = (_Override * (len(tensors.rules) + 1))(
        *[_Override(p, bufts[b]) for p, (_, b) in zip(patterns, tensors.rules, strict=True)],
        _Override(None, None),
    )
    original = llama_cpp.llama_model_load_from_file

    def overridden(path: bytes, params: Any) -> Any:
        params.tensor_buft_overrides = ctypes.addressof(array)
        return original(path, params)

    llama_cpp.llama_model_load_from_file = overridden
    try:
        yield
    finally:
        llama_cpp.llama_model_load_from_file = original


class _Override(ctypes.Structure):
    """struct llama_model_tensor_buft_override (llama.h)."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def buffer_types() -> dict[str, int]:
    """Every device's buffer type by name (ggml_backend_buft_name of ggml_backend_dev_buffer_type),
    as llama.cpp's -ot finds them: ``CPU``, ``Vulkan0``, ``RPC0[host:port]``..."""
    from llamacpp_instr.running import devices

    lib = devices._lib()
    c = ctypes
    lib.ggml_backend_dev_buffer_type.argtypes = [c.c_void_p]
    lib.ggml_backend_dev_buffer_type.restype = c.c_void_p
    lib.ggml_backend_buft_name.argtypes = [c.c_void_p]
    lib.ggml_backend_buft_name.restype = c.c_char_p
    out: dict[str, int] = {}
    for d in devices.registry():
        buft = lib.ggml_backend_dev_buffer_type(d.ptr)
        if buft:
            out.setdefault(lib.ggml_backend_buft_name(buft).decode(errors="replace"), int(buft))
    return out
