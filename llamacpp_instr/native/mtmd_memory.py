"""llama.cpp's own measure of a multimodal projector's memory (an mmproj file, tools/mtmd):
``mtmd_get_memory_usage``, which llama-server's fit adds to its margins, called through ctypes on
libmtmd.

``mtmd_get_memory_usage(mmproj_fname, ctx_params)`` loads the projector as a run would, with
``no_alloc`` (no weight read), and with ``ctx_params.warmup`` reserves its compute graph for the
largest input mtmd takes (its warmup: an image of the projector's warmup size, a 30 s audio chunk),
as ``mtmd_init_from_file`` does; it returns the bytes per ggml device of the weights (the tensors'
``ggml_nbytes``) and the compute buffers. Without ``warmup`` nothing is reserved: the weights
alone. A file it cannot load gives an empty map.

It is a C++ function returning a ``std::map<ggml_backend_dev_t, size_t>``, which ctypes can call
where the ABI passes the map through a hidden pointer in the first argument register and
``std::map`` is libstdc++'s (x86-64 Linux): the caller gives the map's 48 bytes, reads its
red-black tree and frees its nodes with ``operator delete``, as the map's destructor would.
"""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError

# std::map<ggml_backend_dev_t, size_t> mtmd_get_memory_usage(const char *, mtmd_context_params)
SYMBOL = "_Z21mtmd_get_memory_usagePKc19mtmd_context_params"
# libstdc++'s std::map, in 8-byte words: its comparator (padded), then the tree's header node
# (color, parent: the root, leftmost, rightmost) and the node count
_MAP_WORDS = 6
_ROOT, _COUNT = 2, 5
# a node: color, parent, left, right, then the value: the key (the device) and the bytes
_LEFT, _RIGHT, _KEY, _VALUE = 2, 3, 4, 5

Devices = dict[int, int]  # {ggml_backend_dev_t: bytes}


def memory_usage(mtmd_cpp: Any, path: Path, params: Any, warmup: bool) -> Devices:
    """``mtmd_get_memory_usage(path, params)`` of libmtmd (``mtmd_cpp``, llama-cpp-python's
    binding) with ``params.warmup`` set to ``warmup``: {ggml_backend_dev_t: bytes}, empty where
    llama.cpp could not load the projector; a one-line UserError where ctypes cannot call it."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise UserError(
            "--mmproj: llama.cpp's measure of a projector (mtmd_get_memory_usage, a C++ "
            "function) is read on x86-64 Linux only"
        )
    fn = getattr(mtmd_cpp._libmtmd, SYMBOL, None)
    if fn is None:
        raise UserError(f"--mmproj: this libmtmd has no {SYMBOL} (another llama.cpp?)")
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, mtmd_cpp.mtmd_context_params]
    params.warmup = warmup
    out = (ctypes.c_uint64 * _MAP_WORDS)()
    fn(ctypes.addressof(out), str(path).encode(), params)
    found: Devices = {}
    nodes: list[int] = []
    todo = [int(out[_ROOT])]
    while todo:
        node = todo.pop()
        if node:
            words = (ctypes.c_uint64 * _MAP_WORDS).from_address(node)
            found[int(words[_KEY])] = int(words[_VALUE])
            todo += [int(words[_LEFT]), int(words[_RIGHT])]
            nodes.append(node)
    _free(nodes)
    if len(nodes) != int(out[_COUNT]) or len(found) != len(nodes):
        raise UserError(f"--mmproj: libmtmd's answer is not a map this reads ({len(nodes)} nodes)")
    return found


def _free(nodes: list[int]) -> None:
    """The map's nodes freed as its destructor frees them (``operator delete``)."""
    if not nodes:
        return
    delete = ctypes.CDLL("libstdc++.so.6")._ZdlPv
    delete.argtypes = [ctypes.c_void_p]
    delete.restype = None
    for node in nodes:
        delete(node)
