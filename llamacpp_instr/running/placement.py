"""An ``Offload`` made real in this process (``prepare``): each RPC server checked to answer and
registered, the devices found by name, the split checked against them, and a ``Placement``, which
sets a ``llama_model_params`` (llama-cpp-python's ``Llama`` takes no device list, so the placement
sets it at the one call that loads the model).
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.running.offload import ALL, MAX_DEVICES, Offload


@dataclass
class Placement:
    """An ``Offload`` made real in this process: its RPC servers registered, its devices found.
    ``devices`` names the devices used (in llama.cpp's order when it picks them)."""

    offload: Offload
    devices: list[str]
    _dev_array: Any = None
    _split_array: Any = None

    @property
    def offloading(self) -> bool:
        """Whether layers go to a device other than the CPU."""
        return self.offload.offloads and bool(self.devices)

    def apply(self, params: Any) -> None:
        """Set a ``llama_model_params``: layers, devices, split and repacking (the arrays live as
        long as this placement; llama.cpp copies them while the model loads)."""
        params.use_extra_bufts = self.offload.repack
        layers = self.offload.gpu_layers
        params.n_gpu_layers = -1 if layers == ALL else int(layers)  # negative: all (llama.h)
        devs = self._dev_array
        params.devices = None if devs is None else ctypes.cast(devs, ctypes.c_void_p).value
        if self._split_array is not None:
            params.tensor_split = ctypes.cast(self._split_array, ctypes.POINTER(ctypes.c_float))

    @contextmanager
    def loading(self) -> Iterator[None]:
        """Inside the block, every model llama-cpp-python loads (``llama_cpp.Llama``, the server
        that builds one) is placed here: its ``llama_model_load_from_file`` call gets these
        params. Serialized: one placed load at a time in the process."""
        from llama_cpp import llama_cpp

        with _LOAD_LOCK:
            original = llama_cpp.llama_model_load_from_file

            def placed(path: bytes, params: Any) -> Any:
                self.apply(params)
                return original(path, params)

            llama_cpp.llama_model_load_from_file = placed
            try:
                yield
            finally:
                llama_cpp.llama_model_load_from_file = original

    def llama(self, model_path: str, **kwargs: Any) -> Any:
        """A ``llama_cpp.Llama`` of ``model_path`` placed here (``kwargs`` are Llama's)."""
        import llama_cpp

        with self.loading():
            return llama_cpp.Llama(model_path, **kwargs)


_LOAD_LOCK = threading.Lock()
_warned: set[str] = set()


def warn_once(message: str) -> None:
    """A one-line warning on stderr, once per process (a sweep places many models alike)."""
    if message not in _warned:
        _warned.add(message)
        sys.stderr.write(f"warning: {message}\n")
        sys.stderr.flush()


def prepare(offload: Offload) -> Placement:
    """Check and register ``offload.rpc`` (each server must answer ggml-rpc's HELLO within a few
    seconds), find ``offload.devices``, and check the split fits them: a one-line UserError
    otherwise, before any model loads. Warns (once) when the options ask for an offload that
    cannot happen: layers with no device to take them, or devices with no layers for them."""
    from llamacpp_instr.running import devices

    devices.add_rpc_servers(offload.rpc)
    if offload.devices is None:
        used = devices.default_offload()
        dev_array = None
    else:
        used = devices.by_names(offload.devices)
        dev_array = (ctypes.c_void_p * (len(used) + 1))(*[d.ptr for d in used], None)
    split_array = None
    if offload.tensor_split is not None:
        if len(offload.tensor_split) > len(used):
            names = ", ".join(d.name for d in used) or "none"
            raise UserError(
                f"--tensor-split has {len(offload.tensor_split)} proportions for "
                f"{len(used)} device(s) ({names})"
            )
        split_array = (ctypes.c_float * MAX_DEVICES)(*offload.tensor_split)
    if offload.offloads and not used:
        why = (
            "with --device none,"
            if offload.devices == ()
            else "but there is no GPU or RPC device to offload to:"
        )
        warn_once(f"--gpu-layers {offload.gpu_layers} {why} every layer runs on the CPU")
    elif not offload.offloads and (offload.rpc or offload.devices or offload.tensor_split):
        warn_once(
            "--rpc, --device and --tensor-split place the layers --gpu-layers offloads, and it "
            "is 0: every layer runs on the CPU"
        )
    return Placement(offload, [d.name for d in used], dev_array, split_array)
