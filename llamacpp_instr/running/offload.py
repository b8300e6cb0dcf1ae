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

``Offload`` holds the values and checks them without touching anything (data alone: the planners
read it); ``placement.prepare`` makes one real in this process. Every model the commands open
goes through both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from llamacpp_instr.contract.errors import UserError

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


def parse_endpoint(text: str) -> str:
    """``HOST:PORT`` as ggml-rpc parses it (the host up to the first colon: a name or an IPv4
    address, no IPv6 literal), checked: a host and a port in 1-65535. Returns it stripped."""
    ep = text.strip()
    host, sep, port = ep.partition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UserError(
            "takes HOST:PORT endpoints (a host name or IPv4 address and a port), e.g. "
            f"127.0.0.1:50052, not {text!r}"
        )
    return ep


def parse_endpoints(text: str) -> tuple[str, ...]:
    """A comma-separated list of endpoints, each once."""
    eps = tuple(parse_endpoint(p) for p in text.split(","))
    for ep in eps:
        if eps.count(ep) > 1:
            raise UserError(f"names {ep} twice")
    return eps


def parse_rpc(value: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    """``--rpc``: the endpoints, a comma-separated string or a sequence of them."""
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
