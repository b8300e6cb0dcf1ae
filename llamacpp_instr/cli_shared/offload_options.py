"""Where a model's layers run: -ngl/--gpu-layers, --device, --rpc, --tensor-split, --repack (the values and
their checks are ``llamacpp_instr.running.offload``'s, shared with the Python API)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from llamacpp_instr.contract.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])


class _OffloadValue(click.ParamType):
    """A value parsed by one of offload.py's parsers; its UserError is click's usage error."""

    def __init__(self, name: str, parse: Callable[[str], Any]) -> None:
        self.name = name
        self._parse = parse

    def __repr__(self) -> str:
        return f"OffloadValue({self.name!r}, {self._parse.__name__})"

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return self.name  # as written (N|all), not upper-cased

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value  # a default, already parsed
        try:
            return self._parse(value)
        except UserError as exc:
            self.fail(str(exc), param, ctx)


def offload_options(
    *,
    layers: bool = True,
    device: bool = True,
    rpc: bool = True,
    split: bool = True,
    layers_default: str | None = None,
) -> Callable[[F], F]:
    """The offload options a command takes, passed to it as one ``offload`` (an
    ``offload.Offload``): -ngl/--gpu-layers, --device, --rpc, --tensor-split and --repack, each defined
    here once. ``layers_default``: what -ngl's default is in words, where it is not 0 (a log's
    placement, a search)."""
    from llamacpp_instr.running import offload as o
    from llamacpp_instr.running.rpc_endpoint import PROBE_TIMEOUT_S

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs["offload"] = o.Offload(
                gpu_layers=kwargs.pop("gpu_layers", 0),
                devices=kwargs.pop("device", None),
                rpc=kwargs.pop("rpc", None) or (),
                tensor_split=kwargs.pop("tensor_split", None),
                repack=kwargs.pop("repack", True),
            )
            return f(*args, **kwargs)

        g: Any = wrapper
        g = click.option(
            "--repack/--no-repack",
            " /-nr",
            default=True,
            show_default=True,
            help="Let the CPU keep weights repacked for its kernels (CPU_REPACK, Intel AMX), a "
            "copy beside the file's mapping, as llama.cpp does by default (-nr: as in the file).",
        )(g)
        if split:
            g = click.option(
                "--tensor-split",
                type=_OffloadValue("P0,P1,...", o.parse_tensor_split),
                default=None,
                help="Share of the offloaded layers per device, in the order of the devices "
                "used (--device's; by default RPC servers first, then GPUs), e.g. 3,1.",
            )(g)
        if rpc:
            g = click.option(
                "--rpc",
                type=_OffloadValue("HOST:PORT[,...]", o.parse_rpc),
                default=None,
                help="ggml RPC servers (llama.cpp's rpc-server) to offload to, comma-separated: "
                "each becomes a device RPC0, RPC1...; each must answer within "
                f"{PROBE_TIMEOUT_S:g} s.",
            )(g)
        if device:
            g = click.option(
                "--device",
                type=_OffloadValue("NAME[,...]", o.parse_devices),
                default=None,
                help="ggml devices to offload to, comma-separated (Vulkan0, RPC0...: `instr "
                "doctor` lists them); none = the CPU only. Default: every GPU and RPC device.",
            )(g)
        if layers:
            g = click.option(
                "-ngl",
                "--gpu-layers",
                type=_OffloadValue("N|all", o.parse_gpu_layers),
                default=0,
                show_default=layers_default or True,
                help="Layers to offload to the GPU and RPC devices (llama.cpp's -ngl), or all; "
                "0 keeps the model on the CPU.",
            )(g)
        return g  # type: ignore[no-any-return]

    return deco
