"""llama.cpp's own measure of a multimodal projector's memory (an mmproj file, tools/mtmd):
``mtmd_get_memory_usage``, which llama-server's fit adds to its margins, read through the C
function the patched libmtmd gives it, ``mtmd_instr_memory_usage``, called through ctypes.

``mtmd_get_memory_usage(mmproj_fname, ctx_params)`` loads the projector as a run would, with
``no_alloc`` (no weight read), and with ``ctx_params.warmup`` reserves its compute graph for the
largest input mtmd takes (its warmup: an image of the projector's warmup size, a 30 s audio chunk),
as ``mtmd_init_from_file`` does; it returns the bytes per ggml device of the weights (the tensors'
``ggml_nbytes``) and the compute buffers. Without ``warmup`` nothing is reserved: the weights
alone. A file it cannot load gives nothing.

It is a C++ function returning a ``std::map``; ``mtmd_instr_memory_usage`` (patches/, tools/mtmd)
writes that map into the caller's arrays of devices and bytes and returns how many there are (0:
not loaded, -1: a bad argument, -2: the measure failed; more than the arrays hold: called again
with as many, once).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError

SYMBOL = "mtmd_instr_memory_usage"
# devices the first call has room for; a machine with more is asked again with as many, at most
# MAX_DEVICES (ggml's registry lists a handful: a CPU, GPUs, RPC servers)
FIRST_ROOM = 16
MAX_DEVICES = 1024

Devices = dict[int, int]  # {ggml_backend_dev_t: bytes}


def memory_usage(mtmd_cpp: Any, path: Path, params: Any, warmup: bool) -> Devices:
    """``mtmd_get_memory_usage(path, params)`` of libmtmd (``mtmd_cpp``, llama-cpp-python's
    binding) with ``params.warmup`` set to ``warmup``: {ggml_backend_dev_t: bytes}, empty where
    llama.cpp could not load the projector; a one-line UserError where libmtmd has no
    ``mtmd_instr_memory_usage`` or the measure failed."""
    fn = getattr(mtmd_cpp._libmtmd, SYMBOL, None)
    if fn is None:
        raise UserError(
            f"--mmproj: this libmtmd has no {SYMBOL} (not this package's build: `instr build` "
            "builds it, or set MTMD_CPP_LIB to its libraries' folder)"
        )
    fn.restype = ctypes.c_int32
    fn.argtypes = [
        ctypes.c_char_p,
        ctypes.POINTER(mtmd_cpp.mtmd_context_params),
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.c_int32,
    ]
    params.warmup = warmup
    room = FIRST_ROOM
    while True:
        devices = (ctypes.c_void_p * room)()
        sizes = (ctypes.c_uint64 * room)()
        n = int(fn(str(path).encode(), ctypes.byref(params), devices, sizes, room))
        if n < 0:
            raise UserError(f"--mmproj {path}: libmtmd's measure failed ({SYMBOL} returned {n})")
        if n <= room:
            return {int(devices[i] or 0): int(sizes[i]) for i in range(n)}
        if room != FIRST_ROOM or n > MAX_DEVICES:
            raise UserError(f"--mmproj: libmtmd measured {n} devices, more than this reads")
        room = n
