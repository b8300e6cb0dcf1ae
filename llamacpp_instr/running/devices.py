"""ggml's device registry, through the libllama that llama_cpp loaded: the devices a model can be
offloaded to, found by name, and RPC servers added to it as devices.

The functions are looked up through llama_cpp's own library handle, whose dependencies include
libggml: loading libggml again by file name could give this process a second ggml with a registry
of its own, which libllama would never see (tests/helpers/rpc_backend.py says how). What a device is
(name, backend, type, memory) is read by the native ``llama_instr_machine_info``, the same record
``session_start.machine.devices`` holds.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import bindings

# enum ggml_backend_dev_type, in the pin's order
DEVICE_TYPES = ("cpu", "gpu", "igpu", "accel", "meta")
# the types llama.cpp offloads layers to (llama_prepare_model_devices; RPC devices are GPUs)
OFFLOAD_TYPES = ("gpu", "igpu")


@dataclass(frozen=True)
class Device:
    """One device of the registry: ``ptr`` is its ggml_backend_dev_t."""

    ptr: int
    name: str
    type: str
    backend: str  # the name of the device's backend registry: CPU, RPC, Vulkan...


_declared: Any = None


def _lib() -> Any:
    global _declared
    if _declared is not None:
        return _declared
    lib = bindings.import_llama_cpp().llama_cpp._lib
    c = ctypes
    sigs: dict[str, tuple[list[Any], Any]] = {
        "ggml_backend_dev_count": ([], c.c_size_t),
        "ggml_backend_dev_get": ([c.c_size_t], c.c_void_p),
        "ggml_backend_dev_name": ([c.c_void_p], c.c_char_p),
        "ggml_backend_dev_type": ([c.c_void_p], c.c_int),
        "ggml_backend_dev_backend_reg": ([c.c_void_p], c.c_void_p),
        "ggml_backend_reg_name": ([c.c_void_p], c.c_char_p),
        "ggml_backend_reg_count": ([], c.c_size_t),
        "ggml_backend_reg_get": ([c.c_size_t], c.c_void_p),
        "ggml_backend_reg_by_name": ([c.c_char_p], c.c_void_p),
        "ggml_backend_reg_get_proc_address": ([c.c_void_p, c.c_char_p], c.c_void_p),
        "ggml_backend_register": ([c.c_void_p], None),
        "ggml_backend_dev_memory": (
            [c.c_void_p, c.POINTER(c.c_size_t), c.POINTER(c.c_size_t)],
            None,
        ),
    }
    for name, (argtypes, restype) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = restype
    _declared = lib
    return lib


def registry() -> list[Device]:
    """Every device of ggml's registry, in its order (the order of machine.devices)."""
    lib = _lib()
    out = []
    for i in range(int(lib.ggml_backend_dev_count())):
        dev = lib.ggml_backend_dev_get(i)
        t = int(lib.ggml_backend_dev_type(dev))
        out.append(
            Device(
                ptr=int(dev),
                name=lib.ggml_backend_dev_name(dev).decode(errors="replace"),
                type=DEVICE_TYPES[t] if 0 <= t < len(DEVICE_TYPES) else "other",
                backend=lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev)).decode(
                    errors="replace"
                ),
            )
        )
    return out


def memory(device: Device) -> tuple[int, int]:
    """(free, total) bytes of ``device`` as ggml reports them (a memory budget lowers both)."""
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _lib().ggml_backend_dev_memory(device.ptr, ctypes.byref(free), ctypes.byref(total))
    return int(free.value), int(total.value)


def offload_candidates() -> list[Device]:
    """The devices layers can be offloaded to (GPUs, integrated GPUs, RPC servers), in registry
    order."""
    return [d for d in registry() if d.type in OFFLOAD_TYPES]


def default_offload() -> list[Device]:
    """The devices llama.cpp offloads to when given none (llama_prepare_model_devices): RPC
    servers first, then GPUs, then integrated GPUs if there is no GPU. (It also skips a second
    backend's view of a GPU it already has, by device id, which this list keeps.)"""
    cands = offload_candidates()
    rpc = [d for d in cands if d.backend == "RPC"]
    gpus = [d for d in cands if d.type == "gpu" and d.backend != "RPC"]
    igpus = [d for d in cands if d.type == "igpu"]
    return rpc + gpus + (igpus if not gpus else [])


def by_names(names: tuple[str, ...]) -> list[Device]:
    """The offload devices named (case-insensitive, as ggml_backend_dev_by_name), in the order
    given; a one-line UserError naming the available ones for a name that is not one."""
    candidates = offload_candidates()
    out = []
    for name in names:
        found = [d for d in candidates if d.name.lower() == name.lower()]
        if not found:
            have = ", ".join(d.name for d in candidates)
            listing = (
                f"the devices are {have}"
                if have
                else "this build has no GPU or RPC device (--rpc adds RPC servers)"
            )
            raise UserError(
                f"unknown device {name!r} for --device: {listing}; none keeps every layer on "
                "the CPU (`instr doctor` lists the devices)"
            )
        out.append(found[0])
    return out


def _rpc_reg_name(endpoint: str) -> str:
    return f"RPC[{endpoint}]"  # ggml_backend_rpc_add_server's name for the server's registry


def rpc_registered(endpoint: str) -> bool:
    """Whether the RPC server ``endpoint`` is already among ggml's devices in this process (then
    ggml holds a connection to it, and the server, which serves one client at a time, would not
    answer another)."""
    lib = _lib()
    names = {
        lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode(errors="replace")
        for i in range(int(lib.ggml_backend_reg_count()))
    }
    return _rpc_reg_name(endpoint) in names


def add_rpc_servers(endpoints: tuple[str, ...]) -> None:
    """Register each RPC server as ggml devices (RPC0, RPC1... in the order added), as llama.cpp's
    ``--rpc`` does (common/arg.cpp add_rpc_devices): ggml_backend_rpc_add_server through the RPC
    registry's proc address. Each endpoint not yet registered is checked first
    (``rpc_endpoint.check_all``): ggml aborts the process on one that fails. A server already
    registered in this process is not added twice; registered devices stay for the life of the
    process."""
    from llamacpp_instr.running import rpc_endpoint

    if not endpoints:
        return
    rpc_endpoint.check_all(tuple(ep for ep in endpoints if not rpc_registered(ep)))
    lib = _lib()
    rpc = lib.ggml_backend_reg_by_name(b"RPC")
    if not rpc:
        raise UserError("this build of llama.cpp has no RPC backend (GGML_RPC): --rpc needs it")
    addr = lib.ggml_backend_reg_get_proc_address(rpc, b"ggml_backend_rpc_add_server")
    if not addr:
        raise UserError("this build's RPC backend lacks ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(addr)
    for ep in endpoints:
        if rpc_registered(ep):
            continue
        reg = add_server(ep.encode())
        if not reg:
            raise UserError(f"--rpc {ep}: the server has no device")
        lib.ggml_backend_register(reg)
