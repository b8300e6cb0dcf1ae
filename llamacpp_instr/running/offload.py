"""Where a model's layers run: the offload options, one meaning in every command and in the API.

- ``gpu_layers`` (``-ngl/--gpu-layers``): how many layers llama.cpp stores on the offload devices,
  a number or ``"all"``; 0 (the default) keeps the model on the CPU.
- ``devices`` (``--device``): the ggml devices to offload to, by name (``Vulkan0``, ``RPC0``...),
  in order; ``None`` lets llama.cpp pick (every GPU and RPC server, RPC servers first); ``()``
  (``--device none``) offloads to nothing.
- ``rpc`` (``--rpc``): ggml RPC servers (``rpc-server``), ``HOST:PORT`` each, added to ggml's
  devices (``RPC0``, ``RPC1``...) before the model loads, as llama.cpp's own ``--rpc`` does.
- ``tensor_split`` (``--tensor-split``): the share of the offloaded layers each device gets, in
  the order of the devices used.
- ``repack`` (``--repack/--no-repack``, llama.cpp's own, on by default): whether the CPU may keep
  weights in its extra buffer types (``CPU_REPACK``, Intel AMX's ``AMX``), which hold them
  rearranged for its kernels, a copy beside the file's mapping (``use_extra_bufts``).

``Offload`` holds the values and checks them without touching anything; ``prepare`` checks each
RPC server answers, registers it, finds the devices by name and returns a ``Placement``, which
sets a ``llama_model_params`` (llama-cpp-python's ``Llama`` takes no device list, so the placement
sets it at the one call that loads the model). Every model the commands open goes through here.
"""

from __future__ import annotations

import ctypes
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.running.rpc_endpoint import parse_endpoints

ALL = "all"
# LLAMA_MAX_DEVICES of the pin's llama.h (the length of llama_model_params.tensor_split)
MAX_DEVICES = 16


def parse_gpu_layers(value: int | str) -> int | str:
    """A layer count >= 0, or ``"all"``."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == ALL:
            return ALL
        if not re.fullmatch(r"[+-]?\d+", text):
            raise UserError(f"takes a number of layers or 'all', not {value!r}")
        value = int(text)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"must be >= 0 (or 'all'), got {value!r}")
    return value


def parse_devices(value: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...] | None:
    """``--device``: comma-separated ggml device names, each once; ``none`` alone means no
    device (the CPU only)."""
    if value is None:
        return None
    names = [n.strip() for n in (value.split(",") if isinstance(value, str) else value)]
    if names == ["none"]:
        return ()
    if any(not n for n in names):
        raise UserError(f"takes comma-separated device names, not {value!r}")
    if "none" in names:
        raise UserError("none means no device: give it alone")
    lower = [n.lower() for n in names]
    for n in names:
        if lower.count(n.lower()) > 1:
            raise UserError(f"names {n} twice")
    return tuple(names)


def parse_rpc(value: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    if not value:
        return ()
    return parse_endpoints(value if isinstance(value, str) else ",".join(value))


def parse_tensor_split(
    value: str | tuple[float, ...] | list[float] | None,
) -> tuple[float, ...] | None:
    """``--tensor-split``: proportions >= 0, not all 0, separated by commas (or slashes, as
    llama.cpp takes them), e.g. ``3,1``."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            parts = tuple(float(p) for p in re.split(r"[,/]", value))
        except ValueError:
            raise UserError(
                f"takes comma-separated proportions such as 3,1, not {value!r}"
            ) from None
    else:
        parts = tuple(float(p) for p in value)
    if not parts or any(not p >= 0 or p == float("inf") for p in parts) or not any(parts):
        raise UserError(f"proportions must be finite, >= 0 and not all 0, got {value!r}")
    if len(parts) > MAX_DEVICES:
        raise UserError(f"has {len(parts)} proportions; llama.cpp takes at most {MAX_DEVICES}")
    return parts


@dataclass(frozen=True)
class Offload:
    """The offload options' values (see the module doc); checked as they are made, strings
    parsed as the command line parses them."""

    gpu_layers: int | str = 0
    devices: tuple[str, ...] | None = None
    rpc: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] | None = None
    repack: bool = True

    def __post_init__(self) -> None:
        for name, option, parse in (
            ("gpu_layers", "--gpu-layers", parse_gpu_layers),
            ("devices", "--device", parse_devices),
            ("rpc", "--rpc", parse_rpc),
            ("tensor_split", "--tensor-split", parse_tensor_split),
        ):
            try:
                object.__setattr__(self, name, parse(getattr(self, name)))  # type: ignore[operator]
            except UserError as exc:
                raise UserError(f"{option} {exc}") from None
        if self.devices == () and self.rpc:
            raise UserError("--device none uses no device, so --rpc servers would go unused")
        if self.devices == () and self.tensor_split is not None:
            raise UserError("--device none uses no device: there is nothing to --tensor-split")

    @property
    def offloads(self) -> bool:
        return self.gpu_layers != 0

    def describe(self) -> dict[str, Any]:
        """The values as a session's metadata records them."""
        return {
            "gpu_layers": self.gpu_layers,
            "devices": None if self.devices is None else list(self.devices),
            "rpc": list(self.rpc),
            "tensor_split": None if self.tensor_split is None else list(self.tensor_split),
            "repack": self.repack,
        }


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
